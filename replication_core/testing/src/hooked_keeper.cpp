#include "rtable/replication_core/testing/hooked_keeper.h"

namespace rtable::core::testing {
namespace {

std::string firstPath(const Op& op) {
  return std::visit([](const auto& o) { return o.path; }, op);
}

class HookedKeeper final : public Keeper {
 public:
  HookedKeeper(std::shared_ptr<Keeper> inner, std::shared_ptr<KeeperHooks> hooks)
      : inner_(std::move(inner)), hooks_(std::move(hooks)) {}

  KeeperResult<GetResult> get(const std::string& path, WatchCallback watch) override {
    return call({"get", path}, [&] { return inner_->get(path, std::move(watch)); });
  }
  std::vector<KeeperResult<GetResult>> getMany(const std::vector<std::string>& paths) override {
    const KeeperCall call{"get_many", paths.empty() ? "" : paths.front()};
    if (auto before = hooks_->before.get()) {
      if (auto error = before(call)) {
        return std::vector<KeeperResult<GetResult>>(paths.size(), std::unexpected(*error));
      }
    }
    auto results = inner_->getMany(paths);
    if (auto after = hooks_->after.get()) after(call);
    return results;
  }
  KeeperResult<std::optional<Stat>> exists(const std::string& path, WatchCallback watch) override {
    return call({"exists", path}, [&] { return inner_->exists(path, std::move(watch)); });
  }
  KeeperResult<ChildrenResult> children(const std::string& path, WatchCallback watch) override {
    return call({"children", path}, [&] { return inner_->children(path, std::move(watch)); });
  }
  KeeperResult<std::string> create(const std::string& path, const std::string& data,
                                   CreateMode mode) override {
    return call({"create", path}, [&] { return inner_->create(path, data, mode); });
  }
  KeeperResult<Stat> set(const std::string& path, const std::string& data,
                         int32_t version) override {
    return call({"set", path}, [&] { return inner_->set(path, data, version); });
  }
  KeeperStatus remove(const std::string& path, int32_t version) override {
    return call({"remove", path}, [&] { return inner_->remove(path, version); });
  }
  bool expired() const override { return inner_->expired(); }
  bool connected() const override { return !hooks_->disconnected && inner_->connected(); }
  int64_t sessionId() const override { return inner_->sessionId(); }
  KeeperResult<std::unique_ptr<Keeper>> startNewSession() const override {
    auto fresh = inner_->startNewSession();
    if (!fresh) return std::unexpected(fresh.error());
    return hookKeeper(std::shared_ptr<Keeper>(std::move(*fresh)), hooks_);
  }

 protected:
  KeeperResult<std::vector<OpResult>> multiImpl(const std::vector<Op>& ops) override {
    return call({"multi", ops.empty() ? "" : firstPath(ops.front()), &ops},
                [&] { return inner_->multi(ops); });
  }

 private:
  template <class Request>
  auto call(const KeeperCall& call, Request&& request) -> decltype(request()) {
    if (auto before = hooks_->before.get()) {
      if (auto error = before(call)) return std::unexpected(*error);
    }
    auto result = request();
    if (auto after = hooks_->after.get()) after(call);
    return result;
  }

  std::shared_ptr<Keeper> inner_;
  std::shared_ptr<KeeperHooks> hooks_;
};

}  // namespace

std::unique_ptr<Keeper> hookKeeper(std::shared_ptr<Keeper> session,
                                   std::shared_ptr<KeeperHooks> hooks) {
  return std::make_unique<HookedKeeper>(std::move(session), std::move(hooks));
}

}  // namespace rtable::core::testing
