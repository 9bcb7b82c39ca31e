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

// Where a backup goes: exactly one of the two.
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
  std::optional<Filesystem> filesystem;
  std::optional<PersistentVolumeClaim> persistent_volume_claim;
  friend bool operator==(const BackupDestination&, const BackupDestination&) = default;
};

struct ClusterBackupSpec {
  // Exactly one of table and selector.
  std::optional<std::string> table;
  std::optional<LabelSelectorSpec> selector;
  BackupDestination destination;

  // `path` is where `spec` sits in its object: "spec", or "spec.template.spec" in a schedule.
  static std::expected<ClusterBackupSpec, SpecError> parse(const nlohmann::json& spec,
                                                           std::string_view path = "spec");
  nlohmann::json toJson() const;
  friend bool operator==(const ClusterBackupSpec&, const ClusterBackupSpec&) = default;
};

// A ClusterBackup is one run: its spec never changes.
std::optional<SpecError> checkClusterBackupUpdate(const ClusterBackupSpec& old_spec,
                                                  const ClusterBackupSpec& new_spec);

// Five cron fields (minute hour day-of-month month day-of-week), in UTC, as Vixie cron and
// Kubernetes CronJobs read them: *, values, ranges a-b, lists, /step; months JAN-DEC and days
// SUN-SAT by name (all upper or all lower case); day-of-week 7 is Sunday. When both day fields
// are restricted, a day matching either is a match.
class CronSchedule {
 public:
  // The error names the field ("minute 61 is out of range 0-59").
  static std::expected<CronSchedule, std::string> parse(std::string_view text);

  const std::string& text() const { return text_; }
  // The first matching minute strictly after `after` (seconds dropped), or nullopt when none
  // within five years (e.g. "0 0 30 2 *").
  std::optional<std::chrono::sys_seconds> next(std::chrono::sys_seconds after) const;

  friend bool operator==(const CronSchedule& a, const CronSchedule& b) {
    return a.text_ == b.text_;
  }

 private:
  bool matchesDay(std::chrono::year_month_day day) const;

  std::string text_;
  std::bitset<60> minutes_;
  std::bitset<24> hours_;
  std::bitset<32> days_of_month_;  // 1..31
  std::bitset<13> months_;         // 1..12
  std::bitset<7> days_of_week_;    // 0 = Sunday
  bool day_of_month_any_ = false;
  bool day_of_week_any_ = false;
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

struct BackupScheduleSpec {
  CronSchedule schedule;
  std::map<std::string, std::string> template_labels;
  std::map<std::string, std::string> template_annotations;
  ClusterBackupSpec template_spec;
  std::optional<RetentionPolicy> retention;
  ConcurrencyPolicy concurrency_policy = ConcurrencyPolicy::kForbid;
  bool suspend = false;

  static std::expected<BackupScheduleSpec, SpecError> parse(const nlohmann::json& spec);
  nlohmann::json toJson() const;
  friend bool operator==(const BackupScheduleSpec&, const BackupScheduleSpec&) = default;
};

}  // namespace rtable::controllers
