// ClusterBackupSpec and BackupScheduleSpec: the specs of the ClusterBackup and BackupSchedule
// custom resources (crds/, docs/crds.md) as plain data, with the CRD schema's defaults and checks
// and errors that name the field's path. CronSchedule is the schedule's five cron fields.
//
// Plain copyable values; no shared state: thread-safe as values are.
#pragma once

#include <bitset>
#include <chrono>
#include <cstdint>
#include <expected>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/controllers/spec_error.h"
#include "rtable/controllers/time_zone.h"

namespace rtable::controllers {

// metav1.LabelSelector.
struct LabelSelectorSpec {
  struct Requirement {
    std::string key;
    std::string op;  // In, NotIn, Exists, DoesNotExist
    std::vector<std::string> values;
    friend bool operator==(const Requirement&, const Requirement&) = default;
  };
  std::map<std::string, std::string> match_labels;
  std::vector<Requirement> match_expressions;

  // The apiserver's string form ("team=analytics,tier notin (scratch)"), for list calls and
  // op::LabelSelector::parse.
  std::string toSelectorString() const;
  friend bool operator==(const LabelSelectorSpec&, const LabelSelectorSpec&) = default;
};

// Where a backup goes: exactly one of the three.
struct BackupDestination {
  struct Filesystem {
    std::string path;  // absolute, the same on every replica
    friend bool operator==(const Filesystem&, const Filesystem&) = default;
  };
  struct PersistentVolumeClaim {
    std::string claim_name;
    std::string sub_path;  // relative, may be empty
    friend bool operator==(const PersistentVolumeClaim&, const PersistentVolumeClaim&) = default;
  };
  // An S3-compatible bucket. The credentials are two keys of a Secret in the backup's namespace
  // that every replica of the tables mounts (ReplicatedTable spec.backupCredentials): the keys
  // never pass through the operator or ZooKeeper.
  struct S3 {
    std::string endpoint;  // http(s)://host[:port][/path]
    std::string bucket;
    std::string prefix;  // may be empty
    std::string region = "us-east-1";
    std::string credentials_secret;
    std::string access_key_id_key = "accessKeyId";
    std::string secret_access_key_key = "secretAccessKey";
    friend bool operator==(const S3&, const S3&) = default;
  };
  std::optional<Filesystem> filesystem;
  std::optional<PersistentVolumeClaim> persistent_volume_claim;
  std::optional<S3> s3;
  friend bool operator==(const BackupDestination&, const BackupDestination&) = default;
};

// What deleting a ClusterBackup does to its data in the destination (backup_deletion.h).
enum class DeletionPolicy { kDelete, kRetain };
std::string_view deletionPolicyName(DeletionPolicy policy);

struct ClusterBackupSpec {
  // Exactly one of table and selector.
  std::optional<std::string> table;
  std::optional<LabelSelectorSpec> selector;
  BackupDestination destination;
  DeletionPolicy deletion_policy = DeletionPolicy::kDelete;  // the one field that may change

  // `path` is where `spec` sits in its object: "spec", or "spec.template.spec" in a schedule.
  static std::expected<ClusterBackupSpec, SpecError> parse(const nlohmann::json& spec,
                                                           std::string_view path = "spec");
  nlohmann::json toJson() const;
  friend bool operator==(const ClusterBackupSpec&, const ClusterBackupSpec&) = default;
};

// A ClusterBackup is one run: its spec never changes, but for deletionPolicy.
std::optional<SpecError> checkClusterBackupUpdate(const ClusterBackupSpec& old_spec,
                                                  const ClusterBackupSpec& new_spec);

// Five cron fields (minute hour day-of-month month day-of-week) as Vixie cron and Kubernetes
// CronJobs read them: *, values, ranges a-b, lists, /step; months JAN-DEC and days SUN-SAT by name
// (all upper or all lower case); day-of-week 7 is Sunday. When both day fields are restricted, a
// day matching either is a match.
//
// The fields are wall-clock times in a TimeZone (UTC unless given). Across a daylight-saving
// change the schedule behaves as Vixie cron (Debian's cron(8)) does, which for a backup is what
// one wants: a run that happens once a day still happens once that day.
//   - A local time the clocks skip (spring forward, Europe/Berlin 02:00-03:00): a fixed-time
//     schedule (neither the minute nor the hour field starts with '*', e.g. "30 2 * * *") runs at
//     the end of the gap (03:00 local, the instant of the change); a wildcard one ("*/15 * * * *",
//     "30 * * * *") has no run at the times that do not exist.
//   - A local time the clocks repeat (fall back, 02:00-03:00 twice): a fixed-time schedule runs at
//     the first occurrence only; a wildcard one runs at both (it follows elapsed time).
// Kubernetes CronJobs (robfig/cron) differ: they skip a fixed-time run in a gap and run it twice
// in an overlap. Unlike Vixie cron there is no 3-hour limit: that limit is about a system clock
// that jumped, and a zone's transitions are known exactly.
class CronSchedule {
 public:
  // The error names the field ("minute 61 is out of range 0-59").
  static std::expected<CronSchedule, std::string> parse(std::string_view text);

  const std::string& text() const { return text_; }
  // The first run strictly after `after` (seconds dropped), or nullopt when none within five
  // years (e.g. "0 0 30 2 *").
  std::optional<std::chrono::sys_seconds> next(std::chrono::sys_seconds after,
                                               const TimeZone& zone = TimeZone()) const;
  // The last run at or before `at`, or nullopt when none within the five years before it.
  std::optional<std::chrono::sys_seconds> previous(std::chrono::sys_seconds at,
                                                   const TimeZone& zone = TimeZone()) const;
  // Neither the minute nor the hour field starts with '*' (see the class comment).
  bool fixedTime() const { return fixed_time_; }

  friend bool operator==(const CronSchedule& a, const CronSchedule& b) {
    return a.text_ == b.text_;
  }

 private:
  bool matchesDay(std::chrono::year_month_day day) const;
  // The runs whose wall-clock date is `day`, ascending.
  std::vector<std::chrono::sys_seconds> runsOn(std::chrono::local_days day,
                                               const TimeZone& zone) const;

  std::string text_;
  std::bitset<60> minutes_;
  std::bitset<24> hours_;
  std::bitset<32> days_of_month_;  // 1..31
  std::bitset<13> months_;         // 1..12
  std::bitset<7> days_of_week_;    // 0 = Sunday
  bool day_of_month_any_ = false;
  bool day_of_week_any_ = false;
  bool fixed_time_ = false;
};

enum class ConcurrencyPolicy { kForbid, kAllow, kReplace };
std::string_view concurrencyPolicyName(ConcurrencyPolicy policy);

struct RetentionPolicy {
  std::optional<int32_t> keep_last;
  std::optional<std::string> max_age;  // as written: "30d", "1w2d", "12h"
  // max_age in seconds.
  std::optional<std::chrono::seconds> maxAge() const;
  friend bool operator==(const RetentionPolicy&, const RetentionPolicy&) = default;
};

// "30d", "1w2d", "90m": whole numbers with units w, d, h, m, s; the error says what is wrong.
std::expected<std::chrono::seconds, std::string> parseRetentionAge(std::string_view text);

// A BackupSchedule's metadata.name is the value of the label rtable.io/backup-schedule on its
// ClusterBackups and the prefix of their names: a DNS-1123 subdomain of at most 63 characters.
std::optional<SpecError> checkBackupScheduleName(std::string_view name);

struct BackupScheduleSpec {
  CronSchedule schedule;
  // spec.timeZone: the zone the schedule's fields are read in (UTC when unset).
  TimeZone time_zone;
  // A run that could not start at its time (the operator was down) still starts this long after
  // it, not later; unset: however late.
  std::optional<std::chrono::seconds> starting_deadline;
  std::map<std::string, std::string> template_labels;
  std::map<std::string, std::string> template_annotations;
  ClusterBackupSpec template_spec;
  std::optional<RetentionPolicy> retention;
  ConcurrencyPolicy concurrency_policy = ConcurrencyPolicy::kForbid;
  bool suspend = false;

  // Loads spec.timeZone (TimeZone::load): an unknown zone is an error naming the field.
  static std::expected<BackupScheduleSpec, SpecError> parse(const nlohmann::json& spec);
  nlohmann::json toJson() const;
  friend bool operator==(const BackupScheduleSpec&, const BackupScheduleSpec&) = default;
};

}  // namespace rtable::controllers
