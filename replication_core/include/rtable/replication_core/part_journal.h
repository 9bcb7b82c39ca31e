// The journal of small inserted parts (docs/formats.md "Part journal").
//
// A one-row part of a five-column table is eight files. Syncing them before the commit cost more
// than anything else on a single-row insert's way (eight fsyncs plus two directory fsyncs; on ext4
// the files' journal commits do not merge), and even unsynced, creating nine inodes per insert was
// most of rtable-core's CPU on a journal-less ext4. A small part is therefore held in memory
// (PartStore) and appended to this journal, which takes one fdatasync (shared by inserts that
// append at the same time). The part is then as durable as if its files had been synced: after a
// crash, restore() writes it out.
//
// A checkpoint makes everything journaled durable by itself, then removes the journal files it
// covers; the replica runs one every few seconds in the background (rotate(), write out the parts
// it holds, finishCheckpoint()), so the journal stays small and restore() reads little.
//
// Files `journal-<n>.bin` in one directory; appends go to the newest, which usually starts as a
// zero-filled spare (its zero rest ends its records cleanly). Each record is
//   "RTJ1", u32 payload size, XXH3-128 of the payload (u64 high, u64 low), payload
// with payload = u16 + part name, u32 file count, and per file u16 + file name, u64 size, bytes
// (little-endian). A record cut short or failing its hash ends the file's records: a crash
// in the middle of an append leaves such a tail, and that append was never acknowledged.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/table_schema.h"

namespace rtable::core {

// One part as the journal holds it.
struct JournaledPart {
  using File = PartFile;
  std::string name;
  std::vector<File> files;

  std::string encodeRecord() const;
  friend bool operator==(const JournaledPart&, const JournaledPart&) = default;
};

// The record of part `name` with `files` (JournaledPart::encodeRecord without the copy).
std::string encodeJournalRecord(std::string_view name, const std::vector<PartFile>& files);

// The records of one journal file, in order, up to the first damaged one (reported as `damage`).
struct DecodedJournal {
  std::vector<JournaledPart> parts;
  std::string damage;  // empty when the file ends cleanly after its last record
};
DecodedJournal decodeJournal(std::string_view bytes);

// For every part in `parts` that `wanted` names: writes it again, fsynced, replacing whatever its
// directory in `table_dir` holds (a directory that reads back whole may be page cache that never
// reached the disk, after a failed sync). Returns the names written; `source` names where the
// parts came from in errors.
std::expected<std::vector<std::string>, std::string> restoreParts(
    const std::filesystem::path& table_dir, const std::vector<JournaledPart>& parts,
    const std::function<bool(const std::string&)>& wanted, std::string_view source);

class PartJournal {
 public:
  // Opens (creates) `dir`. Journal files already there are kept for restore() and removed by the
  // next checkpoint(); appends go to a new file.
  static std::expected<std::unique_ptr<PartJournal>, std::string> open(
      const std::filesystem::path& dir);
  ~PartJournal();
  PartJournal(const PartJournal&) = delete;
  PartJournal& operator=(const PartJournal&) = delete;

  // Appends part `name`, held in memory, and returns once the record is on disk. After a failed
  // write or sync the journal takes no more records until the next checkpoint: the caller then
  // writes the part's files, synced, itself.
  std::expected<void, std::string> append(const std::string& name, const PartImage& image);

  // Writes every journaled part that `wanted` names (this replica's committed parts) again from
  // the journal, fsynced, replacing what its directory in `table_dir` holds (restoreParts).
  // Returns the names written. Run before loadParts.
  std::expected<std::vector<std::string>, std::string> restore(
      const std::filesystem::path& table_dir,
      const std::function<bool(const std::string&)>& wanted) const;

  // Makes every part journaled so far durable by itself (syncfs of `table_dir`'s file system,
  // which also covers the renames), then removes the journal files that held them.
  std::expected<void, std::string> checkpoint(const std::filesystem::path& table_dir);

  // checkpoint() in two steps, for a caller that writes out parts it holds in memory in between:
  // rotate() sends later appends to a new file and returns the files holding every record so far
  // (none if there is nothing to checkpoint); finishCheckpoint() makes them durable by themselves
  // (syncfs) and removes them. On failure a later checkpoint covers them again.
  struct Rotation {
    std::vector<std::filesystem::path> covered;
    uint64_t bytes = 0;  // appended to them by this process since the last checkpoint
  };
  Rotation rotate();
  std::expected<void, std::string> finishCheckpoint(Rotation rotation,
                                                    const std::filesystem::path& table_dir);
  // Gives the rotated files back, for a later checkpoint (the caller could not write its parts).
  void cancelCheckpoint(Rotation rotation);

  // Bytes appended since the last checkpoint that succeeded (0: nothing to checkpoint).
  uint64_t pendingBytes() const;
  std::vector<std::filesystem::path> filesForTest() const;

 private:
  explicit PartJournal(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::expected<void, std::string> startFile();  // mu_ held
  std::expected<void, std::string> appendRecord(const std::string& record);
  // Zero-fills and syncs the spare file the next startFile() takes (kSpareBytes, part_journal.cpp).
  std::expected<void, std::string> prepareSpare();

  std::filesystem::path dir_;
  mutable std::mutex mu_;
  std::condition_variable synced_cv_;
  int fd_ = -1;
  uint64_t next_number_ = 1;
  std::filesystem::path current_;
  uint64_t file_offset_ = 0;  // where the next record goes in current_
  bool spare_ready_ = false;  // journal-spare.tmp is zero-filled and synced
  bool preparing_spare_ = false;
  std::vector<std::filesystem::path> older_;  // files before current_, all synced
  // Byte counts over every file of this journal, never reset: an append waiting across a
  // checkpoint's rotation compares its own offset with synced_ (which the rotation reached).
  uint64_t appended_ = 0;  // bytes written
  uint64_t synced_ = 0;    // of those, known on disk
  // Records ending in (first, second] were written but never made durable (a failed write or
  // fdatasync), kept past the checkpoint that clears failed_ for appends that waited on them.
  std::vector<std::pair<uint64_t, uint64_t>> failed_ranges_;
  std::string failure_;        // why, for those appends
  bool syncing_ = false;       // an fdatasync of current_ is running
  std::size_t in_flight_ = 0;  // appends between their start and their return
  bool rotating_ = false;      // checkpoint() is switching files: appends wait
  std::string failed_;         // a write or sync failed: appends refused
  uint64_t pending_bytes_ = 0;
};

}  // namespace rtable::core
