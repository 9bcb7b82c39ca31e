#include "rtable/replication_core/block.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <future>
#include <thread>

namespace rtable::core {
namespace {

struct TypeName {
  TypeId id;
  std::string_view name;
};
constexpr std::array<TypeName, 14> kTypeNames = {{
    {TypeId::kUInt8, "UInt8"},
    {TypeId::kUInt16, "UInt16"},
    {TypeId::kUInt32, "UInt32"},
    {TypeId::kUInt64, "UInt64"},
    {TypeId::kInt8, "Int8"},
    {TypeId::kInt16, "Int16"},
    {TypeId::kInt32, "Int32"},
    {TypeId::kInt64, "Int64"},
    {TypeId::kFloat32, "Float32"},
    {TypeId::kFloat64, "Float64"},
    {TypeId::kString, "String"},
    {TypeId::kDate, "Date"},
    {TypeId::kDateTime, "DateTime"},
    {TypeId::kBool, "Bool"},
}};

template <class T>
std::expected<T, std::string> parseFixedDigits(std::string_view text) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return std::unexpected(std::string(text));
  }
  return value;
}

}  // namespace

std::expected<DataType, std::string> DataType::parse(std::string_view text) {
  DataType type;
  std::string_view inner = text;
  constexpr std::string_view kNullable = "Nullable(";
  if (inner.starts_with(kNullable) && inner.ends_with(')')) {
    type.nullable = true;
    inner = inner.substr(kNullable.size(), inner.size() - kNullable.size() - 1);
  }
  for (const auto& [id, name] : kTypeNames) {
    if (inner == name) {
      type.id = id;
      return type;
    }
  }
  return std::unexpected(fmt::format(
      "unknown type '{}' (expected UInt8..UInt64, Int8..Int64, Float32, Float64, String, Date, "
      "DateTime, Bool, or Nullable(T) of one of them)",
      text));
}

std::string DataType::name() const {
  std::string_view base;
  for (const auto& [id_, name_] : kTypeNames) {
    if (id_ == id) base = name_;
  }
  return nullable ? fmt::format("Nullable({})", base) : std::string(base);
}

ColumnValues emptyValuesFor(TypeId type) {
  switch (type) {
    case TypeId::kUInt8:
    case TypeId::kBool:
      return std::vector<uint8_t>{};
    case TypeId::kUInt16:
    case TypeId::kDate:
      return std::vector<uint16_t>{};
    case TypeId::kUInt32:
    case TypeId::kDateTime:
      return std::vector<uint32_t>{};
    case TypeId::kUInt64:
      return std::vector<uint64_t>{};
    case TypeId::kInt8:
      return std::vector<int8_t>{};
    case TypeId::kInt16:
      return std::vector<int16_t>{};
    case TypeId::kInt32:
      return std::vector<int32_t>{};
    case TypeId::kInt64:
      return std::vector<int64_t>{};
    case TypeId::kFloat32:
      return std::vector<float>{};
    case TypeId::kFloat64:
      return std::vector<double>{};
    case TypeId::kString:
      return std::vector<std::string>{};
  }
  return std::vector<uint64_t>{};
}

Column Column::empty(std::string name, DataType type) {
  return Column{std::move(name), type, emptyValuesFor(type.id), {}};
}

std::size_t Column::size() const {
  return std::visit([](const auto& v) { return v.size(); }, values);
}

const Column* Block::find(std::string_view name) const {
  for (const auto& column : columns) {
    if (column.name == name) return &column;
  }
  return nullptr;
}

Block Block::select(const std::vector<std::size_t>& rows) const {
  Block out;
  out.columns.reserve(columns.size());
  for (const auto& column : columns) {
    Column selected = Column::empty(column.name, column.type);
    std::visit(
        [&](const auto& source) {
          auto& target = std::get<std::decay_t<decltype(source)>>(selected.values);
          target.reserve(rows.size());
          for (std::size_t row : rows) target.push_back(source[row]);
        },
        column.values);
    if (column.type.nullable) {
      selected.null_map.reserve(rows.size());
      for (std::size_t row : rows) selected.null_map.push_back(column.null_map[row]);
    }
    out.columns.push_back(std::move(selected));
  }
  return out;
}

void Block::append(const Block& other) {
  if (columns.empty()) {
    *this = other;
    return;
  }
  for (std::size_t i = 0; i < columns.size(); ++i) {
    std::visit(
        [&](auto& target) {
          const auto& source = std::get<std::decay_t<decltype(target)>>(other.columns[i].values);
          target.insert(target.end(), source.begin(), source.end());
        },
        columns[i].values);
    const auto& nulls = other.columns[i].null_map;
    columns[i].null_map.insert(columns[i].null_map.end(), nulls.begin(), nulls.end());
  }
}

void Block::append(Block&& other) {
  if (columns.empty()) {
    *this = std::move(other);
    return;
  }
  for (std::size_t i = 0; i < columns.size(); ++i) {
    std::visit(
        [&](auto& target) {
          auto& source = std::get<std::decay_t<decltype(target)>>(other.columns[i].values);
          if (target.empty()) {
            target = std::move(source);
          } else {
            target.insert(target.end(), std::make_move_iterator(source.begin()),
                          std::make_move_iterator(source.end()));
          }
        },
        columns[i].values);
    auto& nulls = other.columns[i].null_map;
    columns[i].null_map.insert(columns[i].null_map.end(), nulls.begin(), nulls.end());
  }
}

Block Block::concat(std::vector<Block>&& blocks) {
  if (blocks.size() == 1) return std::move(blocks.front());
  std::size_t rows = 0;
  for (const auto& block : blocks) rows += block.rows();
  Block out;
  for (const auto& column : blocks.front().columns)
    out.columns.push_back(Column::empty(column.name, column.type));
  auto joinColumn = [&](std::size_t i) {
    std::visit(
        [&](auto& target) {
          using Values = std::decay_t<decltype(target)>;
          target.reserve(rows);
          for (auto& block : blocks) {
            auto& source = std::get<Values>(block.columns[i].values);
            target.insert(target.end(), std::make_move_iterator(source.begin()),
                          std::make_move_iterator(source.end()));
            Values().swap(source);  // freed as it goes: the memory peaks at one copy
          }
        },
        out.columns[i].values);
    if (out.columns[i].type.nullable) {
      auto& nulls = out.columns[i].null_map;
      nulls.reserve(rows);
      for (auto& block : blocks) {
        nulls.insert(nulls.end(), block.columns[i].null_map.begin(),
                     block.columns[i].null_map.end());
        std::vector<uint8_t>().swap(block.columns[i].null_map);
      }
    }
  };
  // A bulk insert's columns are joined on every core; a few rows are not worth a thread.
  static const std::size_t kCores = std::max(1u, std::thread::hardware_concurrency());
  constexpr std::size_t kParallelRows = 100'000;
  const std::size_t workers = rows >= kParallelRows ? std::min(kCores, out.columns.size()) : 1;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < out.columns.size();) joinColumn(i);
  };
  std::vector<std::future<void>> helpers;
  for (std::size_t w = 1; w < workers; ++w) helpers.push_back(std::async(std::launch::async, work));
  work();
  for (auto& helper : helpers) helper.get();
  blocks.clear();
  return out;
}

namespace {

// Capacity for `more` values, still growing at least geometrically: a bulk insert scatters many
// blocks into the same targets, and an exact reserve each time would copy them on every call.
template <class Vector>
void reserveFor(Vector& values, std::size_t more) {
  const std::size_t needed = values.size() + more;
  if (needed > values.capacity()) values.reserve(std::max(needed, 2 * values.capacity()));
}

}  // namespace

void Block::scatterInto(const std::vector<uint32_t>& group_of_row,
                        const std::vector<Block*>& targets) && {
  // Room for every row first: growing by doubling moved each target's values (and faulted in
  // their pages) about twice more in a bulk insert.
  std::vector<std::size_t> incoming(targets.size(), 0);
  for (const uint32_t group : group_of_row) ++incoming[group];
  for (std::size_t i = 0; i < columns.size(); ++i) {
    std::visit(
        [&](auto& source) {
          using Values = std::decay_t<decltype(source)>;
          std::vector<Values*> out;
          for (std::size_t t = 0; t < targets.size(); ++t) {
            out.push_back(&std::get<Values>(targets[t]->columns[i].values));
            reserveFor(*out.back(), incoming[t]);
          }
          for (std::size_t row = 0; row < source.size(); ++row) {
            out[group_of_row[row]]->push_back(std::move(source[row]));
          }
        },
        columns[i].values);
    if (columns[i].type.nullable) {
      const auto& nulls = columns[i].null_map;
      for (std::size_t t = 0; t < targets.size(); ++t) {
        reserveFor(targets[t]->columns[i].null_map, incoming[t]);
      }
      for (std::size_t row = 0; row < nulls.size(); ++row) {
        targets[group_of_row[row]]->columns[i].null_map.push_back(nulls[row]);
      }
    }
  }
}

std::string formatDate(uint16_t days) {
  const std::chrono::year_month_day ymd{std::chrono::sys_days{std::chrono::days{days}}};
  return fmt::format("{:04}-{:02}-{:02}", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()));
}

std::string formatDateTime(uint32_t seconds) {
  const auto days = seconds / 86400;
  const auto rest = seconds % 86400;
  return fmt::format("{} {:02}:{:02}:{:02}", formatDate(static_cast<uint16_t>(days)), rest / 3600,
                     rest / 60 % 60, rest % 60);
}

std::expected<uint16_t, std::string> parseDate(std::string_view text) {
  // YYYY-MM-DD, from 1970-01-01 to 2149-06-06 (ClickHouse's Date range, UInt16 days).
  // Eight digits in place first, without a call per field (a bulk insert parses a date per
  // row); anything else takes the checks below, which name what is wrong.
  if (text.size() == 10 && text[4] == '-' && text[7] == '-') {
    unsigned digit[10] = {};
    bool digits = true;
    for (const int i : {0, 1, 2, 3, 5, 6, 8, 9}) {
      digit[i] = static_cast<unsigned>(static_cast<unsigned char>(text[i]) - '0');
      digits &= digit[i] <= 9;
    }
    if (digits) {
      const std::chrono::year_month_day ymd{
          std::chrono::year{
              static_cast<int>(digit[0] * 1000 + digit[1] * 100 + digit[2] * 10 + digit[3])},
          std::chrono::month{digit[5] * 10 + digit[6]}, std::chrono::day{digit[8] * 10 + digit[9]}};
      if (ymd.ok()) {
        const auto days = std::chrono::sys_days{ymd}.time_since_epoch().count();
        if (days >= 0 && days <= 65535) return static_cast<uint16_t>(days);
      }
    }
  }
  if (text.size() != 10 || text[4] != '-' || text[7] != '-') {
    return std::unexpected(fmt::format("'{}' is not a date YYYY-MM-DD", text));
  }
  auto y = parseFixedDigits<int>(text.substr(0, 4));
  auto m = parseFixedDigits<unsigned>(text.substr(5, 2));
  auto d = parseFixedDigits<unsigned>(text.substr(8, 2));
  if (!y || !m || !d) return std::unexpected(fmt::format("'{}' is not a date YYYY-MM-DD", text));
  const std::chrono::year_month_day ymd{std::chrono::year{*y}, std::chrono::month{*m},
                                        std::chrono::day{*d}};
  if (!ymd.ok()) return std::unexpected(fmt::format("'{}' is not a valid date", text));
  const auto days = std::chrono::sys_days{ymd}.time_since_epoch().count();
  if (days < 0 || days > 65535) {
    return std::unexpected(fmt::format("date '{}' is outside 1970-01-01 .. 2149-06-06", text));
  }
  return static_cast<uint16_t>(days);
}

std::expected<uint32_t, std::string> parseDateTime(std::string_view text) {
  // "YYYY-MM-DD hh:mm:ss" (UTC) or a plain number of seconds since the epoch.
  if (text.size() != 19 || text[10] != ' ' || text[13] != ':' || text[16] != ':') {
    if (auto seconds = parseFixedDigits<uint32_t>(text)) return *seconds;
    return std::unexpected(fmt::format("'{}' is not a date-time YYYY-MM-DD hh:mm:ss", text));
  }
  auto date = parseDate(text.substr(0, 10));
  if (!date) return std::unexpected(fmt::format("'{}' is not a valid date-time", text));
  auto h = parseFixedDigits<unsigned>(text.substr(11, 2));
  auto mi = parseFixedDigits<unsigned>(text.substr(14, 2));
  auto s = parseFixedDigits<unsigned>(text.substr(17, 2));
  if (!h || !mi || !s || *h > 23 || *mi > 59 || *s > 59) {
    return std::unexpected(fmt::format("'{}' is not a valid date-time", text));
  }
  const uint64_t seconds = uint64_t{*date} * 86400 + *h * 3600 + *mi * 60 + *s;
  if (seconds > UINT32_MAX) {
    return std::unexpected(fmt::format("date-time '{}' is past 2106-02-07 06:28:15", text));
  }
  return static_cast<uint32_t>(seconds);
}

}  // namespace rtable::core
