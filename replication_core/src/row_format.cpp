#include "rtable/replication_core/row_format.h"

#include <fmt/format.h>
#include <simdjson.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

// JSON is read by a hand-written scanner rather than nlohmann::json: a row is one flat object, so
// values go straight from the input bytes into the typed columns with no DOM, no per-row
// allocation and no number conversion before the column's type is known (a UInt64 or a value like
// 1.0 must be judged from its text), and errors can quote the offending text.
//
// Bulk JSON goes through simdjson first (fastJsonRows): its SIMD structural scan and string
// unescaping read the rows, the values' conversions stay this file's own (appendText,
// readJsonValue), so what is accepted and how it is stored is the same. Anything it does not take
// as it stands (a malformed row, an unknown key, a value of another kind) sends the whole chunk
// back to the scanner below, which then gives the exact error with its row and column.

namespace rtable::core {
namespace {

// A bad value is quoted in an error up to this many bytes.
constexpr std::size_t kMaxQuotedValue = 64;
constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

std::string quoteValue(std::string_view text) {
  if (text.size() <= kMaxQuotedValue) return fmt::format("'{}'", text);
  return fmt::format("'{}...'", text.substr(0, kMaxQuotedValue));
}

// memchr over [p, end) that is fine with an empty range; `end` if `c` is not there.
const char* findByte(const char* p, const char* end, char c) {
  if (p == end) return end;
  const void* found = std::memchr(p, c, end - p);
  return found ? static_cast<const char*>(found) : end;
}

#if defined(__SSE2__)
// Bit i set when p[i] == c, for the 64 bytes at p.
inline uint64_t byteMask64(const char* p, char c) {
  const __m128i wanted = _mm_set1_epi8(c);
  uint64_t mask = 0;
  for (int i = 0; i < 4; ++i) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i));
    mask |= static_cast<uint64_t>(
                static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, wanted))))
            << (16 * i);
  }
  return mask;
}

// Bit i becomes the parity of bits 0..i: with quote positions in, the bytes from an opening quote
// up to (not including) its closing one.
inline uint64_t prefixXor(uint64_t x) {
  x ^= x << 1;
  x ^= x << 2;
  x ^= x << 4;
  x ^= x << 8;
  x ^= x << 16;
  x ^= x << 32;
  return x;
}
#endif

// What follows p in an error: "'x'" or "end of data".
std::string describeNext(const char* p, const char* end) {
  if (p == end) return "end of data";
  return fmt::format("'{}'", *p);
}

// ---------------------------------------------------------------------------------------------
// Values from text: TSV and CSV fields, and JSON strings given for non-String columns.

enum class NumberError { kSyntax, kRange };

// Optional sign and decimal digits only, as ClickHouse reads them; "-0" fits an unsigned type.
template <class T>
std::expected<T, NumberError> parseIntegerText(std::string_view text) {
  std::size_t i = 0;
  bool negative = false;
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
    negative = text[0] == '-';
    i = 1;
  }
  if (i == text.size()) return std::unexpected(NumberError::kSyntax);
  uint64_t magnitude = 0;
  bool overflow = false;
  for (; i < text.size(); ++i) {
    const unsigned digit = static_cast<unsigned char>(text[i]) - unsigned{'0'};
    if (digit > 9) return std::unexpected(NumberError::kSyntax);
    if (magnitude > (UINT64_MAX - digit) / 10) {
      overflow = true;
    } else {
      magnitude = magnitude * 10 + digit;
    }
  }
  if (overflow) return std::unexpected(NumberError::kRange);
  if constexpr (std::is_unsigned_v<T>) {
    if ((negative && magnitude != 0) || magnitude > std::numeric_limits<T>::max()) {
      return std::unexpected(NumberError::kRange);
    }
    return static_cast<T>(magnitude);
  } else {
    const uint64_t limit = uint64_t(std::numeric_limits<T>::max()) + (negative ? 1 : 0);
    if (magnitude > limit) return std::unexpected(NumberError::kRange);
    return negative ? static_cast<T>(0 - magnitude) : static_cast<T>(magnitude);
  }
}

// Decimal or exponent form, "nan", "inf", "infinity" (any case, optional sign). Underflow gives
// zero, as strtod does; overflow is an error.
template <class F>
std::expected<F, NumberError> parseFloatText(std::string_view text) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-' && text[1] != '+') text.remove_prefix(1);
  const char* begin = text.data();
  const char* end = begin + text.size();
  F value{};
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    return std::unexpected(NumberError::kSyntax);
  }
  if (ec == std::errc::result_out_of_range) {
    long double wide = 0;
    auto [wide_ptr, wide_ec] = std::from_chars(begin, end, wide);
    if (wide_ec == std::errc() && wide_ptr == end && std::fabs(wide) < 1) {
      return static_cast<F>(wide);
    }
    return std::unexpected(NumberError::kRange);
  }
  return value;
}

// "1.5", "2e3": a number, just not an integer.
bool isFractionalNumber(std::string_view text) {
  if (text.find_first_of(".eE") == std::string_view::npos) return false;
  auto value = parseFloatText<double>(text);
  return value && std::isfinite(*value);
}

std::optional<uint8_t> parseBoolText(std::string_view text) {
  if (text == "true" || text == "1") return 1;
  if (text == "false" || text == "0") return 0;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Where a parsed value goes: one column of the block being filled.

struct ColumnSink {
  const ColumnSpec* spec = nullptr;
  std::string base_type;    // "UInt8" also for Nullable(UInt8): errors name the value's type
  std::string quoted_name;  // the name and the closing quote, as a raw JSON key ends
  void* values = nullptr;   // std::vector<T>* of the column's storage type
  std::vector<uint8_t>* null_map = nullptr;

  template <class T>
  std::vector<T>& as() const {
    return *static_cast<std::vector<T>*>(values);
  }
  void markPresent() const {
    if (spec->type.nullable) null_map->push_back(0);
  }
};

template <class F>
decltype(auto) withStorageType(TypeId id, F&& f) {
  switch (id) {
    case TypeId::kUInt8:
    case TypeId::kBool:
      return f(std::type_identity<uint8_t>{});
    case TypeId::kUInt16:
    case TypeId::kDate:
      return f(std::type_identity<uint16_t>{});
    case TypeId::kUInt32:
    case TypeId::kDateTime:
      return f(std::type_identity<uint32_t>{});
    case TypeId::kUInt64:
      return f(std::type_identity<uint64_t>{});
    case TypeId::kInt8:
      return f(std::type_identity<int8_t>{});
    case TypeId::kInt16:
      return f(std::type_identity<int16_t>{});
    case TypeId::kInt32:
      return f(std::type_identity<int32_t>{});
    case TypeId::kInt64:
      return f(std::type_identity<int64_t>{});
    case TypeId::kFloat32:
      return f(std::type_identity<float>{});
    case TypeId::kFloat64:
      return f(std::type_identity<double>{});
    case TypeId::kString:
      return f(std::type_identity<std::string>{});
  }
  std::unreachable();
}

// The type's default value: 0, "", 1970-01-01, false.
void appendDefault(const ColumnSink& sink) {
  withStorageType(sink.spec->type.id,
                  [&]<class T>(std::type_identity<T>) { sink.as<T>().emplace_back(); });
  sink.markPresent();
}

// NULL: the default value under a 1 in the null map. The column must be Nullable.
void appendNull(const ColumnSink& sink) {
  withStorageType(sink.spec->type.id,
                  [&]<class T>(std::type_identity<T>) { sink.as<T>().emplace_back(); });
  sink.null_map->push_back(1);
}

using ValueResult = std::expected<void, std::string>;

template <class T>
ValueResult appendInteger(const ColumnSink& sink, std::string_view text) {
  auto value = parseIntegerText<T>(text);
  if (!value) {
    if (value.error() == NumberError::kRange) {
      return std::unexpected(
          fmt::format("value {} is out of range for {}", quoteValue(text), sink.base_type));
    }
    if (isFractionalNumber(text)) {
      return std::unexpected(fmt::format("value {} is not a valid {}: not an integer",
                                         quoteValue(text), sink.base_type));
    }
    return std::unexpected(
        fmt::format("value {} is not a valid {}", quoteValue(text), sink.base_type));
  }
  sink.as<T>().push_back(*value);
  sink.markPresent();
  return {};
}

template <class F>
ValueResult appendFloat(const ColumnSink& sink, std::string_view text) {
  auto value = parseFloatText<F>(text);
  if (!value) {
    return std::unexpected(
        fmt::format("value {} {} {}", quoteValue(text),
                    value.error() == NumberError::kRange ? "is out of range for" : "is not a valid",
                    sink.base_type));
  }
  sink.as<F>().push_back(*value);
  sink.markPresent();
  return {};
}

// block.h's message names the value; a very long value gets a short message instead.
template <class T>
ValueResult appendDateLike(const ColumnSink& sink, std::string_view text,
                           std::expected<T, std::string> parsed) {
  if (!parsed) {
    if (text.size() <= kMaxQuotedValue) return std::unexpected(std::move(parsed.error()));
    return std::unexpected(
        fmt::format("value {} is not a valid {}", quoteValue(text), sink.base_type));
  }
  sink.as<T>().push_back(*parsed);
  sink.markPresent();
  return {};
}

// One value in its plain text form (a TSV field after unescaping, a CSV field after unquoting).
ValueResult appendText(const ColumnSink& sink, std::string_view text) {
  switch (sink.spec->type.id) {
    case TypeId::kUInt8:
      return appendInteger<uint8_t>(sink, text);
    case TypeId::kUInt16:
      return appendInteger<uint16_t>(sink, text);
    case TypeId::kUInt32:
      return appendInteger<uint32_t>(sink, text);
    case TypeId::kUInt64:
      return appendInteger<uint64_t>(sink, text);
    case TypeId::kInt8:
      return appendInteger<int8_t>(sink, text);
    case TypeId::kInt16:
      return appendInteger<int16_t>(sink, text);
    case TypeId::kInt32:
      return appendInteger<int32_t>(sink, text);
    case TypeId::kInt64:
      return appendInteger<int64_t>(sink, text);
    case TypeId::kFloat32:
      return appendFloat<float>(sink, text);
    case TypeId::kFloat64:
      return appendFloat<double>(sink, text);
    case TypeId::kString:
      sink.as<std::string>().emplace_back(text);
      sink.markPresent();
      return {};
    case TypeId::kDate:
      return appendDateLike<uint16_t>(sink, text, parseDate(text));
    case TypeId::kDateTime:
      return appendDateLike<uint32_t>(sink, text, parseDateTime(text));
    case TypeId::kBool: {
      auto value = parseBoolText(text);
      if (!value) {
        return std::unexpected(
            fmt::format("value {} is not a valid Bool (true, false, 1 or 0)", quoteValue(text)));
      }
      sink.as<uint8_t>().push_back(*value);
      sink.markPresent();
      return {};
    }
  }
  std::unreachable();
}

// ---------------------------------------------------------------------------------------------
// JSON pieces.

bool isJsonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

const char* skipJsonSpace(const char* p, const char* end) {
  while (p != end && isJsonSpace(*p)) ++p;
  return p;
}

bool isJsonNumber(std::string_view t) {
  std::size_t i = 0;
  const std::size_t n = t.size();
  auto digits = [&] {
    const std::size_t start = i;
    while (i < n && t[i] >= '0' && t[i] <= '9') ++i;
    return i > start;
  };
  if (i < n && t[i] == '-') ++i;
  if (i < n && t[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < n && t[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < n && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == n;
}

std::optional<unsigned> parseHex4(const char* p, const char* end) {
  if (end - p < 4) return std::nullopt;
  unsigned value = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = p[i];
    unsigned digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return value;
}

void appendUtf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// Reads the JSON string at p (at its opening quote) and moves p past the closing quote. Without
// escapes the result points into the input; with escapes it is decoded into `scratch`. Bytes are
// taken as they are (no UTF-8 check), as ClickHouse does.
std::expected<std::string_view, std::string> readJsonString(const char*& p, const char* end,
                                                            std::string& scratch) {
  ++p;
  const char* start = p;
  while (p != end && *p != '"' && *p != '\\') ++p;
  if (p == end) return std::unexpected("unterminated string");
  if (*p == '"') return std::string_view(start, p++ - start);
  scratch.assign(start, p);
  while (true) {
    const char* run = p;
    while (p != end && *p != '"' && *p != '\\') ++p;
    scratch.append(run, p);
    if (p == end) return std::unexpected("unterminated string");
    if (*p == '"') {
      ++p;
      return std::string_view(scratch);
    }
    ++p;  // the backslash
    if (p == end) return std::unexpected("unterminated string");
    const char escape = *p++;
    switch (escape) {
      case '"':
        scratch += '"';
        break;
      case '\\':
        scratch += '\\';
        break;
      case '/':
        scratch += '/';
        break;
      case 'b':
        scratch += '\b';
        break;
      case 'f':
        scratch += '\f';
        break;
      case 'n':
        scratch += '\n';
        break;
      case 'r':
        scratch += '\r';
        break;
      case 't':
        scratch += '\t';
        break;
      case 'u': {
        auto unit = parseHex4(p, end);
        if (!unit) return std::unexpected("invalid \\u escape: expected 4 hex digits");
        p += 4;
        uint32_t code_point = *unit;
        if (code_point >= 0xD800 && code_point <= 0xDBFF) {
          std::optional<unsigned> low;
          if (end - p >= 2 && p[0] == '\\' && p[1] == 'u') low = parseHex4(p + 2, end);
          if (!low || *low < 0xDC00 || *low > 0xDFFF) {
            return std::unexpected(fmt::format(
                "invalid \\u escape: high surrogate \\u{:04X} is not followed by a low one",
                code_point));
          }
          p += 6;
          code_point = 0x10000 + ((code_point - 0xD800) << 10) + (*low - 0xDC00);
        } else if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
          return std::unexpected(
              fmt::format("invalid \\u escape: lone low surrogate \\u{:04X}", code_point));
        }
        appendUtf8(scratch, code_point);
        break;
      }
      default:
        return std::unexpected(fmt::format("invalid escape '\\{}' in a string", escape));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// TSV pieces.

// ClickHouse's TabSeparated escapes, plus any other punctuation or space standing for itself (as
// ClickHouse reads "\x" for an x it does not know). A letter or digit it does not know, "\N"
// inside a value and a lone backslash at the end are errors.
ValueResult unescapeTsv(std::string_view field, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < field.size(); ++i) {
    const char c = field[i];
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i == field.size()) return std::unexpected("a lone '\\' at the end of the value");
    const char e = field[i];
    switch (e) {
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case '0':
        out += '\0';
        break;
      case 'a':
        out += '\a';
        break;
      case 'v':
        out += '\v';
        break;
      case 'e':
        out += '\x1B';
        break;
      case 'N':
        return std::unexpected("'\\N' (NULL) must be the whole value");
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
          return std::unexpected(fmt::format("invalid escape '\\{}'", e));
        }
        out += e;
    }
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Output.

template <class T>
void appendInteger(std::string& out, T value) {
  char buffer[24];
  auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, ptr);
}

// Shortest text that reads back to the same value; "nan", "inf", "-inf" as ClickHouse prints them.
template <class F>
void appendFloatText(std::string& out, F value) {
  if (std::isnan(value)) {
    out += "nan";
  } else if (std::isinf(value)) {
    out += value < 0 ? "-inf" : "inf";
  } else {
    char buffer[64];
    auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
    out.append(buffer, ptr);
  }
}

// Length of the valid UTF-8 sequence at s[i] (2..4), or 0 if it is not one.
std::size_t utf8SequenceLength(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  std::size_t length;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0) low = 0xA0;   // no overlong forms
    if (c == 0xED) high = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0) low = 0x90;
    if (c == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

// A JSON string as ClickHouse writes one: control characters, '"', '\' and '/' escaped, U+2028 and
// U+2029 escaped (they end lines in JavaScript), and bytes that are not UTF-8 replaced by U+FFFD,
// so the output is always valid JSON.
void appendJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t run = 0;
  auto flush = [&](std::size_t i) { out.append(s.data() + run, i - run); };
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\' && c != '/') {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const std::size_t length = utf8SequenceLength(s, i);
      if (length == 3 && c == 0xE2 && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
          (static_cast<unsigned char>(s[i + 2]) & 0xFE) == 0xA8) {
        flush(i);
        out += static_cast<unsigned char>(s[i + 2]) == 0xA8 ? "\\u2028" : "\\u2029";
      } else if (length != 0) {
        i += length;
        continue;
      } else {
        flush(i);
        out += "\xEF\xBF\xBD";
        run = i + 1;
        ++i;
        continue;
      }
      i += 3;
      run = i;
      continue;
    }
    flush(i);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '/':
        out += "\\/";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
    }
    ++i;
    run = i;
  }
  flush(s.size());
  out += '"';
}

// ClickHouse's TabSeparated escaping (writeEscapedString).
void appendTsvEscaped(std::string& out, std::string_view s) {
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char* escaped = nullptr;
    switch (s[i]) {
      case '\t':
        escaped = "\\t";
        break;
      case '\n':
        escaped = "\\n";
        break;
      case '\r':
        escaped = "\\r";
        break;
      case '\b':
        escaped = "\\b";
        break;
      case '\f':
        escaped = "\\f";
        break;
      case '\0':
        escaped = "\\0";
        break;
      case '\\':
        escaped = "\\\\";
        break;
      case '\'':
        escaped = "\\'";
        break;
      default:
        continue;
    }
    out.append(s.data() + run, i - run);
    out += escaped;
    run = i + 1;
  }
  out.append(s.data() + run, s.size() - run);
}

void appendCsvQuoted(std::string& out, std::string_view s) {
  out += '"';
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '"') continue;
    out.append(s.data() + run, i + 1 - run);
    out += '"';
    run = i + 1;
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

// A string-like value (String, Date, DateTime) in the format's quoting.
void appendQuotedText(std::string& out, RowFormat format, std::string_view text) {
  switch (format) {
    case RowFormat::kJSONEachRow:
      appendJsonString(out, text);
      return;
    case RowFormat::kTabSeparated:
      appendTsvEscaped(out, text);
      return;
    case RowFormat::kCSV:
      appendCsvQuoted(out, text);
      return;
  }
}

void appendValue(std::string& out, const Column& column, std::size_t row, RowFormat format) {
  if (column.isNull(row)) {
    out += format == RowFormat::kJSONEachRow ? "null" : "\\N";
    return;
  }
  switch (column.type.id) {
    case TypeId::kUInt8:
      appendInteger(out, std::get<std::vector<uint8_t>>(column.values)[row]);
      return;
    case TypeId::kUInt16:
      appendInteger(out, std::get<std::vector<uint16_t>>(column.values)[row]);
      return;
    case TypeId::kUInt32:
      appendInteger(out, std::get<std::vector<uint32_t>>(column.values)[row]);
      return;
    case TypeId::kUInt64:
      appendInteger(out, std::get<std::vector<uint64_t>>(column.values)[row]);
      return;
    case TypeId::kInt8:
      appendInteger(out, std::get<std::vector<int8_t>>(column.values)[row]);
      return;
    case TypeId::kInt16:
      appendInteger(out, std::get<std::vector<int16_t>>(column.values)[row]);
      return;
    case TypeId::kInt32:
      appendInteger(out, std::get<std::vector<int32_t>>(column.values)[row]);
      return;
    case TypeId::kInt64:
      appendInteger(out, std::get<std::vector<int64_t>>(column.values)[row]);
      return;
    case TypeId::kFloat32:
    case TypeId::kFloat64: {
      const double value = column.type.id == TypeId::kFloat32
                               ? double{std::get<std::vector<float>>(column.values)[row]}
                               : std::get<std::vector<double>>(column.values)[row];
      // JSON has no NaN or infinity: they are written quoted ("nan", "inf", "-inf"), as ClickHouse
      // does with output_format_json_quote_denormals=1, so they read back; its default is null.
      const bool quote = format == RowFormat::kJSONEachRow && !std::isfinite(value);
      if (quote) out += '"';
      if (column.type.id == TypeId::kFloat32) {
        appendFloatText(out, std::get<std::vector<float>>(column.values)[row]);
      } else {
        appendFloatText(out, value);
      }
      if (quote) out += '"';
      return;
    }
    case TypeId::kString:
      appendQuotedText(out, format, std::get<std::vector<std::string>>(column.values)[row]);
      return;
    case TypeId::kDate: {
      const std::string text = formatDate(std::get<std::vector<uint16_t>>(column.values)[row]);
      if (format == RowFormat::kTabSeparated) {
        out += text;
      } else {
        out += '"';
        out += text;
        out += '"';
      }
      return;
    }
    case TypeId::kDateTime: {
      const std::string text = formatDateTime(std::get<std::vector<uint32_t>>(column.values)[row]);
      if (format == RowFormat::kTabSeparated) {
        out += text;
      } else {
        out += '"';
        out += text;
        out += '"';
      }
      return;
    }
    case TypeId::kBool:
      out += std::get<std::vector<uint8_t>>(column.values)[row] != 0 ? "true" : "false";
      return;
  }
}

struct FieldError {
  std::string column;  // empty if not about one column
  std::string message;
};
using RowResult = std::expected<void, FieldError>;

std::unexpected<FieldError> fieldError(std::string_view column, std::string message) {
  return std::unexpected(FieldError{std::string(column), std::move(message)});
}

// Where a CSV row's scan stands, kept across chunks.
enum class CsvScan : uint8_t { kFieldStart, kUnquoted, kQuoted, kQuoteInQuoted };

}  // namespace

// ---------------------------------------------------------------------------------------------

std::expected<RowFormat, std::string> parseRowFormat(std::string_view name) {
  if (name == "JSONEachRow" || name == "JSONLines" || name == "NDJSON")
    return RowFormat::kJSONEachRow;
  if (name == "TabSeparated" || name == "TSV") return RowFormat::kTabSeparated;
  if (name == "CSV") return RowFormat::kCSV;
  return std::unexpected(fmt::format(
      "unknown format '{}' (accepted: JSONEachRow, JSONLines, NDJSON, TabSeparated, TSV, CSV)",
      name));
}

std::string_view rowFormatName(RowFormat format) {
  switch (format) {
    case RowFormat::kJSONEachRow:
      return "JSONEachRow";
    case RowFormat::kTabSeparated:
      return "TabSeparated";
    case RowFormat::kCSV:
      return "CSV";
  }
  return "JSONEachRow";
}

std::string ParseError::toString() const {
  if (column.empty()) return fmt::format("row {}: {}", row, message);
  return fmt::format("row {}, column '{}': {}", row, column, message);
}

// Rows are found first (the scan state survives chunk ends, so a row split across chunks is
// scanned once), then parsed from one contiguous view: in place in the chunk when the row lies
// inside it, else from `pending`, which holds the unfinished row.
struct RowParser::State {
  State(const TableSchema& schema, RowFormat format_, std::size_t max_block_rows_, bool fast_json_)
      : columns(schema.columns()),
        format(format_),
        max_block_rows(std::max<std::size_t>(1, max_block_rows_)),
        fast_json(fast_json_ && format_ == RowFormat::kJSONEachRow) {
    sinks.resize(columns.size());
    for (std::size_t i = 0; i < columns.size(); ++i) {
      sinks[i].spec = &columns[i];
      sinks[i].base_type = DataType{columns[i].type.id, false}.name();
      sinks[i].quoted_name = columns[i].name + '"';
    }
    seen.resize(columns.size());
    startBlock();
  }

  void startBlock() {
    block.columns.clear();
    for (const auto& column : columns)
      block.columns.push_back(Column::empty(column.name, column.type));
    for (std::size_t i = 0; i < columns.size(); ++i) {
      sinks[i].values = std::visit([](auto& v) -> void* { return &v; }, block.columns[i].values);
      sinks[i].null_map = &block.columns[i].null_map;
    }
    rows_in_block = 0;
  }

  void emitBlock(const BlockSink& on_block) {
    on_block(std::move(block));
    startBlock();
  }

  std::unexpected<ParseError> fail(std::string column, std::string message) {
    error = ParseError{rows + 1, std::move(column), std::move(message)};
    return std::unexpected(*error);
  }

  std::expected<void, ParseError> feed(std::string_view chunk, const BlockSink& on_block) {
    if (error) return std::unexpected(*error);
    if (finished) return fail("", "data after the end of the stream");
    if (!bom_checked) {
      // A UTF-8 byte order mark at the start is skipped, as ClickHouse does. It may come split.
      const std::size_t take = std::min(kUtf8Bom.size() - head.size(), chunk.size());
      head.append(chunk.substr(0, take));
      chunk.remove_prefix(take);
      if (head.size() < kUtf8Bom.size() && kUtf8Bom.starts_with(head)) return {};
      bom_checked = true;
      if (head == kUtf8Bom) head.clear();
      // The first bytes with the rest of the chunk, so that its rows are read in one piece.
      std::string start = std::move(head);
      start.append(chunk);
      return consume(start, on_block);
    }
    return consume(chunk, on_block);
  }

  std::expected<void, ParseError> finish(const BlockSink& on_block) {
    if (error) return std::unexpected(*error);
    if (finished) return {};
    if (!bom_checked) {
      bom_checked = true;
      const std::string start = std::move(head);
      if (auto ok = consume(start, on_block); !ok) return ok;
    }
    if (!pending.empty()) {
      // The last row without its line break; for JSON an unfinished object, which fails.
      std::string row = std::move(pending);
      pending.clear();
      if (!acceptRow(row, on_block)) return std::unexpected(*error);
    }
    if (rows_in_block > 0) emitBlock(on_block);
    finished = true;
    return {};
  }

  std::expected<void, ParseError> consume(std::string_view chunk, const BlockSink& on_block) {
    std::size_t pos = 0;
    bool fast_tried = !fast_json;
    while (pos < chunk.size()) {
      // Once the row an earlier chunk left unfinished is done: the whole rows that follow through
      // simdjson; what it leaves (an unfinished last row, or all when it declined) goes on below.
      if (!fast_tried && pending.empty()) {
        fast_tried = true;
        pos += fastJsonRows(chunk.substr(pos), on_block);
        if (pos == chunk.size()) break;
      }
      const bool in_row = !pending.empty();
      if (!in_row) {
        if (format == RowFormat::kJSONEachRow) {
          while (pos < chunk.size() && isJsonSpace(chunk[pos])) ++pos;
          if (pos == chunk.size()) break;
          if (chunk[pos] != '{') {
            return fail("",
                        fmt::format("expected '{{' at the start of a row, got '{}'", chunk[pos]));
          }
        }
        csv_scan = CsvScan::kFieldStart;
        json_in_string = false;
        json_escaped = false;
      }
      const std::size_t row_end = findRowEnd(chunk, pos);
      if (row_end == std::string_view::npos) {
        pending.append(chunk.substr(pos));
        break;
      }
      bool ok;
      if (in_row) {
        pending.append(chunk.substr(pos, row_end - pos));
        ok = acceptRow(pending, on_block);
        pending.clear();
      } else {
        ok = acceptRow(chunk.substr(pos, row_end - pos), on_block);
      }
      if (!ok) return std::unexpected(*error);
      // TSV and CSV rows end before their '\n', JSON rows after their '}'.
      pos = format == RowFormat::kJSONEachRow ? row_end : row_end + 1;
    }
    return {};
  }

  // The end of the row that continues at data[pos], or npos if it goes on past `data`.
  std::size_t findRowEnd(std::string_view data, std::size_t pos) {
    const char* p = data.data() + pos;
    const char* end = data.data() + data.size();
    switch (format) {
      case RowFormat::kTabSeparated: {
        const char* newline = findByte(p, end, '\n');
        return newline != end ? newline - data.data() : std::string_view::npos;
      }
      case RowFormat::kCSV:
        for (; p != end; ++p) {
          const char c = *p;
          switch (csv_scan) {
            case CsvScan::kFieldStart:
              if (c == '\n') return p - data.data();
              if (c == '"') {
                csv_scan = CsvScan::kQuoted;
              } else if (c != ',' && c != ' ' && c != '\t') {
                csv_scan = CsvScan::kUnquoted;
              }
              break;
            case CsvScan::kUnquoted:
              if (c == '\n') return p - data.data();
              if (c == ',') csv_scan = CsvScan::kFieldStart;
              break;
            case CsvScan::kQuoted: {
              p = findByte(p, end, '"');
              if (p == end) return std::string_view::npos;
              csv_scan = CsvScan::kQuoteInQuoted;
              break;
            }
            case CsvScan::kQuoteInQuoted:
              // '""' is a quote inside the value; anything else closes it (text after the
              // closing quote other than blanks is the row parser's error to report).
              if (c == '\n') return p - data.data();
              csv_scan = c == '"' ? CsvScan::kQuoted
                                  : (c == ',' ? CsvScan::kFieldStart : CsvScan::kUnquoted);
              break;
          }
        }
        return std::string_view::npos;
      case RowFormat::kJSONEachRow: {
        // The first '}' outside a string ends the row: values are never objects, so a nested one
        // is an error either way and the row parser reports it. The scan state lives in locals
        // (registers); it is stored back only when the row goes on past `data`.
        bool in_string = json_in_string;
        bool escaped = json_escaped;
        // One byte; true when it ends the row.
        auto step = [&](char c) {
          if (in_string) {
            if (escaped) {
              escaped = false;
            } else if (c == '\\') {
              escaped = true;
            } else if (c == '"') {
              in_string = false;
            }
            return false;
          }
          if (c == '"') in_string = true;
          return c == '}';
        };
        auto rowEnd = [&](const char* after) {
          json_in_string = false;
          json_escaped = false;
          return static_cast<std::size_t>(after - data.data());
        };
        while (p != end) {
#if defined(__SSE2__)
          if (!escaped && end - p >= 64) {
            // Sixty-four bytes at a time. Without a backslash in them, the quotes alone say which
            // bytes are inside strings (the running parity of quotes, started from `in_string`),
            // so the first '}' outside one is found without a branch per byte.
            const uint64_t slashes = byteMask64(p, '\\');
            if (slashes == 0) {
              uint64_t inside = prefixXor(byteMask64(p, '"'));
              if (in_string) inside = ~inside;
              if (const uint64_t ends = byteMask64(p, '}') & ~inside; ends != 0) {
                return rowEnd(p + __builtin_ctzll(ends) + 1);
              }
              in_string = (inside >> 63) != 0;
              p += 64;
              continue;
            }
            // Escapes: this block byte by byte.
            for (const char* block_end = p + 64; p != block_end;) {
              if (step(*p++)) return rowEnd(p);
            }
            continue;
          }
#endif
          if (step(*p++)) return rowEnd(p);
        }
        json_in_string = in_string;
        json_escaped = escaped;
        return std::string_view::npos;
      }
    }
    return std::string_view::npos;
  }

  bool acceptRow(std::string_view row, const BlockSink& on_block) {
    RowResult parsed;
    switch (format) {
      case RowFormat::kJSONEachRow:
        parsed = parseJsonRow(row);
        break;
      case RowFormat::kTabSeparated:
        parsed = parseTsvRow(row);
        break;
      case RowFormat::kCSV:
        parsed = parseCsvRow(row);
        break;
    }
    if (!parsed) {
      fail(std::move(parsed.error().column), std::move(parsed.error().message));
      return false;
    }
    ++rows;
    if (++rows_in_block == max_block_rows) emitBlock(on_block);
    return true;
  }

  static std::string_view withoutCarriageReturn(std::string_view row) {
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    return row;
  }

  // TSV counts its fields exactly; a CSV row's commas may be inside quotes.
  std::string tooManyFields(std::string_view tsv_row) const {
    if (format == RowFormat::kCSV) {
      return fmt::format("too many fields, the table has {} columns", columns.size());
    }
    return fmt::format("too many fields: the row has {}, the table has {} columns",
                       std::count(tsv_row.begin(), tsv_row.end(), '\t') + 1, columns.size());
  }

  std::string tooFewFields(std::size_t fields) const {
    return fmt::format("missing: the row has {} field{}, the table has {} columns", fields,
                       fields == 1 ? "" : "s", columns.size());
  }

  std::string notNullable(std::string_view what) const {
    return fmt::format("{}, and the column is not Nullable", what);
  }

  RowResult parseTsvRow(std::string_view row) {
    row = withoutCarriageReturn(row);
    std::size_t start = 0;
    for (std::size_t i = 0; i < sinks.size(); ++i) {
      const ColumnSink& sink = sinks[i];
      std::size_t tab = row.find('\t', start);
      const bool last = i + 1 == sinks.size();
      if (tab == std::string_view::npos) {
        if (!last) return fieldError(sinks[i + 1].spec->name, tooFewFields(i + 1));
        tab = row.size();
      } else if (last) {
        return fieldError("", tooManyFields(row));
      }
      const std::string_view field = row.substr(start, tab - start);
      start = tab + 1;
      ValueResult appended;
      if (field.find('\\') == std::string_view::npos) {
        appended = appendText(sink, field);
      } else if (field == "\\N") {
        if (!sink.spec->type.nullable)
          return fieldError(sink.spec->name, notNullable("\\N (NULL)"));
        appendNull(sink);
      } else if (auto unescaped = unescapeTsv(field, scratch); !unescaped) {
        appended = std::move(unescaped);
      } else {
        appended = appendText(sink, scratch);
      }
      if (!appended) return fieldError(sink.spec->name, std::move(appended.error()));
    }
    return {};
  }

  // RFC 4180 with ClickHouse's defaults: '"' quoting with '""' inside, blanks around a value
  // trimmed, unquoted \N is NULL, an unquoted empty field is the default (NULL when Nullable).
  RowResult parseCsvRow(std::string_view row) {
    row = withoutCarriageReturn(row);
    const char* p = row.data();
    const char* end = p + row.size();
    auto skipBlanks = [&] {
      while (p != end && (*p == ' ' || *p == '\t')) ++p;
    };
    for (std::size_t i = 0; i < sinks.size(); ++i) {
      const ColumnSink& sink = sinks[i];
      skipBlanks();
      ValueResult appended;
      if (p != end && *p == '"') {
        ++p;
        scratch.clear();
        while (true) {
          const char* quote = findByte(p, end, '"');
          if (quote == end) return fieldError(sink.spec->name, "unterminated quoted value");
          scratch.append(p, quote);
          p = quote + 1;
          if (p == end || *p != '"') break;
          scratch += '"';
          ++p;
        }
        skipBlanks();
        if (p != end && *p != ',') {
          return fieldError(sink.spec->name,
                            fmt::format("unexpected '{}' after the closing quote", *p));
        }
        appended = appendText(sink, scratch);
      } else {
        const char* field_end = findByte(p, end, ',');
        std::string_view field(p, field_end - p);
        while (!field.empty() && (field.back() == ' ' || field.back() == '\t'))
          field.remove_suffix(1);
        p = field_end;
        if (field == "\\N") {
          if (!sink.spec->type.nullable)
            return fieldError(sink.spec->name, notNullable("\\N (NULL)"));
          appendNull(sink);
        } else if (field.empty()) {
          if (sink.spec->type.nullable) {
            appendNull(sink);
          } else {
            appendDefault(sink);
          }
        } else {
          appended = appendText(sink, field);
        }
      }
      if (!appended) return fieldError(sink.spec->name, std::move(appended.error()));
      const bool last = i + 1 == sinks.size();
      if (p == end) {
        if (!last) return fieldError(sinks[i + 1].spec->name, tooFewFields(i + 1));
      } else {
        if (last) return fieldError("", tooManyFields({}));
        ++p;  // the comma
      }
    }
    return {};
  }

  RowResult parseJsonRow(std::string_view row) {
    const char* p = row.data();
    const char* end = p + row.size();
    std::fill(seen.begin(), seen.end(), 0);
    p = skipJsonSpace(p, end);
    if (p == end || *p != '{') {
      return fieldError(
          "", fmt::format("expected '{{' at the start of a row, got {}", describeNext(p, end)));
    }
    p = skipJsonSpace(p + 1, end);
    if (p != end && *p == '}') {
      ++p;
    } else {
      while (true) {
        if (p == end || *p != '"') {
          return fieldError("",
                            fmt::format("expected a key in '\"', got {}", describeNext(p, end)));
        }
        auto key = readJsonString(p, end, key_scratch);
        if (!key) return fieldError("", fmt::format("in a key: {}", key.error()));
        const std::size_t index = columnIndex(*key);
        if (index == sinks.size()) return fieldError(*key, "no such column in the table");
        if (seen[index]) return fieldError(*key, "appears twice in the row");
        seen[index] = 1;
        const ColumnSink& sink = sinks[index];
        p = skipJsonSpace(p, end);
        if (p == end || *p != ':') {
          return fieldError(sink.spec->name, fmt::format("expected ':' after the key, got {}",
                                                         describeNext(p, end)));
        }
        p = skipJsonSpace(p + 1, end);
        if (auto value = readJsonValue(p, end, sink); !value) {
          return fieldError(sink.spec->name, std::move(value.error()));
        }
        p = skipJsonSpace(p, end);
        if (p != end && *p == ',') {
          p = skipJsonSpace(p + 1, end);
          continue;
        }
        if (p != end && *p == '}') {
          ++p;
          break;
        }
        return fieldError("", fmt::format("expected ',' or '}}' after the value of '{}', got {}",
                                          sink.spec->name, describeNext(p, end)));
      }
    }
    if (skipJsonSpace(p, end) != end) {
      return fieldError("", fmt::format("unexpected {} after the object", describeNext(p, end)));
    }
    for (std::size_t i = 0; i < sinks.size(); ++i) {
      if (seen[i]) continue;
      if (!sinks[i].spec->type.nullable)
        return fieldError(sinks[i].spec->name, notNullable("missing"));
      appendNull(sinks[i]);
    }
    return {};
  }

  // The complete rows at the start of `text` read with simdjson into the columns: the bytes they
  // took, or 0 when it declined (the rows it had added are taken back, and the scanner reads the
  // text as if it had never been tried). It declines whatever it does not take exactly as
  // parseJsonRow would: simdjson's errors, a row that is not one object, an unknown or repeated
  // key, an object or array value, a conversion's error; strings and numbers are converted by
  // the same functions as in parseJsonRow.
  std::size_t fastJsonRows(std::string_view text, const BlockSink& on_block) {
    // Below this the scanner is as fast as setting simdjson up.
    constexpr std::size_t kMinBytes = 4096;
    // Up to the last line break: a chunk cut inside a row would end in an unfinished string,
    // which fails simdjson's whole scan; the rest is the scanner's (an unfinished row).
    const std::size_t last_newline = text.rfind('\n');
    if (last_newline == std::string_view::npos) return 0;
    const std::size_t after = text.size() - (last_newline + 1);
    text = text.substr(0, last_newline + 1);
    if (text.size() < kMinBytes) return 0;
    // simdjson reads up to SIMDJSON_PADDING bytes past the text: they must be there, and set.
    // The text is read where it is when the chunk goes on that far (ParallelRowParser's
    // segments end in that much white space), else from a copy.
    const char* json = text.data();
    if (after < simdjson::SIMDJSON_PADDING) {
      json_buffer.assign(text);
      json_buffer.resize(text.size() + simdjson::SIMDJSON_PADDING, ' ');
      json = json_buffer.data();
    }
    if (!json_parser) json_parser = std::make_unique<simdjson::ondemand::parser>();
    simdjson::ondemand::document_stream docs;
    if (json_parser->iterate_many(json, text.size(), std::max<std::size_t>(text.size(), 64))
            .get(docs)) {
      return 0;
    }
    const std::size_t start_rows = rows_in_block;
    std::size_t added = 0;
    auto decline = [&] {
      for (std::size_t i = 0; i < columns.size(); ++i) {
        std::visit([&](auto& values) { values.resize(start_rows); }, block.columns[i].values);
        if (columns[i].type.nullable) block.columns[i].null_map.resize(start_rows);
      }
      return std::size_t{0};
    };
    const char* const buffer_end = json + text.size();
    for (auto doc_result : docs) {
      simdjson::ondemand::document_reference doc;
      simdjson::ondemand::object object;
      if (std::move(doc_result).get(doc) || doc.get_object().get(object)) return decline();
      std::fill(seen.begin(), seen.end(), 0);
      for (auto field_result : object) {
        simdjson::ondemand::field field;
        if (std::move(field_result).get(field)) return decline();
        // The key as it stands in the input, compared in place; an escaped one is unescaped.
        std::size_t index = rawColumnIndex(field.key());
        if (index == sinks.size()) {
          std::string_view key;
          if (field.unescaped_key().get(key)) return decline();
          index = columnIndex(key);
        }
        if (index == sinks.size() || seen[index]) return decline();
        seen[index] = 1;
        const ColumnSink& sink = sinks[index];
        simdjson::ondemand::value value = field.value();
        simdjson::ondemand::json_type type;
        if (value.type().get(type)) return decline();
        switch (type) {
          case simdjson::ondemand::json_type::string: {
            std::string_view string;
            if (value.get_string().get(string)) return decline();
            if (sink.spec->type.id == TypeId::kString) {
              sink.as<std::string>().emplace_back(string);
              sink.markPresent();
            } else if (!appendText(sink, string)) {
              return decline();
            }
            break;
          }
          case simdjson::ondemand::json_type::null: {
            bool is_null = false;
            if (value.is_null().get(is_null) || !is_null || !sink.spec->type.nullable)
              return decline();
            appendNull(sink);
            break;
          }
          case simdjson::ondemand::json_type::number:
          case simdjson::ondemand::json_type::boolean: {
            const char* token = value.raw_json_token().data();
            // Integers and Float64 in simdjson's own conversion, which takes exactly the JSON
            // numbers the scanner's takes, to the same value (correctly rounded); the rest (a
            // fraction for an integer, a value out of range, booleans, Float32, numbers into
            // strings and dates) as the scanner reads the token, from where simdjson found it.
            if (!type_is_bool(type) && appendJsonNumber(value, sink)) {
              // taken
            } else if (const char* p = token; !readJsonValue(p, buffer_end, sink)) {
              return decline();
            }
            // The scanner ends a token at the first byte that cannot be in a number or
            // true/false, which must be followed by ',' or '}'.
            const char* p = token;
            while (p != buffer_end && isTokenByte(*p)) ++p;
            p = skipJsonSpace(p, buffer_end);
            if (p == buffer_end || (*p != ',' && *p != '}')) return decline();
            break;
          }
          default:
            return decline();
        }
      }
      for (std::size_t i = 0; i < sinks.size(); ++i) {
        if (seen[i]) continue;
        if (!sinks[i].spec->type.nullable) return decline();
        appendNull(sinks[i]);
      }
      ++added;
    }
    if (added == 0) return decline();
    rows += added;
    rows_by_simdjson += added;
    rows_in_block += added;
    if (rows_in_block >= max_block_rows) emitBlock(on_block);
    return text.size() - docs.truncated_bytes();
  }

  static bool type_is_bool(simdjson::ondemand::json_type type) {
    return type == simdjson::ondemand::json_type::boolean;
  }
  // A byte of a number or true/false token, as readJsonValue reads one.
  static bool isTokenByte(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
           c == '+' || c == '.';
  }

  // A JSON number into an integer or Float64 column by simdjson's conversion, when it is one
  // that column takes as it stands: false (nothing appended) otherwise.
  static bool appendJsonNumber(simdjson::ondemand::value& value, const ColumnSink& sink) {
    auto unsignedInto = [&]<class T>(std::type_identity<T>) {
      uint64_t v = 0;
      if (value.get_uint64().get(v) || v > std::numeric_limits<T>::max()) return false;
      sink.as<T>().push_back(static_cast<T>(v));
      return true;
    };
    auto signedInto = [&]<class T>(std::type_identity<T>) {
      int64_t v = 0;
      if (value.get_int64().get(v) || v < std::numeric_limits<T>::min() ||
          v > std::numeric_limits<T>::max()) {
        return false;
      }
      sink.as<T>().push_back(static_cast<T>(v));
      return true;
    };
    bool taken = false;
    switch (sink.spec->type.id) {
      case TypeId::kUInt8:
        taken = unsignedInto(std::type_identity<uint8_t>{});
        break;
      case TypeId::kUInt16:
        taken = unsignedInto(std::type_identity<uint16_t>{});
        break;
      case TypeId::kUInt32:
        taken = unsignedInto(std::type_identity<uint32_t>{});
        break;
      case TypeId::kUInt64:
        taken = unsignedInto(std::type_identity<uint64_t>{});
        break;
      case TypeId::kInt8:
        taken = signedInto(std::type_identity<int8_t>{});
        break;
      case TypeId::kInt16:
        taken = signedInto(std::type_identity<int16_t>{});
        break;
      case TypeId::kInt32:
        taken = signedInto(std::type_identity<int32_t>{});
        break;
      case TypeId::kInt64:
        taken = signedInto(std::type_identity<int64_t>{});
        break;
      case TypeId::kFloat64: {
        double v = 0;
        if (!value.get_double().get(v)) {
          sink.as<double>().push_back(v);
          taken = true;
        }
        break;
      }
      default:
        break;
    }
    if (taken) sink.markPresent();
    return taken;
  }

  // The index of the column whose name `matches`, or sinks.size(). Keys mostly come in schema
  // order: the one after the last match is tried first.
  template <class Matches>
  std::size_t findColumn(const Matches& matches) {
    const std::size_t n = sinks.size();
    for (std::size_t k = 0; k < n; ++k) {
      std::size_t i = key_hint + k;
      if (i >= n) i -= n;
      if (matches(sinks[i])) {
        key_hint = i + 1 == n ? 0 : i + 1;
        return i;
      }
    }
    return n;
  }

  std::size_t columnIndex(std::string_view key) {
    return findColumn([&](const ColumnSink& sink) { return sink.spec->name == key; });
  }

  // For a key simdjson has not unescaped: equal when its raw bytes are the name's (column names
  // are identifiers, TableSchema: nothing in them is escaped in JSON).
  std::size_t rawColumnIndex(simdjson::ondemand::raw_json_string key) {
    // raw_json_string::unsafe_is_equal's reads (the name's bytes, then the quote), compared
    // inline: a memcmp call per key was 4% of a bulk insert's time.
    const char* raw = key.raw();
    return findColumn([&](const ColumnSink& sink) {
      const std::string& quoted = sink.quoted_name;
      for (std::size_t i = 0; i < quoted.size(); ++i) {
        if (raw[i] != quoted[i]) return false;
      }
      return true;
    });
  }

  // One JSON value into the column. Beyond plain JSON types, as ClickHouse reads them: numbers,
  // Date and DateTime in strings ("42", "2026-12-01"), a DateTime as a number of seconds,
  // true/false into numbers and Bool, numbers and true/false into String as their text.
  ValueResult readJsonValue(const char*& p, const char* end, const ColumnSink& sink) {
    if (p == end) return std::unexpected("expected a value, got end of data");
    const TypeId type = sink.spec->type.id;
    if (*p == '"') {
      auto text = readJsonString(p, end, scratch);
      if (!text) return std::unexpected(std::move(text.error()));
      if (type == TypeId::kString) {
        if (text->data() == scratch.data()) {
          sink.as<std::string>().push_back(std::move(scratch));
        } else {
          sink.as<std::string>().emplace_back(*text);
        }
        sink.markPresent();
        return {};
      }
      return appendText(sink, *text);
    }
    if (*p == '{' || *p == '[') {
      return std::unexpected(
          fmt::format("expected {}, got {}", sink.base_type, *p == '{' ? "an object" : "an array"));
    }
    const char* start = p;
    while (p != end && ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
                        (*p >= 'A' && *p <= 'Z') || *p == '-' || *p == '+' || *p == '.')) {
      ++p;
    }
    const std::string_view token(start, p - start);
    if (token.empty())
      return std::unexpected(fmt::format("expected a value, got {}", describeNext(p, end)));
    if (token == "null") {
      if (!sink.spec->type.nullable) return std::unexpected(notNullable("null"));
      appendNull(sink);
      return {};
    }
    const bool is_bool = token == "true" || token == "false";
    if (!is_bool && !isJsonNumber(token)) {
      return std::unexpected(fmt::format("malformed JSON value {}", quoteValue(token)));
    }
    switch (type) {
      case TypeId::kString:
        sink.as<std::string>().emplace_back(token);
        sink.markPresent();
        return {};
      case TypeId::kDate:
        return std::unexpected(fmt::format("expected a Date string \"YYYY-MM-DD\", got {}", token));
      case TypeId::kDateTime:
        if (is_bool) return std::unexpected(fmt::format("expected a DateTime, got {}", token));
        return appendText(sink, token);
      case TypeId::kBool:
        return appendText(sink, token);
      default:
        return appendText(sink, is_bool ? (token == "true" ? "1" : "0") : token);
    }
  }

  const std::vector<ColumnSpec> columns;
  const RowFormat format;
  const std::size_t max_block_rows;

  Block block;
  std::vector<ColumnSink> sinks;  // one per column, into `block`
  std::size_t rows_in_block = 0;
  std::size_t rows = 0;  // complete rows so far, all blocks

  std::string pending;  // the unfinished row
  CsvScan csv_scan = CsvScan::kFieldStart;
  bool json_in_string = false;
  bool json_escaped = false;

  bool bom_checked = false;
  std::string head;  // the first bytes, until they tell whether there is a byte order mark
  bool finished = false;
  std::optional<ParseError> error;

  std::vector<uint8_t> seen;  // JSON: columns present in the current row
  std::size_t key_hint = 0;
  std::string scratch;
  std::string key_scratch;

  const bool fast_json;  // JSONEachRow through simdjson first (fastJsonRows)
  std::unique_ptr<simdjson::ondemand::parser> json_parser;
  std::string json_buffer;  // the text simdjson reads, with room for its padding
  std::size_t rows_by_simdjson = 0;
};

RowParser::RowParser(const TableSchema& schema, RowFormat format, std::size_t max_block_rows,
                     bool simdjson)
    : state_(std::make_unique<State>(schema, format, max_block_rows, simdjson)) {}
RowParser::~RowParser() = default;
RowParser::RowParser(RowParser&&) noexcept = default;
RowParser& RowParser::operator=(RowParser&&) noexcept = default;

std::expected<void, ParseError> RowParser::feed(std::string_view chunk, const BlockSink& on_block) {
  return state_->feed(chunk, on_block);
}

std::expected<void, ParseError> RowParser::finish(const BlockSink& on_block) {
  return state_->finish(on_block);
}

std::size_t RowParser::rowsParsed() const {
  return state_->rows;
}

std::size_t RowParser::rowsReadBySimdjson() const {
  return state_->rows_by_simdjson;
}

// ---------------------------------------------------------------------------------------------
// ParallelRowParser. JSONEachRow is cut at line breaks: a JSON string cannot hold a raw one, so
// in the usual stream (a row per line) every cut is a row end, found with one memrchr rather than
// a scan of every byte in the calling thread. A row written over several lines can be cut in its
// middle; the segment before the cut then ends in an unfinished object and fails, and from that
// segment on the stream is read serially, which gives exactly RowParser's rows or error. TSV and
// CSV are cut where RowParser's own row-end scan finds a row end (CSV quotes may hold line breaks).

struct ParallelRowParser::Impl {
  struct Segment {
    std::vector<Block> blocks;
    std::size_t rows = 0;
    std::optional<ParseError> error;
  };
  struct Flight {
    std::future<Segment> result;
    std::shared_ptr<const std::string> text;  // JSON: kept for a serial re-read
    std::size_t size = 0;                     // of the text, without the padding
  };

  Impl(const TableSchema& schema_, RowFormat format_, std::size_t threads_,
       std::size_t max_block_rows_, std::size_t segment_bytes_)
      : schema(schema_),
        format(format_),
        cut_at_line_breaks(format_ == RowFormat::kJSONEachRow),
        max_in_flight(std::max<std::size_t>(1, threads_) * 2),
        max_block_rows(max_block_rows_),
        segment_bytes(std::max<std::size_t>(1, segment_bytes_)),
        scanner(schema_, format_, max_block_rows_) {}

  ~Impl() { waitAll(); }

  void waitAll() {
    for (auto& flight : in_flight) {
      if (flight.result.valid()) flight.result.wait();
    }
  }

  // Parses one segment in a worker. Only the first segment can start with a byte order mark.
  static Segment parse(const TableSchema& schema, RowFormat format, std::size_t max_block_rows,
                       std::shared_ptr<const std::string> text, bool first) {
    Segment out;
    RowParser parser(schema, format, max_block_rows);
    if (!first) parser.state_->bom_checked = true;
    auto keep = [&](Block&& block) { out.blocks.push_back(std::move(block)); };
    auto fed = parser.feed(*text, keep);
    if (fed) fed = parser.finish(keep);
    if (!fed) out.error = fed.error();
    out.rows = parser.rowsParsed();
    return out;
  }

  // TSV and CSV: the offset just past the last complete row in `buffer`, scanning from `scanned`.
  void scanRows() {
    if (!bom_decided) {
      // A byte order mark is the first RowParser's to skip; the scan starts after it.
      const std::string_view start = std::string_view(buffer).substr(0, kUtf8Bom.size());
      if (start.size() < kUtf8Bom.size() && kUtf8Bom.starts_with(start)) return;
      bom_decided = true;
      if (start == kUtf8Bom) bom_length = kUtf8Bom.size();
    }
    std::size_t pos = std::max(scanned, bom_length);
    RowParser::State& state = *scanner.state_;
    const std::string_view data(buffer);
    while (pos < data.size()) {
      const std::size_t start = pos;
      state.csv_scan = CsvScan::kFieldStart;
      state.json_in_string = false;
      state.json_escaped = false;
      const std::size_t row_end = state.findRowEnd(data, start);
      if (row_end == std::string_view::npos) break;
      pos = row_end + 1;
      cut = pos;
    }
    scanned = cut;
  }

  void dispatch(std::size_t end) {
    // The buffer becomes the segment; the few bytes after `end` start the next one.
    auto text = std::make_shared<std::string>(std::move(buffer));
    buffer = freshBuffer();
    buffer.append(*text, end);
    text->resize(end);
    // JSON: white space after the last row, which simdjson may read past the text's end
    // (RowParser then reads the segment in place).
    if (cut_at_line_breaks) text->append(simdjson::SIMDJSON_PADDING, ' ');
    scanned = scanned > end ? scanned - end : 0;
    cut = cut > end ? cut - end : 0;
    bom_length = 0;  // it went with the first segment
    Flight flight;
    flight.result = std::async(std::launch::async, parse, std::cref(schema), format, max_block_rows,
                               text, segments == 0);
    if (cut_at_line_breaks) {
      flight.text = std::move(text);
      flight.size = end;
    }
    in_flight.push_back(std::move(flight));
    ++segments;
  }

  // Room for a segment, the chunk that completes it and simdjson's padding: the buffer is never
  // copied to grow, nor to take the padding.
  std::string freshBuffer() const {
    std::string fresh;
    fresh.reserve(segment_bytes + segment_bytes / 4 + simdjson::SIMDJSON_PADDING);
    return fresh;
  }

  // Hands over finished segments in order; with `all`, waits for every one.
  std::expected<void, ParseError> deliver(const BlockSink& on_block, bool all) {
    while (!in_flight.empty()) {
      auto& front = in_flight.front();
      const bool must_wait = all || in_flight.size() >= max_in_flight;
      if (!must_wait && front.result.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
        break;
      Segment segment = front.result.get();
      if (segment.error) {
        if (cut_at_line_breaks) return readOnSerially(on_block);
        return fail(*segment.error);
      }
      in_flight.pop_front();
      ++delivered;
      rows_before += segment.rows;
      for (auto& block : segment.blocks) on_block(std::move(block));
    }
    return {};
  }

  // A segment failed (the front one): it, the segments after it and the rest of the stream are
  // read by one RowParser from that segment's start, a row boundary (every segment before it
  // ended in complete rows).
  std::expected<void, ParseError> readOnSerially(const BlockSink& on_block) {
    waitAll();
    serial.emplace(schema, format, max_block_rows);
    if (delivered > 0) serial->state_->bom_checked = true;
    std::deque<Flight> flights = std::move(in_flight);
    in_flight.clear();
    for (auto& flight : flights) {
      const std::string_view text = std::string_view(*flight.text).substr(0, flight.size);
      if (auto fed = feedSerial(text, on_block); !fed) return fed;
    }
    std::string rest = std::move(buffer);
    buffer.clear();
    return feedSerial(rest, on_block);
  }

  std::expected<void, ParseError> feedSerial(std::string_view text, const BlockSink& on_block) {
    if (auto fed = serial->feed(text, on_block); !fed) return fail(fed.error());
    return {};
  }

  std::expected<void, ParseError> fail(ParseError error) {
    error.row += rows_before;
    failed = error;
    return std::unexpected(error);
  }

  std::expected<void, ParseError> feed(std::string_view chunk, const BlockSink& on_block) {
    if (failed) return std::unexpected(*failed);
    if (serial) return feedSerial(chunk, on_block);
    if (cut_at_line_breaks) {
      const std::size_t before = buffer.size();
      // A small insert keeps a small buffer; one past 64 KiB gets a segment's room at once.
      if (before + chunk.size() > (64 << 10) && buffer.capacity() < segment_bytes) {
        std::string room = freshBuffer();
        room.append(buffer);
        buffer = std::move(room);
      }
      buffer.append(chunk);
      if (buffer.size() >= segment_bytes) {
        // The last line break, looked for in what came now (the bytes before had none).
        const void* found = memrchr(buffer.data() + before, '\n', buffer.size() - before);
        if (found) dispatch(static_cast<const char*>(found) - buffer.data() + 1);
      }
    } else {
      buffer.append(chunk);
      scanRows();
      if (cut >= segment_bytes) dispatch(cut);
    }
    return deliver(on_block, /*all=*/false);
  }

  std::expected<void, ParseError> finish(const BlockSink& on_block) {
    if (failed) return std::unexpected(*failed);
    if (!serial && segments == 0) {
      // A short stream: no thread is worth it.
      serial.emplace(schema, format, max_block_rows);
      if (auto fed = feedSerial(buffer, on_block); !fed) return fed;
      buffer.clear();
    }
    if (!serial) {
      if (!buffer.empty()) dispatch(buffer.size());
      if (auto delivered_all = deliver(on_block, /*all=*/true); !delivered_all)
        return delivered_all;
      if (!serial) return {};
    }
    if (auto finished = serial->finish(on_block); !finished) return fail(finished.error());
    return {};
  }

  const TableSchema schema;
  const RowFormat format;
  const bool cut_at_line_breaks;
  const std::size_t max_in_flight;
  const std::size_t max_block_rows;
  const std::size_t segment_bytes;
  RowParser scanner;  // TSV, CSV: only its row-end scan is used

  std::string buffer;       // bytes not yet handed to a worker
  std::size_t scanned = 0;  // buffer[0, scanned) is whole rows
  std::size_t cut = 0;      // the end of the last whole row found
  bool bom_decided = false;
  std::size_t bom_length = 0;  // a byte order mark at the start of buffer
  std::size_t segments = 0;
  std::size_t delivered = 0;  // segments handed over
  std::deque<Flight> in_flight;
  std::size_t rows_before = 0;      // rows of the segments handed over
  std::optional<RowParser> serial;  // the stream's reader from where a segment failed
  std::optional<ParseError> failed;
};

ParallelRowParser::ParallelRowParser(const TableSchema& schema, RowFormat format,
                                     std::size_t threads, std::size_t max_block_rows,
                                     std::size_t segment_bytes)
    : impl_(std::make_unique<Impl>(schema, format, threads, max_block_rows, segment_bytes)) {}
ParallelRowParser::~ParallelRowParser() = default;

std::expected<void, ParseError> ParallelRowParser::feed(std::string_view chunk,
                                                        const BlockSink& on_block) {
  return impl_->feed(chunk, on_block);
}

std::expected<void, ParseError> ParallelRowParser::finish(const BlockSink& on_block) {
  return impl_->finish(on_block);
}

// ---------------------------------------------------------------------------------------------

void writeRows(const Block& block, RowFormat format, std::string& out, std::size_t begin,
               std::size_t end) {
  end = std::min(end, block.rows());
  if (begin >= end) return;
  // 64-bit integers are written as plain JSON numbers. ClickHouse quotes them by default
  // (output_format_json_quote_64bit_integers=1) for JavaScript's sake; readers here take both.
  std::vector<std::string> json_keys;
  if (format == RowFormat::kJSONEachRow) {
    for (const auto& column : block.columns) {
      std::string key;
      appendJsonString(key, column.name);
      key += ':';
      json_keys.push_back(std::move(key));
    }
  }
  const char separator = format == RowFormat::kCSV ? ',' : '\t';
  for (std::size_t row = begin; row < end; ++row) {
    if (format == RowFormat::kJSONEachRow) out += '{';
    for (std::size_t i = 0; i < block.columns.size(); ++i) {
      if (format == RowFormat::kJSONEachRow) {
        if (i > 0) out += ',';
        out += json_keys[i];
      } else if (i > 0) {
        out += separator;
      }
      appendValue(out, block.columns[i], row, format);
    }
    if (format == RowFormat::kJSONEachRow) out += '}';
    out += '\n';
  }
}

}  // namespace rtable::core
