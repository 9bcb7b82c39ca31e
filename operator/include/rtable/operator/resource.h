// Resource addressing: which REST collection an object lives in, the URL paths and the query
// parameters of the Kubernetes API.
//
// Plain data, no I/O. Paths and query strings come out percent-encoded, ready for the wire.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rtable::op {

// A REST mapping: group/version/resource plus the kind and scope a client needs to address it
// (what client-go gets from discovery; here the caller states it).
struct ResourceType {
  std::string group;     // "" for the core group ("/api/v1"), else "/apis/<group>/<version>"
  std::string version;   // "v1", "v1alpha1"
  std::string resource;  // plural, lower case: "pods", "replicatedtables"
  std::string kind;      // "Pod", "ReplicatedTable"
  bool namespaced = true;
  // Whether `/status` is a subresource: then updates ignore status and updateStatus ignores the
  // rest. False for ConfigMap, Secret, Lease, Event and CRDs without `subresources.status`.
  bool status_subresource = true;

  std::string apiVersion() const;  // "v1", "apps/v1"
  // "statefulsets.apps" or "pods": the form the apiserver uses in messages.
  std::string groupResource() const;

  friend bool operator==(const ResourceType&, const ResourceType&) = default;
};

// Types the operator creates or watches.
namespace resources {
ResourceType namespaces();
ResourceType pods();
ResourceType services();
ResourceType configMaps();
ResourceType secrets();
ResourceType events();  // core/v1 Events
ResourceType persistentVolumeClaims();
ResourceType statefulSets();
ResourceType podDisruptionBudgets();
ResourceType networkPolicies();
ResourceType leases();
ResourceType customResourceDefinitions();
}  // namespace resources

// Namespace and name of one object. `ns` is empty for cluster-scoped objects.
struct ObjectKey {
  std::string ns;
  std::string name;

  std::string toString() const;  // "ns/name", or "name" when cluster-scoped
  friend auto operator<=>(const ObjectKey&, const ObjectKey&) = default;
};

// "/api/v1/namespaces/ns/pods", "/apis/apps/v1/statefulsets" (empty ns of a namespaced type: all
// namespaces).
std::string collectionPath(const ResourceType& type, std::string_view ns);
// "/api/v1/namespaces/ns/pods/name[/subresource]".
std::string objectPath(const ResourceType& type, std::string_view ns, std::string_view name,
                       std::string_view subresource = {});

// Ordered query parameters; encode() gives "a=1&b=x%20y" (no leading '?').
class QueryParams {
 public:
  QueryParams& add(std::string name, std::string value);
  bool empty() const { return params_.empty(); }
  const std::vector<std::pair<std::string, std::string>>& params() const { return params_; }
  std::string encode() const;

 private:
  std::vector<std::pair<std::string, std::string>> params_;
};

// path + "?" + query, or just path when there is no query.
std::string withQuery(std::string path, const QueryParams& query);

enum class ResourceVersionMatch { kUnset, kNotOlderThan, kExact };

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  int64_t limit = 0;  // 0: no limit
  std::string continue_token;
  std::string resource_version;  // "": most recent (quorum read); "0": any
  ResourceVersionMatch resource_version_match = ResourceVersionMatch::kUnset;
  std::optional<int64_t> timeout_seconds;
};

struct WatchOptions {
  std::string label_selector;
  std::string field_selector;
  // Start after this resourceVersion. "" or "0": synthetic ADDED events for what exists first.
  std::string resource_version;
  bool allow_watch_bookmarks = true;
  // The server ends the stream after this long. Callers jitter it (client-go: 5-10 min) so
  // watches of many clients do not all restart at once.
  std::optional<int64_t> timeout_seconds;
};

// For create and update (PUT).
struct WriteOptions {
  std::string field_manager;
  bool dry_run = false;
};

enum class PatchType {
  kMerge,           // RFC 7386, application/merge-patch+json
  kJson,            // RFC 6902, application/json-patch+json
  kStrategicMerge,  // application/strategic-merge-patch+json (built-in types only)
  kApply,           // server-side apply, application/apply-patch+yaml (needs field_manager)
};

std::string_view patchContentType(PatchType type);

struct PatchOptions {
  std::string field_manager;  // required for kApply
  std::optional<bool> force;  // kApply only: take over fields owned by other managers
  bool dry_run = false;
  std::string subresource;  // "" or "status"
};

enum class PropagationPolicy { kOrphan, kBackground, kForeground };
std::string_view propagationPolicyName(PropagationPolicy policy);

struct DeleteOptions {
  std::optional<std::string> precondition_uid;
  std::optional<std::string> precondition_resource_version;
  std::optional<PropagationPolicy> propagation_policy;
  std::optional<int64_t> grace_period_seconds;
  bool dry_run = false;
};

QueryParams listQuery(const ListOptions& options);
// watch=1 plus the selectors, resourceVersion, allowWatchBookmarks and timeoutSeconds.
QueryParams watchQuery(const WatchOptions& options);
QueryParams writeQuery(const WriteOptions& options);
QueryParams patchQuery(PatchType type, const PatchOptions& options);
// Only for a DELETE without a body: the apiserver reads DeleteOptions from the body when there is
// one and then ignores the query string, so HttpKubeClient always sends the body form below.
QueryParams deleteQuery(const DeleteOptions& options);
// A metav1.DeleteOptions body, serialized.
std::string deleteOptionsBody(const DeleteOptions& options);

}  // namespace rtable::op
