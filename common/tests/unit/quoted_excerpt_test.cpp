#include "rtable/common/quoted_excerpt.h"

#include <gtest/gtest.h>

#include <string>

namespace rtable::common {
namespace {

TEST(QuotedExcerpt, QuotesPrintableText) {
  EXPECT_EQ(quotedExcerpt("HTTP/1.1 200 OK"), "'HTTP/1.1 200 OK'");
  EXPECT_EQ(quotedExcerpt(""), "''");
}

TEST(QuotedExcerpt, EscapesControlBytesHighBytesAndTheBackslash) {
  EXPECT_EQ(quotedExcerpt(std::string("a\tb\r\n\0\x7f\xff\\", 9)),
            "'a\\x09b\\x0d\\x0a\\x00\\x7f\\xff\\x5c'");
}

TEST(QuotedExcerpt, CutsAfterEightyBytes) {
  const std::string eighty(80, 'x');
  EXPECT_EQ(quotedExcerpt(eighty), "'" + eighty + "'");
  EXPECT_EQ(quotedExcerpt(eighty + "y"), "'" + eighty + "'...");
}

}  // namespace
}  // namespace rtable::common
