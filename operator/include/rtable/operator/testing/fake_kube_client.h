// FakeKubeClient: an in-memory apiserver behind the KubeClient interface, for unit tests of
// informers and reconcilers.
//
// Honours what the apiserver guarantees: one global resourceVersion stamped on every write (and
// on nothing else: a no-op update writes nothing); uid, creationTimestamp, generation (bumped on
// changes outside metadata and status, and when deletion starts); kConflict on a stale
// resourceVersion or failed precondition; the status subresource (update ignores status,
// updateStatus ignores everything else); finalizers (delete sets deletionTimestamp, removing the
// last finalizer deletes, no new finalizers once deleting); namespaces must exist (default,
// kube-system, kube-public and kube-node-lease do); lists are consistent snapshots sorted by
// namespace/name with limit/continue and label/field selectors; watches replay history from a
// resourceVersion, send synthetic ADDED for "" and "0", turn selector transitions into ADDED and
// DELETED, and get a 410 Expired ERROR event for a compacted resourceVersion.
//
// Not modelled (say so in a test that needs it): metadata.generation is set on every type (the
// apiserver leaves it out on e.g. ConfigMap); garbage collection of ownerReferences and
// namespace deletion cascades (those are kube-controller-manager's), admission, defaulting and
// schema validation, strategic merge patch (kBadRequest), field ownership of server-side apply
// (applied as a JSON merge patch, creating the object when absent), periodic bookmarks (send one
// with bookmarkForTest()).
//
// Thread safety: all methods may be called from any thread, including from watch handlers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "rtable/operator/kube_client.h"

namespace rtable::op::testing {

enum class Verb { kGet, kList, kCreate, kUpdate, kUpdateStatus, kPatch, kDelete, kWatch };
std::string_view verbName(Verb verb);

// One request as the fake saw it.
struct Action {
  Verb verb;
  std::string resource;  // ResourceType::groupResource()
  ObjectKey key;         // the name is empty for list and watch
  std::string subresource;
};

class FakeKubeClient final : public KubeClient {
 public:
  FakeKubeClient();
  ~FakeKubeClient() override;

  KubeResult<nlohmann::json> get(const ResourceType& type, const ObjectKey& key) override;
  KubeResult<ObjectList> list(const ResourceType& type, std::string_view ns,
                              const ListOptions& options = {}) override;
  KubeResult<nlohmann::json> create(const ResourceType& type, const nlohmann::json& object,
                                    const WriteOptions& options = {}) override;
  KubeResult<nlohmann::json> update(const ResourceType& type, const nlohmann::json& object,
                                    const WriteOptions& options = {}) override;
  KubeResult<nlohmann::json> updateStatus(const ResourceType& type, const nlohmann::json& object,
                                          const WriteOptions& options = {}) override;
  KubeResult<nlohmann::json> patch(const ResourceType& type, const ObjectKey& key,
                                   PatchType patch_type, const nlohmann::json& patch,
                                   const PatchOptions& options = {}) override;
  KubeResult<DeleteResult> remove(const ResourceType& type, const ObjectKey& key,
                                  const DeleteOptions& options = {}) override;
  KubeResult<std::unique_ptr<Watch>> watch(const ResourceType& type, std::string_view ns,
                                           const WatchOptions& options, WatchEventHandler on_event,
                                           WatchEndHandler on_end) override;

  // --- test hooks ---

  enum class FaultTiming {
    kBeforeApply,  // the request is not applied (a refused connection, a 5xx)
    kAfterApply,   // applied, but the caller sees the error (a lost answer)
  };
  // The next `count` requests of `verb` fail with `error`.
  void failNextForTest(Verb verb, KubeError error, int count = 1,
                       FaultTiming timing = FaultTiming::kBeforeApply);
  // Forgets history up to and including `resource_version`: watches and exact lists from an
  // older version get 410 Expired. `0` compacts everything written so far.
  void compactForTest(int64_t resource_version = 0);
  // Sends a BOOKMARK with the current resourceVersion to every watch that allows bookmarks.
  void bookmarkForTest();
  // Ends every running watch as the server would at its timeout (WatchEndReason::kServerClosed).
  void closeWatchesForTest();
  int64_t currentResourceVersionForTest() const;
  std::vector<Action> actionsForTest() const;
  void clearActionsForTest();
  std::size_t activeWatchesForTest() const;

  class WatchImpl;
  struct State;  // opaque: the objects, their history and the running watches

 private:
  std::shared_ptr<State> state_;
};

}  // namespace rtable::op::testing
