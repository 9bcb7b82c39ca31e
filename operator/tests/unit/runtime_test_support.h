// Test support for the runtime's unit tests (informer, controller, leader election): a KubeClient
// that delegates to another and lets a test intervene, and a condition wait with a deadline.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "rtable/operator/kube_client.h"

namespace rtable::op::testing {

// Polls `predicate` every 2 ms until it holds or `timeout` (real time) passes.
template <class Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return predicate();
}

// Forwards every call to `inner`; `before` (if set) runs first and may answer instead with an
// error (a network partition, a gate that holds a request until the test lets it go).
class InterceptingKubeClient final : public KubeClient {
 public:
  enum class Call { kGet, kList, kCreate, kUpdate, kUpdateStatus, kPatch, kRemove, kWatch };
  using Hook = std::function<std::optional<KubeError>(Call call)>;

  explicit InterceptingKubeClient(KubeClient& inner) : inner_(inner) {}
  void setHook(Hook hook) { hook_ = std::move(hook); }  // before the client is in use
  // Sees the options of every list call (before the hook).
  void setListObserver(std::function<void(const ListOptions&)> observer) {
    list_observer_ = std::move(observer);
  }

  KubeResult<nlohmann::json> get(const ResourceType& t, const ObjectKey& k) override {
    if (auto e = intercept(Call::kGet)) return std::unexpected(*e);
    return inner_.get(t, k);
  }
  KubeResult<ObjectList> list(const ResourceType& t, std::string_view ns,
                              const ListOptions& o) override {
    if (list_observer_) list_observer_(o);
    if (auto e = intercept(Call::kList)) return std::unexpected(*e);
    return inner_.list(t, ns, o);
  }
  KubeResult<nlohmann::json> create(const ResourceType& t, const nlohmann::json& o,
                                    const WriteOptions& w) override {
    if (auto e = intercept(Call::kCreate)) return std::unexpected(*e);
    return inner_.create(t, o, w);
  }
  KubeResult<nlohmann::json> update(const ResourceType& t, const nlohmann::json& o,
                                    const WriteOptions& w) override {
    if (auto e = intercept(Call::kUpdate)) return std::unexpected(*e);
    return inner_.update(t, o, w);
  }
  KubeResult<nlohmann::json> updateStatus(const ResourceType& t, const nlohmann::json& o,
                                          const WriteOptions& w) override {
    if (auto e = intercept(Call::kUpdateStatus)) return std::unexpected(*e);
    return inner_.updateStatus(t, o, w);
  }
  KubeResult<nlohmann::json> patch(const ResourceType& t, const ObjectKey& k, PatchType p,
                                   const nlohmann::json& j, const PatchOptions& o) override {
    if (auto e = intercept(Call::kPatch)) return std::unexpected(*e);
    return inner_.patch(t, k, p, j, o);
  }
  KubeResult<DeleteResult> remove(const ResourceType& t, const ObjectKey& k,
                                  const DeleteOptions& o) override {
    if (auto e = intercept(Call::kRemove)) return std::unexpected(*e);
    return inner_.remove(t, k, o);
  }
  KubeResult<std::unique_ptr<Watch>> watch(const ResourceType& t, std::string_view ns,
                                           const WatchOptions& o, WatchEventHandler on_event,
                                           WatchEndHandler on_end) override {
    if (auto e = intercept(Call::kWatch)) return std::unexpected(*e);
    return inner_.watch(t, ns, o, std::move(on_event), std::move(on_end));
  }

 private:
  std::optional<KubeError> intercept(Call call) { return hook_ ? hook_(call) : std::nullopt; }

  KubeClient& inner_;
  Hook hook_;
  std::function<void(const ListOptions&)> list_observer_;
};

}  // namespace rtable::op::testing
