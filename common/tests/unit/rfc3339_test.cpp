#include "rtable/common/rfc3339.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace rtable::common {
namespace {

using namespace std::chrono;
using namespace std::chrono_literals;

const sys_time<nanoseconds> kTime = sys_days{2025y / January / 2} + 3h + 4min + 5s + 123'456'789ns;

TEST(Rfc3339, WholeSecondsRoundDown) {
  EXPECT_EQ(formatRfc3339(time_point_cast<system_clock::duration>(kTime)), "2025-01-02T03:04:05Z");
  EXPECT_EQ(formatRfc3339(sys_days{2025y / January / 2}), "2025-01-02T00:00:00Z");
  EXPECT_EQ(formatRfc3339(sys_days{2024y / December / 31} + 23h + 59min + 59s + 999ms),
            "2024-12-31T23:59:59Z");
}

TEST(Rfc3339, MicrosecondsHaveSixDigits) {
  EXPECT_EQ(formatRfc3339Micros(time_point_cast<system_clock::duration>(kTime)),
            "2025-01-02T03:04:05.123456Z");
  EXPECT_EQ(formatRfc3339Micros(sys_days{2025y / January / 2} + 7us),
            "2025-01-02T00:00:00.000007Z");
  EXPECT_EQ(formatRfc3339Micros(sys_days{2025y / January / 2}), "2025-01-02T00:00:00.000000Z");
  // A leap day, and the last microsecond of a year.
  EXPECT_EQ(formatRfc3339Micros(sys_days{2028y / February / 29} + 12h),
            "2028-02-29T12:00:00.000000Z");
  EXPECT_EQ(formatRfc3339Micros(sys_days{2026y / January / 1} - 1us),
            "2025-12-31T23:59:59.999999Z");
  EXPECT_EQ(formatRfc3339Micros(system_clock::time_point(1500000us)),
            "1970-01-01T00:00:01.500000Z");
  EXPECT_EQ(formatRfc3339Micros(system_clock::time_point(1'700'000'000s) + 7us),
            "2023-11-14T22:13:20.000007Z");
}

TEST(Rfc3339, ParsesWhatItFormatsAndRefusesTheRest) {
  const auto time = time_point_cast<system_clock::duration>(kTime);
  EXPECT_EQ(parseRfc3339(formatRfc3339(time)), floor<seconds>(time));
  EXPECT_EQ(parseRfc3339(formatRfc3339Micros(time)), floor<microseconds>(time));
  EXPECT_EQ(parseRfc3339("2028-02-29T12:00:00.5Z"), sys_days{2028y / February / 29} + 12h + 500ms);
  for (const char* bad : {"", "2025-01-02", "2025-01-02T03:04:05", "2025-01-02T03:04:05+01:00",
                          "2025-02-30T00:00:00Z", "2025-01-02T24:00:00Z", "2025-01-02T03:04:05.Z",
                          "2025-01-02 03:04:05Z", "2025-01-02T03:04:0xZ"}) {
    EXPECT_FALSE(parseRfc3339(bad)) << bad;
  }
}

TEST(Rfc3339, BeforeTheEpochRoundsDownToo) {
  const auto time = sys_days{1970y / January / 1} - 500ms;
  EXPECT_EQ(formatRfc3339(time), "1969-12-31T23:59:59Z");
  EXPECT_EQ(formatRfc3339Micros(time), "1969-12-31T23:59:59.500000Z");
}

// fmt 9 formats a time_point in local time; these must not.
TEST(Rfc3339, IsUtcWhateverTheLocalZone) {
  const char* old = std::getenv("TZ");
  const std::string saved = old ? old : "";
  setenv("TZ", "America/New_York", 1);
  tzset();
  const std::string seconds = formatRfc3339(sys_days{2025y / January / 2} + 3h);
  const std::string micros = formatRfc3339Micros(sys_days{2025y / January / 2} + 3h);
  if (old) {
    setenv("TZ", saved.c_str(), 1);
  } else {
    unsetenv("TZ");
  }
  tzset();
  EXPECT_EQ(seconds, "2025-01-02T03:00:00Z");
  EXPECT_EQ(micros, "2025-01-02T03:00:00.000000Z");
}

}  // namespace
}  // namespace rtable::common
