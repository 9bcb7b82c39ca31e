#include "rtable/operator/resource.h"

#include <nlohmann/json.hpp>

#include "rtable/common/percent_encoding.h"

namespace rtable::op {

using common::percentEncode;

std::string ResourceType::apiVersion() const {
  return group.empty() ? version : group + "/" + version;
}

std::string ResourceType::groupResource() const {
  return group.empty() ? resource : resource + "." + group;
}

namespace resources {
namespace {
ResourceType make(std::string group, std::string version, std::string resource, std::string kind,
                  bool namespaced, bool status_subresource) {
  return ResourceType{std::move(group), std::move(version), std::move(resource),
                      std::move(kind),  namespaced,         status_subresource};
}
}  // namespace

ResourceType namespaces() {
  return make("", "v1", "namespaces", "Namespace", false, true);
}
ResourceType pods() {
  return make("", "v1", "pods", "Pod", true, true);
}
ResourceType services() {
  return make("", "v1", "services", "Service", true, true);
}
ResourceType configMaps() {
  return make("", "v1", "configmaps", "ConfigMap", true, false);
}
ResourceType secrets() {
  return make("", "v1", "secrets", "Secret", true, false);
}
ResourceType events() {
  return make("", "v1", "events", "Event", true, false);
}
ResourceType persistentVolumeClaims() {
  return make("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true, true);
}
ResourceType statefulSets() {
  return make("apps", "v1", "statefulsets", "StatefulSet", true, true);
}
ResourceType podDisruptionBudgets() {
  return make("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true, true);
}
ResourceType networkPolicies() {
  return make("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", true, false);
}
ResourceType leases() {
  return make("coordination.k8s.io", "v1", "leases", "Lease", true, false);
}
ResourceType customResourceDefinitions() {
  return make("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
              false, true);
}
}  // namespace resources

std::string ObjectKey::toString() const {
  return ns.empty() ? name : ns + "/" + name;
}

std::string collectionPath(const ResourceType& type, std::string_view ns) {
  std::string path = type.group.empty()
                         ? "/api/" + percentEncode(type.version)
                         : "/apis/" + percentEncode(type.group) + "/" + percentEncode(type.version);
  if (type.namespaced && !ns.empty()) path += "/namespaces/" + percentEncode(ns);
  path += "/" + percentEncode(type.resource);
  return path;
}

std::string objectPath(const ResourceType& type, std::string_view ns, std::string_view name,
                       std::string_view subresource) {
  std::string path = collectionPath(type, ns) + "/" + percentEncode(name);
  if (!subresource.empty()) path += "/" + percentEncode(subresource);
  return path;
}

QueryParams& QueryParams::add(std::string name, std::string value) {
  params_.emplace_back(std::move(name), std::move(value));
  return *this;
}

std::string QueryParams::encode() const {
  std::string out;
  for (const auto& [name, value] : params_) {
    if (!out.empty()) out += '&';
    out += percentEncode(name);
    out += '=';
    out += percentEncode(value);
  }
  return out;
}

std::string withQuery(std::string path, const QueryParams& query) {
  if (query.empty()) return path;
  return path + "?" + query.encode();
}

std::string_view patchContentType(PatchType type) {
  switch (type) {
    case PatchType::kMerge:
      return "application/merge-patch+json";
    case PatchType::kJson:
      return "application/json-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
    case PatchType::kApply:
      return "application/apply-patch+yaml";
  }
  return "application/merge-patch+json";
}

std::string_view propagationPolicyName(PropagationPolicy policy) {
  switch (policy) {
    case PropagationPolicy::kOrphan:
      return "Orphan";
    case PropagationPolicy::kBackground:
      return "Background";
    case PropagationPolicy::kForeground:
      return "Foreground";
  }
  return "Background";
}

QueryParams listQuery(const ListOptions& options) {
  QueryParams q;
  if (!options.label_selector.empty()) q.add("labelSelector", options.label_selector);
  if (!options.field_selector.empty()) q.add("fieldSelector", options.field_selector);
  if (options.limit > 0) q.add("limit", std::to_string(options.limit));
  if (!options.continue_token.empty()) q.add("continue", options.continue_token);
  if (!options.resource_version.empty()) q.add("resourceVersion", options.resource_version);
  switch (options.resource_version_match) {
    case ResourceVersionMatch::kUnset:
      break;
    case ResourceVersionMatch::kNotOlderThan:
      q.add("resourceVersionMatch", "NotOlderThan");
      break;
    case ResourceVersionMatch::kExact:
      q.add("resourceVersionMatch", "Exact");
      break;
  }
  if (options.timeout_seconds) q.add("timeoutSeconds", std::to_string(*options.timeout_seconds));
  return q;
}

QueryParams watchQuery(const WatchOptions& options) {
  QueryParams q;
  q.add("watch", "1");
  if (!options.label_selector.empty()) q.add("labelSelector", options.label_selector);
  if (!options.field_selector.empty()) q.add("fieldSelector", options.field_selector);
  if (!options.resource_version.empty()) q.add("resourceVersion", options.resource_version);
  if (options.allow_watch_bookmarks) q.add("allowWatchBookmarks", "true");
  if (options.timeout_seconds) q.add("timeoutSeconds", std::to_string(*options.timeout_seconds));
  return q;
}

QueryParams writeQuery(const WriteOptions& options) {
  QueryParams q;
  if (options.dry_run) q.add("dryRun", "All");
  if (!options.field_manager.empty()) q.add("fieldManager", options.field_manager);
  return q;
}

QueryParams patchQuery(PatchType type, const PatchOptions& options) {
  QueryParams q;
  if (options.dry_run) q.add("dryRun", "All");
  if (!options.field_manager.empty()) q.add("fieldManager", options.field_manager);
  // The apiserver rejects `force` on anything but an apply patch.
  if (type == PatchType::kApply && options.force) q.add("force", *options.force ? "true" : "false");
  return q;
}

QueryParams deleteQuery(const DeleteOptions& options) {
  QueryParams q;
  if (options.dry_run) q.add("dryRun", "All");
  if (options.grace_period_seconds) {
    q.add("gracePeriodSeconds", std::to_string(*options.grace_period_seconds));
  }
  if (options.propagation_policy) {
    q.add("propagationPolicy", std::string(propagationPolicyName(*options.propagation_policy)));
  }
  return q;
}

std::string deleteOptionsBody(const DeleteOptions& options) {
  nlohmann::json body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (options.precondition_uid || options.precondition_resource_version) {
    auto& pre = body["preconditions"];
    if (options.precondition_uid) pre["uid"] = *options.precondition_uid;
    if (options.precondition_resource_version) {
      pre["resourceVersion"] = *options.precondition_resource_version;
    }
  }
  if (options.propagation_policy) {
    body["propagationPolicy"] = propagationPolicyName(*options.propagation_policy);
  }
  if (options.grace_period_seconds) body["gracePeriodSeconds"] = *options.grace_period_seconds;
  if (options.dry_run) body["dryRun"] = nlohmann::json::array({"All"});
  return body.dump();
}

}  // namespace rtable::op
