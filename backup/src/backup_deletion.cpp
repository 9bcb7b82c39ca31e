#include "rtable/backup/backup_deletion.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <set>

#include "destination_json.h"
#include "rtable/backup/backup_manifest.h"
#include "rtable/backup/backup_reader.h"
#include "rtable/replication_core/hash128.h"
#include "wall_clock.h"

namespace rtable::backup {
namespace {

using nlohmann::json;
using State = DeletionRequest::State;

constexpr std::string_view kDataPrefix = "data/";
constexpr std::string_view kManifestFile = "/manifest.json";

std::string_view stateName(State state) {
  switch (state) {
    case State::kPending:
      return "pending";
    case State::kDone:
      return "done";
    case State::kFailed:
      return "failed";
  }
  return "pending";
}

std::optional<State> stateNamed(std::string_view name) {
  for (State state : {State::kPending, State::kDone, State::kFailed}) {
    if (stateName(state) == name) return state;
  }
  return std::nullopt;
}

// The size in a data file's name, "data/3f/3f0a...-4096" (0 when it does not say).
uint64_t sizeInName(std::string_view name) {
  const auto dash = name.rfind('-');
  uint64_t size = 0;
  if (dash == std::string_view::npos) return 0;
  auto [end, error] = std::from_chars(name.data() + dash + 1, name.data() + name.size(), size);
  return error == std::errc() && end == name.data() + name.size() ? size : 0;
}

StorageError stopped() {
  return StorageError{StorageError::Kind::kUnavailable,
                      "stopped: the deletion lost its lock on the destination"};
}

std::string trimmedPrefix(std::string_view prefix) {
  while (prefix.starts_with('/')) prefix.remove_prefix(1);
  while (prefix.ends_with('/')) prefix.remove_suffix(1);
  return std::string(prefix);
}

// Whether a backup operation on `destination` may still write to it or reuse a file there: one
// with a live host, or one too young to tell (its initiator joins just after creating it).
core::KeeperResult<std::optional<std::string>> liveOperationOn(core::Keeper& keeper,
                                                               const std::string& backups_root,
                                                               const DestinationRef& destination,
                                                               int64_t now_ms,
                                                               const DeletionOptions& options) {
  auto children = keeper.children(backups_root);
  if (!children) return std::unexpected(children.error());
  for (const auto& name : children->names) {
    if (!name.starts_with(kOperationPrefix)) continue;
    auto node = keeper.get(backups_root + "/" + name);
    if (!node) {
      if (node.error().code == core::KeeperCode::kNoNode) continue;
      return std::unexpected(node.error());
    }
    auto operation = BackupOperation::parse(node->data);
    // An unreadable operation might be anywhere: taken as one on this destination.
    if (operation && !sameDestination(operation->destination, destination)) continue;
    BackupPaths paths{backups_root,
                      operation ? operation->uid : name.substr(kOperationPrefix.size())};
    auto stages = keeper.children(paths.stage());
    if (!stages && stages.error().code != core::KeeperCode::kNoNode) {
      return std::unexpected(stages.error());
    }
    if (stages) {
      for (const auto& stage : stages->names) {
        if (parseStageNodeName(stage).kind == StageNodeName::Kind::kAlive) {
          return std::optional<std::string>(fmt::format("backup {} runs on it", name));
        }
      }
    }
    if (now_ms - node->stat.ctime < options.dead_operation_age.count()) {
      return std::optional<std::string>(fmt::format("backup {} has just started", name));
    }
  }
  return std::optional<std::string>();
}

}  // namespace

std::string DeletionRequest::format() const {
  return json{{"backup", backup},
              {"destination", destinationToJson(destination)},
              {"tableRoots", table_roots},
              {"state", stateName(state)},
              {"message", message},
              {"deleter", deleter},
              {"filesRemoved", files_removed},
              {"bytesRemoved", bytes_removed},
              {"requestedMs", requested_ms},
              {"finishedMs", finished_ms}}
      .dump();
}

std::expected<DeletionRequest, std::string> DeletionRequest::parse(std::string_view text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return std::unexpected("not a JSON object");
  DeletionRequest request;
  for (auto [field, target, required] :
       {std::tuple{"backup", &request.backup, true}, std::tuple{"message", &request.message, false},
        std::tuple{"deleter", &request.deleter, false}}) {
    auto it = doc.find(field);
    if (it == doc.end() && !required) continue;
    if (it == doc.end() || !it->is_string() || (required && it->get<std::string>().empty())) {
      return std::unexpected(fmt::format("{}: a non-empty string is required", field));
    }
    *target = it->get<std::string>();
  }
  if (request.backup.find('/') != std::string::npos || request.backup == "." ||
      request.backup == "..") {
    return std::unexpected(fmt::format("backup: '{}' is not a plain name", request.backup));
  }
  auto destination = doc.find("destination");
  if (destination == doc.end()) return std::unexpected("destination: an object is required");
  auto parsed = destinationFromJson(*destination, "destination.");
  if (!parsed) return std::unexpected(parsed.error());
  request.destination = std::move(*parsed);
  auto roots = doc.find("tableRoots");
  if (roots == doc.end() || !roots->is_array() || roots->empty()) {
    return std::unexpected("tableRoots: at least one table root is required");
  }
  for (const auto& root : *roots) {
    if (!root.is_string() || !root.get<std::string>().starts_with('/')) {
      return std::unexpected(fmt::format("tableRoots: '{}' is not a ZooKeeper path", root.dump()));
    }
    request.table_roots.push_back(root.get<std::string>());
  }
  auto state = doc.find("state");
  if (state == doc.end() || !state->is_string() || !stateNamed(state->get<std::string>())) {
    return std::unexpected(fmt::format("state: '{}' is none of pending, done, failed",
                                       state == doc.end() ? "" : state->dump()));
  }
  request.state = *stateNamed(state->get<std::string>());
  for (auto [field, target] : {std::pair{"filesRemoved", &request.files_removed},
                               std::pair{"bytesRemoved", &request.bytes_removed}}) {
    auto it = doc.find(field);
    if (it == doc.end()) continue;
    if (!it->is_number_unsigned()) {
      return std::unexpected(fmt::format("{}: a number >= 0 is required", field));
    }
    *target = it->get<uint64_t>();
  }
  for (auto [field, target] : {std::pair{"requestedMs", &request.requested_ms},
                               std::pair{"finishedMs", &request.finished_ms}}) {
    auto it = doc.find(field);
    if (it == doc.end()) continue;
    if (!it->is_number_integer())
      return std::unexpected(fmt::format("{}: a number is required", field));
    *target = it->get<int64_t>();
  }
  return request;
}

std::string deletionsPath(std::string_view table_root) {
  return fmt::format("{}/backup_deletions", table_root);
}

std::string deletionRequestPath(std::string_view table_root, std::string_view uid) {
  return fmt::format("{}/{}", deletionsPath(table_root), uid);
}

std::string legacyDeletionRequestPath(std::string_view backups_root, std::string_view uid) {
  return fmt::format("{}/deletions/{}", backups_root, uid);
}

std::string destinationLocksPath(std::string_view backups_root) {
  return fmt::format("{}/destinations", backups_root);
}

bool sameDestination(const DestinationRef& a, const DestinationRef& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DestinationRef::Kind::kFilesystem) return a.path == b.path;
  // Claims of the same name in two namespaces count as one: a wait too many, never one too few.
  if (a.kind == DestinationRef::Kind::kVolume) {
    return a.claim_name == b.claim_name && a.path == b.path;
  }
  return a.endpoint == b.endpoint && a.bucket == b.bucket &&
         trimmedPrefix(a.prefix) == trimmedPrefix(b.prefix);
}

std::string destinationLockPath(std::string_view backups_root, const DestinationRef& destination) {
  std::string where;
  switch (destination.kind) {
    case DestinationRef::Kind::kFilesystem:
      where = fmt::format("filesystem\n{}", destination.path);
      break;
    case DestinationRef::Kind::kVolume:
      where = fmt::format("volume\n{}\n{}", destination.claim_name, destination.path);
      break;
    case DestinationRef::Kind::kS3:
      where = fmt::format("s3\n{}\n{}\n{}", destination.endpoint, destination.bucket,
                          trimmedPrefix(destination.prefix));
      break;
  }
  return fmt::format("{}/{}", destinationLocksPath(backups_root),
                     core::hash128(where).hex().substr(0, 16));
}

StorageResult<DeletionStats> deleteBackupData(BackupStorage& storage, const std::string& name,
                                              const std::function<bool()>& keep_going) {
  auto may = [&] { return !keep_going || keep_going(); };
  DeletionStats stats;
  // The manifest first: from here on this is not a backup, whatever else is left.
  const std::string manifest = manifestName(name);
  auto size = storage.size(manifest);
  if (!size) return std::unexpected(size.error());
  if (*size) {
    if (!may()) return std::unexpected(stopped());
    if (auto removed = storage.remove(manifest); !removed) return std::unexpected(removed.error());
    stats.manifest_removed = true;
  }
  const std::string own_prefix = fmt::format("{}{}/", kManifestsPrefix, name);
  auto own = storage.list(own_prefix);
  if (!own) return std::unexpected(own.error());
  for (const auto& object : *own) {
    if (!may()) return std::unexpected(stopped());
    if (auto removed = storage.remove(object); !removed) return std::unexpected(removed.error());
  }

  // What the remaining backups refer to.
  std::set<std::string> referenced;
  auto listed = storage.list(std::string(kManifestsPrefix));
  if (!listed) return std::unexpected(listed.error());
  for (const auto& object : *listed) {
    if (!object.ends_with(kManifestFile)) continue;
    const std::string other = object.substr(
        kManifestsPrefix.size(), object.size() - kManifestsPrefix.size() - kManifestFile.size());
    auto read = readManifest(storage, other);
    if (!read && read.error().kind == StorageError::Kind::kNotFound) continue;  // removed meanwhile
    if (!read) {
      return std::unexpected(StorageError{
          read.error().kind == StorageError::Kind::kUnavailable ? StorageError::Kind::kUnavailable
                                                                : StorageError::Kind::kCorrupt,
          fmt::format("the manifest of backup {} cannot be read, so no data file can be called "
                      "unused: {}",
                      other, read.error().message)});
    }
    for (auto& file : read->dataFiles()) referenced.insert(std::move(file));
  }
  auto data = storage.list(std::string(kDataPrefix));
  if (!data) return std::unexpected(data.error());
  for (const auto& object : *data) {
    if (referenced.contains(object)) {
      ++stats.files_kept;
      continue;
    }
    if (!may()) return std::unexpected(stopped());
    if (auto removed = storage.remove(object); !removed) return std::unexpected(removed.error());
    ++stats.files_removed;
    stats.bytes_removed += sizeInName(object);
  }
  return stats;
}

std::expected<std::size_t, std::string> deleteIfAsked(
    core::Keeper& keeper, const std::string& backups_root, const std::string& table_root,
    const std::string& host, const DestinationOpener& open, const DeletionOptions& options) {
  auto children = keeper.children(deletionsPath(table_root));
  if (!children) {
    if (children.error().code == core::KeeperCode::kNoNode) return 0;
    return std::unexpected("listing the deletion requests: " + children.error().toString());
  }
  return deleteRequested(keeper, std::move(children->names), backups_root, table_root, host, open,
                         options);
}

std::expected<std::size_t, std::string> deleteRequested(
    core::Keeper& keeper, std::vector<std::string> names, const std::string& backups_root,
    const std::string& table_root, const std::string& host, const DestinationOpener& open,
    const DeletionOptions& options) {
  std::sort(names.begin(), names.end());
  std::size_t finished = 0;
  for (const auto& name : names) {
    const std::string path = deletionRequestPath(table_root, name);
    auto node = keeper.get(path);
    if (!node) {
      if (node.error().code == core::KeeperCode::kNoNode) continue;
      return std::unexpected(fmt::format("reading {}: {}", path, node.error().toString()));
    }
    auto request = DeletionRequest::parse(node->data);
    if (!request) {
      spdlog::warn("backup deletion {}: unreadable ({}); skipped", path, request.error());
      continue;
    }
    if (request->state != State::kPending) continue;
    if (std::find(request->table_roots.begin(), request->table_roots.end(), table_root) ==
        request->table_roots.end()) {
      continue;
    }

    // The destination's lock, held to the end of this run (ephemeral: a deleter that dies frees
    // it, and the request stays pending for the next).
    const std::string lock = destinationLockPath(backups_root, request->destination);
    if (auto made = core::createAncestorsAndSelf(keeper, destinationLocksPath(backups_root));
        !made) {
      return std::unexpected("creating " + destinationLocksPath(backups_root) + ": " +
                             made.error().toString());
    }
    auto locked = keeper.create(lock, host, core::CreateMode::kEphemeral);
    if (!locked) {
      if (locked.error().code == core::KeeperCode::kNodeExists) continue;  // another deleter
      return std::unexpected(fmt::format("locking {}: {}", lock, locked.error().toString()));
    }
    auto release = [&] { (void)keeper.remove(lock); };
    // ZooKeeper's clock for the operations' age: the lock's own creation time.
    auto lock_stat = keeper.exists(lock);
    if (!lock_stat || !*lock_stat) {
      release();
      continue;
    }
    auto live =
        liveOperationOn(keeper, backups_root, request->destination, (*lock_stat)->ctime, options);
    if (!live || *live) {
      if (live) {
        spdlog::info("backup deletion of {} waits: {}", request->backup, **live);
      }
      release();
      continue;
    }

    DeletionRequest result = *request;
    result.deleter = host;
    auto storage = open(request->destination);
    StorageResult<DeletionStats> stats =
        storage ? deleteBackupData(**storage, request->backup, [&] { return !keeper.expired(); })
                : StorageResult<DeletionStats>(std::unexpected(storage.error()));
    if (!stats && stats.error().kind == StorageError::Kind::kUnavailable) {
      spdlog::warn("backup deletion of {} in {}: {} (trying again)", request->backup,
                   request->destination.location(), stats.error().message);
      release();
      continue;
    }
    if (stats) {
      result.state = State::kDone;
      result.files_removed = stats->files_removed;
      result.bytes_removed = stats->bytes_removed;
      result.message = fmt::format(
          "{} backup {} from {}: {} data files ({} bytes) removed, {} kept for other backups",
          stats->manifest_removed ? "deleted" : "no manifest left of", request->backup,
          request->destination.location(), stats->files_removed, stats->bytes_removed,
          stats->files_kept);
    } else {
      result.state = State::kFailed;
      result.message =
          fmt::format("{} ({})", stats.error().message, storageErrorKindName(stats.error().kind));
    }
    result.finished_ms = wallClockMs();
    auto saved = keeper.set(path, result.format(), node->stat.version);
    release();
    if (!saved && saved.error().code != core::KeeperCode::kNoNode &&
        saved.error().code != core::KeeperCode::kBadVersion) {
      return std::unexpected(fmt::format("recording {}: {}", path, saved.error().toString()));
    }
    spdlog::info("backup deletion: {}", result.message);
    ++finished;
  }
  return finished;
}

}  // namespace rtable::backup
