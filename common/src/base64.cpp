#include "rtable/common/base64.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <climits>

#include "rtable/common/quoted_excerpt.h"

namespace rtable::common {
namespace {

// EVP_EncodeBlock and EVP_DecodeBlock take an int length: bigger inputs go in chunks of whole
// groups (3 bytes in, 4 characters out).
constexpr std::size_t kEncodeChunkBytes = std::size_t{3} << 20;

bool inAlphabet(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

unsigned char* bytesOf(std::string& s) {
  return reinterpret_cast<unsigned char*>(s.data());
}
const unsigned char* bytesOf(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

}  // namespace

std::string base64Encode(std::string_view bytes) {
  // EVP_EncodeBlock writes a NUL after the text.
  std::string out((bytes.size() + 2) / 3 * 4 + 1, '\0');
  std::size_t written = 0;
  for (std::size_t at = 0; at < bytes.size(); at += kEncodeChunkBytes) {
    const std::string_view chunk = bytes.substr(at, kEncodeChunkBytes);
    written += static_cast<std::size_t>(
        EVP_EncodeBlock(bytesOf(out) + written, bytesOf(chunk), static_cast<int>(chunk.size())));
  }
  out.resize(written);
  return out;
}

std::expected<std::string, std::string> base64Decode(std::string_view text) {
  std::string clean;
  clean.reserve(text.size());
  std::size_t padding = 0;
  std::size_t first_padding = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\r' || c == '\n' || c == ' ') continue;
    // EVP_DecodeBlock reads '=' as zero bits wherever it stands, so these checks are ours.
    if (c == '=') {
      if (padding == 0) first_padding = i;
      if (++padding > 2)
        return std::unexpected(fmt::format("more than two '=' from offset {}", first_padding));
    } else if (padding > 0) {
      return std::unexpected(fmt::format("'=' at offset {} is not at the end", first_padding));
    } else if (!inAlphabet(c)) {
      return std::unexpected(fmt::format("{} at offset {} is not a base64 character",
                                         quotedExcerpt(text.substr(i, 1)), i));
    }
    clean += c;
  }
  if (clean.size() % 4 != 0) {
    return std::unexpected(
        fmt::format("{} base64 characters, not a multiple of 4 (missing padding?)", clean.size()));
  }
  if (clean.size() > static_cast<std::size_t>(INT_MAX))
    return std::unexpected("too long to decode");
  std::string out(clean.size() / 4 * 3, '\0');
  const int decoded = EVP_DecodeBlock(bytesOf(out), bytesOf(clean), static_cast<int>(clean.size()));
  if (decoded < 0)
    return std::unexpected("not valid base64");  // not reached after the checks above
  // EVP_DecodeBlock gives 3 bytes per group, padding included.
  out.resize(static_cast<std::size_t>(decoded) - padding);
  return out;
}

}  // namespace rtable::common
