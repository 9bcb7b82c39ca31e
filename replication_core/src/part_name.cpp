#include "rtable/replication_core/part_name.h"

#include <fmt/format.h>

#include <charconv>
#include <vector>

namespace rtable::core {
namespace {

template <class T>
std::expected<T, std::string> parseField(std::string_view name, std::string_view field,
                                         std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || text[0] == '-' || text[0] == '+') {
    return std::unexpected(
        fmt::format("part name '{}': {} '{}' is not a non-negative number", name, field, text));
  }
  return value;
}

}  // namespace

bool isValidPartitionId(std::string_view id) {
  if (id.empty()) return false;
  for (char c : id) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::expected<PartName, std::string> PartName::parse(std::string_view name) {
  std::vector<std::string_view> fields;
  for (std::size_t start = 0;;) {
    const std::size_t end = name.find('_', start);
    fields.push_back(name.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  if (fields.size() != 4 && fields.size() != 5) {
    return std::unexpected(
        fmt::format("part name '{}': expected <partition>_<min>_<max>_<level>[_<mutation>]", name));
  }
  if (!isValidPartitionId(fields[0])) {
    return std::unexpected(fmt::format(
        "part name '{}': partition id '{}' must be letters, digits or '-'", name, fields[0]));
  }
  PartName part;
  part.partition_id = fields[0];
  auto min_block = parseField<int64_t>(name, "min block", fields[1]);
  if (!min_block) return std::unexpected(min_block.error());
  auto max_block = parseField<int64_t>(name, "max block", fields[2]);
  if (!max_block) return std::unexpected(max_block.error());
  auto level = parseField<uint32_t>(name, "level", fields[3]);
  if (!level) return std::unexpected(level.error());
  part.min_block = *min_block;
  part.max_block = *max_block;
  part.level = *level;
  if (fields.size() == 5) {
    auto mutation = parseField<int64_t>(name, "mutation", fields[4]);
    if (!mutation) return std::unexpected(mutation.error());
    part.mutation = *mutation;
  }
  // One part, one name: "all_01_1_0" or an explicit "_0" mutation would alias "all_1_1_0".
  if (part.format() != name) {
    return std::unexpected(
        fmt::format("part name '{}' is not canonical (it would be '{}')", name, part.format()));
  }
  if (part.min_block > part.max_block) {
    return std::unexpected(fmt::format("part name '{}': min block {} is above max block {}", name,
                                       part.min_block, part.max_block));
  }
  return part;
}

std::string PartName::format() const {
  if (mutation == 0) return fmt::format("{}_{}_{}_{}", partition_id, min_block, max_block, level);
  return fmt::format("{}_{}_{}_{}_{}", partition_id, min_block, max_block, level, mutation);
}

bool PartName::contains(const PartName& rhs) const {
  // An equal level is only possible over the same block range (a part contains itself, and its
  // mutated version): all_0_5_2 does not contain all_0_4_2, all_0_5_3 and all_0_4_2_9 do.
  const bool same_range = min_block == rhs.min_block && max_block == rhs.max_block;
  return partition_id == rhs.partition_id && min_block <= rhs.min_block &&
         max_block >= rhs.max_block && level >= rhs.level && mutation >= rhs.mutation &&
         (same_range || level > rhs.level || isFakeDropRange());
}

bool PartName::isDisjoint(const PartName& rhs) const {
  return partition_id != rhs.partition_id || max_block < rhs.min_block || min_block > rhs.max_block;
}

}  // namespace rtable::core
