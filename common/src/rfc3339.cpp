#include "rtable/common/rfc3339.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

namespace rtable::common {
namespace {

using std::chrono::system_clock;

// fmt 9 formats a system_clock::time_point in local time: go through fmt::gmtime's std::tm.
std::tm utc(system_clock::time_point seconds) {
  return fmt::gmtime(system_clock::to_time_t(seconds));
}

}  // namespace

std::string formatRfc3339(system_clock::time_point time) {
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}Z", utc(std::chrono::floor<std::chrono::seconds>(time)));
}

std::optional<system_clock::time_point> parseRfc3339(std::string_view text) {
  // YYYY-MM-DDTHH:MM:SS[.ffffff]Z
  auto digits = [&](std::size_t at, std::size_t count) -> std::optional<int> {
    if (at + count > text.size()) return std::nullopt;
    int value = 0;
    for (std::size_t i = at; i < at + count; ++i) {
      if (text[i] < '0' || text[i] > '9') return std::nullopt;
      value = value * 10 + (text[i] - '0');
    }
    return value;
  };
  if (text.size() < 20 || text[4] != '-' || text[7] != '-' || text[10] != 'T' || text[13] != ':' ||
      text[16] != ':' || text.back() != 'Z') {
    return std::nullopt;
  }
  auto year = digits(0, 4), month = digits(5, 2), day = digits(8, 2), hour = digits(11, 2),
       minute = digits(14, 2), second = digits(17, 2);
  if (!year || !month || !day || !hour || !minute || !second) return std::nullopt;
  const std::chrono::year_month_day date{std::chrono::year{*year},
                                         std::chrono::month{static_cast<unsigned>(*month)},
                                         std::chrono::day{static_cast<unsigned>(*day)}};
  if (!date.ok() || *hour > 23 || *minute > 59 || *second > 60) return std::nullopt;
  std::chrono::microseconds fraction{0};
  if (text.size() > 20) {
    if (text[19] != '.' || text.size() == 21) return std::nullopt;
    int64_t micros = 0;
    std::size_t count = 0;
    for (std::size_t i = 20; i + 1 < text.size(); ++i, ++count) {
      if (text[i] < '0' || text[i] > '9') return std::nullopt;
      if (count < 6) micros = micros * 10 + (text[i] - '0');
    }
    for (; count < 6; ++count) micros *= 10;
    fraction = std::chrono::microseconds(micros);
  }
  return std::chrono::sys_days(date) + std::chrono::hours(*hour) + std::chrono::minutes(*minute) +
         std::chrono::seconds(*second) + fraction;
}

std::string formatRfc3339Micros(system_clock::time_point time) {
  const auto seconds = std::chrono::floor<std::chrono::seconds>(time);
  const auto micros = std::chrono::floor<std::chrono::microseconds>(time - seconds).count();
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06}Z", utc(seconds), micros);
}

}  // namespace rtable::common
