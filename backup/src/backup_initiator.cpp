#include "rtable/backup/backup_initiator.h"

#include <fmt/format.h>

#include "rtable/backup/backup_deletion.h"
#include "rtable/replication_core/table_swap.h"

namespace rtable::backup {

using core::KeeperCode;

namespace {

// The stages a replica passes, in order, for "the last stage it reached".
int stageRank(std::string_view stage_name) {
  if (stage_name.starts_with(stage::kGatheringMetadata)) return 1;
  if (stage_name == stage::kExtractingData) return 2;
  if (stage_name == stage::kBuildingFileInfos) return 3;
  if (stage_name == stage::kWritingBackup) return 4;
  if (stage_name == stage::kCompleted) return 5;
  return 0;
}

}  // namespace

BackupInitiator::BackupInitiator(core::KeeperFactory factory, BackupPaths paths,
                                 BackupOperation operation, StageSyncOptions options)
    : factory_(factory),
      paths_(paths),
      operation_(std::move(operation)),
      options_(options),
      sync_(std::move(factory), std::move(paths), operation_.hosts(), "", options) {}

std::expected<void, StartRefusal> BackupInitiator::start() {
  auto failed = [](std::string message) {
    return std::unexpected(StartRefusal{StartRefusal::Kind::kFailed, std::move(message)});
  };
  for (int round = 0; round < 3; ++round) {
    auto outcome = sync_.withRetries(
        "", "starting the operation",
        [&](core::Keeper& keeper) -> core::KeeperResult<std::optional<StartRefusal>> {
          for (const auto& node :
               {paths_.root, paths_.aliveTracker(), destinationLocksPath(paths_.root)}) {
            if (auto made = core::createAncestorsAndSelf(keeper, node); !made) {
              return std::unexpected(made.error());
            }
          }
          std::vector<core::Op> ops;
          ops.push_back(core::op::Create{paths_.operation(), operation_.format(),
                                         core::CreateMode::kPersistent});
          for (const auto& child :
               {paths_.stage(), paths_.parts(), paths_.fileInfos(), paths_.writingFiles()}) {
            ops.push_back(core::op::Create{child, "", core::CreateMode::kPersistent});
          }
          // No deletion cleans the destination meanwhile (backup_deletion.h).
          const std::size_t destination_check = ops.size();
          ops.push_back(
              core::op::CheckNotExists{destinationLockPath(paths_.root, operation_.destination)});
          std::size_t first_table_op = ops.size();
          for (const auto& table : operation_.tables) {
            ops.push_back(core::op::CheckNotExists{core::swapPath(table.table_root)});
            ops.push_back(core::op::Create{core::backupLockPath(table.table_root), operation_.uid,
                                           core::CreateMode::kPersistent});
          }
          auto made = keeper.multi(ops);
          if (made) return std::optional<StartRefusal>{};
          const auto& error = made.error();
          if (error.code != KeeperCode::kNodeExists || !error.failed_op_index) {
            return std::unexpected(error);
          }
          std::size_t index = *error.failed_op_index;
          if (index == 0) {
            // Our operation exists: an earlier attempt's answer was lost.
            return std::optional<StartRefusal>{};
          }
          if (index == destination_check) {
            return std::optional<StartRefusal>{StartRefusal{
                StartRefusal::Kind::kBusy,
                fmt::format("the data of a deleted backup is being removed from {}; the backup "
                            "starts when that ends",
                            operation_.destination.location())}};
          }
          if (index < first_table_op) return std::unexpected(error);
          const BackupTableRef& table = operation_.tables[(index - first_table_op) / 2];
          if ((index - first_table_op) % 2 == 0) {
            return std::optional<StartRefusal>{StartRefusal{
                StartRefusal::Kind::kBusy,
                fmt::format("table {}: a table swap runs; the backup starts when it ends",
                            table.table)}};
          }
          // Another backup holds the table: refused, unless no host of it is alive any more.
          auto lock = keeper.get(core::backupLockPath(table.table_root));
          if (!lock) return std::unexpected(lock.error());
          BackupPaths other{paths_.root, lock->data};
          auto stages = keeper.children(other.stage());
          bool live = false;
          if (stages) {
            for (const auto& name : stages->names) {
              if (parseStageNodeName(name).kind == StageNodeName::Kind::kAlive) live = true;
            }
          } else if (stages.error().code != KeeperCode::kNoNode) {
            return std::unexpected(stages.error());
          }
          if (live) {
            return std::optional<StartRefusal>{StartRefusal{
                StartRefusal::Kind::kBusy,
                fmt::format("table {}: backup {} runs on it; one backup of a table at a time",
                            table.table, lock->data)}};
          }
          // A dead operation's lock: removed (only if unchanged), then the next round starts again.
          auto removed = keeper.remove(core::backupLockPath(table.table_root), lock->stat.version);
          if (!removed && removed.error().code != KeeperCode::kNoNode &&
              removed.error().code != KeeperCode::kBadVersion) {
            return std::unexpected(removed.error());
          }
          return std::optional<StartRefusal>{StartRefusal{StartRefusal::Kind::kFailed, "retry"}};
        });
    if (!outcome) return failed(outcome.error().message);
    if (*outcome && (*outcome)->message == "retry") continue;
    if (*outcome) return std::unexpected(**outcome);
    auto joined = sync_.join();
    if (!joined) return failed(joined.error().toString());
    return {};
  }
  return failed("the tables' backup locks kept changing");
}

BackupResult<void> BackupInitiator::resume() {
  auto exists = sync_.withRetries("", "reading the operation",
                                  [&](core::Keeper& keeper) -> core::KeeperResult<bool> {
                                    auto node = keeper.exists(paths_.operation());
                                    if (!node) return std::unexpected(node.error());
                                    return node->has_value();
                                  });
  if (!exists) return std::unexpected(exists.error());
  if (!*exists) return std::unexpected(BackupError{"", "", "the operation's nodes are gone"});
  // started| exists already: the alive node is what a new session must bring back.
  return sync_.withRetries("", "rejoining", [&](core::Keeper& keeper) -> core::KeeperStatus {
    auto made = keeper.multi({core::op::Create{paths_.alive(""), "", core::CreateMode::kEphemeral},
                              core::op::Set{paths_.aliveTracker(), "", -1}});
    if (!made && made.error().code != KeeperCode::kNodeExists) {
      return std::unexpected(made.error());
    }
    return {};
  });
}

BackupResult<BackupProgress> BackupInitiator::poll() {
  auto state = sync_.readState();
  if (!state) return std::unexpected(state.error());
  BackupProgress progress;
  auto hosts = operation_.hosts();
  std::map<std::string, int> reached_by_all;  // stage -> replicas that reached it
  for (const auto& host : hosts) {
    const auto& host_state = state->hosts[host];
    BackupProgress::Host& entry = progress.hosts[host];
    entry.alive = host_state.alive;
    int best = -1;
    for (const auto& [stage_name, result] : host_state.stages) {
      ++reached_by_all[stage_name];
      int rank = stageRank(stage_name);
      if (rank > best) {
        best = rank;
        entry.stage = stage_name;
      }
      if (stage_name == stage::kWritingBackup) entry.stats = HostStats::parse(result);
    }
    progress.totals.files_written += entry.stats.files_written;
    progress.totals.bytes_written += entry.stats.bytes_written;
    progress.totals.files_reused += entry.stats.files_reused;
    progress.totals.bytes_reused += entry.stats.bytes_reused;
  }
  if (state->error) {
    progress.phase = BackupProgress::Phase::kFailed;
    progress.error = state->error;
    return progress;
  }
  // The barrier: the initiator arrives at each stage once every replica has.
  const auto& mine = state->hosts[""].stages;
  for (const auto& [stage_name, count] : reached_by_all) {
    if (count != static_cast<int>(hosts.size()) || mine.contains(stage_name)) continue;
    std::string result =
        stage_name.starts_with(stage::kGatheringMetadata) ? std::string(stage::kConsistent) : "";
    if (auto set = sync_.setStage(stage_name, result); !set) return std::unexpected(set.error());
  }
  if (reached_by_all[std::string(stage::kCompleted)] == static_cast<int>(hosts.size())) {
    progress.phase = BackupProgress::Phase::kCompleted;
    // The manifest writer (the first host) reports the summary.
    progress.summary =
        BackupSummary::parse(state->hosts[hosts.front()].stages[std::string(stage::kCompleted)]);
    return progress;
  }
  // A replica gone for good: nobody else may be waiting to notice it (they may all be writing).
  auto now = std::chrono::steady_clock::now();
  for (const auto& host : hosts) {
    const auto& host_state = state->hosts[host];
    if (host_state.alive || host_state.finished) {
      missing_since_.erase(host);
      continue;
    }
    auto [since, _] = missing_since_.emplace(host, now);
    if (now - since->second >= options_.host_lost_timeout) {
      BackupError error{
          host, progress.hosts[host].stage,
          "the replica is gone: its alive node has been missing for " +
              std::to_string(
                  std::chrono::duration_cast<std::chrono::seconds>(now - since->second).count()) +
              " s (the process died or lost ZooKeeper)",
          "HostGone"};
      sync_.setError(error);
      progress.phase = BackupProgress::Phase::kFailed;
      progress.error = error;
      return progress;
    }
  }
  return progress;
}

void BackupInitiator::fail(const std::string& message) {
  sync_.setError(BackupError{"", "", message});
}

BackupResult<void> BackupInitiator::cleanUp() {
  return sync_.withRetries("", "cleaning up", [&](core::Keeper& keeper) -> core::KeeperStatus {
    for (const auto& table : operation_.tables) {
      auto lock = keeper.get(core::backupLockPath(table.table_root));
      if (lock && lock->data == operation_.uid) {
        auto removed = keeper.remove(core::backupLockPath(table.table_root), lock->stat.version);
        if (!removed && removed.error().code != KeeperCode::kNoNode &&
            removed.error().code != KeeperCode::kBadVersion) {
          return std::unexpected(removed.error());
        }
      } else if (!lock && lock.error().code != KeeperCode::kNoNode) {
        return std::unexpected(lock.error());
      }
    }
    return core::removeRecursive(keeper, paths_.operation());
  });
}

}  // namespace rtable::backup
