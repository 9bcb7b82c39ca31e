// Part names and the covering rules between them, as ClickHouse's MergeTreePartInfo.
//
// A part `<partition>_<min_block>_<max_block>_<level>[_<mutation>]` holds the rows of blocks
// min..max of one partition; a merge of parts gives a part of level max(levels) + 1 over the union
// of their block ranges, which covers (replaces) them.
#pragma once

#include <compare>
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

namespace rtable::core {

struct PartName {
  // Level of the fake part that covers a whole drop range (ClickHouse MAX_LEVEL).
  static constexpr uint32_t kMaxLevel = 999999999;
  // Block numbers come from ZooKeeper's int32 sequential counter, so none exceeds this
  // (ClickHouse raised its MAX_BLOCK_NUMBER to the same value in 26.4, PR #102243).
  static constexpr int64_t kMaxBlockNumber = 2147483647;

  std::string partition_id;
  int64_t min_block = 0;
  int64_t max_block = 0;
  uint32_t level = 0;
  int64_t mutation = 0;  // 0: none; the name has no mutation suffix then

  // Errors name what is wrong, e.g. "part name '2026_x_1_0': min block 'x' is not a number".
  static std::expected<PartName, std::string> parse(std::string_view name);
  std::string format() const;

  // ClickHouse's MergeTreePartInfo::contains: same partition, a block range that includes rhs's,
  // a level and mutation at least rhs's, and (the same range, a higher level, or a drop range).
  // A part contains itself.
  bool contains(const PartName& rhs) const;
  bool isDisjoint(const PartName& rhs) const;
  bool isFakeDropRange() const { return level == kMaxLevel; }
  int64_t blocksCount() const { return max_block - min_block + 1; }

  // Ordered as (partition, min, max, level, mutation), like ActiveDataPartSet's map.
  friend auto operator<=>(const PartName&, const PartName&) = default;
  friend bool operator==(const PartName&, const PartName&) = default;
};

// A partition id may hold letters, digits and '-' (MergeTreePartInfo's charset).
bool isValidPartitionId(std::string_view id);

}  // namespace rtable::core
