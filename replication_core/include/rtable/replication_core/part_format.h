// The on-disk part format (DESIGN.md 2.1, docs/formats.md "Parts on disk"): writing a block as an
// immutable part directory, reading it back, verifying it against its checksums, and the start-up
// scan of a table's data directory.
//
// A part `<partition>_<min>_<max>_<level>/` holds `<column>.bin` per column (zstd-compressed
// blocks), `columns.txt`, `count.txt` and `checksums.txt`. The same block always gives
// byte-identical files, so replicas that merge the same parts get parts with equal checksums.
//
// Free functions over paths; each call owns the files it touches for its duration. Two calls on
// different parts may run concurrently; writePart refuses a part whose `tmp_` directory exists, so
// two writers of one part name cannot interleave. loadParts removes `tmp_*` directories and must
// run before any writer starts.
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rtable/replication_core/block.h"
#include "rtable/replication_core/hash128.h"
#include "rtable/replication_core/part_name.h"
#include "rtable/replication_core/table_schema.h"

namespace rtable::core {

// Where broken and unexpected parts are moved, in a generation's data directory.
inline constexpr std::string_view kDetachedDir = "detached";
// The part file that lists every other with its size and hash.
inline constexpr std::string_view kChecksumsFile = "checksums.txt";

// The content of `checksums.txt`: every other file of the part with its size and XXH3-128, sorted
// by name, and the part's total hash (what replicas compare, and what an `attach` log entry
// carries as `part_checksum:`).
struct PartChecksums {
  struct File {
    std::string name;
    uint64_t size = 0;
    Hash128 hash;
    friend bool operator==(const File&, const File&) = default;
  };
  std::vector<File> files;  // sorted by name, names unique
  Hash128 total;

  // Sorts `files` by name and computes the total. Names must be unique.
  static PartChecksums fromFiles(std::vector<File> files);
  // Hasher128 over (name, size, hash.high, hash.low) of each file in order.
  static Hash128 totalOf(const std::vector<File>& files);
  const File* find(std::string_view name) const;

  std::string format() const;
  // Refuses unsorted or duplicate names and a total that does not match the files; errors name
  // the line ("checksums.txt line 4: ...").
  static std::expected<PartChecksums, std::string> parse(std::string_view text);

  friend bool operator==(const PartChecksums&, const PartChecksums&) = default;
};

// One file of a part, held in memory.
struct PartFile {
  std::string name;
  std::string bytes;
  friend bool operator==(const PartFile&, const PartFile&) = default;
};

// A whole part held in memory, byte for byte what writePart puts on disk: a small inserted part
// lives so from its commit until the part journal's next checkpoint writes it out, and a merge
// that takes it first never writes it at all (TableReplica).
struct PartImage {
  std::vector<PartFile> files;  // checksums.txt and every file it lists
  PartChecksums checksums;      // checksums.txt parsed

  const PartFile* find(std::string_view name) const;
  uint64_t bytes() const;  // all files, checksums.txt included
};

enum class PartSync {
  kNow,    // every file and the directory fsynced before the call returns
  kLater,  // nothing fsynced: the caller makes the part durable (syncPartFiles, or PartJournal)
};

// Writes `block`'s files into `dir`, which must not exist yet, `dir` removed on failure. For a
// part staged before its name is known; it becomes visible (and durable) when the caller renames
// `dir` into the table directory and fsyncs that.
std::expected<PartChecksums, std::string> writeStagedPart(const std::filesystem::path& dir,
                                                          const TableSchema& schema,
                                                          const Block& block,
                                                          PartSync sync = PartSync::kNow);

// `block` encoded as a part in memory; the same bytes writeStagedPart would write.
std::expected<PartImage, std::string> encodePart(const TableSchema& schema, const Block& block);

// Writes a part's files held in memory (a PartImage's, or a journal record's) into `dir`, which
// must not exist yet (`dir` removed on failure); with PartSync::kNow every file and `dir` are
// fsynced.
std::expected<void, std::string> writePartImage(const std::filesystem::path& dir,
                                                const std::vector<PartFile>& files, PartSync sync);

// fsyncs every file of a part written with PartSync::kLater (checksums.txt and the files it
// lists), all at once, then its directory.
std::expected<void, std::string> syncPartFiles(const std::filesystem::path& dir,
                                               const PartChecksums& checksums);

// Writes `block` (columns as `schema`, rows already sorted by the caller) as part `name` under
// `table_dir`: into `tmp_<name>`, every file and the directory fsynced, then renamed to `<name>`
// (never over an existing part) and `table_dir` fsynced. On failure nothing is left behind.
std::expected<PartChecksums, std::string> writePart(const std::filesystem::path& table_dir,
                                                    const PartName& name, const TableSchema& schema,
                                                    const Block& block);

// All rows of the part, columns in the schema's order. Every file read is checked against
// checksums.txt (size and hash) as it streams; one column at a time is held in memory beside the
// result.
std::expected<Block, std::string> readPart(const std::filesystem::path& part_dir,
                                           const TableSchema& schema);

// readPart of an image; `name_for_errors` stands for the part directory in messages.
std::expected<Block, std::string> readPart(const PartImage& image, const TableSchema& schema,
                                           const std::filesystem::path& name_for_errors);

// Checks the whole part: the files present are exactly those checksums.txt lists, which are
// exactly this schema's; every size and hash; columns.txt is the schema's; every column holds
// count.txt's number of rows. Memory stays at one compressed block. Errors name the part
// directory, the file and the reason.
std::expected<PartChecksums, std::string> verifyPart(const std::filesystem::path& part_dir,
                                                     const TableSchema& schema);

struct LoadedParts {
  std::vector<std::pair<PartName, PartChecksums>> valid;  // ordered by PartName
  // Parts that failed verifyPart, now in `detached/broken_<name>` with a `reason.txt`: (name,
  // reason).
  std::vector<std::pair<std::string, std::string>> broken;
  // Entries that are neither parts nor `tmp_*` nor `detached`, left untouched: (name, why).
  std::vector<std::pair<std::string, std::string>> ignored;
  // `tmp_*` directories removed (writes cut short by a crash).
  std::vector<std::string> removed_temporary;
};

// The start-up scan of `table_dir` (see LoadedParts). Reads every part in full, as verifyPart.
// Fails only when the directory cannot be listed or a broken part cannot be moved aside.
std::expected<LoadedParts, std::string> loadParts(const std::filesystem::path& table_dir,
                                                  const TableSchema& schema);

}  // namespace rtable::core
