#include "rtable/controllers/backup_specs.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <regex>

#include "destination_specs.h"
#include "json_fields.h"
#include "rtable/backup/backup_operation.h"

namespace rtable::controllers {
namespace {

using detail::fail;
using detail::indexPath;
using detail::JsonFields;
using nlohmann::json;

// 10 years: a bound for the CRD's schema, far beyond any useful deadline.
constexpr int64_t kMaxStartingDeadlineSeconds = 315'360'000;

const std::regex& dns1035LabelPattern() {
  static const std::regex pattern("[a-z]([-a-z0-9]*[a-z0-9])?");
  return pattern;
}

LabelSelectorSpec parseSelector(const json& value, const std::string& path) {
  JsonFields fields(value, path);
  LabelSelectorSpec selector;
  selector.match_labels = fields.stringMap("matchLabels");
  const json& expressions = fields.array("matchExpressions", 32);
  for (std::size_t i = 0; i < expressions.size(); ++i) {
    JsonFields expression(expressions[i], indexPath(fields.at("matchExpressions"), i));
    LabelSelectorSpec::Requirement requirement;
    requirement.key = expression.string("key", 317);
    if (requirement.key.empty()) fail(expression.at("key"), "required");
    requirement.op = expression.string("operator");
    const bool with_values = requirement.op == "In" || requirement.op == "NotIn";
    if (!with_values && requirement.op != "Exists" && requirement.op != "DoesNotExist") {
      fail(expression.at("operator"),
           fmt::format("'{}' is not one of In, NotIn, Exists, DoesNotExist", requirement.op));
    }
    const json& values = expression.array("values", 64);
    for (std::size_t v = 0; v < values.size(); ++v) {
      if (!values[v].is_string()) fail(indexPath(expression.at("values"), v), "expected a string");
      requirement.values.push_back(values[v].get<std::string>());
    }
    // metav1.LabelSelector's own rule.
    if (with_values && requirement.values.empty())
      fail(expression.at("values"), "In and NotIn need values");
    if (!with_values && !requirement.values.empty()) {
      fail(expression.at("values"), "Exists and DoesNotExist take no values");
    }
    expression.rejectUnknown();
    selector.match_expressions.push_back(std::move(requirement));
  }
  fields.rejectUnknown();
  return selector;
}

json selectorJson(const LabelSelectorSpec& selector) {
  json result = json::object();
  if (!selector.match_labels.empty())
    result["matchLabels"] = detail::stringMapJson(selector.match_labels);
  if (!selector.match_expressions.empty()) {
    json list = json::array();
    for (const auto& r : selector.match_expressions) {
      json item = {{"key", r.key}, {"operator", r.op}};
      if (!r.values.empty()) item["values"] = r.values;
      list.push_back(std::move(item));
    }
    result["matchExpressions"] = std::move(list);
  }
  return result;
}

}  // namespace

const std::regex& secretNamePattern() {
  static const std::regex pattern(
      R"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)");
  return pattern;
}

BackupDestination::S3 parseS3(const json& value, const std::string& path) {
  static const std::regex endpoint_pattern(R"(https?://[^/\s]+(/\S*)?)");
  // S3's bucket naming rule (the part every implementation shares).
  static const std::regex bucket_pattern(R"([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])");
  // A Secret's keys (Kubernetes' rule for data keys).
  static const std::regex key_pattern(R"([-._a-zA-Z0-9]+)");
  JsonFields fields(value, path);
  BackupDestination::S3 s3;
  s3.endpoint = fields.string("endpoint", 2048);
  detail::checkPattern(fields.at("endpoint"), s3.endpoint, endpoint_pattern,
                       "an http:// or https:// URL");
  s3.bucket = fields.string("bucket", 63);
  detail::checkPattern(fields.at("bucket"), s3.bucket, bucket_pattern,
                       "a bucket name (3 to 63 of a-z, 0-9, '.' and '-')");
  s3.prefix = fields.optionalString("prefix", 1024).value_or("");
  if (s3.prefix.starts_with('/')) fail(fields.at("prefix"), "must not start with '/'");
  s3.region = fields.optionalString("region", 64).value_or(s3.region);
  if (s3.region.empty()) fail(fields.at("region"), "may not be empty");
  const json* credentials_value = fields.find("credentials");
  if (!credentials_value) fail(fields.at("credentials"), "required");
  JsonFields credentials(*credentials_value, fields.at("credentials"));
  s3.credentials_secret = credentials.string("secretName", 253);
  detail::checkPattern(credentials.at("secretName"), s3.credentials_secret, secretNamePattern(),
                       "a Secret's name");
  for (auto [key, target] : {std::pair{"accessKeyIdKey", &s3.access_key_id_key},
                             std::pair{"secretAccessKeyKey", &s3.secret_access_key_key}}) {
    if (auto given = credentials.optionalString(key, 253)) {
      detail::checkPattern(credentials.at(key), *given, key_pattern, "a Secret's key");
      *target = std::move(*given);
    }
  }
  credentials.rejectUnknown();
  fields.rejectUnknown();
  return s3;
}

BackupDestination::PersistentVolumeClaim parseVolumeClaim(const json& value,
                                                          const std::string& path) {
  JsonFields fields(value, path);
  BackupDestination::PersistentVolumeClaim claim;
  claim.claim_name = fields.string("claimName", 253);
  detail::checkPattern(fields.at("claimName"), claim.claim_name, secretNamePattern(),
                       "a PersistentVolumeClaim's name");
  claim.sub_path = fields.optionalString("subPath", 4096).value_or("");
  if (auto problem = backup::volumePathProblem(claim.sub_path)) {
    fail(fields.at("subPath"), fmt::format("'{}' {}", claim.sub_path, *problem));
  }
  fields.rejectUnknown();
  return claim;
}

json volumeClaimJson(const BackupDestination::PersistentVolumeClaim& claim) {
  json out = {{"claimName", claim.claim_name}};
  if (!claim.sub_path.empty()) out["subPath"] = claim.sub_path;
  return out;
}

json s3Json(const BackupDestination::S3& s3) {
  json out = {{"endpoint", s3.endpoint},
              {"bucket", s3.bucket},
              {"region", s3.region},
              {"credentials",
               {{"secretName", s3.credentials_secret},
                {"accessKeyIdKey", s3.access_key_id_key},
                {"secretAccessKeyKey", s3.secret_access_key_key}}}};
  if (!s3.prefix.empty()) out["prefix"] = s3.prefix;
  return out;
}

namespace {

BackupDestination parseDestination(JsonFields& spec) {
  const json* value = spec.find("destination");
  if (!value) fail(spec.at("destination"), "required");
  JsonFields fields(*value, spec.at("destination"));
  BackupDestination destination;
  if (const json* fs = fields.find("filesystem")) {
    JsonFields filesystem(*fs, fields.at("filesystem"));
    std::string path = filesystem.string("path", 4096);
    if (path.size() < 2 || path.front() != '/' || path.back() == '/') {
      fail(filesystem.at("path"),
           fmt::format("'{}' must be an absolute path without a trailing '/'", path));
    }
    filesystem.rejectUnknown();
    destination.filesystem = BackupDestination::Filesystem{std::move(path)};
  }
  if (const json* pvc = fields.find("persistentVolumeClaim")) {
    destination.persistent_volume_claim =
        parseVolumeClaim(*pvc, fields.at("persistentVolumeClaim"));
  }
  if (const json* s3 = fields.find("s3")) destination.s3 = parseS3(*s3, fields.at("s3"));
  fields.rejectUnknown();
  if (destination.filesystem.has_value() + destination.persistent_volume_claim.has_value() +
          destination.s3.has_value() !=
      1) {
    fail(fields.path(), "exactly one of filesystem, persistentVolumeClaim and s3 must be given");
  }
  return destination;
}

ClusterBackupSpec parseBackupSpec(const json& object, const std::string& path) {
  JsonFields spec(object, path);
  ClusterBackupSpec result;
  if (auto table = spec.optionalString("table", 52)) {
    if (!std::regex_match(*table, dns1035LabelPattern())) {
      fail(spec.at("table"),
           fmt::format("'{}' is not a ReplicatedTable name (a DNS-1035 label)", *table));
    }
    result.table = std::move(*table);
  }
  if (const json* selector = spec.find("selector"))
    result.selector = parseSelector(*selector, spec.at("selector"));
  result.destination = parseDestination(spec);
  if (auto policy = spec.optionalString("deletionPolicy")) {
    if (*policy == "Retain") {
      result.deletion_policy = DeletionPolicy::kRetain;
    } else if (*policy != "Delete") {
      fail(spec.at("deletionPolicy"), fmt::format("'{}' is neither Delete nor Retain", *policy));
    }
  }
  spec.rejectUnknown();
  if (result.table.has_value() == result.selector.has_value()) {
    fail(path, "exactly one of table and selector must be given");
  }
  return result;
}

template <class T, class F>
std::expected<T, SpecError> catching(F&& parse) {
  try {
    return parse();
  } catch (const detail::SpecFailure& failure) {
    return std::unexpected(failure.error);
  } catch (const json::exception& e) {
    return std::unexpected(SpecError{"spec", e.what()});
  }
}

// --- cron ---

struct CronField {
  const char* name;
  int min;
  int max;
  const std::array<const char*, 12>* names;  // value names from `min`, or nullptr
};

constexpr std::array<const char*, 12> kMonthNames = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                                     "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"};
constexpr std::array<const char*, 12> kDayNames = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"};

std::expected<int, std::string> cronValue(std::string_view text, const CronField& field) {
  if (field.names && text.size() == 3) {
    std::string upper(text);
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return std::toupper(c); });
    std::string lower(text);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    // All upper or all lower case, as the CRD's pattern allows.
    if (text == upper || text == lower) {
      for (std::size_t i = 0; i < field.names->size() && (*field.names)[i]; ++i) {
        if (upper == (*field.names)[i]) return field.min + static_cast<int>(i);
      }
    }
  }
  if (text.empty() || text.size() > 2 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::unexpected(fmt::format("{} '{}' is not a number{}", field.name, text,
                                       field.names ? " or a name" : ""));
  }
  const int value = std::stoi(std::string(text));
  if (value < field.min || value > field.max) {
    return std::unexpected(
        fmt::format("{} {} is out of range {}-{}", field.name, value, field.min, field.max));
  }
  return value;
}

// One field into `bits` (indexed by value); `any` when it is a bare '*'.
std::expected<void, std::string> parseCronField(std::string_view text, const CronField& field,
                                                std::vector<bool>& bits, bool& any) {
  any = text == "*";
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    if (item.empty()) return std::unexpected(fmt::format("{} has an empty list item", field.name));
    int step = 1;
    if (auto slash = item.find('/'); slash != std::string_view::npos) {
      std::string_view step_text = item.substr(slash + 1);
      if (step_text.empty() || step_text.size() > 2 || step_text[0] == '0' ||
          !std::all_of(step_text.begin(), step_text.end(),
                       [](char c) { return c >= '0' && c <= '9'; })) {
        return std::unexpected(
            fmt::format("{} step '{}' is not a number from 1 to 99", field.name, step_text));
      }
      step = std::stoi(std::string(step_text));
      item = item.substr(0, slash);
    }
    int low = field.min;
    int high = field.max;
    if (item != "*") {
      const auto dash = item.find('-');
      auto first = cronValue(item.substr(0, dash), field);
      if (!first) return std::unexpected(first.error());
      low = *first;
      high = step > 1 ? field.max : low;  // "5/15" is 5-max/15, as in Vixie cron
      if (dash != std::string_view::npos) {
        auto last = cronValue(item.substr(dash + 1), field);
        if (!last) return std::unexpected(last.error());
        high = *last;
        if (high < low) {
          return std::unexpected(
              fmt::format("{} range {}-{} ends before it starts", field.name, low, high));
        }
      }
    }
    for (int v = low; v <= high; v += step) bits[static_cast<std::size_t>(v)] = true;
    start = comma + 1;
  }
  return {};
}

}  // namespace

std::string LabelSelectorSpec::toSelectorString() const {
  std::vector<std::string> terms;
  for (const auto& [key, value] : match_labels) terms.push_back(fmt::format("{}={}", key, value));
  for (const auto& r : match_expressions) {
    if (r.op == "In" || r.op == "NotIn") {
      terms.push_back(fmt::format("{} {} ({})", r.key, r.op == "In" ? "in" : "notin",
                                  fmt::join(r.values, ",")));
    } else {
      terms.push_back(r.op == "Exists" ? r.key : "!" + r.key);
    }
  }
  return fmt::format("{}", fmt::join(terms, ","));
}

std::expected<ClusterBackupSpec, SpecError> ClusterBackupSpec::parse(const json& spec,
                                                                     std::string_view path) {
  return catching<ClusterBackupSpec>([&] { return parseBackupSpec(spec, std::string(path)); });
}

json ClusterBackupSpec::toJson() const {
  json spec = json::object();
  if (table) spec["table"] = *table;
  if (selector) spec["selector"] = selectorJson(*selector);
  if (destination.filesystem)
    spec["destination"]["filesystem"]["path"] = destination.filesystem->path;
  if (destination.persistent_volume_claim) {
    spec["destination"]["persistentVolumeClaim"] =
        volumeClaimJson(*destination.persistent_volume_claim);
  }
  if (destination.s3) spec["destination"]["s3"] = s3Json(*destination.s3);
  spec["deletionPolicy"] = deletionPolicyName(deletion_policy);
  return spec;
}

std::string_view deletionPolicyName(DeletionPolicy policy) {
  return policy == DeletionPolicy::kRetain ? "Retain" : "Delete";
}

std::optional<SpecError> checkClusterBackupUpdate(const ClusterBackupSpec& old_spec,
                                                  const ClusterBackupSpec& new_spec) {
  ClusterBackupSpec compared = new_spec;
  compared.deletion_policy = old_spec.deletion_policy;
  if (old_spec == compared) return std::nullopt;
  return SpecError{"spec",
                   "a ClusterBackup's spec is immutable but for deletionPolicy: create a new "
                   "ClusterBackup"};
}

std::expected<CronSchedule, std::string> CronSchedule::parse(std::string_view text) {
  static const std::array<CronField, 5> kFields = {{{"minute", 0, 59, nullptr},
                                                    {"hour", 0, 23, nullptr},
                                                    {"day of month", 1, 31, nullptr},
                                                    {"month", 1, 12, &kMonthNames},
                                                    {"day of week", 0, 7, &kDayNames}}};
  auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  if (text.empty() || is_space(text.front()) || is_space(text.back())) {
    return std::unexpected(fmt::format("'{}' must be five fields separated by spaces", text));
  }
  std::vector<std::string_view> parts;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    parts.push_back(text.substr(start, i - start));
    while (i < text.size() && is_space(text[i])) ++i;
  }
  if (parts.size() != 5) {
    return std::unexpected(
        fmt::format("'{}' has {} fields, expected 5 (minute hour day-of-month month day-of-week)",
                    text, parts.size()));
  }
  CronSchedule schedule;
  schedule.text_ = std::string(text);
  std::array<bool, 5> any{};
  for (std::size_t f = 0; f < 5; ++f) {
    std::vector<bool> bits(static_cast<std::size_t>(kFields[f].max) + 1, false);
    auto parsed = parseCronField(parts[f], kFields[f], bits, any[f]);
    if (!parsed) return std::unexpected(parsed.error());
    for (std::size_t v = 0; v < bits.size(); ++v) {
      if (!bits[v]) continue;
      switch (f) {
        case 0:
          schedule.minutes_.set(v);
          break;
        case 1:
          schedule.hours_.set(v);
          break;
        case 2:
          schedule.days_of_month_.set(v);
          break;
        case 3:
          schedule.months_.set(v);
          break;
        case 4:
          schedule.days_of_week_.set(v % 7);
          break;  // 7 is Sunday too
      }
    }
  }
  schedule.day_of_month_any_ = any[2];
  schedule.day_of_week_any_ = any[4];
  // Vixie cron's MIN_STAR / HR_STAR: the field's text starts with '*' ("*", "*/15").
  schedule.fixed_time_ = !parts[0].starts_with('*') && !parts[1].starts_with('*');
  return schedule;
}

bool CronSchedule::matchesDay(std::chrono::year_month_day day) const {
  if (!months_.test(static_cast<unsigned>(day.month()))) return false;
  const bool dom = days_of_month_.test(static_cast<unsigned>(day.day()));
  const bool dow =
      days_of_week_.test(std::chrono::weekday(std::chrono::sys_days(day)).c_encoding());
  // Vixie cron: with both day fields restricted, either may match.
  if (day_of_month_any_ || day_of_week_any_) return dom && dow;
  return dom || dow;
}

std::vector<std::chrono::sys_seconds> CronSchedule::runsOn(std::chrono::local_days day,
                                                           const TimeZone& zone) const {
  using namespace std::chrono;
  std::vector<sys_seconds> runs;
  if (!matchesDay(year_month_day(sys_days(day.time_since_epoch())))) return runs;
  // Most days have no transition near them: one offset for the whole day.
  const auto offset = zone.fixedOffsetBetween(sys_seconds(day.time_since_epoch()) - hours(27),
                                              sys_seconds(day.time_since_epoch()) + hours(51));
  for (int h = 0; h < 24; ++h) {
    if (!hours_.test(static_cast<std::size_t>(h))) continue;
    for (int m = 0; m < 60; ++m) {
      if (!minutes_.test(static_cast<std::size_t>(m))) continue;
      const local_seconds local = day + hours(h) + minutes(m);
      if (offset) {
        runs.push_back(sys_seconds(local.time_since_epoch() - *offset));
        continue;
      }
      const TimeZone::LocalLookup found = zone.lookup(local);
      switch (found.kind) {
        case TimeZone::LocalLookup::Kind::kUnique:
          runs.push_back(found.first);
          break;
        case TimeZone::LocalLookup::Kind::kRepeated:
          runs.push_back(found.first);
          if (!fixed_time_) runs.push_back(found.second);
          break;
        case TimeZone::LocalLookup::Kind::kSkipped:
          if (fixed_time_) runs.push_back(found.first);  // the end of the gap
          break;
      }
    }
  }
  std::sort(runs.begin(), runs.end());
  runs.erase(std::unique(runs.begin(), runs.end()), runs.end());
  return runs;
}

std::optional<std::chrono::sys_seconds> CronSchedule::next(std::chrono::sys_seconds after,
                                                           const TimeZone& zone) const {
  using namespace std::chrono;
  after = floor<minutes>(after) + seconds(59);  // strictly after the minute of `after`
  // From the day before: a run of that day can fall after `after` (a gap's end).
  local_days day = floor<days>(zone.toLocal(after)) - days(1);
  std::optional<sys_seconds> best;
  for (int n = 0; n < 5 * 366 + 3; ++n, day += days(1)) {
    for (sys_seconds run : runsOn(day, zone)) {
      if (run > after && (!best || run < *best)) best = run;
    }
    // A day's runs all come before the next day's, but for a gap's end, which is checked too.
    if (best && sys_seconds(day.time_since_epoch()) > *best + hours(48)) break;
  }
  return best;
}

std::optional<std::chrono::sys_seconds> CronSchedule::previous(std::chrono::sys_seconds at,
                                                               const TimeZone& zone) const {
  using namespace std::chrono;
  local_days day = floor<days>(zone.toLocal(at)) + days(1);
  std::optional<sys_seconds> best;
  for (int n = 0; n < 5 * 366 + 3; ++n, day -= days(1)) {
    for (sys_seconds run : runsOn(day, zone)) {
      if (run <= at && (!best || run > *best)) best = run;
    }
    if (best && sys_seconds(day.time_since_epoch()) + hours(48) < *best) break;
  }
  return best;
}

std::optional<SpecError> checkBackupScheduleName(std::string_view name) {
  static const std::regex subdomain(
      "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  if (name.size() > 63 || !std::regex_match(std::string(name), subdomain)) {
    return SpecError{
        "metadata.name",
        fmt::format("'{}' must be a DNS-1123 subdomain of at most 63 characters: it is "
                    "the value of the label rtable.io/backup-schedule on its "
                    "ClusterBackups and the prefix of their names",
                    name)};
  }
  return std::nullopt;
}

std::string_view concurrencyPolicyName(ConcurrencyPolicy policy) {
  switch (policy) {
    case ConcurrencyPolicy::kForbid:
      return "Forbid";
    case ConcurrencyPolicy::kAllow:
      return "Allow";
    case ConcurrencyPolicy::kReplace:
      return "Replace";
  }
  return "Forbid";
}

std::expected<std::chrono::seconds, std::string> parseRetentionAge(std::string_view text) {
  if (text.empty()) return std::unexpected("'' is not a duration");
  int64_t total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    if (i == start || i == text.size() || i - start > 9) {
      return std::unexpected(
          fmt::format("'{}' is not a duration like 30d, 12h or 1w2d (units w, d, h, m, s)", text));
    }
    const int64_t amount = std::stoll(std::string(text.substr(start, i - start)));
    int64_t unit = 0;
    switch (text[i]) {
      case 'w':
        unit = 7 * 86400;
        break;
      case 'd':
        unit = 86400;
        break;
      case 'h':
        unit = 3600;
        break;
      case 'm':
        unit = 60;
        break;
      case 's':
        unit = 1;
        break;
      default:
        return std::unexpected(fmt::format(
            "'{}' is not a duration like 30d, 12h or 1w2d (units w, d, h, m, s)", text));
    }
    total += amount * unit;
    ++i;
  }
  return std::chrono::seconds(total);
}

std::optional<std::chrono::seconds> RetentionPolicy::maxAge() const {
  if (!max_age) return std::nullopt;
  auto age = parseRetentionAge(*max_age);
  return age ? std::optional(*age) : std::nullopt;
}

std::expected<BackupScheduleSpec, SpecError> BackupScheduleSpec::parse(const json& object) {
  return catching<BackupScheduleSpec>([&] {
    JsonFields spec(object, "spec");
    BackupScheduleSpec result;
    auto schedule = CronSchedule::parse(spec.string("schedule", 512));
    if (!schedule) fail(spec.at("schedule"), schedule.error());
    result.schedule = std::move(*schedule);
    auto zone = TimeZone::load(spec.optionalString("timeZone", 64).value_or("UTC"));
    if (!zone) fail(spec.at("timeZone"), zone.error());
    result.time_zone = std::move(*zone);
    if (auto deadline =
            spec.optionalInteger("startingDeadlineSeconds", 1, kMaxStartingDeadlineSeconds)) {
      result.starting_deadline = std::chrono::seconds(*deadline);
    }

    const json* template_value = spec.find("template");
    if (!template_value) fail(spec.at("template"), "required");
    JsonFields templ(*template_value, spec.at("template"));
    if (const json* metadata = templ.find("metadata")) {
      JsonFields meta(*metadata, templ.at("metadata"));
      result.template_labels = meta.stringMap("labels");
      result.template_annotations = meta.stringMap("annotations");
      meta.rejectUnknown();
    }
    const json* backup = templ.find("spec");
    if (!backup) fail(templ.at("spec"), "required");
    result.template_spec = parseBackupSpec(*backup, templ.at("spec"));
    templ.rejectUnknown();

    if (const json* value = spec.find("retention")) {
      JsonFields retention(*value, spec.at("retention"));
      RetentionPolicy policy;
      if (auto keep = retention.optionalInteger("keepLast", 1, 10000))
        policy.keep_last = static_cast<int32_t>(*keep);
      if (auto age = retention.optionalString("maxAge", 64)) {
        if (auto parsed = parseRetentionAge(*age); !parsed)
          fail(retention.at("maxAge"), parsed.error());
        policy.max_age = std::move(*age);
      }
      retention.rejectUnknown();
      result.retention = std::move(policy);
    }
    const std::string policy = spec.optionalString("concurrencyPolicy").value_or("Forbid");
    if (policy == "Forbid") {
      result.concurrency_policy = ConcurrencyPolicy::kForbid;
    } else if (policy == "Allow") {
      result.concurrency_policy = ConcurrencyPolicy::kAllow;
    } else if (policy == "Replace") {
      result.concurrency_policy = ConcurrencyPolicy::kReplace;
    } else {
      fail(spec.at("concurrencyPolicy"),
           fmt::format("'{}' is not one of Forbid, Allow, Replace", policy));
    }
    result.suspend = spec.boolean("suspend", false);
    spec.rejectUnknown();
    return result;
  });
}

json BackupScheduleSpec::toJson() const {
  json spec = json::object();
  spec["schedule"] = schedule.text();
  spec["timeZone"] = time_zone.name();
  if (starting_deadline) spec["startingDeadlineSeconds"] = starting_deadline->count();
  json templ = json::object();
  if (!template_labels.empty())
    templ["metadata"]["labels"] = detail::stringMapJson(template_labels);
  if (!template_annotations.empty())
    templ["metadata"]["annotations"] = detail::stringMapJson(template_annotations);
  templ["spec"] = template_spec.toJson();
  spec["template"] = std::move(templ);
  if (retention) {
    json r = json::object();
    if (retention->keep_last) r["keepLast"] = *retention->keep_last;
    if (retention->max_age) r["maxAge"] = *retention->max_age;
    spec["retention"] = std::move(r);
  }
  spec["concurrencyPolicy"] = concurrencyPolicyName(concurrency_policy);
  spec["suspend"] = suspend;
  return spec;
}

}  // namespace rtable::controllers
