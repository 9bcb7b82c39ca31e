#include "rtable/replication_core/keeper_session.h"

#include "rtable/replication_core/measured_keeper.h"

namespace rtable::core {

KeeperSession::KeeperSession(KeeperFactory factory, metrics::ReplicaMetrics& metrics)
    : factory_(std::move(factory)), metrics_(metrics) {}

KeeperResult<std::shared_ptr<Keeper>> KeeperSession::connect() {
  auto keeper = factory_();
  if (!keeper) return std::unexpected(keeper.error());
  return std::shared_ptr<Keeper>(measureKeeper(std::move(*keeper), metrics_));
}

void KeeperSession::install(std::shared_ptr<Keeper> session,
                            std::function<KeeperStatus(Keeper&)> activate) {
  std::lock_guard lock(mu_);
  keeper_ = std::move(session);
  activate_ = std::move(activate);
  metrics_.replica_readonly.Set(0);
}

std::shared_ptr<Keeper> KeeperSession::current() {
  std::lock_guard lock(mu_);
  if (closed_ || !keeper_) return nullptr;
  if (!keeper_->expired()) {
    // Cut off from every server: read-only until the client finds one (requests would fail with
    // connection loss, and an insert caught by one has an unknown outcome; refused now, it has
    // none).
    const bool connected = keeper_->connected();
    metrics_.replica_readonly.Set(connected ? 0 : 1);
    return connected ? keeper_ : nullptr;
  }
  // One renewal at a time: callers wait for it rather than each opening a session.
  auto fresh = keeper_->startNewSession();
  if (!fresh) {
    metrics_.replica_readonly.Set(1);
    return nullptr;
  }
  std::shared_ptr<Keeper> renewed = std::move(*fresh);
  // The expired session's is_active went with it: the new one marks the replica live again.
  if (!activate_(*renewed)) {
    metrics_.replica_readonly.Set(1);
    return nullptr;
  }
  keeper_ = std::move(renewed);
  metrics_.replica_readonly.Set(0);
  return keeper_;
}

void KeeperSession::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  keeper_.reset();
}

}  // namespace rtable::core
