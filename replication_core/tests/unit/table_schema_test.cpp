#include "rtable/replication_core/table_schema.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "rtable/replication_core/hash128.h"

namespace rtable::core {
namespace {

DataType type(std::string_view text) {
  auto parsed = DataType::parse(text);
  EXPECT_TRUE(parsed) << parsed.error();
  return *parsed;
}

TEST(DataType, EveryTypeRoundTrips) {
  for (const char* name : {"UInt8", "UInt16", "UInt32", "UInt64", "Int8", "Int16", "Int32", "Int64",
                           "Float32", "Float64", "String", "Date", "DateTime", "Bool",
                           "Nullable(UInt64)", "Nullable(String)", "Nullable(Date)"}) {
    EXPECT_EQ(type(name).name(), name);
  }
  auto bad = DataType::parse("Decimal(10,2)");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("unknown type 'Decimal(10,2)'"), std::string::npos);
  EXPECT_FALSE(DataType::parse("Nullable(Nullable(UInt8))"));
}

TEST(Dates, ParseAndFormatLikeClickHouse) {
  EXPECT_EQ(parseDate("1970-01-01"), 0);
  EXPECT_EQ(parseDate("2026-12-01"), 20788);
  EXPECT_EQ(formatDate(20788), "2026-12-01");
  EXPECT_EQ(parseDate("2149-06-06"), 65535);
  EXPECT_FALSE(parseDate("2149-06-07"));
  EXPECT_FALSE(parseDate("2026-02-30"));
  EXPECT_FALSE(parseDate("2026-1-01"));
  EXPECT_EQ(parseDateTime("2026-12-01 03:04:05"), 20788u * 86400 + 3 * 3600 + 4 * 60 + 5);
  EXPECT_EQ(parseDateTime("1764558000"), 1764558000u);
  EXPECT_EQ(formatDateTime(1764558000), "2025-12-01 03:00:00");
  EXPECT_FALSE(parseDateTime("2026-12-01 24:00:00"));
}

TEST(Dates, EveryDateOfTheRangeParsesBackAndNothingOutside) {
  for (uint32_t days = 0; days <= 65535; ++days) {
    const auto parsed = parseDate(formatDate(static_cast<uint16_t>(days)));
    ASSERT_TRUE(parsed) << formatDate(static_cast<uint16_t>(days));
    ASSERT_EQ(*parsed, days);
  }
  for (const char* bad :
       {"1969-12-31", "0000-01-01", "2026-00-10", "2026-13-01", "2026-04-31", "2025-02-29",
        "2026-12-0x", "2026/12/01", "+026-12-01", "-026-12-01", "2026-12-01 "}) {
    const auto parsed = parseDate(bad);
    EXPECT_FALSE(parsed) << bad;
    if (!parsed) {
      EXPECT_NE(parsed.error().find(std::string(bad).substr(0, 10)), std::string::npos);
    }
  }
  EXPECT_EQ(parseDate("2024-02-29"), 19782);
}

TEST(TableSchema, ValidationNamesTheColumn) {
  const std::vector<ColumnSpec> columns = {
      {"d", type("Date")}, {"n", type("Nullable(UInt8)")}, {"s", type("String")}};
  auto ok = TableSchema::create(columns, *PartitionKey::parse("toYYYYMM(d)"), {"s", "d"});
  ASSERT_TRUE(ok) << ok.error();
  const std::vector<std::pair<std::string, std::string>> bad_keys = {
      {"toYYYYMM(s)", "needs a Date or DateTime column, 's' is String"},
      {"n", "partition key column 'n' must not be Nullable"},
      {"missing", "names no column"},
  };
  for (const auto& [key, why] : bad_keys) {
    auto schema = TableSchema::create(columns, *PartitionKey::parse(key), {});
    ASSERT_FALSE(schema) << key;
    EXPECT_NE(schema.error().find(why), std::string::npos) << schema.error();
  }
  auto order = TableSchema::create(columns, {}, {"zz"});
  ASSERT_FALSE(order);
  EXPECT_NE(order.error().find("ORDER BY column 'zz'"), std::string::npos);
  auto twice = TableSchema::create({{"a", type("UInt8")}, {"a", type("UInt8")}}, {}, {});
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().find("column 'a' is declared twice"), std::string::npos);
  EXPECT_FALSE(TableSchema::create({{"1a", type("UInt8")}}, {}, {}));
  EXPECT_FALSE(PartitionKey::parse("toYYYYMM(a b)"));
  EXPECT_EQ(PartitionKey::parse("toYYYYMMDD(d)")->format(), "toYYYYMMDD(d)");
}

class SchemaWithRows : public ::testing::Test {
 protected:
  Block rows() {
    Block block = schema_.emptyBlock();
    std::get<std::vector<uint16_t>>(block.columns[0].values) = {20788, 20758, 20789, 20788};
    std::get<std::vector<uint32_t>>(block.columns[1].values) = {3, 1, 2, 1};
    block.columns[1].null_map = {0, 1, 0, 0};
    std::get<std::vector<std::string>>(block.columns[2].values) = {"b", "a", "c", "a"};
    return block;
  }
  TableSchema schema_ = *TableSchema::create({{"d", *DataType::parse("Date")},
                                              {"n", *DataType::parse("Nullable(UInt32)")},
                                              {"s", *DataType::parse("String")}},
                                             *PartitionKey::parse("toYYYYMM(d)"), {"n", "s"});
};

TEST_F(SchemaWithRows, SplitsByMonthInFirstSeenOrder) {
  auto parts = schema_.splitByPartition(rows());
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].first, "202612");
  EXPECT_EQ(parts[0].second.rows(), 3u);
  EXPECT_EQ(parts[1].first, "202611");
  EXPECT_EQ(std::get<std::vector<std::string>>(parts[1].second.columns[2].values),
            std::vector<std::string>{"a"});
  EXPECT_EQ(parts[1].second.columns[1].null_map, std::vector<uint8_t>{1});
}

TEST_F(SchemaWithRows, PartitionIdsFollowClickHousesRules) {
  auto daily = *TableSchema::create(schema_.columns(), *PartitionKey::parse("toYYYYMMDD(d)"), {});
  EXPECT_EQ(daily.partitionIds(rows())[0], "20261201");
  auto by_string = *TableSchema::create(schema_.columns(), *PartitionKey::parse("s"), {});
  EXPECT_EQ(by_string.partitionIds(rows())[0], hash128("b").hex());
  auto none = *TableSchema::create(schema_.columns(), {}, {});
  EXPECT_EQ(none.partitionIds(rows()), std::vector<std::string>(4, "all"));
}

// splitByPartition groups day keys by day number; it must name and group rows exactly as
// partitionIds does, for every kind of key.
TEST(TableSchema, SplitAgreesWithThePartitionIdsOfEveryRow) {
  const std::vector<ColumnSpec> columns = {{"d", *DataType::parse("Date")},
                                           {"t", *DataType::parse("DateTime")},
                                           {"s", *DataType::parse("String")},
                                           {"u", *DataType::parse("UInt16")}};
  Block block;
  for (const auto& c : columns) block.columns.push_back(Column::empty(c.name, c.type));
  auto& d = std::get<std::vector<uint16_t>>(block.columns[0].values);
  auto& t = std::get<std::vector<uint32_t>>(block.columns[1].values);
  auto& s = std::get<std::vector<std::string>>(block.columns[2].values);
  auto& u = std::get<std::vector<uint16_t>>(block.columns[3].values);
  for (uint32_t i = 0; i < 500; ++i) {
    d.push_back(static_cast<uint16_t>(20700 + (i * 7919) % 120));  // days over four months, mixed
    t.push_back(1764558000u + (i * 104729u) % (90u * 86400u));
    s.push_back(std::string(1, static_cast<char>('a' + i % 5)));
    u.push_back(static_cast<uint16_t>(i % 3));
  }
  for (const char* key :
       {"toYYYYMM(d)", "toYYYYMMDD(d)", "d", "toYYYYMM(t)", "toYYYYMMDD(t)", "t", "s", "u", ""}) {
    auto schema = TableSchema::create(columns, *PartitionKey::parse(key), {});
    ASSERT_TRUE(schema) << key;
    const auto ids = schema->partitionIds(block);
    std::vector<std::pair<std::string, std::vector<std::size_t>>> expected;
    for (std::size_t row = 0; row < ids.size(); ++row) {
      auto it = std::find_if(expected.begin(), expected.end(),
                             [&](const auto& g) { return g.first == ids[row]; });
      if (it == expected.end()) it = expected.insert(expected.end(), {ids[row], {}});
      it->second.push_back(row);
    }
    const auto parts = schema->splitByPartition(block);
    ASSERT_EQ(parts.size(), expected.size()) << key;
    for (std::size_t g = 0; g < parts.size(); ++g) {
      EXPECT_EQ(parts[g].first, expected[g].first) << key;
      EXPECT_EQ(parts[g].second, block.select(expected[g].second)) << key;
    }
  }
  EXPECT_GT(TableSchema::create(columns, *PartitionKey::parse("toYYYYMMDD(d)"), {})
                ->splitByPartition(block)
                .size(),
            100u);
}

TEST_F(SchemaWithRows, SortsByOrderByWithNullsLastAndStably) {
  // n: 3, NULL, 2, 1 ; s: b, a, c, a  -> (1,a) row 3, (2,c) row 2, (3,b) row 0, (NULL,a) row 1
  EXPECT_EQ(schema_.sortPermutation(rows()), (std::vector<std::size_t>{3, 2, 0, 1}));
  auto unsorted = *TableSchema::create(schema_.columns(), {}, {});
  EXPECT_EQ(unsorted.sortPermutation(rows()), (std::vector<std::size_t>{0, 1, 2, 3}));
}

// A strictly increasing first key decides the order alone (the typed pass); a repeat in it, a
// NaN or a NULL leaves the order to all the keys.
TEST(SortPermutation, AStrictlyIncreasingFirstKeyDecidesAlone) {
  auto schema = *TableSchema::create(
      {{"x", *DataType::parse("Float64")}, {"s", *DataType::parse("String")}}, {}, {"x", "s"});
  auto block = [&](std::vector<double> x, std::vector<std::string> s) {
    Block rows = schema.emptyBlock();
    std::get<std::vector<double>>(rows.columns[0].values) = std::move(x);
    std::get<std::vector<std::string>>(rows.columns[1].values) = std::move(s);
    return rows;
  };
  using Order = std::vector<std::size_t>;
  EXPECT_EQ(schema.sortPermutation(block({1, 2, 3}, {"c", "b", "a"})), (Order{0, 1, 2}));
  EXPECT_EQ(schema.sortPermutation(block({1, 2, 2}, {"c", "b", "a"})), (Order{0, 2, 1}));
  EXPECT_EQ(schema.sortPermutation(block({1, std::nan(""), 3}, {"a", "b", "c"})), (Order{0, 2, 1}));
  EXPECT_EQ(schema.sortPermutation(block({3, 2, 1}, {"a", "b", "c"})), (Order{2, 1, 0}));
}

TEST(Hash128, IsStableAndLengthPrefixed) {
  EXPECT_EQ(hash128("").hex().size(), 32u);
  Hasher128 a;
  a.updateString("ab");
  a.updateString("c");
  Hasher128 b;
  b.updateString("a");
  b.updateString("bc");
  EXPECT_NE(a.digest(), b.digest());
  Hasher128 c;
  c.update("abc");
  EXPECT_EQ(c.digest(), hash128("abc"));
}

}  // namespace
}  // namespace rtable::core
