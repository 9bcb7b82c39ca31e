#include "rtable/replication_core/log_entry.h"

#include <fmt/format.h>

#include <charconv>
#include <ctime>

namespace rtable::core {
namespace {

std::string formatUtc(int64_t seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::expected<int64_t, std::string> parseUtc(std::string_view text) {
  std::tm tm{};
  const std::string copy(text);
  const char* end = strptime(copy.c_str(), "%Y-%m-%d %H:%M:%S", &tm);
  if (!end || *end != '\0') return std::unexpected("expected 'YYYY-MM-DD hh:mm:ss'");
  return static_cast<int64_t>(timegm(&tm));
}

// Reads the text line by line, remembering the line number for errors.
class LineReader {
 public:
  explicit LineReader(std::string_view text) : text_(text) {}

  bool atEnd() const { return pos_ >= text_.size(); }
  int lineNumber() const { return line_; }

  std::expected<std::string_view, std::string> next(std::string_view what) {
    if (atEnd())
      return std::unexpected(errorAhead(fmt::format("expected {}, found the end", what)));
    const std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) {
      return std::unexpected(errorAhead(fmt::format("expected {} ending in a newline", what)));
    }
    std::string_view line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++line_;
    return line;
  }

  std::string_view peek() const {
    const std::size_t end = text_.find('\n', pos_);
    return text_.substr(pos_, end == std::string_view::npos ? std::string_view::npos : end - pos_);
  }

  // "<key>: <value>" with that exact key.
  std::expected<std::string_view, std::string> field(std::string_view key) {
    auto line = next(fmt::format("'{}: '", key));
    if (!line) return line;
    const std::string prefix = fmt::format("{}: ", key);
    if (!line->starts_with(prefix)) {
      // An empty value is written without the trailing space by some writers.
      if (*line == prefix.substr(0, prefix.size() - 1)) return std::string_view{};
      return std::unexpected(error(fmt::format("expected '{}', found '{}'", prefix, *line)));
    }
    return line->substr(prefix.size());
  }

  // About the line last read.
  std::string error(const std::string& message) const {
    return fmt::format("log entry line {}: {}", line_, message);
  }
  // About the line not read yet.
  std::string errorAhead(const std::string& message) const {
    return fmt::format("log entry line {}: {}", line_ + 1, message);
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  int line_ = 0;
};

template <class T>
std::expected<T, std::string> parseNumber(const LineReader& reader, std::string_view key,
                                          std::string_view text) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return std::unexpected(reader.error(fmt::format("{} '{}' is not a number", key, text)));
  }
  return value;
}

std::expected<bool, std::string> parseBool(const LineReader& reader, std::string_view key,
                                           std::string_view text) {
  if (text == "0") return false;
  if (text == "1") return true;
  return std::unexpected(reader.error(fmt::format("{} must be 0 or 1, found '{}'", key, text)));
}

}  // namespace

std::string escapeString(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\0':
        out += "\\0";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\'':
        out += "\\'";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::expected<std::string, std::string> unescapeString(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    if (++i == text.size()) return std::unexpected("a lone backslash at the end");
    switch (text[i]) {
      case '\\':
        out += '\\';
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '0':
        out += '\0';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case '\'':
        out += '\'';
        break;
      default:
        return std::unexpected(fmt::format("unknown escape '\\{}'", text[i]));
    }
  }
  return out;
}

std::string LogEntry::format() const {
  std::string text = fmt::format("format version: {}\ncreate_time: {}\nsource replica: {}\n",
                                 format_version, formatUtc(create_time), source_replica);
  text += fmt::format("block_id: {}\n", escapeString(block_id));
  switch (type) {
    case Type::kGetPart:
      text += fmt::format("get\n{}", new_part_name);
      break;
    case Type::kAttachPart:
      text += fmt::format("attach\n{}\npart_checksum: {}", new_part_name, part_checksum);
      break;
    case Type::kMergeParts:
      text += "merge\n";
      for (const auto& source : source_parts) text += source + "\n";
      text += fmt::format("into\n{}\ndeduplicate: {}", new_part_name, deduplicate ? 1 : 0);
      break;
    case Type::kDropRange:
      text += fmt::format("{}\n{}", detach ? "detach" : "drop", new_part_name);
      break;
  }
  text += "\n";
  if (!part_type.empty()) text += fmt::format("part_type: {}\n", part_type);
  if (quorum != 0) text += fmt::format("quorum: {}\n", quorum);
  return text;
}

std::expected<LogEntry, std::string> LogEntry::parse(std::string_view text) {
  LineReader reader(text);
  LogEntry entry;
  auto version = reader.field("format version");
  if (!version) return std::unexpected(version.error());
  auto version_number = parseNumber<int>(reader, "format version", *version);
  if (!version_number) return std::unexpected(version_number.error());
  // 2 added create_time, 3 block_id, 4 merge's deduplicate; 5+ carry fields rtable does not use.
  if (*version_number < 3 || *version_number > 4) {
    return std::unexpected(
        reader.error(fmt::format("format version {} is not supported (3 or 4)", *version_number)));
  }
  entry.format_version = *version_number;

  auto create_time = reader.field("create_time");
  if (!create_time) return std::unexpected(create_time.error());
  auto seconds = parseUtc(*create_time);
  if (!seconds) return std::unexpected(reader.error("create_time: " + seconds.error()));
  entry.create_time = *seconds;

  auto source = reader.field("source replica");
  if (!source) return std::unexpected(source.error());
  entry.source_replica = std::string(*source);

  auto block_id = reader.field("block_id");
  if (!block_id) return std::unexpected(block_id.error());
  auto unescaped = unescapeString(*block_id);
  if (!unescaped) return std::unexpected(reader.error("block_id: " + unescaped.error()));
  entry.block_id = std::move(*unescaped);

  auto keyword = reader.next("the entry type");
  if (!keyword) return std::unexpected(keyword.error());
  auto part_line = [&](std::string_view what) -> std::expected<std::string, std::string> {
    auto line = reader.next(what);
    if (!line) return std::unexpected(line.error());
    return std::string(*line);
  };
  if (*keyword == "get" || *keyword == "attach" || *keyword == "drop" || *keyword == "detach") {
    entry.type = *keyword == "get"      ? Type::kGetPart
                 : *keyword == "attach" ? Type::kAttachPart
                                        : Type::kDropRange;
    entry.detach = *keyword == "detach";
    auto part = part_line("a part name");
    if (!part) return std::unexpected(part.error());
    entry.new_part_name = std::move(*part);
    if (entry.type == Type::kAttachPart) {
      auto checksum = reader.field("part_checksum");
      if (!checksum) return std::unexpected(checksum.error());
      entry.part_checksum = std::string(*checksum);
    }
  } else if (*keyword == "merge") {
    entry.type = Type::kMergeParts;
    for (;;) {
      auto line = reader.next("a source part or 'into'");
      if (!line) return std::unexpected(line.error());
      if (*line == "into") break;
      entry.source_parts.emplace_back(*line);
    }
    auto part = part_line("the merged part's name");
    if (!part) return std::unexpected(part.error());
    entry.new_part_name = std::move(*part);
    if (reader.peek().starts_with("deduplicate: ")) {
      auto dedup = reader.field("deduplicate");
      if (!dedup) return std::unexpected(dedup.error());
      auto flag = parseBool(reader, "deduplicate", *dedup);
      if (!flag) return std::unexpected(flag.error());
      entry.deduplicate = *flag;
    }
  } else {
    return std::unexpected(reader.error(fmt::format("unknown entry type '{}'", *keyword)));
  }

  // The writer ends the body with a newline; older writers add an empty line.
  if (!reader.atEnd() && reader.peek().empty()) (void)reader.next("an empty line");
  if (reader.peek().starts_with("part_type: ")) {
    // The line may still lack its newline (the end of the text): an error, not a value.
    auto part_type = reader.field("part_type");
    if (!part_type) return std::unexpected(part_type.error());
    entry.part_type = std::string(*part_type);
  }
  if (reader.peek().starts_with("quorum: ")) {
    auto quorum = reader.field("quorum");
    if (!quorum) return std::unexpected(quorum.error());
    auto number = parseNumber<int>(reader, "quorum", *quorum);
    if (!number) return std::unexpected(number.error());
    entry.quorum = *number;
  }
  if (!reader.atEnd()) {
    return std::unexpected(
        reader.errorAhead(fmt::format("unexpected '{}' after the entry", reader.peek())));
  }
  return entry;
}

std::string_view logEntryTypeName(LogEntry::Type type) {
  switch (type) {
    case LogEntry::Type::kGetPart:
      return "GET_PART";
    case LogEntry::Type::kAttachPart:
      return "ATTACH_PART";
    case LogEntry::Type::kMergeParts:
      return "MERGE_PARTS";
    case LogEntry::Type::kDropRange:
      return "DROP_RANGE";
  }
  return "UNKNOWN";
}

}  // namespace rtable::core
