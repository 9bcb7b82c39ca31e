#include "rtable/replication_core/part_store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <variant>

#include "posix_file.h"

namespace rtable::core {
namespace fs = std::filesystem;
namespace {

constexpr const char* kJournalDir = "journal";

uint64_t imageBytes(const PartImage& image) {
  uint64_t bytes = 0;
  for (const auto& file : image.files) bytes += file.bytes.size();
  return bytes;
}

}  // namespace

uint64_t valueBytes(const Block& block) {
  uint64_t total = 0;
  for (const auto& column : block.columns) {
    total += column.null_map.size();
    std::visit(
        [&](const auto& values) {
          using T = typename std::decay_t<decltype(values)>::value_type;
          if constexpr (std::is_same_v<T, std::string>) {
            for (const auto& value : values) total += value.size() + 1;
          } else {
            total += values.size() * sizeof(T);
          }
        },
        column.values);
  }
  return total;
}

DataPart::~DataPart() {
  // A held part that was never written out has no directory; remove_all then does nothing.
  if (remove_when_unused) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

std::expected<Block, std::string> readDataPart(const DataPart& part, const TableSchema& schema) {
  return part.image ? readPart(*part.image, schema, part.dir) : readPart(part.dir, schema);
}

PartStore::PartStore(fs::path data_dir, const TableSchema& schema, PartStoreOptions options,
                     metrics::ReplicaMetrics& metrics, const common::Clock& clock,
                     std::unique_ptr<PartJournal> journal)
    : data_dir_(std::move(data_dir)),
      schema_(schema),
      options_(options),
      metrics_(metrics),
      clock_(clock),
      journal_(std::move(journal)),
      last_checkpoint_(clock_.now()) {}

PartStore::~PartStore() = default;

std::expected<std::unique_ptr<PartStore>, std::string> PartStore::open(
    const fs::path& data_dir, const TableSchema& schema, PartStoreOptions options,
    metrics::ReplicaMetrics& metrics, const common::Clock& clock) {
  if (auto made = makeDirectories(data_dir); !made) return std::unexpected(made.error());
  // Inserts that were still staging when the process stopped were never acknowledged.
  std::error_code ec;
  fs::remove_all(data_dir / kStagingDir, ec);
  auto journal = PartJournal::open(data_dir / kJournalDir);
  if (!journal) return std::unexpected(journal.error());
  return std::unique_ptr<PartStore>(
      new PartStore(data_dir, schema, options, metrics, clock, std::move(*journal)));
}

std::expected<std::vector<std::string>, std::string> PartStore::load(
    const std::set<std::string>& committed, const std::vector<JournaledPart>& other_copies) {
  auto wanted = [&](const std::string& name) { return committed.contains(name); };
  // A committed part held in memory, or written without fsync, may not have survived: the
  // journal has it. Its directory may look whole in the page cache and still not be on disk
  // (after a failed sync), so it is written again either way.
  auto restored = journal_->restore(data_dir_, wanted);
  if (!restored) return std::unexpected(restored.error());
  for (const auto& name : *restored)
    spdlog::info("part {} written again from the part journal", name);
  if (!other_copies.empty()) {
    auto copied = restoreParts(data_dir_, other_copies, wanted, "its image in ZooKeeper");
    if (!copied) return std::unexpected(copied.error());
    for (const auto& name : *copied)
      spdlog::info("part {} written from its image in ZooKeeper", name);
  }
  auto loaded = loadParts(data_dir_, schema_);
  if (!loaded) return std::unexpected(loaded.error());
  // Everything is durable by itself from here on (restoreParts fsyncs what it writes); the
  // journal starts empty.
  if (auto checkpointed = journal_->checkpoint(data_dir_); !checkpointed) {
    return std::unexpected(checkpointed.error());
  }
  ActiveDataPartSet committed_set;
  for (const auto& name : committed) {
    if (auto part = PartName::parse(name)) (void)committed_set.add(*part);
  }
  std::set<std::string> local;
  std::vector<std::string> unexpected;
  for (auto& [name, checksums] : loaded->valid) {
    const std::string text = name.format();
    local.insert(text);
    std::error_code ec;
    if (committed.contains(text)) {
      makeVisible(name, std::move(checksums), 0, nullptr);
      continue;
    }
    auto container = committed_set.containingPart(name);
    if (container && *container != name) {
      // A merge's source whose removal was cut short: its rows are in the merged part.
      fs::remove_all(data_dir_ / text, ec);
      continue;
    }
    // Written, never committed, so never acknowledged: out of the way of a retry.
    fs::create_directories(data_dir_ / kDetachedDir, ec);
    fs::rename(data_dir_ / text, data_dir_ / kDetachedDir / ("unexpected_" + text), ec);
    unexpected.push_back(text);
  }
  std::vector<std::string> lost;
  for (const auto& name : committed) {
    if (!local.contains(name)) lost.push_back(name);
  }
  std::lock_guard lock(mu_);
  for (const auto& [name, reason] : loaded->broken) {
    report_.broken.push_back(fmt::format("{}: {}", name, reason));
    metrics_.broken_parts.Increment();
  }
  report_.unexpected = std::move(unexpected);
  report_.lost = lost;
  return lost;
}

DataPartPtr PartStore::makeDataPart(const PartName& name, PartChecksums checksums, uint64_t rows,
                                    std::shared_ptr<const PartImage> image) const {
  auto part = std::make_shared<DataPart>();
  part->name = name;
  part->dir = data_dir_ / name.format();
  for (const auto& file : checksums.files) part->bytes += file.size;
  part->checksums = std::move(checksums);
  part->image = std::move(image);
  part->rows = rows;
  if (rows != 0 || part->image) return part;
  std::error_code ec;
  if (auto count = fs::file_size(part->dir / "count.txt", ec); !ec && count < 32) {
    std::FILE* f = std::fopen((part->dir / "count.txt").c_str(), "r");
    if (f) {
      unsigned long long counted = 0;
      if (std::fscanf(f, "%llu", &counted) == 1) part->rows = counted;
      std::fclose(f);
    }
  }
  return part;
}

std::vector<DataPartPtr> PartStore::activeParts() const {
  std::lock_guard lock(mu_);
  std::vector<DataPartPtr> parts;
  parts.reserve(active_.size());
  for (const auto& [name, part] : active_) parts.push_back(part);
  return parts;
}

DataPartPtr PartStore::activePart(const PartName& name) const {
  std::lock_guard lock(mu_);
  auto it = active_.find(name);
  return it == active_.end() ? nullptr : it->second;
}

std::vector<PartName> PartStore::activeNames() const {
  std::lock_guard lock(mu_);
  std::vector<PartName> names;
  names.reserve(active_.size());
  for (const auto& [name, part] : active_) names.push_back(name);
  return names;
}

uint64_t PartStore::rowCount() const {
  std::lock_guard lock(mu_);
  uint64_t rows = 0;
  for (const auto& [name, part] : active_) rows += part->rows;
  return rows;
}

std::vector<PartName> PartStore::partsCoveredBy(const PartName& part) const {
  std::lock_guard lock(mu_);
  return active_set_.partsCoveredBy(part);
}

LocalPartLookup PartStore::lookup() const {
  auto set = std::make_shared<ActiveDataPartSet>();
  {
    std::lock_guard lock(mu_);
    *set = active_set_;
    for (const auto& name : committing_) (void)set->add(name);
  }
  return [set](const PartName& part) { return set->containingPart(part); };
}

bool PartStore::willHold(uint64_t value_bytes) {
  if (value_bytes > options_.journal_part_bytes) return false;
  {
    std::lock_guard lock(mu_);
    if (held_bytes_ < options_.held_parts_max_bytes) return true;
  }
  requestCheckpoint();
  return false;
}

void PartStore::beginCommit(const PartName& name, const std::shared_ptr<const PartImage>& image) {
  std::lock_guard lock(mu_);
  committing_.insert(name);
  // Held before its journal record exists: a checkpoint whose rotation covers the record writes
  // the part out.
  if (image) holdLocked(name, image);
}

void PartStore::endCommit(const PartName& name) {
  std::lock_guard lock(mu_);
  committing_.erase(name);
}

std::expected<void, std::string> PartStore::writeSyncedPart(const PartName& name,
                                                            const PartImage& image) {
  const fs::path tmp = data_dir_ / kStagingDir / ("synced-" + name.format());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (auto made = makeDirectories(tmp.parent_path()); !made) return made;
  if (auto written = writePartImage(tmp, image.files, PartSync::kNow); !written) return written;
  if (auto renamed = renameNoReplace(tmp, data_dir_ / name.format()); !renamed) {
    fs::remove_all(tmp, ec);
    return renamed;
  }
  return fsyncDirectory(data_dir_);
}

std::expected<void, std::string> PartStore::makeDurable(const PartName& name, NewPart& part) {
  if (part.image) {
    auto journaled = journal_->append(name.format(), *part.image);
    if (journaled) return {};
    spdlog::warn("part journal: {}; writing part {} as synced files", journaled.error(),
                 name.format());
    // Out of the held parts first, so that no checkpoint writes it any more; a copy one wrote
    // (not known durable) is replaced.
    forgetHeld(name);
    if (auto written = writeSyncedPart(name, *part.image); !written) return written;
    part.image.reset();
    return {};
  }
  if (auto renamed = renameNoReplace(part.dir, data_dir_ / name.format()); !renamed) return renamed;
  return fsyncDirectory(data_dir_);
}

void PartStore::discard(const PartName& name, const NewPart& part) {
  // A held part's files may exist too: a checkpoint may have written (and synced) it meanwhile.
  if (part.image) forgetHeld(name);
  std::error_code ec;
  fs::remove_all(data_dir_ / name.format(), ec);
}

std::expected<void, std::string> PartStore::unplace(const PartName& name, const NewPart& part) {
  if (!part.image) return renamePath(data_dir_ / name.format(), part.dir);
  discard(name, part);
  return {};
}

void PartStore::addUncertain(const PartName& name, NewPart part) {
  std::lock_guard lock(mu_);
  uncertain_[name] = std::move(part);
}

std::map<PartName, NewPart> PartStore::uncertainParts() const {
  std::lock_guard lock(mu_);
  return uncertain_;
}

bool PartStore::isUncertain(const PartName& name) const {
  std::lock_guard lock(mu_);
  return uncertain_.contains(name);
}

void PartStore::forgetUncertain(const PartName& name) {
  std::lock_guard lock(mu_);
  uncertain_.erase(name);
}

std::vector<std::string> PartStore::uncertainNames() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, part] : uncertain_) names.push_back(name.format());
  return names;
}

void PartStore::makeVisible(const PartName& name, PartChecksums checksums, uint64_t rows,
                            std::shared_ptr<const PartImage> image) {
  std::lock_guard lock(mu_);
  // A held part is released only once a checkpoint wrote it out and synced it: if that happened
  // while its commit ran, it is a part with files now.
  if (image && !held_.contains(name)) image.reset();
  DataPartPtr part = makeDataPart(name, std::move(checksums), rows, std::move(image));
  committing_.erase(name);
  if (active_.contains(name)) return;  // visible already (an uncertain commit resolved twice)
  auto added = active_set_.add(name);
  if (!added || *added != ActiveDataPartSet::AddResult::kAdded) {
    // Merges never cover blocks on their way in, so a committed part is never covered already.
    spdlog::error("part {} could not become visible: {}", name.format(),
                  added ? "covered by an active part" : added.error());
    releaseHeldLocked(name);
    return;
  }
  // The parts it covers start at its partition and min block (the map's order): a single-row
  // insert looks at one or two parts, not at every active part of the table.
  const PartName first{name.partition_id, name.min_block, name.min_block, 0, 0};
  for (auto it = active_.lower_bound(first); it != active_.end() &&
                                             it->first.partition_id == name.partition_id &&
                                             it->first.min_block <= name.max_block;) {
    if (name.contains(it->first) && it->first != name) {
      it = retireLocked(it);
    } else {
      ++it;
    }
  }
  active_[name] = std::move(part);
  metrics_.parts.Set(static_cast<double>(active_.size()));
}

std::expected<std::vector<DataPartPtr>, std::string> PartStore::mergeSources(
    const PartName& result, const std::vector<std::string>& sources) const {
  std::vector<DataPartPtr> parts;
  std::lock_guard lock(mu_);
  for (const auto& name : sources) {
    auto part = PartName::parse(name);
    auto it = part ? active_.find(*part) : active_.end();
    if (it == active_.end()) return std::unexpected("merge source " + name + " is not here");
    parts.push_back(it->second);
  }
  // A part inside the result that is not a source would be covered without its rows being
  // merged in: refuse (the leader chose wrongly) rather than lose them.
  for (const auto& [name, part] : active_) {
    if (!result.contains(name)) continue;
    const bool is_source = std::any_of(parts.begin(), parts.end(),
                                       [&](const DataPartPtr& s) { return s->name == name; });
    if (!is_source) {
      return std::unexpected(
          fmt::format("merge {} would cover part {}, which is not one of its "
                      "sources; not merging",
                      result.format(), name.format()));
    }
  }
  return parts;
}

std::shared_ptr<const PartImage> PartStore::holdMergeResult(const PartName& name,
                                                            const Block& rows) {
  // A stream of small inserts keeps merging small parts: a synced file per column for each
  // result contended with the inserts' journal appends for the same disk. Held and journaled, a
  // merge result is as durable as a small insert; the next checkpoint writes it out (unless a
  // later merge took it), and after a crash start-up writes it again once ZooKeeper lists it.
  if (!willHold(valueBytes(rows))) return nullptr;
  auto encoded = encodePart(schema_, rows);
  if (!encoded) {
    spdlog::warn("merge {}: {}; writing it as files", name.format(), encoded.error());
    return nullptr;
  }
  auto image = std::make_shared<const PartImage>(std::move(*encoded));
  {
    std::lock_guard lock(mu_);
    holdLocked(name, image);
  }
  if (auto journaled = journal_->append(name.format(), *image); !journaled) {
    spdlog::warn("part journal: {}; writing merged part {} as files", journaled.error(),
                 name.format());
    forgetHeld(name);
    return nullptr;
  }
  return image;
}

void PartStore::retire(const std::vector<PartName>& parts, const std::string& detach_prefix) {
  std::vector<DataPartPtr> detached;
  {
    std::lock_guard lock(mu_);
    for (const auto& name : parts) {
      active_set_.remove(name);
      auto it = active_.find(name);
      if (it == active_.end()) continue;
      if (detach_prefix.empty()) {
        retireLocked(it);
        continue;
      }
      detached.push_back(it->second);
      releaseHeldLocked(name);
      active_.erase(it);
    }
    metrics_.parts.Set(static_cast<double>(active_.size()));
  }
  std::error_code ec;
  if (!detached.empty()) fs::create_directories(data_dir_ / kDetachedDir, ec);
  for (const auto& part : detached) {
    const fs::path target = data_dir_ / kDetachedDir / (detach_prefix + part->name.format());
    if (part->image) {
      // Held in memory: its rows are kept on disk like any other detached part's; a copy a
      // checkpoint wrote (not known durable) goes.
      fs::remove_all(part->dir, ec);
      if (auto written = writePartImage(target, part->image->files, PartSync::kNow); !written) {
        spdlog::warn("detaching part {}: {}", part->name.format(), written.error());
      }
    } else if (auto moved = renamePath(part->dir, target); !moved) {
      spdlog::warn("detaching part {}: {}", part->name.format(), moved.error());
    }
  }
}

std::map<PartName, DataPartPtr>::iterator PartStore::retireLocked(
    std::map<PartName, DataPartPtr>::iterator it) {
  it->second->remove_when_unused = true;
  releaseHeldLocked(it->first);  // a merged or dropped part needs no writing out
  return active_.erase(it);
}

PartStore::MergeView PartStore::mergeView() const {
  MergeView view;
  std::lock_guard lock(mu_);
  for (const auto& [name, part] : active_) view.active_rows.emplace(name, part->rows);
  view.arriving.assign(committing_.begin(), committing_.end());
  for (const auto& [name, part] : uncertain_) view.arriving.push_back(name);
  return view;
}

void PartStore::holdLocked(const PartName& name, std::shared_ptr<const PartImage> image) {
  const uint64_t bytes = imageBytes(*image);
  auto [it, added] = held_.try_emplace(name);
  if (!added) held_bytes_ -= it->second.bytes;
  it->second = Held{std::move(image), bytes, false};
  held_bytes_ += bytes;
}

void PartStore::releaseHeldLocked(const PartName& name) {
  auto it = held_.find(name);
  if (it == held_.end()) return;
  held_bytes_ -= it->second.bytes;
  held_.erase(it);
}

void PartStore::forgetHeld(const PartName& name) {
  std::lock_guard lock(mu_);
  auto it = held_.find(name);
  if (it == held_.end()) return;
  if (it->second.written) {
    std::error_code ec;
    fs::remove_all(data_dir_ / name.format(), ec);
  }
  releaseHeldLocked(name);
}

void PartStore::requestCheckpoint() {
  if (checkpoint_wanted_.exchange(true)) return;
  if (wake_) wake_();
}

void PartStore::checkpointIfDue() {
  const bool wanted = checkpoint_wanted_.exchange(false);
  bool due;
  {
    std::lock_guard lock(checkpoint_mu_);
    due = wanted || clock_.now() - last_checkpoint_ >= options_.checkpoint_interval;
  }
  bool held;
  {
    std::lock_guard lock(mu_);
    held = !held_.empty();
  }
  if (due && (journal_->pendingBytes() > 0 || held)) {
    if (auto done = checkpoint(); !done) {
      spdlog::warn("{}", done.error());
      metrics_.part_journal_checkpoint_failures.Increment();
    }
  }
  metrics_.part_journal_bytes.Set(static_cast<double>(journal_->pendingBytes()));
  std::lock_guard lock(mu_);
  metrics_.parts_in_memory.Set(static_cast<double>(held_.size()));
  metrics_.parts_in_memory_bytes.Set(static_cast<double>(held_bytes_));
}

std::expected<void, std::string> PartStore::checkpoint() {
  std::lock_guard checkpoint_lock(checkpoint_mu_);
  last_checkpoint_ = clock_.now();
  // Every record the rotation covers belongs to a part held by then (held before its append), or
  // to one that left the table: written out, all are durable after the sync without the records.
  PartJournal::Rotation rotation = journal_->rotate();
  {
    std::lock_guard lock(mu_);
    if (rotation.covered.empty() && held_.empty()) return {};
  }
  if (auto written = writeHeldParts(); !written) {
    journal_->cancelCheckpoint(std::move(rotation));
    settleHeldParts(/*synced=*/false);
    return std::unexpected("part journal checkpoint: " + written.error());
  }
  auto synced = rotation.covered.empty()
                    ? syncFileSystem(data_dir_)
                    : journal_->finishCheckpoint(std::move(rotation), data_dir_);
  // A failed sync may have lost any write since the last one, and the next sync would not say so:
  // the parts stay held and are written again, and the journal keeps their records meanwhile.
  settleHeldParts(synced.has_value());
  if (!synced) return std::unexpected("part journal checkpoint: " + synced.error());
  return {};
}

std::expected<void, std::string> PartStore::writeHeldParts() {
  std::vector<std::pair<PartName, std::shared_ptr<const PartImage>>> todo;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, held] : held_) {
      if (!held.written) todo.emplace_back(name, held.image);
    }
  }
  if (todo.empty()) return {};
  if (auto made = makeDirectories(data_dir_ / kStagingDir); !made) return made;
  std::error_code ec;
  for (const auto& [name, image] : todo) {
    // Written aside, then renamed under mu_ only if still held: a part that left meanwhile
    // (merged, dropped, its commit refused) must not come back as a directory.
    const fs::path tmp = data_dir_ / kStagingDir / ("held-" + name.format());
    const fs::path final_dir = data_dir_ / name.format();
    fs::remove_all(tmp, ec);
    if (auto written = writePartImage(tmp, image->files, PartSync::kLater); !written)
      return written;
    std::lock_guard lock(mu_);
    auto held = held_.find(name);
    if (held == held_.end() || held->second.written) {
      fs::remove_all(tmp, ec);
      continue;
    }
    // A copy an earlier checkpoint wrote before its sync failed is not trusted: replaced. Readers
    // read the held part from memory, never from this directory.
    fs::remove_all(final_dir, ec);
    if (auto renamed = renamePath(tmp, final_dir); !renamed) return renamed;
    held->second.written = true;
  }
  return {};
}

void PartStore::settleHeldParts(bool synced) {
  std::lock_guard lock(mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    if (!it->second.written) {
      ++it;
      continue;
    }
    if (!synced) {
      it->second.written = false;
      ++it;
      continue;
    }
    // Durable by its files now: readers take them from there (readers of the held DataPart keep
    // its image).
    if (auto active = active_.find(it->first); active != active_.end() && active->second->image) {
      active->second =
          makeDataPart(it->first, active->second->checksums, active->second->rows, nullptr);
    }
    held_bytes_ -= it->second.bytes;
    it = held_.erase(it);
  }
}

PartStore::Report PartStore::report() const {
  std::lock_guard lock(mu_);
  return report_;
}

std::size_t PartStore::heldPartsForTest() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

}  // namespace rtable::core
