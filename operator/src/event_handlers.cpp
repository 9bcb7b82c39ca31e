#include "rtable/operator/event_handlers.h"

#include <set>

namespace rtable::op {

ObjectKey objectKeyFromString(std::string_view key) {
  const auto slash = key.find('/');
  if (slash == std::string_view::npos) return {"", std::string(key)};
  return {std::string(key.substr(0, slash)), std::string(key.substr(slash + 1))};
}

ResourceEventHandlers enqueueObject(WorkQueue& queue) {
  auto enqueue = [&queue](const nlohmann::json& object) {
    queue.add(objectKeyOf(object).toString());
  };
  return {
      enqueue,
      [enqueue](const nlohmann::json&, const nlohmann::json& new_object) { enqueue(new_object); },
      enqueue,
  };
}

namespace {
std::string_view groupOf(std::string_view api_version) {
  const auto slash = api_version.find('/');
  return slash == std::string_view::npos ? std::string_view() : api_version.substr(0, slash);
}
}  // namespace

std::vector<ObjectKey> ownerKeysOf(const nlohmann::json& object, const OwnerFilter& filter) {
  std::vector<ObjectKey> keys;
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return keys;
  auto refs = metadata->find("ownerReferences");
  if (refs == metadata->end() || !refs->is_array()) return keys;
  const ObjectKey own = objectKeyOf(object);
  for (const auto& ref : *refs) {
    if (!ref.is_object()) continue;
    if (filter.controller_only && !ref.value("controller", false)) continue;
    if (ref.value("kind", "") != filter.kind) continue;
    if (groupOf(ref.value("apiVersion", "")) != filter.group) continue;
    const std::string name = ref.value("name", "");
    if (name.empty()) continue;
    keys.push_back({filter.namespaced ? own.ns : std::string(), name});
  }
  return keys;
}

ResourceEventHandlers enqueueOwner(WorkQueue& queue, OwnerFilter filter) {
  auto enqueue = [&queue, filter](const nlohmann::json& object) {
    for (const auto& key : ownerKeysOf(object, filter)) queue.add(key.toString());
  };
  return {
      enqueue,
      [&queue, filter](const nlohmann::json& old_object, const nlohmann::json& new_object) {
        std::set<ObjectKey> keys;
        for (auto& key : ownerKeysOf(old_object, filter)) keys.insert(std::move(key));
        for (auto& key : ownerKeysOf(new_object, filter)) keys.insert(std::move(key));
        for (const auto& key : keys) queue.add(key.toString());
      },
      enqueue,
  };
}

}  // namespace rtable::op
