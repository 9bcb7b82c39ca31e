// Command-line values of the benches: a bad one is refused with a line naming the flag (exit 2),
// never thrown from std::stoi or read as zero.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

namespace rtable::bench {

// `text` as a whole number from `min` to `max`, or why not: "--clients: expected a whole number
// from 1 to 10000, got 'x'".
inline std::expected<int64_t, std::string> wholeNumber(std::string_view flag, std::string_view text,
                                                       int64_t min, int64_t max) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return std::unexpected(
        fmt::format("{}: expected a whole number from {} to {}, got '{}'", flag, min, max, text));
  }
  return value;
}

// Whether --help or -h is among the arguments (the usage then goes to stdout, exit 0).
inline bool wantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return true;
  }
  return false;
}

// The flags come as "--flag value" pairs: a last flag without its value is an error.
inline std::expected<void, std::string> pairedFlags(int argc, char** argv) {
  if (argc % 2 == 0) return std::unexpected(fmt::format("{} needs a value", argv[argc - 1]));
  return {};
}

}  // namespace rtable::bench
