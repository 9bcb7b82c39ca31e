// The `where=` filter of selects: comparisons of a column with a literal, joined by AND.
//
//   x > 5 AND s = 'it''s' AND d >= '2026-12-01' AND n IS NOT NULL
//
// Operators: = == != <> < <= > >=, IS NULL, IS NOT NULL. A literal is read as the column's type
// (a date string for a Date column, true/false for Bool); a comparison with a NULL value is false,
// as in SQL.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/replication_core/block.h"
#include "rtable/replication_core/table_schema.h"

namespace rtable::core {

class RowFilter {
 public:
  // Errors name the column or the text that could not be read.
  static std::expected<RowFilter, std::string> parse(std::string_view text,
                                                     const TableSchema& schema);

  bool empty() const { return conditions_.empty(); }
  // The rows of `block` (the schema's columns) that pass, in order.
  std::vector<std::size_t> matchingRows(const Block& block) const;

  enum class Op { kEq, kNe, kLt, kLe, kGt, kGe, kIsNull, kIsNotNull };
  struct Condition {
    std::size_t column = 0;
    Op op = Op::kEq;
    ColumnValues literal;  // one value of the column's storage type (empty for IS [NOT] NULL)
  };

 private:
  std::vector<Condition> conditions_;
};

}  // namespace rtable::core
