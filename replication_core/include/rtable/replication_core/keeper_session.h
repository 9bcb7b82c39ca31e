// A replica's ZooKeeper session: one at a time, replaced after it expires. A new session is made
// live (`activate`: is_active, host, is_lost) before anyone gets it; until that succeeds the
// replica has none and is read-only (rtable_replica_readonly).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/keeper.h"

namespace rtable::core {

using KeeperFactory = std::function<KeeperResult<std::unique_ptr<Keeper>>()>;

class KeeperSession {
 public:
  // Sessions come from `factory`, timed into `metrics` (which must outlive this).
  KeeperSession(KeeperFactory factory, metrics::ReplicaMetrics& metrics);

  // The first session, not yet made live (start-up activates it itself, then installs it).
  KeeperResult<std::shared_ptr<Keeper>> connect();
  // `session`, made live by the caller, is the current one; later ones are made live by
  // `activate` (run with no lock of the replica held).
  void install(std::shared_ptr<Keeper> session, std::function<KeeperStatus(Keeper&)> activate);

  // The current session, replaced (and made live) if it expired; nullptr if ZooKeeper cannot be
  // reached now (a new session cannot be made, or the live one has lost its connection and not
  // found a server again), or before install(). No request to ZooKeeper while the session lives, so
  // callers may ask often.
  std::shared_ptr<Keeper> current();
  // Closes the session (its ephemeral nodes go); current() answers nullptr from now on.
  void close();

 private:
  const KeeperFactory factory_;
  metrics::ReplicaMetrics& metrics_;
  std::mutex mu_;
  std::shared_ptr<Keeper> keeper_;
  std::function<KeeperStatus(Keeper&)> activate_;
  bool closed_ = false;
};

}  // namespace rtable::core
