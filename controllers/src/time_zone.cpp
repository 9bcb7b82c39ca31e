#include "rtable/controllers/time_zone.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

namespace rtable::controllers {

struct TimeZone::Data {
  std::string name;
  int32_t initial_offset = 0;   // before the first transition (RFC 8536: time type 0)
  std::vector<int64_t> at;      // transitions, ascending, each one changing the offset
  std::vector<int32_t> offset;  // the offset from at[i] on
};

namespace {

using namespace std::chrono;

// Offsets stay within this (RFC 8536 3.2 says -89999..93599 s): local and UTC differ by less.
constexpr int64_t kMaxOffset = 26 * 3600;

// Big-endian reads over a TZif file; any read past the end makes ok() false.
class TzifReader {
 public:
  explicit TzifReader(std::string_view bytes) : bytes_(bytes) {}
  bool ok() const { return ok_; }
  std::size_t position() const { return pos_; }
  std::string_view take(std::size_t n) {
    if (!ok_ || bytes_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint8_t u8() {
    auto b = take(1);
    return b.empty() ? 0 : static_cast<uint8_t>(b[0]);
  }
  int64_t bigEndian(std::size_t n) {
    auto b = take(n);
    if (b.size() != n) return 0;
    uint64_t value = 0;
    for (char c : b) value = (value << 8) | static_cast<uint8_t>(c);
    if (n == 4) return static_cast<int32_t>(static_cast<uint32_t>(value));
    return static_cast<int64_t>(value);
  }

 private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

struct TzifCounts {
  int64_t isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt;
};

std::expected<std::pair<char, TzifCounts>, std::string> readHeader(TzifReader& in) {
  if (in.take(4) != "TZif") return std::unexpected("no TZif magic");
  const char version = static_cast<char>(in.u8());
  in.take(15);
  TzifCounts c{};
  c.isutcnt = in.bigEndian(4);
  c.isstdcnt = in.bigEndian(4);
  c.leapcnt = in.bigEndian(4);
  c.timecnt = in.bigEndian(4);
  c.typecnt = in.bigEndian(4);
  c.charcnt = in.bigEndian(4);
  if (!in.ok()) return std::unexpected("truncated header");
  for (int64_t n : {c.isutcnt, c.isstdcnt, c.leapcnt, c.timecnt, c.typecnt, c.charcnt}) {
    if (n < 0 || n > 1'000'000) return std::unexpected("implausible counts in the header");
  }
  if (c.typecnt < 1) return std::unexpected("no local time types");
  return std::pair{version, c};
}

// --- the POSIX TZ footer rule (RFC 8536 3.3, POSIX 8.3 with the RFC's extensions) ---

struct RuleDate {
  char kind = 'M';  // 'J': Julian day 1..365 without Feb 29; 'D': day 0..365; 'M': month.week.day
  int a = 0, b = 0, c = 0;
  int32_t time = 2 * 3600;  // local time of the change, may be negative or above 24 h
};

struct PosixRule {
  int32_t std_offset = 0;  // UTC offset (east positive), unlike the TZ string's sign
  std::optional<int32_t> dst_offset;
  RuleDate start, end;
};

class PosixParser {
 public:
  explicit PosixParser(std::string_view text) : s_(text) {}

  std::optional<PosixRule> parse() {
    PosixRule rule;
    if (!name()) return std::nullopt;
    auto std_offset = offset(24);
    if (!std_offset) return std::nullopt;
    rule.std_offset = -*std_offset;
    if (done()) return rule;
    if (!name()) return std::nullopt;
    rule.dst_offset = rule.std_offset + 3600;
    if (!done() && peek() != ',') {
      auto dst = offset(24);
      if (!dst) return std::nullopt;
      rule.dst_offset = -*dst;
    }
    if (done()) {
      // POSIX's default when a zone has DST but no rule: the US rules.
      rule.start = RuleDate{'M', 3, 2, 0};
      rule.end = RuleDate{'M', 11, 1, 0};
      return rule;
    }
    if (!eat(',')) return std::nullopt;
    auto start = date();
    if (!start || !eat(',')) return std::nullopt;
    auto end = date();
    if (!end || !done()) return std::nullopt;
    rule.start = *start;
    rule.end = *end;
    return rule;
  }

 private:
  bool done() const { return i_ >= s_.size(); }
  char peek() const { return done() ? '\0' : s_[i_]; }
  bool eat(char c) {
    if (peek() != c) return false;
    ++i_;
    return true;
  }
  bool name() {
    if (eat('<')) {
      const std::size_t close = s_.find('>', i_);
      if (close == std::string_view::npos || close - i_ < 3) return false;
      i_ = close + 1;
      return true;
    }
    const std::size_t start = i_;
    while (!done() && std::isalpha(static_cast<unsigned char>(peek()))) ++i_;
    return i_ - start >= 3;
  }
  std::optional<int> number(int max) {
    const std::size_t start = i_;
    int value = 0;
    while (!done() && std::isdigit(static_cast<unsigned char>(peek()))) {
      value = value * 10 + (s_[i_++] - '0');
      if (value > max) return std::nullopt;
    }
    if (i_ == start) return std::nullopt;
    return value;
  }
  // [+-]hh[:mm[:ss]] in seconds.
  std::optional<int32_t> offset(int max_hours) {
    int sign = 1;
    if (eat('-')) {
      sign = -1;
    } else {
      eat('+');
    }
    auto h = number(max_hours);
    if (!h) return std::nullopt;
    int32_t seconds = *h * 3600;
    if (eat(':')) {
      auto m = number(59);
      if (!m) return std::nullopt;
      seconds += *m * 60;
      if (eat(':')) {
        auto sec = number(59);
        if (!sec) return std::nullopt;
        seconds += *sec;
      }
    }
    return sign * seconds;
  }
  std::optional<RuleDate> date() {
    RuleDate d;
    if (eat('J')) {
      auto n = number(365);
      if (!n || *n < 1) return std::nullopt;
      d = RuleDate{'J', *n, 0, 0};
    } else if (eat('M')) {
      auto m = number(12);
      if (!m || *m < 1 || !eat('.')) return std::nullopt;
      auto w = number(5);
      if (!w || *w < 1 || !eat('.')) return std::nullopt;
      auto wd = number(6);
      if (!wd) return std::nullopt;
      d = RuleDate{'M', *m, *w, *wd};
    } else {
      auto n = number(365);
      if (!n) return std::nullopt;
      d = RuleDate{'D', *n, 0, 0};
    }
    if (eat('/')) {
      auto time = offset(167);
      if (!time) return std::nullopt;
      d.time = *time;
    }
    return d;
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

sys_days ruleDay(const RuleDate& rule, int y) {
  const year yr{y};
  const sys_days jan1 = sys_days(yr / January / 1);
  switch (rule.kind) {
    case 'J':
      return jan1 + days(rule.a - 1 + (yr.is_leap() && rule.a >= 60 ? 1 : 0));
    case 'D':
      return jan1 + days(rule.a);
    default: {
      const month m{static_cast<unsigned>(rule.a)};
      const sys_days first = sys_days(yr / m / 1);
      const int first_wd = static_cast<int>(weekday(first).c_encoding());
      int day = 1 + (rule.c - first_wd + 7) % 7 + (rule.b - 1) * 7;
      const int last = static_cast<int>(static_cast<unsigned>((yr / m / std::chrono::last).day()));
      while (day > last) day -= 7;
      return first + days(day - 1);
    }
  }
}

// Appends the rule's transitions after `after` through kLastRuleYear to `data`.
void extendByRule(TimeZone::Data& data, const PosixRule& rule, int64_t after, int from_year) {
  int32_t current = data.at.empty() ? data.initial_offset : data.offset.back();
  if (!rule.dst_offset) {
    if (rule.std_offset != current) {
      data.at.push_back(after + 1);
      data.offset.push_back(rule.std_offset);
    }
    return;
  }
  std::vector<std::pair<int64_t, int32_t>> changes;
  for (int y = from_year; y <= TimeZone::kLastRuleYear; ++y) {
    const int64_t start = (ruleDay(rule.start, y).time_since_epoch() / seconds(1)) +
                          rule.start.time - rule.std_offset;
    const int64_t end =
        (ruleDay(rule.end, y).time_since_epoch() / seconds(1)) + rule.end.time - *rule.dst_offset;
    changes.emplace_back(start, *rule.dst_offset);
    changes.emplace_back(end, rule.std_offset);
  }
  std::stable_sort(changes.begin(), changes.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 0; i < changes.size(); ++i) {
    // Several changes at one instant (permanent DST written as a year-long rule): the last wins.
    if (i + 1 < changes.size() && changes[i + 1].first == changes[i].first) continue;
    const auto [at, offset] = changes[i];
    if (at <= after || offset == current) continue;
    data.at.push_back(at);
    data.offset.push_back(offset);
    current = offset;
  }
}

std::expected<std::shared_ptr<TimeZone::Data>, std::string> parseTzif(std::string name,
                                                                      std::string_view bytes) {
  TzifReader in(bytes);
  auto header = readHeader(in);
  if (!header) return std::unexpected(header.error());
  auto [version, counts] = *header;
  std::size_t time_size = 4;
  if (version != '\0') {
    // Skip the 32-bit block: the 64-bit one follows with its own header.
    in.take(static_cast<std::size_t>(counts.timecnt * 5 + counts.typecnt * 6 + counts.charcnt +
                                     counts.leapcnt * 8 + counts.isstdcnt + counts.isutcnt));
    header = readHeader(in);
    if (!header) return std::unexpected("second header: " + header.error());
    counts = header->second;
    time_size = 8;
  }
  if (counts.leapcnt != 0)
    return std::unexpected("a zone with leap seconds (right/...) is not supported");
  std::vector<int64_t> times(static_cast<std::size_t>(counts.timecnt));
  for (auto& t : times) t = in.bigEndian(time_size);
  std::vector<uint8_t> indices(static_cast<std::size_t>(counts.timecnt));
  for (auto& i : indices) i = in.u8();
  std::vector<int32_t> type_offsets(static_cast<std::size_t>(counts.typecnt));
  for (auto& offset : type_offsets) {
    offset = static_cast<int32_t>(in.bigEndian(4));
    in.take(2);  // isdst, desigidx
  }
  in.take(static_cast<std::size_t>(counts.charcnt + counts.isstdcnt + counts.isutcnt));
  if (!in.ok()) return std::unexpected("truncated data block");

  auto data = std::make_shared<TimeZone::Data>();
  data->name = std::move(name);
  for (int32_t offset : type_offsets) {
    if (offset <= -kMaxOffset || offset >= kMaxOffset)
      return std::unexpected(fmt::format("UTC offset {} s is out of range", offset));
  }
  data->initial_offset = type_offsets[0];
  int32_t current = data->initial_offset;
  for (std::size_t i = 0; i < times.size(); ++i) {
    if (indices[i] >= type_offsets.size()) return std::unexpected("a bad local time type index");
    if (i > 0 && times[i] <= times[i - 1]) return std::unexpected("transitions out of order");
    const int32_t offset = type_offsets[indices[i]];
    if (offset == current) continue;
    data->at.push_back(times[i]);
    data->offset.push_back(offset);
    current = offset;
  }

  if (version != '\0') {
    // The footer: "\n<POSIX TZ string>\n"; empty means no rule after the last transition.
    const std::string_view rest = bytes.substr(in.position());
    if (rest.size() < 2 || rest[0] != '\n') return std::unexpected("no footer");
    const std::size_t close = rest.find('\n', 1);
    if (close == std::string_view::npos) return std::unexpected("an unterminated footer");
    const std::string_view tz = rest.substr(1, close - 1);
    if (!tz.empty()) {
      auto rule = PosixParser(tz).parse();
      if (!rule) return std::unexpected(fmt::format("a footer rule it cannot read: '{}'", tz));
      const int64_t last = times.empty() ? std::numeric_limits<int32_t>::min() : times.back();
      const int from_year =
          times.empty()
              ? 1970
              : static_cast<int>(year_month_day(floor<days>(sys_seconds(seconds(last)))).year()) -
                    1;
      extendByRule(*data, *rule, last, from_year);
    }
  }
  return data;
}

bool validZoneName(std::string_view name) {
  if (name.empty() || name.size() > 64 || !std::isalpha(static_cast<unsigned char>(name[0])))
    return false;
  bool after_slash = false;
  for (char c : name) {
    if (c == '/') {
      if (after_slash) return false;
      after_slash = true;
      continue;
    }
    after_slash = false;
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '+' && c != '-')
      return false;
  }
  return !after_slash;
}

std::shared_ptr<const TimeZone::Data> utcData() {
  static const auto utc = [] {
    auto data = std::make_shared<TimeZone::Data>();
    data->name = "UTC";
    return std::shared_ptr<const TimeZone::Data>(std::move(data));
  }();
  return utc;
}

}  // namespace

TimeZone::TimeZone() : data_(utcData()) {}

const std::string& TimeZone::name() const {
  return data_->name;
}

std::expected<TimeZone, std::string> TimeZone::fromTzif(std::string name, std::string_view bytes) {
  auto data = parseTzif(std::move(name), bytes);
  if (!data) return std::unexpected(data.error());
  return TimeZone(std::shared_ptr<const Data>(std::move(*data)));
}

std::expected<TimeZone, std::string> TimeZone::load(std::string_view name) {
  if (name == "UTC") return TimeZone();
  if (!validZoneName(name) || name == "localtime" || name == "posixrules") {
    return std::unexpected(fmt::format(
        "'{}' is not a time zone name (an IANA name such as Europe/Berlin, or UTC)", name));
  }
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Data>, std::less<>> loaded;
  {
    std::lock_guard lock(mu);
    if (auto it = loaded.find(name); it != loaded.end()) return TimeZone(it->second);
  }
  const char* tzdir = std::getenv("TZDIR");
  const std::filesystem::path dir = tzdir && *tzdir ? tzdir : "/usr/share/zoneinfo";
  const std::filesystem::path path = dir / std::string(name);
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return std::unexpected(
        fmt::format("unknown time zone '{}' (not in the tz database at {}{})", name, dir.string(),
                    std::filesystem::exists(dir, error) ? "" : ", which is not installed"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in)
    return std::unexpected(fmt::format("time zone '{}': cannot read {}", name, path.string()));
  auto zone = fromTzif(std::string(name), bytes.str());
  if (!zone) {
    return std::unexpected(
        fmt::format("time zone '{}': {}: {}", name, path.string(), zone.error()));
  }
  std::lock_guard lock(mu);
  loaded.emplace(std::string(name), zone->data_);
  return zone;
}

seconds TimeZone::offsetAt(sys_seconds at) const {
  const auto& t = data_->at;
  const auto it = std::upper_bound(t.begin(), t.end(), at.time_since_epoch().count());
  if (it == t.begin()) return seconds(data_->initial_offset);
  return seconds(data_->offset[static_cast<std::size_t>(it - t.begin() - 1)]);
}

std::optional<seconds> TimeZone::fixedOffsetBetween(sys_seconds from, sys_seconds to) const {
  const auto& t = data_->at;
  const auto first = std::upper_bound(t.begin(), t.end(), from.time_since_epoch().count());
  const auto last = std::upper_bound(t.begin(), t.end(), to.time_since_epoch().count());
  if (first != last) return std::nullopt;
  return offsetAt(from);
}

local_seconds TimeZone::toLocal(sys_seconds at) const {
  return local_seconds(at.time_since_epoch() + offsetAt(at));
}

TimeZone::LocalLookup TimeZone::lookup(local_seconds local) const {
  const auto& t = data_->at;
  const int64_t l = local.time_since_epoch().count();
  // Pieces of constant offset: k = -1 before t[0], k = i from t[i] to t[i+1]. Only those near
  // `local` can hold an instant that shows it.
  auto offsetOf = [&](std::ptrdiff_t k) {
    return k < 0 ? data_->initial_offset : data_->offset[static_cast<std::size_t>(k)];
  };
  const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(t.size());
  std::ptrdiff_t k = std::upper_bound(t.begin(), t.end(), l - kMaxOffset) - t.begin() - 1;
  std::vector<int64_t> found;
  std::optional<int64_t> gap_end;
  for (; k < n && (k < 0 || t[static_cast<std::size_t>(k)] <= l + kMaxOffset); ++k) {
    const int64_t start =
        k < 0 ? std::numeric_limits<int64_t>::min() : t[static_cast<std::size_t>(k)];
    const int64_t end =
        k + 1 < n ? t[static_cast<std::size_t>(k + 1)] : std::numeric_limits<int64_t>::max();
    const int64_t u = l - offsetOf(k);
    if (start <= u && u < end) found.push_back(u);
    if (k >= 0 && !gap_end) {
      // The wall clock jumps from start + before to start + after at this transition.
      const int64_t before = offsetOf(k - 1);
      const int64_t after = offsetOf(k);
      if (start + before <= l && l < start + after) gap_end = start;
    }
  }
  LocalLookup result;
  if (found.empty()) {
    result.kind = LocalLookup::Kind::kSkipped;
    result.first = sys_seconds(seconds(gap_end.value_or(l - offsetOf(k - 1))));
    return result;
  }
  result.first = sys_seconds(seconds(found.front()));
  if (found.size() > 1) {
    result.kind = LocalLookup::Kind::kRepeated;
    result.second = sys_seconds(seconds(found.back()));
  }
  return result;
}

}  // namespace rtable::controllers
