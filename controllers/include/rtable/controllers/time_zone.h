// TimeZone: an IANA time zone ("Europe/Berlin") read from the system's tz database, for cron
// schedules evaluated in local time (BackupSchedule's spec.timeZone).
//
// g++ 12's libstdc++ has no std::chrono tzdb (locate_zone arrives with GCC 13), so this reads the
// compiled TZif files (RFC 8536) that Debian's tzdata installs under /usr/share/zoneinfo ($TZDIR
// if set, as glibc reads it): the transitions of the file, then, after its last one, those of its
// POSIX TZ footer rule ("CET-1CEST,M3.5.0,M10.5.0/3") computed through kLastRuleYear. "UTC" is
// built in, so the default zone works without tzdata installed. Leap-second ("right/") zones are
// refused.
//
// A TimeZone is an immutable value that shares its transitions (copies are cheap); load() keeps
// every zone it read for the life of the process (as std::chrono::get_tzdb() would). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::controllers {

class TimeZone {
 public:
  // The footer rule's transitions are computed up to the end of this year; later instants keep
  // the offset in force then.
  static constexpr int kLastRuleYear = 2199;

  // How a local wall-clock time maps to instants.
  struct LocalLookup {
    enum class Kind {
      kUnique,    // exactly one instant: `first`
      kSkipped,   // none: it falls in a gap (clocks moved forward); `first` is the gap's end, the
                  // instant of the transition
      kRepeated,  // two: `first` and `second` (clocks moved back)
    };
    Kind kind = Kind::kUnique;
    std::chrono::sys_seconds first;
    std::chrono::sys_seconds second;
  };

  // UTC.
  TimeZone();

  // The zone named `name` ("UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires"). The error
  // says why: not a zone name, unknown, or not a TZif file.
  static std::expected<TimeZone, std::string> load(std::string_view name);
  // A zone from the bytes of a TZif file (tests, and load()).
  static std::expected<TimeZone, std::string> fromTzif(std::string name, std::string_view bytes);

  const std::string& name() const;
  // The UTC offset in force at `at` (local = at + offset).
  std::chrono::seconds offsetAt(std::chrono::sys_seconds at) const;
  std::chrono::local_seconds toLocal(std::chrono::sys_seconds at) const;
  LocalLookup lookup(std::chrono::local_seconds local) const;
  // The offset when it is the same from `from` to `to` (no transition in between), else nullopt.
  std::optional<std::chrono::seconds> fixedOffsetBetween(std::chrono::sys_seconds from,
                                                         std::chrono::sys_seconds to) const;

  friend bool operator==(const TimeZone& a, const TimeZone& b) { return a.name() == b.name(); }

  struct Data;

 private:
  explicit TimeZone(std::shared_ptr<const Data> data) : data_(std::move(data)) {}
  std::shared_ptr<const Data> data_;
};

}  // namespace rtable::controllers
