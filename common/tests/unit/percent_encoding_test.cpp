#include "rtable/common/percent_encoding.h"

#include <gtest/gtest.h>

#include <string>

namespace rtable::common {
namespace {

TEST(PercentEncode, KeepsTheUnreservedCharacters) {
  EXPECT_EQ(percentEncode("aZ09-_.~"), "aZ09-_.~");
  EXPECT_EQ(percentEncode("all_1_1_0"), "all_1_1_0");  // a part name
  EXPECT_EQ(percentEncode(""), "");
}

TEST(PercentEncode, EncodesEverythingElseInUpperCaseHex) {
  EXPECT_EQ(percentEncode("a=b,c!=d"), "a%3Db%2Cc%21%3Dd");
  EXPECT_EQ(percentEncode("x in (a, b)"), "x%20in%20%28a%2C%20b%29");
  EXPECT_EQ(percentEncode("+/&?#%"), "%2B%2F%26%3F%23%25");
  EXPECT_EQ(percentEncode("id >= 2 AND score IS NOT NULL"),
            "id%20%3E%3D%202%20AND%20score%20IS%20NOT%20NULL");
}

TEST(PercentEncode, EncodesEachByteOfUtf8AndControlBytes) {
  EXPECT_EQ(percentEncode("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(percentEncode(std::string("\0\n\x7f\xff", 4)), "%00%0A%7F%FF");
}

}  // namespace
}  // namespace rtable::common
