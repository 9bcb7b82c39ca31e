#include "rtable/operator/kube_client.h"

namespace rtable::op {

std::string_view watchEndReasonName(WatchEndReason reason) {
  switch (reason) {
    case WatchEndReason::kServerClosed:
      return "server closed";
    case WatchEndReason::kStopped:
      return "stopped";
    case WatchEndReason::kError:
      return "error";
  }
  return "unknown";
}

KubeResult<ObjectList> KubeClient::listAll(const ResourceType& type, std::string_view ns,
                                           ListOptions options, int max_restarts) {
  const ListOptions first_page = options;
  ObjectList all;
  int restarts = 0;
  for (;;) {
    auto page = list(type, ns, options);
    if (!page) {
      // The snapshot behind a continue token was compacted: only a fresh list helps.
      if (page.error().kind == KubeErrorKind::kGone && !options.continue_token.empty() &&
          restarts < max_restarts) {
        ++restarts;
        all = ObjectList{};
        options = first_page;
        continue;
      }
      return std::unexpected(page.error());
    }
    if (options.continue_token.empty()) all.resource_version = page->resource_version;
    for (auto& item : page->items) all.items.push_back(std::move(item));
    if (page->continue_token.empty()) return all;
    options.continue_token = page->continue_token;
    // A continue token pins the snapshot; the apiserver refuses it together with these.
    options.resource_version.clear();
    options.resource_version_match = ResourceVersionMatch::kUnset;
  }
}

ObjectKey objectKeyOf(const nlohmann::json& object) {
  ObjectKey key;
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return key;
  if (auto ns = metadata->find("namespace"); ns != metadata->end() && ns->is_string()) {
    key.ns = ns->get<std::string>();
  }
  if (auto name = metadata->find("name"); name != metadata->end() && name->is_string()) {
    key.name = name->get<std::string>();
  }
  return key;
}

std::string resourceVersionOf(const nlohmann::json& object) {
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return {};
  auto rv = metadata->find("resourceVersion");
  return rv != metadata->end() && rv->is_string() ? rv->get<std::string>() : std::string();
}

}  // namespace rtable::op
