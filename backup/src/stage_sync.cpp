#include "rtable/backup/stage_sync.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace rtable::backup {

using core::KeeperCode;

std::string BackupError::toString() const {
  std::string who = host.empty() ? "the initiator" : fmt::format("host {}", host);
  if (stage.empty()) return fmt::format("{}: {}", who, message);
  return fmt::format("{}, stage '{}': {}", who, stage, message);
}

std::string BackupError::format() const {
  return nlohmann::json{{"host", host}, {"stage", stage}, {"message", message}, {"reason", reason}}
      .dump();
}

BackupError BackupError::parse(std::string_view text) {
  auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  BackupError error;
  if (!doc.is_object()) {
    error.message = std::string(text);
    return error;
  }
  error.host = doc.value("host", "");
  error.stage = doc.value("stage", "");
  error.message = doc.value("message", std::string(text));
  error.reason = doc.value("reason", "Failed");
  return error;
}

BackupStageSync::BackupStageSync(core::KeeperFactory factory, BackupPaths paths,
                                 std::vector<std::string> hosts, std::string current_host,
                                 StageSyncOptions options, const common::Clock& clock)
    : factory_(std::move(factory)),
      paths_(std::move(paths)),
      hosts_(std::move(hosts)),
      current_host_(std::move(current_host)),
      options_(options),
      clock_(clock) {
  hosts_.push_back("");  // the initiator takes part in every barrier (seed 001)
}

BackupStageSync::~BackupStageSync() {
  stop();
}

void BackupStageSync::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard lock(signal_->mu);
    signal_->stopped = true;
  }
  signal_->cv.notify_all();
}

void BackupStageSync::setChangeListener(std::function<void()> listener) {
  std::lock_guard lock(signal_->mu);
  signal_->listener = std::move(listener);
}

bool BackupStageSync::waitForChange(std::chrono::milliseconds duration) {
  std::unique_lock lock(signal_->mu);
  auto deadline = clock_.now() + duration;
  while (!signal_->stopped && !signal_->changed && clock_.now() < deadline) {
    clock_.waitUntil(signal_->cv, lock, deadline);
  }
  signal_->changed = false;
  return !signal_->stopped;
}

BackupError BackupStageSync::stoppedError(std::string_view stage) const {
  return BackupError{current_host_, std::string(stage), "stopped (the process is shutting down)",
                     "Stopped"};
}

bool BackupStageSync::sleepOrStop(std::chrono::milliseconds duration) {
  std::unique_lock lock(mu_);
  auto deadline = clock_.now() + duration;
  while (!stopped_ && clock_.now() < deadline) clock_.waitUntil(cv_, lock, deadline);
  return !stopped_;
}

core::KeeperStatus BackupStageSync::createAliveNode(core::Keeper& keeper) {
  // The tracker's version moves whenever an alive node appears: a cheap "something changed" for
  // whoever checks that no other operation runs (seed 001).
  auto created =
      keeper.multi({core::op::Create{paths_.alive(current_host_), "", core::CreateMode::kEphemeral},
                    core::op::Set{paths_.aliveTracker(), "", -1}});
  if (!created && created.error().code == KeeperCode::kNodeExists) return {};
  if (!created) return std::unexpected(created.error());
  return {};
}

BackupResult<std::shared_ptr<core::Keeper>> BackupStageSync::session(std::string_view stage) {
  std::shared_ptr<core::Keeper> keeper;
  bool joined = false;
  {
    std::lock_guard lock(mu_);
    if (keeper_ && !keeper_->expired()) return keeper_;
    joined = joined_;
  }
  auto fresh = factory_();
  if (!fresh) {
    return std::unexpected(BackupError{current_host_, std::string(stage),
                                       "no ZooKeeper session: " + fresh.error().toString()});
  }
  keeper = std::shared_ptr<core::Keeper>(std::move(*fresh));
  {
    // The old session's watch went with it (or fires once more: one spare wake-up).
    std::lock_guard lock(signal_->mu);
    signal_->armed = false;
  }
  if (joined) {
    // A new session: the old one's alive node went with it.
    if (auto alive = createAliveNode(*keeper); !alive) {
      return std::unexpected(BackupError{current_host_, std::string(stage),
                                         "recreating the alive node: " + alive.error().toString()});
    }
  }
  std::lock_guard lock(mu_);
  keeper_ = keeper;
  return keeper;
}

void BackupStageSync::dropSession(const std::shared_ptr<core::Keeper>& keeper) {
  std::lock_guard lock(mu_);
  if (keeper_ == keeper) keeper_.reset();
}

BackupResult<void> BackupStageSync::join() {
  auto joined = withRetries("", "joining", [&](core::Keeper& keeper) -> core::KeeperStatus {
    auto claimed = keeper.multi(
        {core::op::Create{paths_.started(current_host_), "1", core::CreateMode::kPersistent},
         core::op::Create{paths_.alive(current_host_), "", core::CreateMode::kEphemeral},
         core::op::Set{paths_.aliveTracker(), "", -1}});
    if (claimed) return {};
    if (claimed.error().code == KeeperCode::kNodeExists && claimed.error().failed_op_index == 0) {
      // started| exists: ours from an attempt whose answer was lost, if our alive node is there.
      auto alive = keeper.exists(paths_.alive(current_host_));
      if (!alive) return std::unexpected(alive.error());
      if (*alive && (*alive)->ephemeral_owner == keeper.sessionId()) return {};
    }
    return std::unexpected(claimed.error());
  });
  if (!joined) {
    if (joined.error().message.find("node exists") != std::string::npos) {
      joined.error().message =
          fmt::format("this host joined the operation before and lost it (restarted?): {}",
                      joined.error().message);
    }
    return joined;
  }
  std::lock_guard lock(mu_);
  joined_ = true;
  return {};
}

BackupResult<void> BackupStageSync::setStage(std::string_view stage, std::string_view result) {
  return withRetries(
      stage, "publishing the stage", [&](core::Keeper& keeper) -> core::KeeperStatus {
        auto error = keeper.get(paths_.error());
        if (error) {
          // Someone failed: no point in going on (reported by the caller's next wait).
          return {};
        }
        if (error.error().code != KeeperCode::kNoNode) return std::unexpected(error.error());
        auto created = keeper.create(paths_.current(current_host_, stage), std::string(result),
                                     core::CreateMode::kPersistent);
        if (!created && created.error().code != KeeperCode::kNodeExists) {
          return std::unexpected(created.error());
        }
        return {};
      });
}

void BackupStageSync::setError(const BackupError& error) {
  // One attempt with retries of connection errors; the first error set is the one everyone sees.
  auto set = withRetries(error.stage, "setting the error", [&](core::Keeper& keeper) {
    auto created = keeper.create(paths_.error(), error.format(), core::CreateMode::kPersistent);
    if (!created && created.error().code == KeeperCode::kNodeExists) return core::KeeperStatus{};
    if (!created) return core::KeeperStatus(std::unexpected(created.error()));
    return core::KeeperStatus{};
  });
  (void)set;
}

BackupResult<void> BackupStageSync::finish() {
  auto finished = withRetries("", "finishing", [&](core::Keeper& keeper) -> core::KeeperStatus {
    auto created = keeper.create(paths_.finished(current_host_), "", core::CreateMode::kPersistent);
    // kNoNode: the initiator removed the operation already (it completed or failed).
    if (!created && created.error().code != KeeperCode::kNodeExists &&
        created.error().code != KeeperCode::kNoNode) {
      return std::unexpected(created.error());
    }
    auto removed = keeper.remove(paths_.alive(current_host_));
    if (!removed && removed.error().code != KeeperCode::kNoNode) {
      return std::unexpected(removed.error());
    }
    return {};
  });
  std::lock_guard lock(mu_);
  joined_ = false;
  return finished;
}

BackupResult<BackupStageSync::State> BackupStageSync::readState() {
  return withRetries(
      "", "reading the stage nodes", [&](core::Keeper& keeper) -> core::KeeperResult<State> {
        // One watch at a time: a host that waits hours in one stage would otherwise pile up a
        // watch per look, all firing at the next change. It fires once, also when the session
        // ends (then the next look arms one on the new session).
        core::WatchCallback watch;
        {
          std::lock_guard lock(signal_->mu);
          if (!signal_->armed) {
            signal_->armed = true;
            watch = [signal = signal_](const core::WatchEvent&) {
              std::function<void()> listener;
              {
                std::lock_guard lock(signal->mu);
                signal->armed = false;
                signal->changed = true;
                listener = signal->listener;
              }
              signal->cv.notify_all();
              if (listener) listener();
            };
          }
        }
        auto children = keeper.children(paths_.stage(), watch);
        if (!children && watch) {
          std::lock_guard lock(signal_->mu);
          signal_->armed = false;  // not set: a failed request sets no watch
        }
        if (!children) return std::unexpected(children.error());
        State state;
        for (const auto& host : hosts_) state.hosts[host];
        std::vector<std::string> to_read;
        std::vector<StageNodeName> to_read_names;
        for (const auto& name : children->names) {
          StageNodeName node = parseStageNodeName(name);
          auto host = state.hosts.find(node.host);
          if (node.kind == StageNodeName::Kind::kError) {
            auto value = keeper.get(paths_.error());
            if (value) state.error = BackupError::parse(value->data);
            continue;
          }
          if (host == state.hosts.end()) continue;  // not one of ours
          switch (node.kind) {
            case StageNodeName::Kind::kStarted:
              host->second.started = true;
              break;
            case StageNodeName::Kind::kFinished:
              host->second.finished = true;
              break;
            case StageNodeName::Kind::kAlive:
              host->second.alive = true;
              break;
            case StageNodeName::Kind::kCurrent: {
              std::lock_guard lock(mu_);
              auto cached = results_cache_.find(name);
              if (cached != results_cache_.end()) {
                host->second.stages[node.stage] = cached->second;
              } else {
                to_read.push_back(paths_.stage() + "/" + name);
                to_read_names.push_back(node);
              }
              break;
            }
            default:
              break;
          }
        }
        auto values = keeper.getMany(to_read);
        for (std::size_t i = 0; i < values.size(); ++i) {
          if (!values[i]) return std::unexpected(values[i].error());
          const auto& node = to_read_names[i];
          state.hosts[node.host].stages[node.stage] = values[i]->data;
          std::lock_guard lock(mu_);
          results_cache_[to_read[i].substr(paths_.stage().size() + 1)] = values[i]->data;
        }
        return state;
      });
}

BackupResult<std::map<std::string, std::string>> BackupStageSync::waitForStage(
    std::string_view stage) {
  auto started = clock_.now();
  std::map<std::string, common::Clock::TimePoint> missing_since;
  for (;;) {
    auto state = readState();
    if (!state) return std::unexpected(state.error());
    if (state->error) return std::unexpected(*state->error);
    std::map<std::string, std::string> results;
    std::optional<BackupError> failure;
    auto now = clock_.now();
    for (const auto& host : hosts_) {
      const HostState& host_state = state->hosts[host];
      auto reached = host_state.stages.find(std::string(stage));
      if (reached != host_state.stages.end()) {
        results[host] = reached->second;
        continue;
      }
      if (host_state.finished) {
        failure = BackupError{host, std::string(stage), "finished without coming to this stage",
                              "HostGone"};
        break;
      }
      if (host_state.alive) {
        missing_since.erase(host);
        continue;
      }
      auto [since, _] = missing_since.emplace(host, now);
      auto timeout = host.empty() ? options_.initiator_lost_timeout : options_.host_lost_timeout;
      if (now - since->second >= timeout) {
        failure = BackupError{
            host, std::string(stage),
            fmt::format(
                "{} is gone: its alive node has been missing for {} s (its ZooKeeper "
                "session ended: the process died or lost ZooKeeper)",
                host.empty() ? "the initiator (rtable-operator)" : "the replica",
                std::chrono::duration_cast<std::chrono::seconds>(now - since->second).count()),
            "HostGone"};
        break;
      }
    }
    if (failure) {
      setError(*failure);
      return std::unexpected(*failure);
    }
    if (results.size() == hosts_.size()) return results;
    if (now - started >= options_.stage_timeout) {
      BackupError timeout{
          current_host_, std::string(stage),
          fmt::format(
              "not every host reached this stage within {} s",
              std::chrono::duration_cast<std::chrono::seconds>(options_.stage_timeout).count()),
          "Timeout"};
      setError(timeout);
      return std::unexpected(timeout);
    }
    if (!waitForChange(options_.sync_period)) return std::unexpected(stoppedError(stage));
  }
}

}  // namespace rtable::backup
