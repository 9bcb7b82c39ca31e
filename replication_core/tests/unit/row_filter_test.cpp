#include "rtable/replication_core/row_filter.h"

#include <gtest/gtest.h>

namespace rtable::core {
namespace {

class RowFilterTest : public ::testing::Test {
 protected:
  RowFilterTest() {
    std::get<std::vector<uint16_t>>(block_.columns[0].values) = {
        *parseDate("2026-12-01"), *parseDate("2026-11-30"), *parseDate("2026-12-02")};
    std::get<std::vector<int64_t>>(block_.columns[1].values) = {5, -3, 10};
    std::get<std::vector<std::string>>(block_.columns[2].values) = {"it's", "", "b"};
    block_.columns[2].null_map = {0, 1, 0};
  }
  std::vector<std::size_t> rows(std::string_view where) {
    auto filter = RowFilter::parse(where, schema_);
    EXPECT_TRUE(filter) << filter.error();
    return filter ? filter->matchingRows(block_) : std::vector<std::size_t>{};
  }
  TableSchema schema_ = *TableSchema::create({{"d", *DataType::parse("Date")},
                                              {"x", *DataType::parse("Int64")},
                                              {"s", *DataType::parse("Nullable(String)")}},
                                             {}, {});
  Block block_ = schema_.emptyBlock();
};

TEST_F(RowFilterTest, ComparesWithTypedLiterals) {
  EXPECT_EQ(rows(""), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(rows("x > 0"), (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(rows("x>=-3 and x<10"), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(rows("d >= '2026-12-01' AND x != 10"), (std::vector<std::size_t>{0}));
  EXPECT_EQ(rows("s = 'it''s'"), (std::vector<std::size_t>{0}));
  EXPECT_EQ(rows("s = 'it\\'s'"), (std::vector<std::size_t>{0}));
  // NULL compares false; IS NULL finds it.
  EXPECT_EQ(rows("s != 'b'"), (std::vector<std::size_t>{0}));
  EXPECT_EQ(rows("s IS NULL"), (std::vector<std::size_t>{1}));
  EXPECT_EQ(rows("s is not null"), (std::vector<std::size_t>{0, 2}));
}

TEST_F(RowFilterTest, ErrorsNameTheColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"zz = 1", "unknown column 'zz'"},
      {"x = 'abc'", "column 'x' (Int64): 'abc' is not a number"},
      {"d = '2026-13-01'", "column 'd' (Date)"},
      {"x 5", "column 'x': expected an operator"},
      {"x = 1 OR x = 2", "expected AND"},
      {"s = 'open", "a quoted value is not closed"},
      {"x =", "a value is missing"},
  };
  for (const auto& [where, why] : cases) {
    auto filter = RowFilter::parse(where, schema_);
    ASSERT_FALSE(filter) << where;
    EXPECT_NE(filter.error().find(why), std::string::npos) << filter.error();
  }
}

}  // namespace
}  // namespace rtable::core
