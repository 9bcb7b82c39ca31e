#include "rtable/common/percent_encoding.h"

#include <fmt/format.h>

namespace rtable::common {

std::string percentEncode(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (unsigned char c : value) {
    // Spelt out rather than std::isalnum, which depends on the locale.
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

}  // namespace rtable::common
