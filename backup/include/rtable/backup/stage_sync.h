// The stage barrier of one backup operation in ZooKeeper (seed 001's BackupCoordinationStageSync),
// for one host (a replica) or for the initiator (the operator, host name "").
//
// join() claims the host's place in one multi: started|<host>, the ephemeral alive|<host>, and a
// bump of alive_tracker's version. setStage() publishes current|<host>|<stage> with the host's
// result as its value (kNodeExists is success: an earlier attempt's answer was lost).
// waitForStage() polls until every host and the initiator reached the stage and returns their
// results; it stops with an error when the error node is set, when a host finished without reaching
// the stage, or when a host's alive node stays missing past its timeout (the host died: its session
// ended). Polling, not watches, as in ClickHouse: simple, and it survives any session trouble.
//
// Only connection-level ZooKeeper errors are retried, with doubling backoff; after a session
// expiry a new session is made and the alive node recreated (with the alive_tracker bump) before
// anything else. Every other answer fails the operation with its reason.
//
// Thread safety: one thread drives a BackupStageSync; stop() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "rtable/backup/backup_operation.h"
#include "rtable/common/clock.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/keeper_retry.h"
#include "rtable/replication_core/keeper_session.h"

namespace rtable::backup {

// Why an operation failed: the host it is about ("" for the initiator), the stage, the reason.
struct BackupError {
  std::string host;
  std::string stage;
  std::string message;
  // For a condition's reason: HostGone, Timeout, Stopped, ZooKeeper, InconsistentMetadata, a
  // StorageError kind (AccessDenied, NoBucket, NoSpace, ...), or Failed.
  std::string reason = "Failed";

  // "host events-1, stage 'writing backup': ..."
  std::string toString() const;
  // The error node's value (JSON) and back; a value that is not one becomes the message.
  std::string format() const;
  static BackupError parse(std::string_view text);
  friend bool operator==(const BackupError&, const BackupError&) = default;
};

template <class T>
using BackupResult = std::expected<T, BackupError>;

struct StageSyncOptions {
  // A waiting host looks at the stage nodes when they change (a watch on the stage folder) and at
  // least this often (a lost watch, a missed session event). Seed 001 polls only, every
  // backups.sync_period_ms = 5 s; with five barriers a poll costs half a period each.
  std::chrono::milliseconds sync_period{500};
  // How long a replica's alive node may be missing before it counts as dead: longer than a
  // reconnect (which recreates it), much shorter than a backup.
  std::chrono::milliseconds host_lost_timeout{10000};
  // The same for the initiator: the operator's leader election hands over in about 15 s.
  std::chrono::milliseconds initiator_lost_timeout{120000};
  // The longest wait at one barrier.
  std::chrono::milliseconds stage_timeout{std::chrono::hours(6)};
  // backup_restore_keeper_max_retries is 1000, initial backoff 100 ms, at most 5 s (seed 001).
  core::RetryPolicy retry{std::chrono::milliseconds(100), std::chrono::milliseconds(5000), 1000};
};

class BackupStageSync {
 public:
  // `hosts`: every replica taking part (the initiator "" is added); `current_host` is one of them
  // or "". `clock` must outlive this.
  BackupStageSync(core::KeeperFactory factory, BackupPaths paths, std::vector<std::string> hosts,
                  std::string current_host, StageSyncOptions options = {},
                  const common::Clock& clock = common::SteadyClock::instance());
  ~BackupStageSync();

  const std::string& host() const { return current_host_; }
  const std::vector<std::string>& hosts() const { return hosts_; }  // the initiator last

  // Claims this host's place. A started|<host> node that exists already means this host started
  // the operation before (and lost what it knew): an error, not a second start.
  BackupResult<void> join();
  BackupResult<void> setStage(std::string_view stage, std::string_view result = "");
  // Every host's result of `stage` (the initiator's under "").
  BackupResult<std::map<std::string, std::string>> waitForStage(std::string_view stage);
  // Sets the error node (the first error wins) so that every host stops; best effort.
  void setError(const BackupError& error);
  // finished|<host>, and the alive node goes.
  BackupResult<void> finish();
  // Wakes a waiting host up and makes every later call fail ("stopped").
  void stop();

  struct HostState {
    bool started = false;
    bool finished = false;
    bool alive = false;
    std::map<std::string, std::string> stages;  // stage -> result
  };
  struct State {
    std::map<std::string, HostState> hosts;  // every host named in the constructor, and ""
    std::optional<BackupError> error;
  };
  // One look at the stage nodes. It also arms (once at a time) a watch on the stage folder: its
  // next change wakes a waitForStage and calls the change listener.
  BackupResult<State> readState();
  // Called (on ZooKeeper's thread: keep it short) when the stage folder changed after a
  // readState, i.e. some host reached a stage, finished, or set the error. For an initiator that
  // is polled: the operator requeues the ClusterBackup instead of waiting for its next poll.
  void setChangeListener(std::function<void()> listener);

  // Runs `request` on the current session with this sync's retries (connection-level errors,
  // session renewal with the alive node recreated). For the host's own requests (parts, file
  // infos, writing_files). `what` names the request in an error.
  template <class Request>
  auto withRetries(std::string_view stage, std::string_view what, Request&& request)
      -> BackupResult<typename decltype(request(std::declval<core::Keeper&>()))::value_type>;

 private:
  BackupResult<std::shared_ptr<core::Keeper>> session(std::string_view stage);
  void dropSession(const std::shared_ptr<core::Keeper>& keeper);
  core::KeeperStatus createAliveNode(core::Keeper& keeper);
  bool sleepOrStop(std::chrono::milliseconds duration);
  // Waits until the stage folder changed since the last look, or `duration`; false once stopped.
  bool waitForChange(std::chrono::milliseconds duration);
  BackupError stoppedError(std::string_view stage) const;

  const core::KeeperFactory factory_;
  const BackupPaths paths_;
  std::vector<std::string> hosts_;
  const std::string current_host_;
  const StageSyncOptions options_;
  const common::Clock& clock_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stopped_{false};
  std::shared_ptr<core::Keeper> keeper_;  // guarded by mu_
  bool joined_ = false;                   // alive must be recreated after a session loss
  std::map<std::string, std::string> results_cache_;  // current| node name -> value (immutable)

  // Shared with the armed watch, which may fire after this object is gone.
  struct ChangeSignal {
    std::mutex mu;
    std::condition_variable cv;
    bool armed = false;    // a watch is set and has not fired
    bool changed = false;  // it fired since the last waitForChange
    bool stopped = false;
    std::function<void()> listener;
  };
  const std::shared_ptr<ChangeSignal> signal_ = std::make_shared<ChangeSignal>();
};

template <class Request>
auto BackupStageSync::withRetries(std::string_view stage, std::string_view what, Request&& request)
    -> BackupResult<typename decltype(request(std::declval<core::Keeper&>()))::value_type> {
  auto backoff = options_.retry.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    if (stopped_) return std::unexpected(stoppedError(stage));
    auto keeper = session(stage);
    if (!keeper) return std::unexpected(keeper.error());
    auto result = request(**keeper);
    if (result) {
      if constexpr (std::is_void_v<typename decltype(result)::value_type>) {
        return {};
      } else {
        return std::move(*result);
      }
    }
    if (!result.error().isConnectionLevel() || attempt >= options_.retry.max_attempts) {
      return std::unexpected(BackupError{current_host_, std::string(stage),
                                         std::string(what) + ": " + result.error().toString(),
                                         "ZooKeeper"});
    }
    if ((*keeper)->expired() || result.error().code == core::KeeperCode::kSessionExpired) {
      dropSession(*keeper);
    }
    if (!sleepOrStop(backoff)) return std::unexpected(stoppedError(stage));
    backoff = std::min(backoff * 2, options_.retry.max_backoff);
  }
}

}  // namespace rtable::backup
