// CachedKubeClient: a KubeClient whose reads come from informers' caches and whose server-side
// applies that would change nothing are not sent (controller-runtime's cache-backed client, plus
// what an apply makes cheap to know). A reconciler that runs every few seconds for each of a
// thousand tables then asks the apiserver only for what changed.
//
// - get(type, key): from the Store of the informer registered for the type (serveFrom) once it has
//   synced and holds the key; otherwise from the server: an object the informer does not select
//   (a user's Secret without the operator's labels), one it has not seen yet, a namespace it does
//   not watch. The cache lags the server, as every informer-backed reconcile's does: a reconcile
//   may act on an older version, and the event of the newer one enqueues it again; writes that
//   must not act on a stale version carry a resourceVersion precondition (the finalizer patches).
// - patch(kApply): remembered per object as (SHA-256 of the applied configuration with its field
//   manager and force flag, the resourceVersion the server answered). The same configuration again
//   while the cache holds that very resourceVersion (nobody has changed the object since) is
//   answered with the cached object and not sent: the server would change nothing. A hand edit,
//   the controller manager writing a StatefulSet's status, any change moves the resourceVersion,
//   and the apply is sent. A type without a registered informer is always sent.
// - Everything else goes to the server unchanged; remove() forgets what was applied.
//
// Metrics (with a registry): rtable_operator_cache_reads_total{resource,source="cache"|"server"},
// rtable_operator_applies_total{resource,result="sent"|"unchanged"}.
//
// Thread safety: as KubeClient. The informers and the server client must outlive it.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "rtable/operator/informer.h"
#include "rtable/operator/kube_client.h"

namespace prometheus {
class Registry;
}

namespace rtable::op {

class CachedKubeClient : public KubeClient {
 public:
  explicit CachedKubeClient(KubeClient& server, prometheus::Registry* registry = nullptr);
  ~CachedKubeClient() override;

  // Before the client is used: reads (and applies) of the informer's type in its namespace are
  // answered from its store. One informer per type.
  void serveFrom(const Informer& informer);

  struct Counts {
    int64_t cache_reads = 0;
    int64_t server_reads = 0;
    int64_t applies_sent = 0;
    int64_t applies_unchanged = 0;
  };
  Counts counts() const;

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

 private:
  class Metrics;
  using Digest = std::array<unsigned char, 32>;
  struct Applied {
    Digest digest{};
    std::string resource_version;
  };
  // (groupResource, namespace, name)
  using AppliedKey = std::tuple<std::string, std::string, std::string>;

  // The synced informer serving `type` in `ns`, or null.
  const Informer* informerFor(const ResourceType& type, const std::string& ns) const;

  KubeClient& server_;
  std::vector<const Informer*> informers_;
  std::unique_ptr<Metrics> metrics_;
  std::atomic<int64_t> cache_reads_{0};
  std::atomic<int64_t> server_reads_{0};
  std::atomic<int64_t> applies_sent_{0};
  std::atomic<int64_t> applies_unchanged_{0};
  static constexpr std::size_t kMinPruneAt = 1024;
  mutable std::mutex mu_;
  std::map<AppliedKey, Applied> applied_;
  std::size_t prune_at_ = kMinPruneAt;  // applied_'s size at which gone objects are dropped
};

}  // namespace rtable::op
