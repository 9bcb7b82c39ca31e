// A Keeper that lets a test step into a replica's ZooKeeper requests: before a request (to fail
// it, as a lost connection would, without sending it) and after it (to make something happen
// between two of the replica's requests, deterministically). Around a shared session, so that the
// session can outlive the replica that used it (as a killed process's session does).
//
// Thread safety: as the wrapped Keeper; the hooks run on the calling thread. A test may set or
// clear a hook while the replica's threads call through it (each call takes a copy).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rtable/replication_core/keeper.h"

namespace rtable::core::testing {

struct KeeperCall {
  std::string operation;  // get, exists, children, create, set, remove, get_many, multi
  std::string path;       // of the request (a multi's first op; get_many's first path)
  const std::vector<Op>* ops = nullptr;  // a multi's ops (CheckNotExists already expanded)
};

// A std::function a test assigns while other threads read it.
template <class Signature>
class SharedHook {
 public:
  SharedHook& operator=(std::function<Signature> hook) {
    std::lock_guard lock(mu_);
    hook_ = std::move(hook);
    return *this;
  }
  std::function<Signature> get() const {
    std::lock_guard lock(mu_);
    return hook_;
  }

 private:
  mutable std::mutex mu_;
  std::function<Signature> hook_;
};

struct KeeperHooks {
  // An error: the request is not sent and fails with it.
  SharedHook<std::optional<KeeperError>(const KeeperCall&)> before;
  // After the request returned (whatever it returned).
  SharedHook<void(const KeeperCall&)> after;
  // While set, the session says it lost its connection (Keeper::connected), as a client cut off
  // from every server does; requests still go through `before`.
  std::atomic<bool> disconnected{false};
};

std::unique_ptr<Keeper> hookKeeper(std::shared_ptr<Keeper> session,
                                   std::shared_ptr<KeeperHooks> hooks);

}  // namespace rtable::core::testing
