// A replication log entry (log/log-NNNNNNNNNN, copied verbatim into replicas/<r>/queue/), in
// ClickHouse's ReplicatedMergeTreeLogEntry text format, so entries written by either side parse on
// the other. Plain data: format() and parse() round-trip.
//
//   format version: 4
//   create_time: 2026-12-01 03:00:00
//   source replica: r1
//   block_id: 202612_15119613386410440397_6453052399425447744
//   get
//   202612_5_5_0
//   [quorum: 2]
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::core {

struct LogEntry {
  enum class Type {
    kGetPart,     // get <part>: a new part; replicas fetch it
    kAttachPart,  // attach <part> + part_checksum: a part attached from existing data
    kMergeParts,  // merge <sources...> into <part>
    kDropRange,   // drop <range part> (or detach): remove every part the range covers
  };

  Type type = Type::kGetPart;
  int format_version = 4;   // ClickHouse writes the lowest version that holds the entry: 4
  int64_t create_time = 0;  // seconds since the epoch, written as UTC "YYYY-MM-DD hh:mm:ss"
  std::string source_replica;
  std::string block_id;       // the insert's dedup id; empty for merges and drops
  std::string new_part_name;  // get/attach: the part; merge: the result; drop: the range part
  std::vector<std::string> source_parts;  // merge only
  bool deduplicate = false;               // merge only (OPTIMIZE ... DEDUPLICATE)
  std::string part_checksum;              // attach only: hex of the part's total checksum
  bool detach = false;    // drop only: move the parts to detached/ instead of removing them
  std::string part_type;  // optional ("Compact"); empty means ClickHouse's default (Wide)
  int quorum = 0;  // get only: replicas that must have the part before the insert is acknowledged

  std::string format() const;
  // Errors say what was expected where, e.g. "log entry line 5: unknown entry type 'mutate'".
  static std::expected<LogEntry, std::string> parse(std::string_view text);

  friend bool operator==(const LogEntry&, const LogEntry&) = default;
};

// ClickHouse's escaped-string form (backslash escapes), used for block_id.
std::string escapeString(std::string_view text);
std::expected<std::string, std::string> unescapeString(std::string_view text);

// ClickHouse's name of an entry's type, as system.replication_queue shows it: GET_PART,
// ATTACH_PART, MERGE_PARTS, DROP_RANGE.
std::string_view logEntryTypeName(LogEntry::Type type);

}  // namespace rtable::core
