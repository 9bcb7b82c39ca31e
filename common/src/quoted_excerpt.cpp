#include "rtable/common/quoted_excerpt.h"

#include <fmt/format.h>

namespace rtable::common {

std::string quotedExcerpt(std::string_view text) {
  // Enough for a header line or a file name, short enough for a log line.
  constexpr std::size_t kMaxBytes = 80;
  std::string out = "'";
  for (char c : text.substr(0, kMaxBytes)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    }
  }
  out += text.size() > kMaxBytes ? "'..." : "'";
  return out;
}

}  // namespace rtable::common
