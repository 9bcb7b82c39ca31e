// Typed columns and blocks: the in-memory form of rows between the input parsers, the part
// writer and reader, merges and selects.
//
// Values are stored column by column in native form, as ClickHouse does: Date as UInt16 days
// since 1970-01-01, DateTime as UInt32 seconds since the epoch (UTC), Bool as UInt8 0/1. A
// Nullable column keeps a null map beside the values (the value under a null is the type's
// default). Plain data, not thread-safe.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace rtable::core {

enum class TypeId {
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat32,
  kFloat64,
  kString,
  kDate,
  kDateTime,
  kBool,
};

struct DataType {
  TypeId id = TypeId::kUInt64;
  bool nullable = false;

  // "UInt32", "Nullable(String)", ...; the error names the type text.
  static std::expected<DataType, std::string> parse(std::string_view text);
  std::string name() const;

  friend bool operator==(const DataType&, const DataType&) = default;
};

// One vector per storage type. Date is uint16_t, DateTime uint32_t, Bool uint8_t.
using ColumnValues =
    std::variant<std::vector<uint8_t>, std::vector<uint16_t>, std::vector<uint32_t>,
                 std::vector<uint64_t>, std::vector<int8_t>, std::vector<int16_t>,
                 std::vector<int32_t>, std::vector<int64_t>, std::vector<float>,
                 std::vector<double>, std::vector<std::string>>;

// An empty vector of the storage type of `type`.
ColumnValues emptyValuesFor(TypeId type);

struct Column {
  std::string name;
  DataType type;
  ColumnValues values;
  std::vector<uint8_t> null_map;  // nullable only: 1 where the value is NULL, one per row

  static Column empty(std::string name, DataType type);
  std::size_t size() const;
  bool isNull(std::size_t row) const { return type.nullable && null_map[row] != 0; }

  friend bool operator==(const Column&, const Column&) = default;
};

struct Block {
  std::vector<Column> columns;

  std::size_t rows() const { return columns.empty() ? 0 : columns.front().size(); }
  const Column* find(std::string_view name) const;

  // The rows at `rows` (in that order) as a new block with the same columns.
  Block select(const std::vector<std::size_t>& rows) const;
  // Appends `other`'s rows. Both come from one schema: the columns match by position and type
  // (a mismatch is a bug, and throws std::bad_variant_access).
  void append(const Block& other);
  // The same, moving `other`'s strings.
  void append(Block&& other);
  // The blocks' rows in order as one block (all from one schema, at least one block), moving
  // the strings: each value is moved once into a column of the exact size, where appending one
  // block after another moves it again at every growth. Large columns are joined on every core.
  static Block concat(std::vector<Block>&& blocks);
  // Appends each row r to *targets[group_of_row[r]] (blocks with the same columns), moving the
  // strings: one pass per column instead of a select per group and an append.
  void scatterInto(const std::vector<uint32_t>& group_of_row,
                   const std::vector<Block*>& targets) &&;

  friend bool operator==(const Block&, const Block&) = default;
};

// Dates as ClickHouse prints them: "2026-12-01" and "2026-12-01 03:00:00" (UTC).
std::string formatDate(uint16_t days);
std::string formatDateTime(uint32_t seconds);
std::expected<uint16_t, std::string> parseDate(std::string_view text);
std::expected<uint32_t, std::string> parseDateTime(std::string_view text);

}  // namespace rtable::core
