#include "rtable/common/base64.h"

#include <gtest/gtest.h>

#include <string>

namespace rtable::common {
namespace {

// RFC 4648 section 10's test vectors: every padding case.
struct Vector {
  std::string bytes;
  std::string text;
};
const Vector kVectors[] = {{"", ""},
                           {"f", "Zg=="},
                           {"fo", "Zm8="},
                           {"foo", "Zm9v"},
                           {"foob", "Zm9vYg=="},
                           {"fooba", "Zm9vYmE="},
                           {"foobar", "Zm9vYmFy"}};

TEST(Base64, EncodesTheRfcVectors) {
  for (const auto& v : kVectors) EXPECT_EQ(base64Encode(v.bytes), v.text) << v.bytes;
}

TEST(Base64, DecodesTheRfcVectorsToTheExactLength) {
  for (const auto& v : kVectors) {
    auto decoded = base64Decode(v.text);
    ASSERT_TRUE(decoded) << v.text << ": " << decoded.error();
    EXPECT_EQ(*decoded, v.bytes) << v.text;
  }
}

TEST(Base64, RoundTripsEveryByteAndLength) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  // Lengths 0..257 cover every remainder mod 3 several times, and a NUL in the middle.
  for (std::size_t n = 0; n <= bytes.size() + 1; ++n) {
    const std::string in = (bytes + bytes).substr(0, n);
    const std::string text = base64Encode(in);
    EXPECT_EQ(text.size(), (n + 2) / 3 * 4);
    auto out = base64Decode(text);
    ASSERT_TRUE(out) << n << ": " << out.error();
    EXPECT_EQ(*out, in) << n;
  }
}

TEST(Base64, UsesTheStandardAlphabet) {
  EXPECT_EQ(base64Encode("\xfb\xff\xbf"), "+/+/");
  EXPECT_EQ(*base64Decode("+/+/"), "\xfb\xff\xbf");
  EXPECT_EQ(base64Encode("s3cr3t"), "czNjcjN0");  // a Secret's data, as the apiserver stores it
}

TEST(Base64, SkipsLineBreaksAndSpaces) {
  EXPECT_EQ(*base64Decode("Zm9v\nYmFy\r\n"), "foobar");
  EXPECT_EQ(*base64Decode(" Zm9v YmE= "), "fooba");
  EXPECT_EQ(*base64Decode("Zm9vYg=\n="), "foob");
}

TEST(Base64, RejectsBadInputSayingWhy) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"!!notbase64", "'!' at offset 0 is not a base64 character"},
      {"Zm9v\tYmFy", "'\\x09' at offset 4 is not a base64 character"},
      {"Zm9-", "'-' at offset 3 is not a base64 character"},  // base64url, not standard
      {"Zm9_", "'_' at offset 3 is not a base64 character"},
      {"Zm9", "3 base64 characters, not a multiple of 4 (missing padding?)"},
      {"Zg", "2 base64 characters, not a multiple of 4 (missing padding?)"},
      {"Zg=", "3 base64 characters, not a multiple of 4 (missing padding?)"},
      {"Z===", "more than two '=' from offset 1"},
      {"====", "more than two '=' from offset 0"},
      {"Zg==Zg==", "'=' at offset 2 is not at the end"},
      {"Zm=v", "'=' at offset 2 is not at the end"},
      {std::string("Zm\0v", 4), "'\\x00' at offset 2 is not a base64 character"},
  };
  for (const auto& c : cases) {
    auto decoded = base64Decode(c.text);
    ASSERT_FALSE(decoded) << c.text << " decoded to " << *decoded;
    EXPECT_EQ(decoded.error(), c.message) << c.text;
  }
}

TEST(Base64, EncodesMoreThanOneChunk) {
  // Past the 3 MiB that one EVP_EncodeBlock call is given, and not a multiple of 3.
  const std::string big((3 << 20) + 5, 'x');
  const std::string text = base64Encode(big);
  EXPECT_EQ(text.size(), (big.size() + 2) / 3 * 4);
  EXPECT_EQ(text.substr(0, 4), "eHh4");
  EXPECT_EQ(text.substr(text.size() - 4), "eHg=");
  EXPECT_EQ(*base64Decode(text), big);
}

}  // namespace
}  // namespace rtable::common
