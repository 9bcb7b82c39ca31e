#include "rtable/replication_core/table_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>

#include "rtable/replication_core/hash128.h"

namespace rtable::core {
namespace {

bool isIdentifier(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool isDateLike(TypeId id) {
  return id == TypeId::kDate || id == TypeId::kDateTime;
}

// "YYYYMM" or "YYYYMMDD" of a day number, cached: a block's rows mostly share few days.
class DayFormatter {
 public:
  explicit DayFormatter(bool with_day) : with_day_(with_day) {}
  const std::string& operator()(int64_t days) {
    if (days != last_days_ || last_.empty()) {
      const std::chrono::year_month_day ymd{std::chrono::sys_days{std::chrono::days{days}}};
      last_ = with_day_ ? fmt::format("{:04}{:02}{:02}", static_cast<int>(ymd.year()),
                                      static_cast<unsigned>(ymd.month()),
                                      static_cast<unsigned>(ymd.day()))
                        : fmt::format("{:04}{:02}", static_cast<int>(ymd.year()),
                                      static_cast<unsigned>(ymd.month()));
      last_days_ = days;
    }
    return last_;
  }

 private:
  bool with_day_;
  int64_t last_days_ = -1;
  std::string last_;
};

// A three-way comparison of two rows of one column, NULLs and NaNs last.
using RowComparator = std::function<int(std::size_t, std::size_t)>;

RowComparator comparatorFor(const Column& column) {
  RowComparator compare_values = std::visit(
      [](const auto& values) -> RowComparator {
        return [&values](std::size_t a, std::size_t b) {
          const auto& x = values[a];
          const auto& y = values[b];
          if constexpr (std::is_floating_point_v<std::decay_t<decltype(x)>>) {
            if (std::isnan(x) || std::isnan(y)) return std::isnan(x) - std::isnan(y);
          }
          return x < y ? -1 : (y < x ? 1 : 0);
        };
      },
      column.values);
  if (!column.type.nullable) return compare_values;
  return [&column, compare_values](std::size_t a, std::size_t b) {
    const bool null_a = column.null_map[a] != 0;
    const bool null_b = column.null_map[b] != 0;
    if (null_a || null_b) return int{null_a} - int{null_b};
    return compare_values(a, b);
  };
}

// Each value less than the next: no NULLs, no NaN, no repeats.
bool strictlyIncreasing(const Column& column) {
  if (column.type.nullable) return false;
  return std::visit(
      [](const auto& values) {
        for (std::size_t i = 1; i < values.size(); ++i) {
          if (!(values[i - 1] < values[i])) return false;
        }
        return true;
      },
      column.values);
}

}  // namespace

std::expected<PartitionKey, std::string> PartitionKey::parse(std::string_view text) {
  PartitionKey key;
  if (text.empty() || text == "tuple()") return key;
  for (auto [prefix, kind] : {std::pair{std::string_view("toYYYYMM("), Kind::kToYYYYMM},
                              std::pair{std::string_view("toYYYYMMDD("), Kind::kToYYYYMMDD}}) {
    if (text.starts_with(prefix) && text.ends_with(')')) {
      key.kind = kind;
      key.column = std::string(text.substr(prefix.size(), text.size() - prefix.size() - 1));
      break;
    }
  }
  if (key.kind == Kind::kNone) {
    key.kind = Kind::kColumn;
    key.column = std::string(text);
  }
  if (!isIdentifier(key.column)) {
    return std::unexpected(fmt::format(
        "partition key '{}' must be a column, toYYYYMM(column), toYYYYMMDD(column) or tuple()",
        text));
  }
  return key;
}

std::string PartitionKey::format() const {
  switch (kind) {
    case Kind::kNone:
      return "tuple()";
    case Kind::kColumn:
      return column;
    case Kind::kToYYYYMM:
      return fmt::format("toYYYYMM({})", column);
    case Kind::kToYYYYMMDD:
      return fmt::format("toYYYYMMDD({})", column);
  }
  return "tuple()";
}

std::expected<TableSchema, std::string> TableSchema::create(std::vector<ColumnSpec> columns,
                                                            PartitionKey partition_by,
                                                            std::vector<std::string> order_by) {
  if (columns.empty()) return std::unexpected("a table needs at least one column");
  std::set<std::string> names;
  for (const auto& column : columns) {
    if (!isIdentifier(column.name)) {
      return std::unexpected(
          fmt::format("column name '{}' must be letters, digits and '_', not starting with a digit",
                      column.name));
    }
    if (!names.insert(column.name).second) {
      return std::unexpected(fmt::format("column '{}' is declared twice", column.name));
    }
  }
  TableSchema schema;
  schema.columns_ = std::move(columns);
  if (partition_by.kind != PartitionKey::Kind::kNone) {
    auto index = schema.columnIndex(partition_by.column);
    if (!index) {
      return std::unexpected(
          fmt::format("partition key {} names no column", partition_by.format()));
    }
    const DataType& type = schema.columns_[*index].type;
    if (type.nullable) {
      return std::unexpected(
          fmt::format("partition key column '{}' must not be Nullable", partition_by.column));
    }
    if (partition_by.kind != PartitionKey::Kind::kColumn && !isDateLike(type.id)) {
      return std::unexpected(fmt::format("{} needs a Date or DateTime column, '{}' is {}",
                                         partition_by.format(), partition_by.column, type.name()));
    }
  }
  schema.partition_by_ = std::move(partition_by);
  for (const auto& column : order_by) {
    if (!schema.columnIndex(column)) {
      return std::unexpected(
          fmt::format("ORDER BY column '{}' is not a column of the table", column));
    }
  }
  schema.order_by_ = std::move(order_by);
  return schema;
}

std::optional<std::size_t> TableSchema::columnIndex(std::string_view name) const {
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].name == name) return i;
  }
  return std::nullopt;
}

Block TableSchema::emptyBlock() const {
  Block block;
  for (const auto& column : columns_)
    block.columns.push_back(Column::empty(column.name, column.type));
  return block;
}

std::vector<std::string> TableSchema::partitionIds(const Block& block) const {
  const std::size_t rows = block.rows();
  if (partition_by_.kind == PartitionKey::Kind::kNone) return std::vector<std::string>(rows, "all");
  const Column& column = block.columns[*columnIndex(partition_by_.column)];
  std::vector<std::string> ids;
  ids.reserve(rows);
  std::visit(
      [&](const auto& values) {
        using T = std::decay_t<decltype(values[0])>;
        if (partition_by_.kind != PartitionKey::Kind::kColumn) {
          DayFormatter day(partition_by_.kind == PartitionKey::Kind::kToYYYYMMDD);
          const bool seconds = column.type.id == TypeId::kDateTime;
          if constexpr (std::is_integral_v<T>) {
            for (const auto& v : values)
              ids.push_back(day(seconds ? int64_t(v) / 86400 : int64_t(v)));
          }
        } else if (column.type.id == TypeId::kDate) {
          DayFormatter day(true);
          if constexpr (std::is_integral_v<T>) {
            for (const auto& v : values) ids.push_back(day(int64_t(v)));
          }
        } else if constexpr (std::is_same_v<T, std::string>) {
          for (const auto& v : values) ids.push_back(hash128(v).hex());
        } else if constexpr (std::is_floating_point_v<T>) {
          for (T v : values) {
            // Equal values, one partition: -0.0 is 0.0, and every NaN is the same NaN.
            if (v == 0) v = 0;
            if (std::isnan(v)) v = std::numeric_limits<T>::quiet_NaN();
            ids.push_back(hash128({reinterpret_cast<const char*>(&v), sizeof(v)}).hex());
          }
        } else {
          for (const auto& v : values) ids.push_back(fmt::format("{}", v));
        }
      },
      column.values);
  return ids;
}

TableSchema::PartitionGroups TableSchema::partitionGroups(const Block& block) const {
  const std::size_t rows = block.rows();
  // Each row's group. Rows partitioned by a day are grouped by the day number and the id is
  // formatted once per distinct day, not once per row (a bulk insert of dates spread over a few
  // months otherwise spends a third of its parse time formatting ids).
  PartitionGroups groups;
  auto& group_of_row = groups.group_of_row;
  auto& group_ids = groups.ids;
  group_of_row.resize(rows);
  std::unordered_map<std::string, uint32_t> group_index;
  auto groupFor = [&](const std::string& id) {
    auto [it, inserted] = group_index.try_emplace(id, static_cast<uint32_t>(group_ids.size()));
    if (inserted) group_ids.push_back(id);
    return it->second;
  };
  const Column* column = partition_by_.kind == PartitionKey::Kind::kNone
                             ? nullptr
                             : &block.columns[*columnIndex(partition_by_.column)];
  const bool by_day = column && (partition_by_.kind != PartitionKey::Kind::kColumn ||
                                 column->type.id == TypeId::kDate);
  if (by_day) {
    DayFormatter format(partition_by_.kind != PartitionKey::Kind::kToYYYYMM);
    const bool seconds = column->type.id == TypeId::kDateTime;
    std::unordered_map<int64_t, uint32_t> group_of_day;
    int64_t last_day = std::numeric_limits<int64_t>::min();
    uint32_t last_group = 0;
    std::visit(
        [&](const auto& values) {
          using T = std::decay_t<decltype(values[0])>;
          if constexpr (std::is_integral_v<T>) {
            for (std::size_t row = 0; row < rows; ++row) {
              const int64_t day = seconds ? int64_t(values[row]) / 86400 : int64_t(values[row]);
              if (day != last_day) {
                auto [it, inserted] = group_of_day.try_emplace(day, 0);
                if (inserted) it->second = groupFor(format(day));
                last_day = day;
                last_group = it->second;
              }
              group_of_row[row] = last_group;
            }
          }
        },
        column->values);
  } else {
    const auto ids = partitionIds(block);
    for (std::size_t row = 0; row < rows; ++row) group_of_row[row] = groupFor(ids[row]);
  }
  return groups;
}

std::vector<std::pair<std::string, Block>> TableSchema::splitByPartition(Block block) const {
  const std::size_t rows = block.rows();
  auto [group_ids, group_of_row] = partitionGroups(block);
  std::vector<std::pair<std::string, Block>> parts;
  parts.reserve(group_ids.size());
  if (group_ids.size() <= 1) {
    if (!group_ids.empty()) parts.emplace_back(std::move(group_ids[0]), std::move(block));
    return parts;
  }
  std::vector<std::vector<std::size_t>> rows_of(group_ids.size());
  for (std::size_t row = 0; row < rows; ++row) rows_of[group_of_row[row]].push_back(row);
  for (std::size_t g = 0; g < group_ids.size(); ++g) {
    parts.emplace_back(std::move(group_ids[g]), block.select(rows_of[g]));
  }
  return parts;
}

std::vector<std::size_t> TableSchema::sortPermutation(const Block& block) const {
  std::vector<std::size_t> order(block.rows());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (order_by_.empty()) return order;
  // The first key strictly increasing (ids, times): the rows are in order whatever the other
  // keys say, found in a typed pass (the comparators below cost a call per key and row).
  const bool increasing = strictlyIncreasing(*block.find(order_by_.front()));
  if (increasing) return order;
  std::vector<RowComparator> keys;
  for (const auto& name : order_by_) keys.push_back(comparatorFor(*block.find(name)));
  auto less = [&](std::size_t a, std::size_t b) {
    for (const auto& compare : keys) {
      if (int c = compare(a, b); c != 0) return c < 0;
    }
    return false;
  };
  // Rows often come in key order already (ids, times): one pass then instead of a sort.
  if (std::is_sorted(order.begin(), order.end(), less)) return order;
  std::stable_sort(order.begin(), order.end(), less);
  return order;
}

}  // namespace rtable::core
