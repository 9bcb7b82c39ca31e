#include "rtable/operator/cached_kube_client.h"

#include <openssl/sha.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <algorithm>

namespace rtable::op {

class CachedKubeClient::Metrics {
 public:
  explicit Metrics(prometheus::Registry& registry)
      : reads_(prometheus::BuildCounter()
                   .Name("rtable_operator_cache_reads_total")
                   .Help("Reads of one object by the operator's reconcilers, by where they were "
                         "answered: its informers' cache, or the apiserver")
                   .Register(registry)),
        applies_(prometheus::BuildCounter()
                     .Name("rtable_operator_applies_total")
                     .Help("Server-side applies of the operator's objects: sent, or not sent "
                           "because the object is as the same configuration last left it")
                     .Register(registry)) {}
  void read(const ResourceType& type, bool cached) {
    reads_.Add({{"resource", type.groupResource()}, {"source", cached ? "cache" : "server"}})
        .Increment();
  }
  void apply(const ResourceType& type, bool sent) {
    applies_.Add({{"resource", type.groupResource()}, {"result", sent ? "sent" : "unchanged"}})
        .Increment();
  }

 private:
  prometheus::Family<prometheus::Counter>& reads_;
  prometheus::Family<prometheus::Counter>& applies_;
};

CachedKubeClient::CachedKubeClient(KubeClient& server, prometheus::Registry* registry)
    : server_(server),
      metrics_(registry != nullptr ? std::make_unique<Metrics>(*registry) : nullptr) {}

CachedKubeClient::~CachedKubeClient() = default;

void CachedKubeClient::serveFrom(const Informer& informer) {
  informers_.push_back(&informer);
}

CachedKubeClient::Counts CachedKubeClient::counts() const {
  return Counts{cache_reads_.load(), server_reads_.load(), applies_sent_.load(),
                applies_unchanged_.load()};
}

const Informer* CachedKubeClient::informerFor(const ResourceType& type,
                                              const std::string& ns) const {
  for (const Informer* informer : informers_) {
    if (informer->type() == type &&
        (informer->watchNamespace().empty() || informer->watchNamespace() == ns)) {
      return informer->hasSynced() ? informer : nullptr;
    }
  }
  return nullptr;
}

KubeResult<nlohmann::json> CachedKubeClient::get(const ResourceType& type, const ObjectKey& key) {
  if (const Informer* informer = informerFor(type, key.ns)) {
    if (ObjectPtr object = informer->store().get(key)) {
      ++cache_reads_;
      if (metrics_) metrics_->read(type, true);
      return *object;
    }
  }
  ++server_reads_;
  if (metrics_) metrics_->read(type, false);
  return server_.get(type, key);
}

KubeResult<nlohmann::json> CachedKubeClient::patch(const ResourceType& type, const ObjectKey& key,
                                                   PatchType patch_type,
                                                   const nlohmann::json& patch,
                                                   const PatchOptions& options) {
  const Informer* informer =
      patch_type == PatchType::kApply && !options.dry_run && options.subresource.empty()
          ? informerFor(type, key.ns)
          : nullptr;
  if (informer == nullptr) {
    if (patch_type == PatchType::kApply && metrics_) metrics_->apply(type, true);
    if (patch_type == PatchType::kApply) ++applies_sent_;
    return server_.patch(type, key, patch_type, patch, options);
  }
  // What the server would compare: the configuration, who applies it and whether it takes over
  // fields of other managers.
  std::string configuration = patch.dump();
  configuration += '\n';
  configuration += options.field_manager;
  configuration += options.force.value_or(false) ? "\nforce" : "\n";
  Digest digest{};
  SHA256(reinterpret_cast<const unsigned char*>(configuration.data()), configuration.size(),
         digest.data());
  const AppliedKey applied_key{type.groupResource(), key.ns, key.name};
  {
    std::lock_guard lock(mu_);
    auto it = applied_.find(applied_key);
    if (it != applied_.end() && it->second.digest == digest) {
      ObjectPtr cached = informer->store().get(key);
      if (cached && resourceVersionOf(*cached) == it->second.resource_version) {
        ++applies_unchanged_;
        if (metrics_) metrics_->apply(type, false);
        return *cached;
      }
    }
  }
  ++applies_sent_;
  if (metrics_) metrics_->apply(type, true);
  auto answer = server_.patch(type, key, patch_type, patch, options);
  std::lock_guard lock(mu_);
  if (!answer) {
    applied_.erase(applied_key);
    return answer;
  }
  applied_[applied_key] = Applied{digest, resourceVersionOf(*answer)};
  if (applied_.size() >= prune_at_) {
    // Objects deleted by others (a table's owned objects go with it through the garbage
    // collector, never through this client) leave their entries: drop those the caches no longer
    // hold, at sizes doubling each time, so the work is constant per apply.
    std::erase_if(applied_, [this](const auto& entry) {
      const auto& [resource, ns, name] = entry.first;
      for (const Informer* each : informers_) {
        if (each->type().groupResource() == resource && each->hasSynced() &&
            (each->watchNamespace().empty() || each->watchNamespace() == ns)) {
          return each->store().get({ns, name}) == nullptr;
        }
      }
      return false;
    });
    prune_at_ = std::max<std::size_t>(kMinPruneAt, 2 * applied_.size());
  }
  return answer;
}

KubeResult<DeleteResult> CachedKubeClient::remove(const ResourceType& type, const ObjectKey& key,
                                                  const DeleteOptions& options) {
  {
    std::lock_guard lock(mu_);
    applied_.erase(AppliedKey{type.groupResource(), key.ns, key.name});
  }
  return server_.remove(type, key, options);
}

KubeResult<ObjectList> CachedKubeClient::list(const ResourceType& type, std::string_view ns,
                                              const ListOptions& options) {
  return server_.list(type, ns, options);
}

KubeResult<nlohmann::json> CachedKubeClient::create(const ResourceType& type,
                                                    const nlohmann::json& object,
                                                    const WriteOptions& options) {
  return server_.create(type, object, options);
}

KubeResult<nlohmann::json> CachedKubeClient::update(const ResourceType& type,
                                                    const nlohmann::json& object,
                                                    const WriteOptions& options) {
  return server_.update(type, object, options);
}

KubeResult<nlohmann::json> CachedKubeClient::updateStatus(const ResourceType& type,
                                                          const nlohmann::json& object,
                                                          const WriteOptions& options) {
  return server_.updateStatus(type, object, options);
}

KubeResult<std::unique_ptr<Watch>> CachedKubeClient::watch(const ResourceType& type,
                                                           std::string_view ns,
                                                           const WatchOptions& options,
                                                           WatchEventHandler on_event,
                                                           WatchEndHandler on_end) {
  return server_.watch(type, ns, options, std::move(on_event), std::move(on_end));
}

}  // namespace rtable::op
