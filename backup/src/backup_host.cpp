#include "rtable/backup/backup_host.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "rtable/backup/backup_manifest.h"
#include "rtable/replication_core/table_paths.h"
#include "wall_clock.h"

namespace rtable::backup {
namespace {

std::expected<std::string, std::string> readWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected(fmt::format("cannot open {}", path.string()));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return std::unexpected(fmt::format("cannot read {}", path.string()));
  return bytes.str();
}

// Sequence: where a BackupTableRef of the operation is, for `host`.
const BackupTableRef& tableFor(const BackupOperation& operation, const std::string& host) {
  static const BackupTableRef kNone;
  const BackupTableRef* table = operation.tableOf(host);
  return table ? *table : kNone;
}

}  // namespace

// --- Plain data --------------------------------------------------------------------------------

std::string HostStats::format() const {
  return nlohmann::json{{"filesWritten", files_written},
                        {"bytesWritten", bytes_written},
                        {"filesReused", files_reused},
                        {"bytesReused", bytes_reused}}
      .dump();
}

HostStats HostStats::parse(std::string_view text) {
  auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  HostStats stats;
  if (!doc.is_object()) return stats;
  auto number = [&](const char* name) -> uint64_t {
    auto it = doc.find(name);
    return it != doc.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
  };
  stats.files_written = number("filesWritten");
  stats.bytes_written = number("bytesWritten");
  stats.files_reused = number("filesReused");
  stats.bytes_reused = number("bytesReused");
  return stats;
}

std::string BackupSummary::format() const {
  nlohmann::json tables_json = nlohmann::json::array();
  for (const auto& table : tables) {
    tables_json.push_back({{"table", table.table},
                           {"generation", table.generation},
                           {"parts", table.parts},
                           {"rows", table.rows}});
  }
  return nlohmann::json{{"tables", tables_json},
                        {"dataFiles", data_files},
                        {"dataBytes", data_bytes},
                        {"logicalBytes", logical_bytes},
                        {"manifest", manifest}}
      .dump();
}

std::optional<BackupSummary> BackupSummary::parse(std::string_view text) {
  auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("tables") || !doc["tables"].is_array()) {
    return std::nullopt;
  }
  BackupSummary summary;
  for (const auto& item : doc["tables"]) {
    if (!item.is_object()) return std::nullopt;
    summary.tables.push_back({item.value("table", ""), item.value("generation", int64_t{0}),
                              item.value("parts", uint64_t{0}), item.value("rows", uint64_t{0})});
  }
  summary.data_files = doc.value("dataFiles", uint64_t{0});
  summary.data_bytes = doc.value("dataBytes", uint64_t{0});
  summary.logical_bytes = doc.value("logicalBytes", uint64_t{0});
  summary.manifest = doc.value("manifest", "");
  return summary;
}

uint64_t FrozenPartList::rows() const {
  uint64_t total = 0;
  for (const auto& part : parts) total += part.rows;
  return total;
}

std::string FrozenPartList::format() const {
  std::string text = fmt::format("lag {}\n", lag);
  for (const auto& part : parts) {
    text += fmt::format("{} {} {}\n", part.name, part.rows, part.checksum.hex());
  }
  return text;
}

std::expected<FrozenPartList, std::string> FrozenPartList::parse(std::string_view text) {
  FrozenPartList list;
  std::size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    auto end = text.find('\n');
    if (end == std::string_view::npos) {
      return std::unexpected(fmt::format("part list line {}: no newline at the end", line_number));
    }
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end + 1);
    auto fail = [&](std::string_view what) {
      return std::unexpected(fmt::format("part list line {}: {}", line_number, what));
    };
    auto number = [](std::string_view digits, uint64_t& value) {
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
      return !digits.empty() && ec == std::errc() && ptr == digits.data() + digits.size();
    };
    if (line_number == 1) {
      if (!line.starts_with("lag ") || !number(line.substr(4), list.lag)) {
        return fail("expected 'lag <number>'");
      }
      continue;
    }
    auto first = line.find(' ');
    auto second = first == std::string_view::npos ? first : line.find(' ', first + 1);
    if (second == std::string_view::npos) return fail("expected '<name> <rows> <checksum>'");
    Part part;
    part.name = std::string(line.substr(0, first));
    if (!number(line.substr(first + 1, second - first - 1), part.rows)) return fail("bad rows");
    auto checksum = core::Hash128::fromHex(line.substr(second + 1));
    if (!checksum) return fail("bad checksum");
    part.checksum = *checksum;
    list.parts.push_back(std::move(part));
  }
  if (line_number == 0) return std::unexpected("part list: empty");
  return list;
}

std::string chooseSourceHost(const std::map<std::string, FrozenPartList>& lists) {
  const std::pair<const std::string, FrozenPartList>* best = nullptr;
  for (const auto& entry : lists) {
    if (!best) {
      best = &entry;
      continue;
    }
    const FrozenPartList& a = entry.second;
    const FrozenPartList& b = best->second;
    // Least behind first; then the most rows (a replica that has not fetched everything yet has
    // fewer); the map's order (by name) breaks ties.
    if (a.lag < b.lag || (a.lag == b.lag && a.rows() > b.rows())) best = &entry;
  }
  return best ? best->first : "";
}

// --- BackupHost --------------------------------------------------------------------------------

BackupHost::BackupHost(BackupPaths paths, BackupOperation operation, std::string host,
                       BackupTableSource& source, BackupStorage& storage,
                       core::KeeperFactory keeper_factory, BackupHostOptions options)
    : paths_(std::move(paths)),
      operation_(std::move(operation)),
      host_(std::move(host)),
      table_(tableFor(operation_, host_)),
      source_(source),
      storage_(storage),
      options_(options),
      sync_(std::move(keeper_factory), paths_, operation_.hosts(), host_, options.sync) {}

BackupResult<void> BackupHost::gatherMetadata() {
  auto backoff = std::chrono::milliseconds(100);
  auto deadline = std::chrono::steady_clock::now() + options_.collect_metadata_timeout;
  for (int attempt = 0;; ++attempt) {
    std::string stage_name = stage::gatheringMetadata(attempt);
    // Read twice: a generation that changes in between is caught here (seed 001 compares two
    // passes); the operation's generation must be the one served.
    std::string result(stage::kConsistent);
    int64_t first = source_.generation();
    std::string metadata = source_.metadataText();
    if (first != source_.generation() || metadata != source_.metadataText()) {
      result = stage::kNeedAnotherAttempt;
    } else if (first != table_.generation) {
      result = fmt::format(
          "the replica serves generation {}, the backup was started on generation {} (a table "
          "swap ran in between?)",
          first, table_.generation);
    }
    if (auto set = sync_.setStage(stage_name, result); !set) return std::unexpected(set.error());
    reached("after " + stage_name);
    auto results = sync_.waitForStage(stage_name);
    if (!results) return std::unexpected(results.error());
    bool again = false;
    for (const auto& [host, host_result] : *results) {
      if (host_result == stage::kConsistent) continue;
      if (host_result == stage::kNeedAnotherAttempt) {
        again = true;
        continue;
      }
      BackupError error{host, stage_name, host_result, "InconsistentMetadata"};
      sync_.setError(error);
      return std::unexpected(error);
    }
    if (!again) return {};
    if (std::chrono::steady_clock::now() + backoff > deadline) {
      BackupError error{host_, stage_name, "the metadata did not settle in time",
                        "InconsistentMetadata"};
      sync_.setError(error);
      return std::unexpected(error);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

BackupResult<std::map<std::string, FrozenPartList>> BackupHost::readPartLists(
    const BackupTableRef& table) {
  std::map<std::string, FrozenPartList> lists;
  for (const auto& host : table.hosts) {
    auto text = sync_.withRetries(
        stage::kBuildingFileInfos, "reading part lists",
        [&](core::Keeper& keeper) { return readChunked(keeper, paths_.parts(host)); });
    if (!text) return std::unexpected(text.error());
    auto list = FrozenPartList::parse(*text);
    if (!list) {
      return std::unexpected(
          BackupError{host, std::string(stage::kBuildingFileInfos), list.error()});
    }
    lists[host] = std::move(*list);
  }
  return lists;
}

void BackupHost::reached(std::string_view point) {
  if (options_.test_point) options_.test_point(point);
}

BackupResult<std::vector<bool>> BackupHost::electWriters(const std::vector<std::size_t>& indexes,
                                                         const std::string& my_index) {
  // `create` decides; a node holding my index is mine (an earlier attempt created it and its
  // answer was lost). Without contention a batch costs two round trips, not one per file: one
  // pipelined read of its nodes, then one multi creating the free ones. A create that loses a race
  // fails the multi; the batch is looked at again (the node that won is then read as taken).
  return sync_.withRetries(stage::kWritingBackup, "electing the writers",
                           [&](core::Keeper& keeper) -> core::KeeperResult<std::vector<bool>> {
                             std::vector<std::optional<bool>> won(indexes.size());
                             for (;;) {
                               std::vector<std::string> paths;
                               std::vector<std::size_t> which;
                               for (std::size_t i = 0; i < indexes.size(); ++i) {
                                 if (won[i]) continue;
                                 paths.push_back(paths_.writingFile(indexes[i]));
                                 which.push_back(i);
                               }
                               if (paths.empty()) break;
                               auto nodes = keeper.getMany(paths);
                               std::vector<core::Op> creates;
                               std::vector<std::size_t> created;
                               for (std::size_t k = 0; k < nodes.size(); ++k) {
                                 if (nodes[k]) {
                                   won[which[k]] = nodes[k]->data == my_index;
                                 } else if (nodes[k].error().code == core::KeeperCode::kNoNode) {
                                   creates.push_back(core::op::Create{
                                       paths[k], my_index, core::CreateMode::kPersistent});
                                   created.push_back(which[k]);
                                 } else {
                                   return std::unexpected(nodes[k].error());
                                 }
                               }
                               if (creates.empty()) continue;
                               auto made = keeper.multi(creates);
                               if (made) {
                                 for (std::size_t i : created) won[i] = true;
                               } else if (made.error().code != core::KeeperCode::kNodeExists) {
                                 return std::unexpected(made.error());
                               }
                             }
                             std::vector<bool> result;
                             for (const auto& w : won) result.push_back(*w);
                             return result;
                           });
}

BackupResult<BackupHost::Written> BackupHost::writeDataFile(const PlannedFile& planned,
                                                            const LocalFile& local) {
  auto fail = [&](const StorageError& error) {
    return std::unexpected(BackupError{host_, std::string(stage::kWritingBackup),
                                       fmt::format("{} ({}): {}", planned.data_file,
                                                   storageErrorKindName(error.kind), error.message),
                                       std::string(storageErrorKindName(error.kind))});
  };
  auto stored = storage_.size(planned.data_file);
  if (!stored) return fail(stored.error());
  if (*stored && **stored == planned.info.size) return Written::kReused;
  const core::DataPart& part = *local.part;
  StorageResult<void> put;
  if (part.image) {
    const core::PartFile* file = part.image->find(local.file);
    if (!file) {
      return std::unexpected(
          BackupError{host_, std::string(stage::kWritingBackup),
                      fmt::format("{}: not in the held part", planned.info.name)});
    }
    put = storage_.putBytes(planned.data_file, file->bytes);
  } else {
    put = storage_.putFile(planned.data_file, part.dir / local.file);
  }
  if (!put) return fail(put.error());
  return Written::kWritten;
}

BackupResult<HostStats> BackupHost::writeFiles(const BackupFilePlan& plan) {
  reached("writing files");
  HostStats stats;
  auto hosts = operation_.hosts();
  const std::size_t position =
      static_cast<std::size_t>(std::find(hosts.begin(), hosts.end(), host_) - hosts.begin());
  const std::string my_index = std::to_string(position);
  // Each data file this host holds, once.
  std::vector<std::pair<const PlannedFile*, const LocalFile*>> mine;
  std::set<std::size_t> seen;
  for (const auto& [name, local] : local_files_) {
    const PlannedFile* planned = plan.find(name);
    if (!planned || planned->data_file.empty()) continue;
    if (!seen.insert(planned->data_file_index).second) continue;
    mine.emplace_back(planned, &local);
  }
  // Each host starts at its own share of the list: hosts that hold the same files claim different
  // ones first and meet only near the end, so they seldom race for one.
  if (!mine.empty() && !hosts.empty()) {
    std::rotate(mine.begin(),
                mine.begin() + static_cast<std::ptrdiff_t>(position * mine.size() / hosts.size() %
                                                           mine.size()),
                mine.end());
  }
  // Claimed a few at a time, each batch written before the next is claimed: a host that writes
  // faster claims more, and the last batches leave little for one host alone.
  constexpr std::size_t kElectionBatch = 8;
  for (std::size_t begin = 0; begin < mine.size(); begin += kElectionBatch) {
    const std::size_t end = std::min(mine.size(), begin + kElectionBatch);
    std::vector<std::size_t> indexes;
    for (std::size_t i = begin; i < end; ++i) indexes.push_back(mine[i].first->data_file_index);
    auto won = electWriters(indexes, my_index);
    if (!won) return std::unexpected(won.error());
    std::vector<std::size_t> to_write;
    for (std::size_t i = begin; i < end; ++i) {
      if ((*won)[i - begin]) to_write.push_back(i);
    }
    // The batch's won files, options_.writers at a time; the first error (in list order) wins
    // and no new write starts after one failed.
    std::vector<std::optional<BackupResult<Written>>> results(to_write.size());
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    auto writer = [&] {
      while (!failed) {
        const std::size_t k = next++;
        if (k >= to_write.size()) return;
        const auto& [planned, local] = mine[to_write[k]];
        results[k] = writeDataFile(*planned, *local);
        if (!*results[k]) failed = true;
      }
    };
    const std::size_t threads =
        std::min(to_write.size(), static_cast<std::size_t>(std::max(options_.writers, 1)));
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(writer);
    writer();
    for (auto& thread : pool) thread.join();
    for (std::size_t k = 0; k < to_write.size(); ++k) {
      if (!results[k]) continue;  // not started: another write failed
      if (!*results[k]) return std::unexpected(results[k]->error());
      const uint64_t size = mine[to_write[k]].first->info.size;
      if (**results[k] == Written::kReused) {
        ++stats.files_reused;
        stats.bytes_reused += size;
      } else {
        ++stats.files_written;
        stats.bytes_written += size;
      }
    }
  }
  return stats;
}

BackupResult<std::string> BackupHost::writeManifest(
    const BackupFilePlan& plan, const std::map<std::string, std::string>& write_results) {
  BackupManifest manifest;
  manifest.name = operation_.name;
  manifest.uid = operation_.uid;
  manifest.started_ms = operation_.started_ms;
  for (const auto& table : operation_.tables) {
    auto lists = readPartLists(table);
    if (!lists) return std::unexpected(lists.error());
    std::string source = chooseSourceHost(*lists);
    const FrozenPartList& chosen = lists->at(source);
    ManifestTable entry;
    entry.table = table.table;
    entry.generation = table.generation;
    core::TablePaths table_paths{table.table_root, table.generation, ""};
    auto metadata = sync_.withRetries(stage::kCompleted, "reading the table's metadata",
                                      [&](core::Keeper& keeper) -> core::KeeperResult<std::string> {
                                        auto node = keeper.get(table_paths.metadata());
                                        if (!node) return std::unexpected(node.error());
                                        return node->data;
                                      });
    if (!metadata) return std::unexpected(metadata.error());
    entry.metadata = std::move(*metadata);
    entry.source_host = source;
    entry.rows = chosen.rows();
    for (const auto& part : chosen.parts) {
      entry.parts.push_back(ManifestPart{part.name, part.rows, part.checksum});
    }
    std::sort(entry.parts.begin(), entry.parts.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    manifest.tables.push_back(std::move(entry));
  }
  for (const auto& file : plan.files) {
    manifest.files.push_back(
        ManifestFile{file.info.name, file.info.size, file.info.checksum, file.data_file});
  }
  manifest.data_files = plan.data_files;
  manifest.data_bytes = plan.data_bytes;
  for (const auto& [host, result] : write_results) {
    HostStats stats = HostStats::parse(result);
    manifest.bytes_written += stats.bytes_written;
    manifest.bytes_reused += stats.bytes_reused;
  }
  manifest.completed_ms = wallClockMs();
  auto put = storage_.putBytes(manifestName(operation_.name), manifest.format());
  if (!put) {
    return std::unexpected(
        BackupError{host_, std::string(stage::kCompleted),
                    fmt::format("writing the manifest {} ({}): {}", manifestName(operation_.name),
                                storageErrorKindName(put.error().kind), put.error().message),
                    std::string(storageErrorKindName(put.error().kind))});
  }
  BackupSummary summary;
  for (const auto& table : manifest.tables) {
    summary.tables.push_back({table.table, table.generation, table.parts.size(), table.rows});
  }
  summary.data_files = plan.data_files;
  summary.data_bytes = plan.data_bytes;
  summary.logical_bytes = plan.logical_bytes;
  summary.manifest = manifestName(operation_.name);
  return summary.format();
}

BackupResult<HostStats> BackupHost::run() {
  auto fail = [&](BackupError error) -> BackupResult<HostStats> {
    sync_.setError(error);
    frozen_.clear();
    return std::unexpected(std::move(error));
  };
  if (table_.table.empty()) {
    return fail(BackupError{host_, "", "the operation does not name this host"});
  }
  if (auto joined = sync_.join(); !joined) return fail(joined.error());
  if (auto gathered = gatherMetadata(); !gathered) return fail(gathered.error());

  // Extracting data: caught up with the log, then the parts at one moment, held until the end.
  const bool caught_up = source_.catchUp(options_.catch_up_timeout);
  auto frozen = source_.freeze();
  if (!frozen) return fail(BackupError{host_, std::string(stage::kExtractingData), frozen.error()});
  frozen_ = std::move(frozen->parts);
  FrozenPartList mine;
  mine.lag = caught_up ? 0 : 1 + frozen->lag;
  for (const auto& part : frozen_) {
    mine.parts.push_back({part->name.format(), part->rows, part->checksums.total});
  }
  auto published = sync_.withRetries(
      stage::kExtractingData, "publishing the part list", [&](core::Keeper& keeper) {
        return writeChunked(keeper, paths_.parts(host_), mine.format());
      });
  if (!published) return fail(published.error());
  if (auto set = sync_.setStage(stage::kExtractingData); !set) return fail(set.error());
  reached(fmt::format("after {}", stage::kExtractingData));
  if (auto waited = sync_.waitForStage(stage::kExtractingData); !waited) {
    return fail(waited.error());
  }

  // Building file infos: the source replica's parts; the files of those this host holds alike.
  auto lists = readPartLists(table_);
  if (!lists) return fail(lists.error());
  std::string source = chooseSourceHost(*lists);
  std::map<std::string, core::Hash128> chosen;
  for (const auto& part : lists->at(source).parts) chosen[part.name] = part.checksum;
  std::vector<BackupFileInfo> infos;
  for (const auto& part : frozen_) {
    std::string part_name = part->name.format();
    auto it = chosen.find(part_name);
    if (it == chosen.end() || it->second != part->checksums.total) continue;
    std::string prefix = fmt::format("{}/{}/", table_.table, part_name);
    for (const auto& file : part->checksums.files) {
      BackupFileInfo info{prefix + file.name, file.size, file.hash};
      local_files_[info.name] = LocalFile{part, file.name, info};
      infos.push_back(info);
    }
    // checksums.txt itself: its bytes from memory or disk.
    std::string checksums_text;
    if (part->image) {
      const core::PartFile* file = part->image->find("checksums.txt");
      if (!file) {
        return fail(BackupError{host_, std::string(stage::kBuildingFileInfos),
                                fmt::format("part {} held without checksums.txt", part_name)});
      }
      checksums_text = file->bytes;
    } else {
      auto text = readWholeFile(part->dir / "checksums.txt");
      if (!text)
        return fail(BackupError{host_, std::string(stage::kBuildingFileInfos), text.error()});
      checksums_text = std::move(*text);
    }
    BackupFileInfo info{prefix + "checksums.txt", checksums_text.size(),
                        core::hash128(checksums_text)};
    local_files_[info.name] = LocalFile{part, "checksums.txt", info};
    infos.push_back(info);
  }
  auto infos_published = sync_.withRetries(
      stage::kBuildingFileInfos, "publishing file infos", [&](core::Keeper& keeper) {
        return writeChunked(keeper, paths_.fileInfos(host_), formatFileInfos(infos));
      });
  if (!infos_published) return fail(infos_published.error());
  if (auto set = sync_.setStage(stage::kBuildingFileInfos); !set) return fail(set.error());
  reached(fmt::format("after {}", stage::kBuildingFileInfos));
  if (auto waited = sync_.waitForStage(stage::kBuildingFileInfos); !waited) {
    return fail(waited.error());
  }

  // Writing backup: one plan for all hosts; each writes the files it wins.
  std::map<std::string, std::vector<BackupFileInfo>> all_infos;
  for (const auto& host : operation_.hosts()) {
    auto text = sync_.withRetries(
        stage::kWritingBackup, "reading file infos",
        [&](core::Keeper& keeper) { return readChunked(keeper, paths_.fileInfos(host)); });
    if (!text) return fail(text.error());
    auto parsed = parseFileInfos(*text);
    if (!parsed) return fail(BackupError{host, std::string(stage::kWritingBackup), parsed.error()});
    all_infos[host] = std::move(*parsed);
  }
  auto plan = planFiles(all_infos);
  if (!plan) return fail(BackupError{host_, std::string(stage::kWritingBackup), plan.error()});
  auto stats = writeFiles(*plan);
  if (!stats) return fail(stats.error());
  if (auto set = sync_.setStage(stage::kWritingBackup, stats->format()); !set) {
    return fail(set.error());
  }
  reached(fmt::format("after {}", stage::kWritingBackup));
  auto written = sync_.waitForStage(stage::kWritingBackup);
  if (!written) return fail(written.error());
  frozen_.clear();
  local_files_.clear();

  // Completed: the manifest last, by the first host, whose result is its summary.
  std::string completed_result = stats->format();
  if (operation_.hosts().front() == host_) {
    auto summary = writeManifest(*plan, *written);
    if (!summary) return fail(summary.error());
    completed_result = std::move(*summary);
  }
  if (auto set = sync_.setStage(stage::kCompleted, completed_result); !set) {
    return fail(set.error());
  }
  if (auto finished = sync_.finish(); !finished) return fail(finished.error());
  return *stats;
}

}  // namespace rtable::backup
