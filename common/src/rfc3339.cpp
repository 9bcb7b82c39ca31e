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

std::string formatRfc3339Micros(system_clock::time_point time) {
  const auto seconds = std::chrono::floor<std::chrono::seconds>(time);
  const auto micros = std::chrono::floor<std::chrono::microseconds>(time - seconds).count();
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06}Z", utc(seconds), micros);
}

}  // namespace rtable::common
