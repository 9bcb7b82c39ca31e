#include "rtable/backup/restore.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "destination_json.h"
#include "rtable/backup/backup_reader.h"
#include "wall_clock.h"

namespace rtable::backup {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using State = RestoreRequest::State;

std::optional<State> stateNamed(std::string_view name) {
  for (State state : {State::kPending, State::kRunning, State::kDone, State::kFailed}) {
    if (restoreStateName(state) == name) return state;
  }
  return std::nullopt;
}

// The request node, written only by the elected restorer (its version checked all the same).
class RequestNode {
 public:
  RequestNode(core::Keeper& keeper, std::string path, RestoreRequest request, int32_t version)
      : keeper_(keeper), path_(std::move(path)), request_(std::move(request)), version_(version) {}

  RestoreRequest& request() { return request_; }

  std::expected<void, std::string> save() {
    auto set = keeper_.set(path_, request_.format(), version_);
    if (!set) return std::unexpected("recording the restore's progress: " + set.error().toString());
    version_ = set->version;
    return {};
  }

  // Fails the request for good, with `reason`; the request as it then stands.
  std::expected<std::optional<RestoreRequest>, std::string> fail(const std::string& reason) {
    spdlog::error("restore of backup {}: {}", request_.backup, reason);
    request_.state = State::kFailed;
    request_.message = reason;
    request_.finished_ms = wallClockMs();
    if (auto saved = save(); !saved) return std::unexpected(saved.error());
    return request_;
  }

 private:
  core::Keeper& keeper_;
  const std::string path_;
  RestoreRequest request_;
  int32_t version_;
};

// Removes the staged copies (the attached parts hold their own links).
void removeStaged(const std::vector<StagedPart>& staged) {
  for (const auto& part : staged) {
    std::error_code ec;
    fs::remove_all(part.dir, ec);
  }
}

std::expected<std::optional<RestoreRequest>, std::string> restore(RequestNode& node,
                                                                  const std::string& host,
                                                                  RestoreTarget& target,
                                                                  const DestinationOpener& open,
                                                                  const RestoreOptions& options) {
  RestoreRequest& request = node.request();
  auto storage = open(request.destination);
  if (!storage) {
    return node.fail(
        fmt::format("opening {}: {}", request.destination.location(), storage.error().message));
  }
  auto manifest = readManifest(**storage, request.backup);
  if (!manifest) {
    if (manifest.error().kind == StorageError::Kind::kNotFound) {
      return node.fail(fmt::format(
          "backup '{}' is not in {}: no {} (a backup without its manifest is not complete)",
          request.backup, request.destination.location(), manifestName(request.backup)));
    }
    return node.fail(fmt::format("reading the manifest of backup '{}': {}", request.backup,
                                 manifest.error().message));
  }
  // No table named: the backup's only one.
  const ManifestTable* table = request.table.empty() && manifest->tables.size() == 1
                                   ? &manifest->tables.front()
                                   : manifest->table(request.table);
  if (!table) {
    std::string names;
    for (const auto& one : manifest->tables) names += (names.empty() ? "" : ", ") + one.table;
    return node.fail(
        request.table.empty()
            ? fmt::format("backup '{}' holds several tables ({}): name one", request.backup, names)
            : fmt::format("backup '{}' has no table '{}' (it has: {})", request.backup,
                          request.table, names));
  }
  if (table->metadata != target.metadataText()) {
    return node.fail(fmt::format(
        "backup '{}' holds table '{}' with another schema: the backup's is\n{}this table's is\n{}",
        request.backup, table->table, table->metadata, target.metadataText()));
  }
  if (!target.catchUp(options.catch_up_timeout)) {
    return std::unexpected("this replica did not catch up with the table's log in time");
  }
  if (request.state == State::kPending) {
    // A table with parts of its own would end up with both: only a new, empty one is filled.
    if (const std::size_t parts = target.activePartCount(); parts > 0) {
      return node.fail(fmt::format(
          "the table is not empty ({} active parts): a restore fills only a new, empty table",
          parts));
    }
    request.state = State::kRunning;
    request.parts_total = table->parts.size();
  }
  request.restorer = host;
  request.table = table->table;  // the one found, when none was named
  if (auto saved = node.save(); !saved) return std::unexpected(saved.error());

  const fs::path staging = target.stagingDir();
  for (std::size_t start = request.parts_done; start < table->parts.size();
       start += options.batch) {
    const std::size_t end = std::min(table->parts.size(), start + options.batch);
    std::vector<StagedPart> staged;
    uint64_t rows = 0;
    for (std::size_t i = start; i < end; ++i) {
      const ManifestPart& part = table->parts[i];
      auto name = core::PartName::parse(part.name);
      if (!name) {
        removeStaged(staged);
        return node.fail(fmt::format("the manifest names part '{}': {}", part.name, name.error()));
      }
      const fs::path dir = staging / ("restore-" + part.name);
      std::error_code ec;
      fs::remove_all(dir, ec);  // a copy an earlier attempt left
      fs::create_directories(staging, ec);
      if (auto made = materializePart(**storage, *manifest, table->table, part.name, dir); !made) {
        removeStaged(staged);
        return node.fail(made.error());
      }
      staged.push_back(
          {*name, dir, part.rows, fmt::format("restore-{}-{}", manifest->uid, part.name)});
      rows += part.rows;
    }
    auto attached = target.attach(staged);
    removeStaged(staged);
    if (!attached) {
      return std::unexpected(fmt::format("attaching parts {} to {} of {}: {}", start + 1, end,
                                         table->parts.size(), attached.error()));
    }
    request.parts_done = end;
    request.rows_done += rows;
    if (auto saved = node.save(); !saved) return std::unexpected(saved.error());
  }
  request.state = State::kDone;
  request.finished_ms = wallClockMs();
  if (auto saved = node.save(); !saved) return std::unexpected(saved.error());
  spdlog::info("restored table {} from backup {}: {} parts, {} rows", table->table, request.backup,
               request.parts_done, request.rows_done);
  return request;
}

}  // namespace

std::string_view restoreStateName(State state) {
  switch (state) {
    case State::kPending:
      return "pending";
    case State::kRunning:
      return "running";
    case State::kDone:
      return "done";
    case State::kFailed:
      return "failed";
  }
  return "pending";
}

std::string restoreRequestPath(std::string_view table_root) {
  return fmt::format("{}/restore", table_root);
}

std::string RestoreRequest::format() const {
  return json{{"backup", backup},
              {"table", table},
              {"destination", destinationToJson(destination)},
              {"state", restoreStateName(state)},
              {"message", message},
              {"restorer", restorer},
              {"partsTotal", parts_total},
              {"partsDone", parts_done},
              {"rowsDone", rows_done},
              {"requestedMs", requested_ms},
              {"finishedMs", finished_ms}}
      .dump();
}

std::expected<RestoreRequest, std::string> RestoreRequest::parse(std::string_view text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return std::unexpected("not a JSON object");
  RestoreRequest request;
  for (auto [field, target, required] :
       {std::tuple{"backup", &request.backup, true}, std::tuple{"table", &request.table, false},
        std::tuple{"message", &request.message, false},
        std::tuple{"restorer", &request.restorer, false}}) {
    auto it = doc.find(field);
    if (it == doc.end() && !required) continue;
    if (it == doc.end() || !it->is_string() || (required && it->get<std::string>().empty())) {
      return std::unexpected(fmt::format("{}: a non-empty string is required", field));
    }
    *target = it->get<std::string>();
  }
  if (request.backup.find('/') != std::string::npos || request.backup == "..") {
    return std::unexpected(fmt::format("backup: '{}' is not a plain name", request.backup));
  }
  auto destination = doc.find("destination");
  if (destination == doc.end()) return std::unexpected("destination: an object is required");
  auto parsed = destinationFromJson(*destination, "destination.");
  if (!parsed) return std::unexpected(parsed.error());
  request.destination = std::move(*parsed);
  auto state = doc.find("state");
  if (state == doc.end() || !state->is_string() || !stateNamed(state->get<std::string>())) {
    return std::unexpected(fmt::format("state: '{}' is none of pending, running, done, failed",
                                       state == doc.end() ? "" : state->dump()));
  }
  request.state = *stateNamed(state->get<std::string>());
  for (auto [field, target] :
       {std::pair{"partsTotal", &request.parts_total}, std::pair{"partsDone", &request.parts_done},
        std::pair{"rowsDone", &request.rows_done}}) {
    auto it = doc.find(field);
    if (it == doc.end()) continue;
    if (!it->is_number_unsigned()) {
      return std::unexpected(fmt::format("{}: a number >= 0 is required", field));
    }
    *target = it->get<uint64_t>();
  }
  if (request.parts_done > request.parts_total) {
    return std::unexpected(fmt::format("partsDone: {} is more than partsTotal {}",
                                       request.parts_done, request.parts_total));
  }
  for (auto [field, target] : {std::pair{"requestedMs", &request.requested_ms},
                               std::pair{"finishedMs", &request.finished_ms}}) {
    auto it = doc.find(field);
    if (it != doc.end() && it->is_number_integer()) *target = it->get<int64_t>();
  }
  return request;
}

std::optional<std::string> restoreRefusal(const std::optional<RestoreRequest>& request) {
  if (!request) return std::nullopt;
  switch (request->state) {
    case State::kDone:
      return std::nullopt;
    case State::kFailed:
      return fmt::format(
          "the table's restore from backup '{}' failed ({}): it takes no inserts; delete the "
          "ReplicatedTable and create it again",
          request->backup, request->message);
    case State::kPending:
    case State::kRunning:
      break;
  }
  return fmt::format(
      "the table is being restored from backup '{}' ({} of {} parts): inserts wait "
      "until it is done",
      request->backup, request->parts_done, request->parts_total);
}

std::expected<std::optional<StoredRestoreRequest>, std::string> readRestoreRequest(
    core::Keeper& keeper, std::string_view table_root) {
  const std::string path = restoreRequestPath(table_root);
  auto node = keeper.get(path);
  if (!node) {
    if (node.error().code == core::KeeperCode::kNoNode) return std::nullopt;
    return std::unexpected("reading the restore request: " + node.error().toString());
  }
  auto request = RestoreRequest::parse(node->data);
  if (!request) {
    return std::unexpected(
        fmt::format("the restore request {} is not valid: {}", path, request.error()));
  }
  return StoredRestoreRequest{std::move(*request), node->stat.version};
}

std::expected<std::optional<RestoreRequest>, std::string> restoreIfAsked(
    core::Keeper& keeper, const std::string& table_root, const std::string& host,
    RestoreTarget& target, const DestinationOpener& open, const RestoreOptions& options) {
  auto stored = readRestoreRequest(keeper, table_root);
  if (!stored) return std::unexpected(stored.error());
  if (!*stored) return std::nullopt;
  const RestoreRequest& seen = (*stored)->request;
  if (seen.state == State::kDone || seen.state == State::kFailed) return seen;
  const std::string election = restoreRequestPath(table_root) + "/restorer";
  auto elected = keeper.create(election, host, core::CreateMode::kEphemeral);
  if (!elected) {
    if (elected.error().code == core::KeeperCode::kNodeExists) return seen;
    return std::unexpected("electing the restorer: " + elected.error().toString());
  }
  // The request may have moved on between the read and the election.
  std::expected<std::optional<RestoreRequest>, std::string> outcome;
  auto current = readRestoreRequest(keeper, table_root);
  if (!current) {
    outcome = std::unexpected(current.error());
  } else if (!*current) {
    outcome = std::nullopt;
  } else if ((*current)->request.state == State::kDone ||
             (*current)->request.state == State::kFailed) {
    outcome = (*current)->request;
  } else {
    RequestNode node(keeper, restoreRequestPath(table_root), std::move((*current)->request),
                     (*current)->version);
    outcome = restore(node, host, target, open, options);
  }
  (void)keeper.remove(election);
  return outcome;
}

}  // namespace rtable::backup
