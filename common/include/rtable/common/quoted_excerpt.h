// Untrusted text (from a file or the wire) quoted for an error message. Pure function: thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace rtable::common {

// 'text' in single quotes: at most the first 80 bytes (then '... after the quote), each byte
// outside printable ASCII and the backslash as \xNN, so a message stays one short line.
std::string quotedExcerpt(std::string_view text);

}  // namespace rtable::common
