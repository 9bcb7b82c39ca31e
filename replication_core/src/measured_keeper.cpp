#include "rtable/replication_core/measured_keeper.h"

#include <chrono>

namespace rtable::core {
namespace {

class MeasuredKeeper final : public Keeper {
 public:
  MeasuredKeeper(std::unique_ptr<Keeper> inner, metrics::ReplicaMetrics& metrics)
      : inner_(std::move(inner)), metrics_(metrics) {}

  KeeperResult<GetResult> get(const std::string& path, WatchCallback watch) override {
    return measure("get", [&] { return inner_->get(path, std::move(watch)); });
  }
  std::vector<KeeperResult<GetResult>> getMany(const std::vector<std::string>& paths) override {
    // One pipelined batch is one observation: its latency is what the caller waited.
    const auto start = std::chrono::steady_clock::now();
    auto results = inner_->getMany(paths);
    metrics_.zookeeperRequestDuration("get_many")
        .Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    for (const auto& result : results) {
      if (!result) {
        metrics_.zookeeperErrors("get_many", std::string(keeperCodeName(result.error().code)))
            .Increment();
      }
    }
    return results;
  }
  KeeperResult<std::optional<Stat>> exists(const std::string& path, WatchCallback watch) override {
    return measure("exists", [&] { return inner_->exists(path, std::move(watch)); });
  }
  KeeperResult<ChildrenResult> children(const std::string& path, WatchCallback watch) override {
    return measure("children", [&] { return inner_->children(path, std::move(watch)); });
  }
  KeeperResult<std::string> create(const std::string& path, const std::string& data,
                                   CreateMode mode) override {
    return measure("create", [&] { return inner_->create(path, data, mode); });
  }
  KeeperResult<Stat> set(const std::string& path, const std::string& data,
                         int32_t version) override {
    return measure("set", [&] { return inner_->set(path, data, version); });
  }
  KeeperStatus remove(const std::string& path, int32_t version) override {
    return measure("remove", [&] { return inner_->remove(path, version); });
  }
  bool expired() const override { return inner_->expired(); }
  bool connected() const override { return inner_->connected(); }
  int64_t sessionId() const override { return inner_->sessionId(); }
  KeeperResult<std::unique_ptr<Keeper>> startNewSession() const override {
    auto fresh = inner_->startNewSession();
    if (!fresh) return std::unexpected(fresh.error());
    return measureKeeper(std::move(*fresh), metrics_);
  }

 protected:
  KeeperResult<std::vector<OpResult>> multiImpl(const std::vector<Op>& ops) override {
    // `ops` are expanded already, so the inner multi maps them one to one.
    return measure("multi", [&] { return inner_->multi(ops); });
  }

 private:
  template <class Request>
  auto measure(const char* operation, Request&& request) -> decltype(request()) {
    const auto start = std::chrono::steady_clock::now();
    auto result = request();
    metrics_.zookeeperRequestDuration(operation).Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!result)
      metrics_.zookeeperErrors(operation, std::string(keeperCodeName(result.error().code)))
          .Increment();
    return result;
  }

  std::unique_ptr<Keeper> inner_;
  metrics::ReplicaMetrics& metrics_;
};

}  // namespace

std::unique_ptr<Keeper> measureKeeper(std::unique_ptr<Keeper> inner,
                                      metrics::ReplicaMetrics& metrics) {
  return std::make_unique<MeasuredKeeper>(std::move(inner), metrics);
}

}  // namespace rtable::core
