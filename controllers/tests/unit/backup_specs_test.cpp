#include "rtable/controllers/backup_specs.h"

#include <gtest/gtest.h>

#include <regex>

#include "../crd_examples.h"
#include "rtable/controllers/yaml_json.h"
#include "rtable/operator/label_selector.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;
using namespace std::chrono;
using testing::crdsDir;
using testing::readText;

json exampleSpec(const std::string& file) {
  auto object = yamlToJson(readText(crdsDir() / "examples" / file));
  EXPECT_TRUE(object) << object.error();
  return object ? (*object)["spec"] : json();
}

json crdSchema(const std::string& file) {
  auto crd = yamlToJson(readText(crdsDir() / file));
  EXPECT_TRUE(crd) << crd.error();
  return crd ? (*crd)["spec"]["versions"][0]["schema"]["openAPIV3Schema"] : json();
}

sys_seconds specAt(int y, unsigned m, unsigned d, int h, int min) {
  return sys_days(year{y} / month{m} / day{d}) + hours(h) + minutes(min);
}

TEST(CronSchedule, NextRunTimes) {
  auto nightly = CronSchedule::parse("0 3 * * *");
  ASSERT_TRUE(nightly) << nightly.error();
  EXPECT_EQ(nightly->next(specAt(2026, 12, 1, 2, 59)), specAt(2026, 12, 1, 3, 0));
  EXPECT_EQ(nightly->next(specAt(2026, 12, 1, 3, 0)), specAt(2026, 12, 2, 3, 0));  // strictly after
  EXPECT_EQ(nightly->next(specAt(2026, 12, 31, 4, 0)), specAt(2027, 1, 1, 3, 0));

  auto quarter = CronSchedule::parse("*/15 * * * *");
  ASSERT_TRUE(quarter);
  EXPECT_EQ(quarter->next(specAt(2026, 12, 1, 10, 7) + seconds(30)), specAt(2026, 12, 1, 10, 15));
  EXPECT_EQ(quarter->next(specAt(2026, 12, 1, 23, 45)), specAt(2026, 12, 2, 0, 0));

  auto sundays = CronSchedule::parse("30 1 * * SUN");  // 2026-12-06 is a Sunday
  ASSERT_TRUE(sundays);
  EXPECT_EQ(sundays->next(specAt(2026, 12, 1, 0, 0)), specAt(2026, 12, 6, 1, 30));
  EXPECT_EQ(CronSchedule::parse("30 1 * * 7")->next(specAt(2026, 12, 1, 0, 0)),
            specAt(2026, 12, 6, 1, 30));

  // Both day fields restricted: either matches (the 15th is a Tuesday, the 7th a Monday).
  auto either = CronSchedule::parse("0 0 15 * mon");
  ASSERT_TRUE(either);
  EXPECT_EQ(either->next(specAt(2026, 12, 1, 0, 0)), specAt(2026, 12, 7, 0, 0));
  EXPECT_EQ(either->next(specAt(2026, 12, 14, 0, 0)), specAt(2026, 12, 15, 0, 0));

  auto ranges = CronSchedule::parse("5-10/5,58 9-17 1 JAN-MAR *");
  ASSERT_TRUE(ranges) << ranges.error();
  EXPECT_EQ(ranges->next(specAt(2026, 12, 1, 0, 0)), specAt(2027, 1, 1, 9, 5));
  EXPECT_EQ(ranges->next(specAt(2027, 1, 1, 9, 5)), specAt(2027, 1, 1, 9, 10));
  EXPECT_EQ(ranges->next(specAt(2027, 1, 1, 9, 10)), specAt(2027, 1, 1, 9, 58));

  EXPECT_EQ(CronSchedule::parse("0 0 30 2 *")->next(specAt(2026, 1, 1, 0, 0)), std::nullopt);
  EXPECT_EQ(CronSchedule::parse("0 0 29 2 *")->next(specAt(2026, 1, 1, 0, 0)),
            specAt(2028, 2, 29, 0, 0));
}

TimeZone zone(const char* name) {
  auto loaded = TimeZone::load(name);
  EXPECT_TRUE(loaded) << loaded.error();
  return loaded ? *loaded : TimeZone();
}

// Europe/Berlin in 2026: clocks go 02:00 -> 03:00 on March 29 (at 01:00 UTC) and 03:00 -> 02:00
// on October 25 (at 01:00 UTC). Vixie cron's rules (the class comment).
TEST(CronSchedule, AcrossDaylightSavingChangesInBerlin) {
  const TimeZone berlin = zone("Europe/Berlin");
  auto nightly = CronSchedule::parse("30 2 * * *");
  ASSERT_TRUE(nightly);
  EXPECT_TRUE(nightly->fixedTime());
  // Winter: 02:30 CET is 01:30 UTC.
  EXPECT_EQ(nightly->next(specAt(2026, 3, 27, 12, 0), berlin), specAt(2026, 3, 28, 1, 30));
  // 02:30 does not exist on March 29: the run is at the end of the gap, 03:00 CEST.
  EXPECT_EQ(nightly->next(specAt(2026, 3, 28, 1, 30), berlin), specAt(2026, 3, 29, 1, 0));
  EXPECT_EQ(nightly->next(specAt(2026, 3, 29, 1, 0), berlin), specAt(2026, 3, 30, 0, 30));
  EXPECT_EQ(nightly->previous(specAt(2026, 3, 29, 1, 0), berlin), specAt(2026, 3, 29, 1, 0));
  EXPECT_EQ(nightly->previous(specAt(2026, 3, 29, 0, 59), berlin), specAt(2026, 3, 28, 1, 30));
  // 02:30 happens twice on October 25: one run, at the first (CEST, 00:30 UTC).
  EXPECT_EQ(nightly->next(specAt(2026, 10, 24, 12, 0), berlin), specAt(2026, 10, 25, 0, 30));
  EXPECT_EQ(nightly->next(specAt(2026, 10, 25, 0, 30), berlin), specAt(2026, 10, 26, 1, 30));
  EXPECT_EQ(nightly->previous(specAt(2026, 10, 26, 1, 29), berlin), specAt(2026, 10, 25, 0, 30));

  // Wildcard schedules follow elapsed time: no run at the local times that do not exist, a run
  // at both occurrences of those that repeat.
  auto half_hourly = CronSchedule::parse("*/30 * * * *");
  ASSERT_TRUE(half_hourly);
  EXPECT_FALSE(half_hourly->fixedTime());
  EXPECT_EQ(half_hourly->next(specAt(2026, 3, 29, 0, 30), berlin), specAt(2026, 3, 29, 1, 0));
  std::vector<sys_seconds> fall;
  for (sys_seconds t = specAt(2026, 10, 24, 23, 30); fall.size() < 6;) {
    t = *half_hourly->next(t, berlin);
    fall.push_back(t);
  }
  EXPECT_EQ(fall,
            (std::vector<sys_seconds>{specAt(2026, 10, 25, 0, 0), specAt(2026, 10, 25, 0, 30),
                                      specAt(2026, 10, 25, 1, 0), specAt(2026, 10, 25, 1, 30),
                                      specAt(2026, 10, 25, 2, 0), specAt(2026, 10, 25, 2, 30)}));
  auto hourly = CronSchedule::parse("30 * * * *");
  ASSERT_TRUE(hourly);
  EXPECT_EQ(hourly->next(specAt(2026, 3, 29, 0, 30), berlin), specAt(2026, 3, 29, 1, 30));  // 03:30
  EXPECT_EQ(hourly->next(specAt(2026, 10, 25, 0, 30), berlin), specAt(2026, 10, 25, 1, 30));
  EXPECT_EQ(hourly->previous(specAt(2026, 10, 25, 1, 29), berlin), specAt(2026, 10, 25, 0, 30));
  // Hours outside the change are plain local times.
  EXPECT_EQ(CronSchedule::parse("0 3 * * *")->next(specAt(2026, 7, 1, 0, 0), berlin),
            specAt(2026, 7, 1, 1, 0));
}

// New York changes at 02:00 local (March 8 and November 1, 2026); Sydney is the other way round.
TEST(CronSchedule, AcrossDaylightSavingChangesElsewhere) {
  const TimeZone new_york = zone("America/New_York");
  // 02:00 itself is skipped: the run is at 03:00 EDT, 07:00 UTC.
  EXPECT_EQ(CronSchedule::parse("0 2 * * *")->next(specAt(2026, 3, 7, 12, 0), new_york),
            specAt(2026, 3, 8, 7, 0));
  // 01:00 happens at 05:00 UTC (EDT) and 06:00 UTC (EST): one run.
  auto one = CronSchedule::parse("0 1 * * *");
  EXPECT_EQ(one->next(specAt(2026, 10, 31, 12, 0), new_york), specAt(2026, 11, 1, 5, 0));
  EXPECT_EQ(one->next(specAt(2026, 11, 1, 5, 0), new_york), specAt(2026, 11, 2, 6, 0));
  // Sundays at 02:30 in Sydney: the October 4 run is at 03:00 AEDT (16:00 UTC the day before).
  const TimeZone sydney = zone("Australia/Sydney");
  EXPECT_EQ(CronSchedule::parse("30 2 * * SUN")->next(specAt(2026, 10, 1, 0, 0), sydney),
            specAt(2026, 10, 3, 16, 0));
  // A day's match is by the local date: Monday 00:15 in Sydney is Sunday in UTC.
  EXPECT_EQ(CronSchedule::parse("15 0 * * MON")->next(specAt(2026, 12, 1, 0, 0), sydney),
            specAt(2026, 12, 6, 13, 15));
}

TEST(CronSchedule, ErrorsSayWhatIsWrong) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"0 3 * *", "'0 3 * *' has 4 fields, expected 5"},
      {"0 3 * * * *", "has 6 fields"},
      {"61 3 * * *", "minute 61 is out of range 0-59"},
      {"0 24 * * *", "hour 24 is out of range 0-23"},
      {"0 0 0 * *", "day of month 0 is out of range 1-31"},
      {"0 0 * 13 *", "month 13 is out of range 1-12"},
      {"0 0 * * 8", "day of week 8 is out of range 0-7"},
      {"0 0 * FOO *", "month 'FOO' is not a number or a name"},
      {"0 0 * * Sun", "day of week 'Sun' is not a number or a name"},
      {"10-5 * * * *", "minute range 10-5 ends before it starts"},
      {"*/0 * * * *", "minute step '0' is not a number"},
      {"1,,2 * * * *", "minute has an empty list item"},
      {" 0 3 * * *", "must be five fields"},
      {"", "must be five fields"},
      {"every night", "has 2 fields"},
  };
  for (const auto& [text, error] : cases) {
    auto parsed = CronSchedule::parse(text);
    ASSERT_FALSE(parsed) << text;
    EXPECT_NE(parsed.error().find(error), std::string::npos)
        << parsed.error() << "\nexpected: " << error;
  }
}

// The CRD's pattern for spec.schedule and CronSchedule::parse accept the same schedules.
TEST(CronSchedule, AgreesWithTheCrdPattern) {
  const json schema = crdSchema("rtable.io_backupschedules.yaml");
  const std::regex pattern(
      schema["properties"]["spec"]["properties"]["schedule"]["pattern"].get<std::string>());
  for (const char* text : {"0 3 * * *",
                           "*/15 * * * *",
                           "30 1 * * SUN",
                           "0 0 1,15 * mon",
                           "5-10/5,58 9-17 1 JAN-MAR *",
                           "0 0 * * 1-5",
                           "0  3 * * *",
                           "0 3 1 1 0",
                           "59 23 31 12 7",
                           "0 3 * * *  ",
                           "0 3 * *",
                           "61 3 * * *",
                           "0 24 * * *",
                           "0 0 0 * *",
                           "0 0 * 13 *",
                           "0 0 * * 8",
                           "0 0 * FOO *",
                           "0 0 * * Sun",
                           "*/0 * * * *",
                           "1,,2 * * * *",
                           " 0 3 * * *",
                           "@daily",
                           "0 3 * * * *",
                           "0 0 */99 * *"}) {
    EXPECT_EQ(std::regex_match(std::string(text), pattern), CronSchedule::parse(text).has_value())
        << "'" << text << "'";
  }
}

TEST(ClusterBackupSpec, ParsesTheExamples) {
  auto single = ClusterBackupSpec::parse(exampleSpec("events-backup.yaml"));
  ASSERT_TRUE(single) << single.error().toString();
  EXPECT_EQ(single->table, "events");
  EXPECT_FALSE(single->selector);
  ASSERT_TRUE(single->destination.filesystem);
  EXPECT_EQ(single->destination.filesystem->path, "/backups/events-2026-12-01");

  auto team = ClusterBackupSpec::parse(exampleSpec("team-backup.yaml"));
  ASSERT_TRUE(team) << team.error().toString();
  ASSERT_TRUE(team->selector);
  EXPECT_EQ(team->selector->toSelectorString(), "team=analytics,tier notin (scratch)");
  ASSERT_TRUE(team->destination.persistent_volume_claim);
  EXPECT_EQ(team->destination.persistent_volume_claim->claim_name, "rtable-backups");

  // The selector string means to the runtime what the spec means.
  auto selector = op::LabelSelector::parse(team->selector->toSelectorString());
  ASSERT_TRUE(selector) << selector.error();
  EXPECT_TRUE(selector->matches({{"team", "analytics"}}));
  EXPECT_TRUE(selector->matches({{"team", "analytics"}, {"tier", "gold"}}));
  EXPECT_FALSE(selector->matches({{"team", "analytics"}, {"tier", "scratch"}}));
  EXPECT_FALSE(selector->matches({{"team", "web"}}));

  auto s3 = ClusterBackupSpec::parse(exampleSpec("events-backup-s3.yaml"));
  ASSERT_TRUE(s3) << s3.error().toString();
  ASSERT_TRUE(s3->destination.s3);
  EXPECT_EQ(s3->destination.s3->endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(s3->destination.s3->bucket, "analytics-backups");
  EXPECT_EQ(s3->destination.s3->prefix, "cluster-a");
  EXPECT_EQ(s3->destination.s3->region, "eu-west-1");
  EXPECT_EQ(s3->destination.s3->credentials_secret, "s3-backup");
  EXPECT_EQ(s3->destination.s3->access_key_id_key, "accessKeyId");  // the CRD's defaults
  EXPECT_EQ(s3->destination.s3->secret_access_key_key, "secretAccessKey");

  for (const auto* s : {&*single, &*team, &*s3}) {
    auto again = ClusterBackupSpec::parse(s->toJson());
    ASSERT_TRUE(again);
    EXPECT_EQ(*again, *s);
  }
}

TEST(ClusterBackupSpec, ErrorsNameTheField) {
  const json base = {{"table", "events"}, {"destination", {{"filesystem", {{"path", "/b"}}}}}};
  const std::vector<std::pair<json, const char*>> cases = {
      {json::object(), "spec.destination: required"},
      {{{"destination", {{"filesystem", {{"path", "/b"}}}}}},
       "spec: exactly one of table and selector"},
      {{{"table", "events"},
        {"selector", json::object()},
        {"destination", {{"filesystem", {{"path", "/b"}}}}}},
       "spec: exactly one of table and selector"},
      {{{"table", "Events"}, {"destination", {{"filesystem", {{"path", "/b"}}}}}},
       "spec.table: 'Events' is not a ReplicatedTable name"},
      {{{"table", "events"}, {"destination", json::object()}},
       "spec.destination: exactly one of filesystem, persistentVolumeClaim and s3"},
      {{{"table", "events"}, {"destination", {{"filesystem", {{"path", "b"}}}}}},
       "spec.destination.filesystem.path: 'b' must be an absolute path"},
      {{{"table", "events"}, {"destination", {{"persistentVolumeClaim", {{"subPath", "x"}}}}}},
       "spec.destination.persistentVolumeClaim.claimName: required"},
      {{{"table", "events"}, {"destination", {{"s3", {{"bucket", "xyz"}}}}}},
       "spec.destination.s3.endpoint: required"},
      {{{"table", "events"},
        {"destination", {{"s3", {{"endpoint", "s3.amazonaws.com"}, {"bucket", "xyz"}}}}}},
       "spec.destination.s3.endpoint: 's3.amazonaws.com' is not an http:// or https:// URL"},
      {{{"table", "events"},
        {"destination",
         {{"s3", {{"endpoint", "https://s3.amazonaws.com"}, {"bucket", "Backups"}}}}}},
       "spec.destination.s3.bucket: 'Backups' is not a bucket name"},
      {{{"table", "events"},
        {"destination",
         {{"s3", {{"endpoint", "https://s3.amazonaws.com"}, {"bucket", "backups"}}}}}},
       "spec.destination.s3.credentials: required"},
      {{{"table", "events"},
        {"destination",
         {{"s3",
           {{"endpoint", "https://s3.amazonaws.com"},
            {"bucket", "backups"},
            {"credentials", {{"secretName", "s3"}, {"accessKeyIdKey", "a/b"}}}}}}}},
       "spec.destination.s3.credentials.accessKeyIdKey: 'a/b' is not a Secret's key"},
      {{{"table", "events"},
        {"destination",
         {{"s3",
           {{"endpoint", "https://s3.amazonaws.com"},
            {"bucket", "backups"},
            {"credentials", {{"secretName", "s3"}}},
            {"acl", "private"}}}}}},
       "spec.destination.s3.acl: unknown field"},
      {{{"table", "events"},
        {"destination",
         {{"filesystem", {{"path", "/b"}}},
          {"s3",
           {{"endpoint", "https://s3.amazonaws.com"},
            {"bucket", "backups"},
            {"credentials", {{"secretName", "s3"}}}}}}}},
       "spec.destination: exactly one of filesystem, persistentVolumeClaim and s3"},
      {{{"selector", {{"matchExpressions", {{{"key", "a"}, {"operator", "In"}}}}}},
        {"destination", {{"filesystem", {{"path", "/b"}}}}}},
       "spec.selector.matchExpressions[0].values: In and NotIn need values"},
      {{{"selector", {{"matchExpressions", {{{"key", "a"}, {"operator", "Near"}}}}}},
        {"destination", {{"filesystem", {{"path", "/b"}}}}}},
       "spec.selector.matchExpressions[0].operator: 'Near' is not one of"},
  };
  for (const auto& [spec, error] : cases) {
    auto parsed = ClusterBackupSpec::parse(spec);
    ASSERT_FALSE(parsed) << spec.dump();
    EXPECT_TRUE(parsed.error().toString().starts_with(error))
        << parsed.error().toString() << "\nexpected: " << error;
  }
  auto nested = ClusterBackupSpec::parse(json::object(), "spec.template.spec");
  EXPECT_EQ(nested.error().path, "spec.template.spec.destination");

  const ClusterBackupSpec a = *ClusterBackupSpec::parse(base);
  json other = base;
  other["destination"]["filesystem"]["path"] = "/c";
  EXPECT_FALSE(checkClusterBackupUpdate(a, a));
  EXPECT_EQ(checkClusterBackupUpdate(a, *ClusterBackupSpec::parse(other))->path, "spec");
}

TEST(BackupScheduleSpec, ParsesTheExamplesWithDefaults) {
  auto nightly = BackupScheduleSpec::parse(exampleSpec("nightly-backup.yaml"));
  ASSERT_TRUE(nightly) << nightly.error().toString();
  EXPECT_EQ(nightly->schedule.text(), "0 3 * * *");
  EXPECT_EQ(nightly->template_labels.at("schedule"), "nightly");
  EXPECT_EQ(nightly->template_spec.table, "events");
  ASSERT_TRUE(nightly->retention);
  EXPECT_EQ(nightly->retention->keep_last, 7);
  EXPECT_FALSE(nightly->retention->max_age);
  EXPECT_EQ(nightly->concurrency_policy, ConcurrencyPolicy::kForbid);
  EXPECT_FALSE(nightly->suspend);
  EXPECT_EQ(nightly->toJson()["concurrencyPolicy"], "Forbid");
  EXPECT_EQ(nightly->toJson()["suspend"], false);
  EXPECT_EQ(nightly->time_zone.name(), "UTC");
  EXPECT_EQ(nightly->toJson()["timeZone"], "UTC");
  EXPECT_FALSE(nightly->starting_deadline);

  auto weekly = BackupScheduleSpec::parse(exampleSpec("weekly-backup.yaml"));
  ASSERT_TRUE(weekly) << weekly.error().toString();
  EXPECT_TRUE(weekly->suspend);
  EXPECT_EQ(weekly->retention->maxAge(), hours(28 * 24));
  EXPECT_EQ(weekly->time_zone.name(), "Europe/Berlin");
  EXPECT_EQ(weekly->starting_deadline, hours(6));
  for (const auto* s : {&*nightly, &*weekly}) {
    auto again = BackupScheduleSpec::parse(s->toJson());
    ASSERT_TRUE(again) << again.error().toString();
    EXPECT_EQ(*again, *s);
  }
}

TEST(BackupScheduleSpec, ErrorsNameTheField) {
  const json base = exampleSpec("nightly-backup.yaml");
  const std::vector<std::tuple<const char*, json, const char*>> cases = {
      {"/schedule", "0 3 * *", "spec.schedule: '0 3 * *' has 4 fields"},
      {"/schedule", 3, "spec.schedule: expected a string"},
      {"/concurrencyPolicy", "Sometimes",
       "spec.concurrencyPolicy: 'Sometimes' is not one of Forbid, Allow, Replace"},
      {"/retention/keepLast", 0, "spec.retention.keepLast: must be from 1 to 10000"},
      {"/retention/maxAge", "30 days", "spec.retention.maxAge: '30 days' is not a duration"},
      {"/template/spec/destination", json::object(),
       "spec.template.spec.destination: exactly one of"},
      {"/template/spec/selector",
       {{"matchLabels", {{"a", "b"}}}},
       "spec.template.spec: exactly one of table and selector"},
      {"/suspend", "no", "spec.suspend: expected true or false"},
      {"/timeZone", "Mars/Olympus_Mons", "spec.timeZone: unknown time zone 'Mars/Olympus_Mons'"},
      {"/timeZone", "Europe Berlin", "spec.timeZone: 'Europe Berlin' is not a time zone name"},
      {"/startingDeadlineSeconds", 0, "spec.startingDeadlineSeconds: must be from 1 to"},
  };
  for (const auto& [pointer, value, error] : cases) {
    json spec = base;
    spec[json::json_pointer(pointer)] = value;
    auto parsed = BackupScheduleSpec::parse(spec);
    ASSERT_FALSE(parsed) << pointer;
    EXPECT_TRUE(parsed.error().toString().starts_with(error))
        << parsed.error().toString() << "\nexpected: " << error;
  }
  json no_template = base;
  no_template.erase("template");
  EXPECT_EQ(BackupScheduleSpec::parse(no_template).error().toString(), "spec.template: required");
}

TEST(BackupScheduleSpec, TheNameIsALabelValue) {
  EXPECT_FALSE(checkBackupScheduleName("nightly"));
  EXPECT_FALSE(checkBackupScheduleName("team.nightly-2"));
  EXPECT_FALSE(checkBackupScheduleName(std::string(63, 'a')));
  EXPECT_EQ(checkBackupScheduleName(std::string(64, 'a'))->path, "metadata.name");
  EXPECT_TRUE(checkBackupScheduleName("Nightly"));
  EXPECT_TRUE(checkBackupScheduleName("-nightly"));
}

TEST(RetentionAge, Units) {
  EXPECT_EQ(parseRetentionAge("30d"), hours(30 * 24));
  EXPECT_EQ(parseRetentionAge("1w2d"), hours(9 * 24));
  EXPECT_EQ(parseRetentionAge("90m"), minutes(90));
  EXPECT_EQ(parseRetentionAge("1h30m15s"), seconds(5415));
  for (const char* bad : {"", "d", "30", "30 d", "3y", "-1d"})
    EXPECT_FALSE(parseRetentionAge(bad)) << bad;
}

// One schema for a ClusterBackup's spec and a schedule's template.spec, so a template that the
// schedule accepts always makes a ClusterBackup the apiserver accepts.
TEST(BackupCrds, TheScheduleTemplateIsAClusterBackupSpec) {
  const json backup = crdSchema("rtable.io_clusterbackups.yaml")["properties"]["spec"];
  const json templ = crdSchema("rtable.io_backupschedules.yaml")["properties"]["spec"]["properties"]
                                                                ["template"]["properties"]["spec"];
  ASSERT_TRUE(backup.is_object());
  EXPECT_EQ(templ, backup);
}

}  // namespace
}  // namespace rtable::controllers
