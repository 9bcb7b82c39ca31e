#include "rtable/operator/informer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace rtable::op {

namespace {

// client-go's reflector: a watch that ends within a second without a single event is treated as a
// failure, so that a server (or proxy) closing watches at once does not make a hot loop.
constexpr auto kShortWatch = std::chrono::seconds(1);

// client-go's minWatchTimeout: timeouts are uniform in [5, 10) minutes.
constexpr int64_t kMinWatchTimeoutSeconds = 5 * 60;

// Errors where the server did not answer the watch request itself: the resourceVersion is still
// good, so the watch is retried from it (client-go does so for refused connections and 429).
bool retryWatchAfter(const KubeError& error) {
  switch (error.kind) {
    case KubeErrorKind::kConnection:
    case KubeErrorKind::kTimeout:
    case KubeErrorKind::kTooManyRequests:
    case KubeErrorKind::kServerError:
      return true;
    default:
      return false;
  }
}

}  // namespace

void stripManagedFields(nlohmann::json& object) {
  auto metadata = object.find("metadata");
  if (metadata != object.end() && metadata->is_object()) metadata->erase("managedFields");
}

Informer::Informer(KubeClient& client, InformerOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : common::SteadyClock::instance()),
      random_(std::random_device{}()) {
  if (options_.name.empty()) options_.name = options_.type.groupResource();
}

Informer::~Informer() {
  stop();
}

void Informer::addHandlers(ResourceEventHandlers handlers) {
  handlers_.push_back(std::move(handlers));
}

bool Informer::addIndex(const std::string& name, IndexFunc func) {
  return store_.addIndex(name, std::move(func));
}

void Informer::start() {
  std::lock_guard lifecycle(lifecycle_mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void Informer::stop() {
  std::lock_guard lifecycle(lifecycle_mu_);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Informer::waitForSync(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return synced_.load() || stopping_; });
  return synced_.load();
}

std::string Informer::lastSyncResourceVersion() const {
  std::lock_guard lock(mu_);
  return resource_version_;
}

std::optional<KubeError> Informer::lastError() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

int Informer::consecutiveFailures() const {
  std::lock_guard lock(mu_);
  return failures_;
}

bool Informer::stopping() const {
  std::lock_guard lock(mu_);
  return stopping_;
}

void Informer::run() {
  bool need_list = true;
  while (!stopping()) {
    if (!sleepBackoff()) return;
    if (need_list) {
      if (!list()) continue;
      need_list = false;
    }
    bool retry_watch = false;
    switch (watchOnce(retry_watch)) {
      case WatchOutcome::kStopped:
        return;
      case WatchOutcome::kServerClosed:
        break;  // resume from the last resourceVersion
      case WatchOutcome::kGone:
        need_list = true;  // never retry a resourceVersion that is gone
        break;
      case WatchOutcome::kFailed:
        need_list = !retry_watch;
        break;
    }
  }
}

bool Informer::list() {
  ListOptions options;
  options.label_selector = options_.label_selector;
  options.field_selector = options_.field_selector;
  options.limit = options_.page_size;
  auto listed = client_.listAll(options_.type, options_.ns, options);
  ++lists_;
  if (!listed) {
    recordFailure(listed.error());
    return false;
  }
  std::vector<ObjectPtr> objects;
  objects.reserve(listed->items.size());
  for (auto& item : listed->items) {
    // List items come without kind and apiVersion; watch events carry them. The cache holds one
    // shape whichever way an object came in.
    if (!item.contains("kind")) item["kind"] = options_.type.kind;
    if (!item.contains("apiVersion")) item["apiVersion"] = options_.type.apiVersion();
    if (options_.transform) options_.transform(item);
    objects.push_back(std::make_shared<const nlohmann::json>(std::move(item)));
  }
  const auto changes = store_.replace(std::move(objects));
  {
    std::lock_guard lock(mu_);
    resource_version_ = listed->resource_version;
  }
  for (const auto& change : changes) {
    switch (change.kind) {
      case StoreChange::Kind::kAdded:
        notifyAdd(*change.new_object);
        break;
      case StoreChange::Kind::kUpdated:
        notifyUpdate(*change.old_object, *change.new_object);
        break;
      case StoreChange::Kind::kDeleted:
        notifyDelete(*change.old_object);
        break;
    }
  }
  if (!synced_.load()) {
    {
      std::lock_guard lock(mu_);
      synced_ = true;
    }
    cv_.notify_all();
  }
  return true;
}

Informer::WatchOutcome Informer::watchOnce(bool& retry_watch) {
  uint64_t generation = 0;
  WatchOptions options;
  options.label_selector = options_.label_selector;
  options.field_selector = options_.field_selector;
  options.allow_watch_bookmarks = true;
  options.timeout_seconds = nextWatchTimeout().count();
  {
    std::lock_guard lock(mu_);
    generation = ++generation_;
    pending_.clear();
    options.resource_version = resource_version_;
  }
  auto on_event = [this, generation](const WatchEvent& event) {
    {
      std::lock_guard lock(mu_);
      pending_.push_back({generation, event, std::nullopt});
    }
    cv_.notify_all();
  };
  auto on_end = [this, generation](const WatchEnd& end) {
    {
      std::lock_guard lock(mu_);
      pending_.push_back({generation, std::nullopt, end});
    }
    cv_.notify_all();
  };
  const auto started = clock_.now();
  auto watch = client_.watch(options_.type, options_.ns, options, on_event, on_end);
  ++watches_;
  if (!watch) {
    recordFailure(watch.error());
    if (watch.error().kind == KubeErrorKind::kGone) return WatchOutcome::kGone;
    retry_watch = retryWatchAfter(watch.error());
    return WatchOutcome::kFailed;
  }
  const WatchOutcome outcome = consume(generation, started);
  (*watch)->stop();  // not under mu_: the reader thread may be waiting for it
  return outcome;
}

Informer::WatchOutcome Informer::consume(uint64_t generation, common::Clock::TimePoint started) {
  int64_t events = 0;
  for (;;) {
    Pending item;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (stopping_) return WatchOutcome::kStopped;
      item = std::move(pending_.front());
      pending_.pop_front();
    }
    if (item.generation != generation) continue;
    if (item.end) {
      switch (item.end->reason) {
        case WatchEndReason::kServerClosed:
          if (events == 0 && clock_.now() - started < kShortWatch) {
            recordFailure(KubeError::of(KubeErrorKind::kServerError,
                                        "the watch ended at once without an event"));
            return WatchOutcome::kFailed;
          }
          {
            std::lock_guard lock(mu_);
            failures_ = 0;  // a watch that ran its course: the connection is healthy
          }
          return WatchOutcome::kServerClosed;
        case WatchEndReason::kStopped:
        case WatchEndReason::kError:
          recordFailure(item.end->error
                            ? *item.end->error
                            : KubeError::connection(fmt::format(
                                  "watch ended: {}", watchEndReasonName(item.end->reason))));
          return WatchOutcome::kFailed;
      }
    }
    WatchEvent& event = *item.event;
    if (event.type == WatchEventType::kError) {
      recordFailure(event.error);
      return event.error.kind == KubeErrorKind::kGone ? WatchOutcome::kGone : WatchOutcome::kFailed;
    }
    ++events;
    handleEvent(std::move(event));
  }
}

void Informer::handleEvent(WatchEvent event) {
  std::string rv = event.resourceVersion();
  if (options_.transform &&
      (event.type == WatchEventType::kAdded || event.type == WatchEventType::kModified ||
       event.type == WatchEventType::kDeleted)) {
    options_.transform(event.object);
  }
  switch (event.type) {
    case WatchEventType::kAdded:
    case WatchEventType::kModified: {
      auto object = std::make_shared<const nlohmann::json>(std::move(event.object));
      if (ObjectPtr old = store_.upsert(object)) {
        notifyUpdate(*old, *object);
      } else {
        notifyAdd(*object);
      }
      break;
    }
    case WatchEventType::kDeleted:
      store_.erase(objectKeyOf(event.object));
      notifyDelete(event.object);
      break;
    case WatchEventType::kBookmark:
    case WatchEventType::kError:
      break;
  }
  if (!rv.empty()) {
    std::lock_guard lock(mu_);
    resource_version_ = std::move(rv);
  }
}

void Informer::recordFailure(const KubeError& error) {
  const auto now = clock_.now();
  {
    std::lock_guard lock(mu_);
    if (failures_ > 0 && now - last_failure_ >= options_.backoff_reset) failures_ = 0;
    ++failures_;
    last_failure_ = now;
    last_error_ = error;
  }
  if (error.kind == KubeErrorKind::kGone) {
    spdlog::info("informer {}: {}; listing again", options_.name, error.toString());
  } else {
    spdlog::warn("informer {}: {}", options_.name, error.toString());
  }
  if (options_.on_error) options_.on_error(error);
}

bool Informer::sleepBackoff() {
  std::unique_lock lock(mu_);
  if (failures_ <= 1) return !stopping_;  // the first retry is immediate
  auto delay = options_.backoff_initial;
  for (int i = 2; i < failures_ && delay < options_.backoff_max; ++i) delay *= 2;
  const auto deadline = last_failure_ + std::min(delay, options_.backoff_max);
  while (!stopping_ && clock_.now() < deadline) clock_.waitUntil(cv_, lock, deadline);
  return !stopping_;
}

std::chrono::seconds Informer::nextWatchTimeout() {
  if (options_.watch_timeout) return options_.watch_timeout();
  std::uniform_int_distribution<int64_t> seconds(kMinWatchTimeoutSeconds,
                                                 2 * kMinWatchTimeoutSeconds - 1);
  return std::chrono::seconds(seconds(random_));
}

void Informer::notifyAdd(const nlohmann::json& object) {
  for (const auto& h : handlers_) {
    if (h.on_add) h.on_add(object);
  }
}

void Informer::notifyUpdate(const nlohmann::json& old_object, const nlohmann::json& new_object) {
  for (const auto& h : handlers_) {
    if (h.on_update) h.on_update(old_object, new_object);
  }
}

void Informer::notifyDelete(const nlohmann::json& object) {
  for (const auto& h : handlers_) {
    if (h.on_delete) h.on_delete(object);
  }
}

}  // namespace rtable::op
