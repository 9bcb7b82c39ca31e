// An in-memory ZooKeeper for unit tests, with ZooKeeper 3.8's semantics: versions, one zxid per
// transaction, atomic multi, ephemeral nodes tied to a session, one-shot watches, and a per-parent
// int32 sequential counter that is not lowered by deletes and stalls at 2147483647 (ZooKeeper
// >= 3.6 keeps the old value when the increment overflows). The Stat it reports encodes cversion as
// the real server does: counter * 2 - numChildren, in int32.
//
// The keeper conformance suite runs against this fake and the real server; where they differ, the
// fake is wrong.
//
// Thread safety: all methods may be called concurrently. Watch callbacks run synchronously on the
// thread whose request triggered them, after the server's lock is released.
#pragma once

#include <memory>
#include <string>

#include "rtable/replication_core/keeper.h"

namespace rtable::core::testing {

class FakeKeeperServer : public std::enable_shared_from_this<FakeKeeperServer> {
 public:
  static std::shared_ptr<FakeKeeperServer> create();
  virtual ~FakeKeeperServer() = default;

  // A new session. Destroying the returned Keeper closes the session (its ephemerals go).
  virtual std::unique_ptr<Keeper> connect() = 0;
  // As if the server timed the session out: ephemerals removed, pending watches of the session get
  // a kSessionExpired event, every later request of it fails with kSessionExpired.
  virtual void expireSession(int64_t session_id) = 0;
  // Sets the parent's sequential counter, as the snapshot tool does on a stopped real server.
  virtual KeeperStatus setSequentialCounterForTest(const std::string& path, int32_t counter) = 0;
  // After `after` more requests, the next `count` fail with kConnectionLoss and are not applied.
  virtual void failNextRequestsForTest(int count, int after = 0) = 0;
  // After `after` more multis, the next `count` are applied, then answer kConnectionLoss: the
  // connection dropped after the server committed them, before the client saw the reply.
  virtual void loseNextMultiAnswersForTest(int count, int after = 0) = 0;
  // From now on ctime/mtime of new writes are `ms` (ms since the epoch) instead of the wall clock.
  virtual void setTimeForTest(int64_t ms) = 0;
  // Requests that reached the tree (a multi counts once), to check round trips.
  virtual int64_t requestCountForTest() const = 0;
};

}  // namespace rtable::core::testing
