// A Keeper that lets a test step into a replica's ZooKeeper requests: before a request (to fail
// it, as a lost connection would, without sending it) and after it (to make something happen
// between two of the replica's requests, deterministically). Around a shared session, so that the
// session can outlive the replica that used it (as a killed process's session does).
//
// Thread safety: as the wrapped Keeper; the hooks run on the calling thread.
#pragma once

#include <functional>
#include <memory>
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

struct KeeperHooks {
  // An error: the request is not sent and fails with it.
  std::function<std::optional<KeeperError>(const KeeperCall&)> before;
  // After the request returned (whatever it returned).
  std::function<void(const KeeperCall&)> after;
};

std::unique_ptr<Keeper> hookKeeper(std::shared_ptr<Keeper> session,
                                   std::shared_ptr<KeeperHooks> hooks);

}  // namespace rtable::core::testing
