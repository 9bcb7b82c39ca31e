// A table's schema: typed columns, the partition key and the ORDER BY key (DESIGN.md 2.1), and
// what follows from them for a block of rows: its partitions and its sort order.
#pragma once

#include <expected>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rtable/replication_core/block.h"

namespace rtable::core {

struct ColumnSpec {
  std::string name;
  DataType type;
  friend bool operator==(const ColumnSpec&, const ColumnSpec&) = default;
};

struct PartitionKey {
  enum class Kind { kNone, kColumn, kToYYYYMM, kToYYYYMMDD };
  Kind kind = Kind::kNone;
  std::string column;

  // "" or "tuple()" (one partition, "all"), "col", "toYYYYMM(col)", "toYYYYMMDD(col)".
  static std::expected<PartitionKey, std::string> parse(std::string_view text);
  std::string format() const;
  friend bool operator==(const PartitionKey&, const PartitionKey&) = default;
};

class TableSchema {
 public:
  // Checks names (identifiers, unique), that key columns exist, and that the partition key fits
  // its column (toYYYYMM of a Date or DateTime, never Nullable). Errors name the column.
  static std::expected<TableSchema, std::string> create(std::vector<ColumnSpec> columns,
                                                        PartitionKey partition_by,
                                                        std::vector<std::string> order_by);

  const std::vector<ColumnSpec>& columns() const { return columns_; }
  const PartitionKey& partitionBy() const { return partition_by_; }
  const std::vector<std::string>& orderBy() const { return order_by_; }
  std::optional<std::size_t> columnIndex(std::string_view name) const;

  // An empty block with this schema's columns.
  Block emptyBlock() const;

  // The partition id of every row: "all", "202612", "20261201", the integer value (as ClickHouse
  // names them), or for a String or Float key the XXH3-128 hex of the value (ClickHouse hashes
  // with SipHash there, so those ids differ from ClickHouse's). `block` has this schema's columns.
  std::vector<std::string> partitionIds(const Block& block) const;
  // The block's rows grouped by partition id, in first-seen order, each group in input order.
  std::vector<std::pair<std::string, Block>> splitByPartition(Block block) const;
  // The partition ids in first-seen order, and each row's index into them.
  struct PartitionGroups {
    std::vector<std::string> ids;
    std::vector<uint32_t> group_of_row;
  };
  PartitionGroups partitionGroups(const Block& block) const;
  // Row order by the ORDER BY key (ascending, NULLs last), stable: equal keys keep input order.
  // `block` has this schema's columns.
  std::vector<std::size_t> sortPermutation(const Block& block) const;

  friend bool operator==(const TableSchema&, const TableSchema&) = default;

 private:
  std::vector<ColumnSpec> columns_;
  PartitionKey partition_by_;
  std::vector<std::string> order_by_;
};

}  // namespace rtable::core
