#include "rtable/operator/event_recorder.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "rtable/common/rfc3339.h"

namespace rtable::op {

using nlohmann::json;

namespace {

// The apiserver's limit for a new Event's note (events.k8s.io NoteLengthLimit); core/v1 takes
// longer ones, but kubectl's columns do not.
constexpr std::size_t kMessageLimit = 1024;

std::string stringAt(const json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string truncated(std::string_view text) {
  if (text.size() <= kMessageLimit) return std::string(text);
  return std::string(text.substr(0, kMessageLimit - 3)) + "...";
}

// Namespaced objects have their Events beside them; cluster-scoped ones in "default" (client-go).
std::string eventNamespace(const ObjectReference& object) {
  return object.ns.empty() ? "default" : object.ns;
}

}  // namespace

std::string_view eventTypeName(EventType type) {
  return type == EventType::kWarning ? "Warning" : "Normal";
}

ObjectReference ObjectReference::of(const json& object) {
  ObjectReference ref;
  ref.api_version = stringAt(object, "apiVersion");
  ref.kind = stringAt(object, "kind");
  if (auto metadata = object.find("metadata"); metadata != object.end() && metadata->is_object()) {
    ref.ns = stringAt(*metadata, "namespace");
    ref.name = stringAt(*metadata, "name");
    ref.uid = stringAt(*metadata, "uid");
    ref.resource_version = stringAt(*metadata, "resourceVersion");
  }
  return ref;
}

json ObjectReference::toJson() const {
  json out = json::object();
  auto put = [&](const char* field, const std::string& value) {
    if (!value.empty()) out[field] = value;
  };
  put("apiVersion", api_version);
  put("kind", kind);
  put("namespace", ns);
  put("name", name);
  put("uid", uid);
  put("resourceVersion", resource_version);
  return out;
}

KubeEventRecorder::KubeEventRecorder(KubeClient& client, KubeEventRecorderOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : common::SteadyClock::instance()) {
  if (!options_.wall_clock) options_.wall_clock = [] { return std::chrono::system_clock::now(); };
  options_.queue_capacity = std::max<std::size_t>(options_.queue_capacity, 1);
  options_.cache_size = std::max<std::size_t>(options_.cache_size, 1);
  options_.max_tries = std::max(options_.max_tries, 1);
  thread_ = std::thread([this] { run(); });
}

KubeEventRecorder::~KubeEventRecorder() {
  shutdown(common::Clock::Duration::zero());
}

void KubeEventRecorder::record(const ObjectReference& object, EventType type,
                               std::string_view reason, std::string_view message) {
  Pending pending{
      object, type, std::string(reason), truncated(message), clock_.now(), options_.wall_clock()};
  spdlog::debug("event {} {} {}/{}: {}", eventTypeName(type), reason, object.ns, object.name,
                pending.message);
  int64_t dropped = 0;
  {
    std::lock_guard lock(mu_);
    if (!stopping_ && queue_.size() < options_.queue_capacity) {
      queue_.push_back(std::move(pending));
    } else {
      dropped = ++stats_.dropped;
    }
  }
  if (dropped == 0) {
    cv_.notify_all();
  } else if (dropped % 100 == 1) {  // the first of every hundred: the log is not a flood too
    spdlog::warn("events: queue full or stopped, dropped {} so far (latest: {} {} on {}/{})",
                 dropped, eventTypeName(type), reason, object.ns, object.name);
  }
}

void KubeEventRecorder::shutdown(common::Clock::Duration grace) {
  std::lock_guard lifecycle(lifecycle_mu_);
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      drain_deadline_ = clock_.now() + grace;
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool KubeEventRecorder::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return queue_.empty() && !busy_; });
}

EventRecorderStats KubeEventRecorder::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::size_t KubeEventRecorder::queuedForTest() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void KubeEventRecorder::run() {
  for (;;) {
    Pending pending;
    {
      std::unique_lock lock(mu_);
      while (queue_.empty() && !stopping_) cv_.wait(lock);
      if (stopping_ && (queue_.empty() || clock_.now() >= drain_deadline_)) {
        stats_.dropped += static_cast<int64_t>(queue_.size());
        queue_.clear();
        break;
      }
      pending = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    process(pending);
    {
      std::lock_guard lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
  cv_.notify_all();
}

bool KubeEventRecorder::allowedBySpamFilter(const Pending& pending) {
  // client-go's getSpamKey: the source and the object, not the reason.
  const std::string key =
      fmt::format("{}\x1f{}\x1f{}\x1f{}\x1f{}", options_.component, pending.object.kind,
                  pending.object.ns, pending.object.name, pending.object.uid);
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    if (buckets_.size() >= options_.cache_size) {
      buckets_.erase(buckets_lru_.back());
      buckets_lru_.pop_back();
    }
    buckets_lru_.push_front(key);
    it = buckets_
             .emplace(key, Bucket{static_cast<double>(options_.spam_burst), pending.when,
                                  buckets_lru_.begin()})
             .first;
  } else {
    buckets_lru_.splice(buckets_lru_.begin(), buckets_lru_, it->second.lru);
  }
  Bucket& bucket = it->second;
  if (pending.when > bucket.refilled && options_.spam_refill > common::Clock::Duration::zero()) {
    const double earned = std::chrono::duration<double>(pending.when - bucket.refilled) /
                          std::chrono::duration<double>(options_.spam_refill);
    bucket.tokens = std::min(static_cast<double>(options_.spam_burst), bucket.tokens + earned);
    bucket.refilled = pending.when;
  }
  if (bucket.tokens < 1.0 - 1e-9) return false;  // slack for the sum of fractions
  bucket.tokens -= 1.0;
  return true;
}

std::string KubeEventRecorder::uniqueName(const Pending& pending) {
  // client-go: "<object name>.<unix nanos in hex>"; strictly increasing here, so two events of
  // one object in the same nanosecond (or under a frozen test clock) get different names.
  int64_t nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(pending.wall.time_since_epoch()).count();
  nanos = std::max(nanos, last_name_nanos_ + 1);
  last_name_nanos_ = nanos;
  return fmt::format("{}.{:x}", pending.object.name.empty() ? "event" : pending.object.name,
                     static_cast<uint64_t>(nanos));
}

void KubeEventRecorder::process(const Pending& pending) {
  const std::string type(eventTypeName(pending.type));
  // client-go's getEventKey: everything but the object's resourceVersion and the times.
  const std::string key =
      fmt::format("{}\x1f{}\x1f{}\x1f{}\x1f{}\x1f{}\x1f{}\x1f{}\x1f{}", options_.component,
                  pending.object.api_version, pending.object.kind, pending.object.ns,
                  pending.object.name, pending.object.uid, type, pending.reason, pending.message);
  const std::string now = common::formatRfc3339(pending.wall);

  // Observe (client-go counts an occurrence before the spam filter looks at it).
  bool repeat = false;
  Seen* seen = nullptr;
  if (auto it = seen_.find(key); it != seen_.end()) {
    seen = &it->second;
    seen_lru_.splice(seen_lru_.begin(), seen_lru_, seen->lru);
    repeat = pending.when - seen->last_seen <= options_.aggregation_window;
  } else {
    if (seen_.size() >= options_.cache_size) {
      seen_.erase(seen_lru_.back());
      seen_lru_.pop_back();
    }
    seen_lru_.push_front(key);
    seen = &seen_.emplace(key, Seen{}).first->second;
    seen->lru = seen_lru_.begin();
  }
  if (repeat) {
    ++seen->count;
  } else {
    seen->name = uniqueName(pending);
    seen->ns = eventNamespace(pending.object);
    seen->count = 1;
    seen->first_timestamp = now;
  }
  seen->last_seen = pending.when;

  if (!allowedBySpamFilter(pending)) {
    std::lock_guard lock(mu_);
    ++stats_.filtered;
    return;
  }

  const ResourceType events = resources::events();
  const std::string what = fmt::format("event {} {} on {} {}/{}", type, pending.reason,
                                       pending.object.kind, pending.object.ns, pending.object.name);
  json event = {{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"name", seen->name}, {"namespace", seen->ns}}},
                {"involvedObject", pending.object.toJson()},
                {"type", type},
                {"reason", pending.reason},
                {"message", pending.message},
                {"source", {{"component", options_.component}}},
                {"reportingComponent", options_.component},
                {"firstTimestamp", seen->first_timestamp},
                {"lastTimestamp", now},
                {"count", seen->count}};
  if (!options_.instance.empty()) event["reportingInstance"] = options_.instance;

  KubeError error;
  bool posted = false;
  bool patched = false;
  if (seen->count > 1) {
    const json patch = {{"count", seen->count}, {"lastTimestamp", now}};
    posted = post(
        [&] { return client_.patch(events, {seen->ns, seen->name}, PatchType::kMerge, patch, {}); },
        what, &error, /*not_found_is_an_answer=*/true);
    patched = posted;
    // Expired (Events live an hour) or never created (filtered, failed): create it again.
    if (!posted && error.kind == KubeErrorKind::kNotFound) {
      posted = post([&] { return client_.create(events, event); }, what, &error);
    }
  } else {
    posted = post([&] { return client_.create(events, event); }, what, &error);
  }
  std::lock_guard lock(mu_);
  if (!posted) {
    ++stats_.failed;
  } else if (patched) {
    ++stats_.patched;
  } else {
    ++stats_.created;
  }
}

bool KubeEventRecorder::post(const std::function<KubeResult<json>()>& send, const std::string& what,
                             KubeError* last_error, bool not_found_is_an_answer) {
  for (int attempt = 1;; ++attempt) {
    auto result = send();
    if (result) return true;
    *last_error = result.error();
    // Our own earlier attempt got through after all (names are unique per occurrence).
    if (result.error().kind == KubeErrorKind::kAlreadyExists) return true;
    if (result.error().kind == KubeErrorKind::kNotFound && not_found_is_an_answer) return false;
    if (!result.error().outcomeUnknown() || attempt >= options_.max_tries) {
      spdlog::warn("{}: not recorded: {}", what, result.error().toString());
      return false;
    }
    spdlog::debug("{}: attempt {}: {}", what, attempt, result.error().toString());
    if (!sleepForRetry(clock_.now() + options_.retry_delay)) {
      spdlog::warn("{}: not recorded (stopping): {}", what, result.error().toString());
      return false;
    }
  }
}

bool KubeEventRecorder::sleepForRetry(common::Clock::TimePoint until) {
  std::unique_lock lock(mu_);
  for (;;) {
    const auto now = clock_.now();
    if (stopping_ && now >= drain_deadline_) return false;
    if (now >= until) return true;
    clock_.waitUntil(cv_, lock, stopping_ ? std::min(until, drain_deadline_) : until);
  }
}

}  // namespace rtable::op
