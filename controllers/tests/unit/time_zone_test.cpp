// TimeZone on Debian's tzdata: offsets and local-time lookups (gaps, overlaps) at known
// transitions, the footer rule beyond the file's table, glibc's localtime_r as an oracle for
// several zones over decades, and the errors.
#include "rtable/controllers/time_zone.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

namespace rtable::controllers {
namespace {

using namespace std::chrono;
using Kind = TimeZone::LocalLookup::Kind;

sys_seconds utc(int y, unsigned m, unsigned d, int h, int min = 0) {
  return sys_days(year{y} / month{m} / day{d}) + hours(h) + minutes(min);
}
local_seconds local(int y, unsigned m, unsigned d, int h, int min = 0) {
  return local_days(year{y} / month{m} / day{d}) + hours(h) + minutes(min);
}

TimeZone zone(const char* name) {
  auto loaded = TimeZone::load(name);
  EXPECT_TRUE(loaded) << loaded.error();
  return loaded ? *loaded : TimeZone();
}

TEST(TimeZone, UtcIsBuiltIn) {
  const TimeZone utc_zone;
  EXPECT_EQ(utc_zone.name(), "UTC");
  EXPECT_EQ(zone("UTC"), utc_zone);
  EXPECT_EQ(utc_zone.offsetAt(utc(2026, 7, 1, 0)), seconds(0));
  EXPECT_EQ(utc_zone.lookup(local(2026, 3, 29, 2, 30)).first, utc(2026, 3, 29, 2, 30));
  EXPECT_EQ(zone("Etc/UTC").offsetAt(utc(2026, 7, 1, 0)), seconds(0));
}

TEST(TimeZone, BerlinAcrossItsTransitions) {
  const TimeZone berlin = zone("Europe/Berlin");
  EXPECT_EQ(berlin.name(), "Europe/Berlin");
  EXPECT_EQ(berlin.offsetAt(utc(2026, 1, 15, 12)), hours(1));
  EXPECT_EQ(berlin.offsetAt(utc(2026, 3, 29, 0, 59)), hours(1));
  EXPECT_EQ(berlin.offsetAt(utc(2026, 3, 29, 1, 0)), hours(2));
  EXPECT_EQ(berlin.offsetAt(utc(2026, 10, 25, 0, 59)), hours(2));
  EXPECT_EQ(berlin.offsetAt(utc(2026, 10, 25, 1, 0)), hours(1));
  EXPECT_EQ(berlin.toLocal(utc(2026, 7, 1, 1)), local(2026, 7, 1, 3));

  // Spring forward: 02:00-03:00 local does not exist; its end is 01:00 UTC.
  auto gap = berlin.lookup(local(2026, 3, 29, 2, 30));
  EXPECT_EQ(gap.kind, Kind::kSkipped);
  EXPECT_EQ(gap.first, utc(2026, 3, 29, 1, 0));
  EXPECT_EQ(berlin.lookup(local(2026, 3, 29, 2, 0)).kind, Kind::kSkipped);
  auto after_gap = berlin.lookup(local(2026, 3, 29, 3, 0));
  EXPECT_EQ(after_gap.kind, Kind::kUnique);
  EXPECT_EQ(after_gap.first, utc(2026, 3, 29, 1, 0));
  EXPECT_EQ(berlin.lookup(local(2026, 3, 29, 1, 59)).first, utc(2026, 3, 29, 0, 59));

  // Fall back: 02:00-03:00 local happens twice, first in CEST then in CET.
  auto overlap = berlin.lookup(local(2026, 10, 25, 2, 30));
  EXPECT_EQ(overlap.kind, Kind::kRepeated);
  EXPECT_EQ(overlap.first, utc(2026, 10, 25, 0, 30));
  EXPECT_EQ(overlap.second, utc(2026, 10, 25, 1, 30));
  EXPECT_EQ(berlin.lookup(local(2026, 10, 25, 3, 0)).kind, Kind::kUnique);
  EXPECT_EQ(berlin.lookup(local(2026, 10, 25, 1, 59)).kind, Kind::kUnique);

  EXPECT_EQ(berlin.fixedOffsetBetween(utc(2026, 5, 1, 0), utc(2026, 6, 1, 0)), hours(2));
  EXPECT_EQ(berlin.fixedOffsetBetween(utc(2026, 3, 28, 0), utc(2026, 3, 30, 0)), std::nullopt);
}

// Debian's files list transitions through 2037; later ones come from the footer rule.
TEST(TimeZone, TheFooterRuleGoesOnAfterTheTable) {
  const TimeZone berlin = zone("Europe/Berlin");
  EXPECT_EQ(berlin.offsetAt(utc(2050, 3, 27, 0, 59)), hours(1));
  EXPECT_EQ(berlin.offsetAt(utc(2050, 3, 27, 1, 0)), hours(2));
  EXPECT_EQ(berlin.offsetAt(utc(2050, 10, 30, 1, 0)), hours(1));
  EXPECT_EQ(berlin.offsetAt(utc(2150, 3, 29, 1, 0)), hours(2));
  EXPECT_EQ(berlin.lookup(local(2150, 10, 25, 2, 30)).kind, Kind::kRepeated);
  // Past kLastRuleYear the last offset stays.
  EXPECT_EQ(berlin.offsetAt(utc(2300, 7, 1, 0)), hours(1));
}

TEST(TimeZone, SouthernHemisphereAndHalfHours) {
  const TimeZone sydney = zone("Australia/Sydney");
  EXPECT_EQ(sydney.offsetAt(utc(2026, 1, 1, 0)), hours(11));
  EXPECT_EQ(sydney.offsetAt(utc(2026, 4, 4, 16)), hours(10));
  EXPECT_EQ(sydney.lookup(local(2026, 10, 4, 2, 30)).kind, Kind::kSkipped);
  EXPECT_EQ(sydney.lookup(local(2026, 10, 4, 2, 30)).first, utc(2026, 10, 3, 16));
  EXPECT_EQ(sydney.lookup(local(2026, 4, 5, 2, 30)).kind, Kind::kRepeated);

  const TimeZone lord_howe = zone("Australia/Lord_Howe");  // DST of 30 minutes
  EXPECT_EQ(lord_howe.offsetAt(utc(2026, 7, 1, 0)), hours(10) + minutes(30));
  EXPECT_EQ(lord_howe.offsetAt(utc(2026, 1, 1, 0)), hours(11));
  EXPECT_EQ(zone("Asia/Kolkata").offsetAt(utc(2026, 7, 1, 0)), hours(5) + minutes(30));
  EXPECT_EQ(zone("America/Sao_Paulo").offsetAt(utc(2026, 1, 1, 0)),
            hours(-3));  // no DST since 2019
}

// glibc reads the same files (and footers) on its own: every 197 minutes (a step that goes through
// every minute of the hour) from 2000 to 2060, in zones with different kinds of rules, both agree.
TEST(TimeZone, AgreesWithGlibcLocaltime) {
  const char* saved = std::getenv("TZ");
  const std::string saved_tz = saved ? saved : "";
  for (const char* name :
       {"Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe",
        "America/Santiago", "Africa/Casablanca", "Asia/Tehran", "Pacific/Apia"}) {
    SCOPED_TRACE(name);
    const TimeZone ours = zone(name);
    setenv("TZ", (std::string(":") + name).c_str(), 1);
    tzset();
    int mismatches = 0;
    for (sys_seconds t = utc(2000, 1, 1, 0); t < utc(2060, 1, 1, 0) && mismatches < 5;
         t += minutes(197)) {
      const std::time_t time = t.time_since_epoch().count();
      std::tm tm{};
      localtime_r(&time, &tm);
      if (ours.offsetAt(t) != seconds(tm.tm_gmtoff)) {
        ++mismatches;
        ADD_FAILURE() << "at " << time << ": ours " << ours.offsetAt(t).count() << " s, glibc "
                      << tm.tm_gmtoff << " s";
      }
    }
  }
  if (saved) {
    setenv("TZ", saved_tz.c_str(), 1);
  } else {
    unsetenv("TZ");
  }
  tzset();
}

TEST(TimeZone, ErrorsSayWhatIsWrong) {
  auto unknown = TimeZone::load("Mars/Olympus_Mons");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().find("unknown time zone 'Mars/Olympus_Mons'"), std::string::npos)
      << unknown.error();
  for (const char* bad : {"", "../etc/passwd", "/etc/passwd", "Europe Berlin", "Europe//Berlin",
                          "Europe/", "localtime", "posixrules", "Europe/Berlin.tz"}) {
    auto loaded = TimeZone::load(bad);
    ASSERT_FALSE(loaded) << bad;
    EXPECT_NE(loaded.error().find("is not a time zone name"), std::string::npos) << loaded.error();
  }
  auto directory = TimeZone::load("Europe");
  ASSERT_FALSE(directory);
  EXPECT_NE(directory.error().find("unknown time zone"), std::string::npos) << directory.error();
  auto leap = TimeZone::load("right/UTC");
  ASSERT_FALSE(leap);
  EXPECT_NE(leap.error().find("leap seconds"), std::string::npos) << leap.error();

  EXPECT_EQ(TimeZone::fromTzif("x", "not a tzif file").error(), "no TZif magic");
  std::ifstream in("/usr/share/zoneinfo/Europe/Berlin", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string whole = bytes.str();
  ASSERT_GT(whole.size(), 100u);
  EXPECT_TRUE(TimeZone::fromTzif("Europe/Berlin", whole));
  EXPECT_FALSE(TimeZone::fromTzif("Europe/Berlin", whole.substr(0, whole.size() / 2)));
  EXPECT_FALSE(TimeZone::fromTzif("Europe/Berlin", whole.substr(0, whole.size() - 1)));
}

}  // namespace
}  // namespace rtable::controllers
