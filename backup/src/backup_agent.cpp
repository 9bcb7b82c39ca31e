#include "rtable/backup/backup_agent.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "rtable/replication_core/table_swap.h"

namespace rtable::backup {

BackupAgent::BackupAgent(core::KeeperFactory factory, std::string backups_root,
                         std::string table_root, std::string host, BackupTableSource& source,
                         StorageFactory storage, BackupAgentOptions options)
    : factory_(std::move(factory)),
      backups_root_(std::move(backups_root)),
      table_root_(std::move(table_root)),
      host_(std::move(host)),
      source_(source),
      storage_(std::move(storage)),
      options_(options) {}

BackupAgent::~BackupAgent() {
  stop();
}

void BackupAgent::restoreInto(RestoreTarget& target, DestinationOpener open,
                              std::function<void(std::optional<std::string>)> refuse_inserts,
                              RestoreOptions options) {
  restore_target_ = &target;
  restore_open_ = std::move(open);
  refuse_inserts_ = std::move(refuse_inserts);
  restore_options_ = options;
}

core::WatchCallback BackupAgent::waker() {
  return [this](const core::WatchEvent&) {
    {
      std::lock_guard lock(mu_);
      wake_ = true;
    }
    cv_.notify_all();
  };
}

void BackupAgent::lookAtRestore() {
  // A restore that ended never starts again (a table is restored once, at its creation): its
  // refusal, or none, stands, and there is nothing more to look at.
  if (restore_ended_) return;
  // The watch wakes the loop when the request appears or changes (another replica's progress,
  // its end); the poll covers a lost watch.
  const std::string path = restoreRequestPath(table_root_);
  auto there = keeper_->exists(path, waker());
  if (!there) return;
  if (!*there) {
    refuse_inserts_(std::nullopt);
    return;
  }
  auto request = restoreIfAsked(*keeper_, table_root_, host_, *restore_target_, restore_open_,
                                restore_options_);
  if (!request) {
    // Passing (restoreIfAsked): the refusal stays as it was; the next look goes on.
    spdlog::warn("restore: {} (trying again)", request.error());
    return;
  }
  refuse_inserts_(restoreRefusal(*request));
  restore_ended_ = *request && ((*request)->state == RestoreRequest::State::kDone ||
                                (*request)->state == RestoreRequest::State::kFailed);
}

void BackupAgent::lookAtDeletions() {
  // A request appearing wakes the loop (the watch is set again at each look).
  const std::string path = deletionsPath(table_root_);
  auto watched = keeper_->children(path, waker());
  if (!watched) {
    if (watched.error().code == core::KeeperCode::kNoNode) (void)keeper_->exists(path, waker());
    return;
  }
  if (watched->names.empty()) return;
  const DestinationOpener open = [this](const DestinationRef& destination) {
    BackupOperation operation;
    operation.destination = destination;
    return storage_(operation);
  };
  // The requests as listed with the watch: one round trip per look, not two.
  auto finished = deleteRequested(*keeper_, std::move(watched->names), backups_root_, table_root_,
                                  host_, open, options_.deletion);
  if (!finished) spdlog::warn("backup deletion: {} (trying again)", finished.error());
}

void BackupAgent::start() {
  thread_ = std::thread([this] { loop(); });
}

void BackupAgent::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (running_) running_->stop();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::map<std::string, std::string> BackupAgent::outcomesForTest() const {
  std::lock_guard lock(mu_);
  return outcomes_;
}

void BackupAgent::loop() {
  for (;;) {
    lookAndRun();
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, options_.poll_period, [&] { return stopping_ || wake_; });
    if (stopping_) return;
    wake_ = false;
  }
}

void BackupAgent::lookAndRun() {
  if (!keeper_ || keeper_->expired()) {
    auto fresh = factory_();
    if (!fresh) return;  // ZooKeeper unreachable: the next period tries again
    keeper_ = std::shared_ptr<core::Keeper>(std::move(*fresh));
  }
  if (restore_target_) lookAtRestore();
  lookAtDeletions();
  // A new operation wakes the loop at once (the watch fires once; the next look sets it again).
  auto children = keeper_->children(backups_root_, waker());
  if (!children) {
    // No backup ever ran here: be told when the root appears.
    if (children.error().code == core::KeeperCode::kNoNode)
      (void)keeper_->exists(backups_root_, waker());
    return;
  }
  std::vector<std::string> names = children->names;
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    if (!name.starts_with(kOperationPrefix)) continue;
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      if (!seen_.insert(name).second) continue;
    }
    auto look_again = [&] {
      std::lock_guard lock(mu_);
      seen_.erase(name);
    };
    std::string path = backups_root_ + "/" + name;
    auto node = keeper_->get(path);
    if (!node) {
      // Gone, or not to be read by this table's identity (not its backup): passed over.
      const auto code = node.error().code;
      if (code != core::KeeperCode::kNoNode && code != core::KeeperCode::kNoAuth) look_again();
      continue;
    }
    auto operation = BackupOperation::parse(node->data);
    if (!operation) {
      spdlog::warn("backup operation {}: unreadable ({}); skipped", path, operation.error());
      continue;
    }
    const BackupTableRef* table = operation->tableOf(host_);
    if (!table || table->table_root != table_root_) continue;
    // Anyone reaching ZooKeeper could write an operation naming this table (and a destination to
    // send its data to). A real one comes with the table's backup lock naming it, made in the same
    // multi inside the table's tree, which only its identity writes (BackupInitiator::start). No
    // such lock: forged, or ended already.
    auto lock = keeper_->get(core::backupLockPath(table_root_));
    if (!lock && lock.error().code != core::KeeperCode::kNoNode) {
      look_again();
      continue;
    }
    if (!lock || lock->data != operation->uid) {
      spdlog::warn(
          "backup operation {} names this replica, but the table's backup lock names {}: not run "
          "(it ended, or was not made by the operator)",
          path, lock ? "'" + lock->data + "'" : std::string("no backup"));
      continue;
    }
    // Started before (this process restarted), finished, or failed already: not ours to run.
    BackupPaths paths{backups_root_, operation->uid};
    auto started = keeper_->exists(paths.started(host_));
    auto error = keeper_->exists(paths.error());
    if (!started || !error) {
      look_again();
      continue;
    }
    if (*started || *error) continue;
    runOperation(*operation);
  }
}

void BackupAgent::runOperation(const BackupOperation& operation) {
  BackupPaths paths{backups_root_, operation.uid};
  spdlog::info("backup {} ({}): joining as {}", operation.name, operation.uid, host_);
  auto storage = storage_(operation);
  if (!storage) {
    // Joined, so that the error is this host's, then failed at once.
    BackupStageSync sync(factory_, paths, operation.hosts(), host_, options_.host.sync);
    (void)sync.join();
    BackupError error{
        host_, "",
        fmt::format("opening the destination {} ({}): {}", operation.destination.location(),
                    storageErrorKindName(storage.error().kind), storage.error().message),
        std::string(storageErrorKindName(storage.error().kind))};
    sync.setError(error);
    std::lock_guard lock(mu_);
    outcomes_[operation.uid] = error.toString();
    spdlog::error("backup {} ({}): {}", operation.name, operation.uid, error.toString());
    return;
  }
  BackupHost runner(paths, operation, host_, source_, **storage, factory_, options_.host);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    running_ = &runner;
  }
  auto result = runner.run();
  std::lock_guard lock(mu_);
  running_ = nullptr;
  if (result) {
    outcomes_[operation.uid] = "completed";
    spdlog::info(
        "backup {} ({}): completed here, {} files ({} bytes) written, {} ({} bytes) "
        "reused",
        operation.name, operation.uid, result->files_written, result->bytes_written,
        result->files_reused, result->bytes_reused);
  } else {
    outcomes_[operation.uid] = result.error().toString();
    spdlog::error("backup {} ({}): failed: {}", operation.name, operation.uid,
                  result.error().toString());
  }
}

}  // namespace rtable::backup
