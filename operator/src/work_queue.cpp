#include "rtable/operator/work_queue.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <deque>
#include <map>
#include <set>

namespace rtable::op {

// client-go's workqueue metrics (k8s.io/client-go/util/workqueue/metrics.go), as
// controller-runtime registers them.
class WorkQueue::Metrics {
 public:
  Metrics(prometheus::Registry& registry, const std::string& name) {
    const prometheus::Labels labels{{"name", name}};
    // client-go: prometheus.ExponentialBuckets(10e-9, 10, 10), 10 ns .. 10 s.
    const prometheus::Histogram::BucketBoundaries buckets = {1e-8, 1e-7, 1e-6, 1e-5, 1e-4,
                                                             1e-3, 1e-2, 1e-1, 1,    10};
    depth = &prometheus::BuildGauge()
                 .Name("workqueue_depth")
                 .Help("Current depth of workqueue")
                 .Register(registry)
                 .Add(labels);
    adds = &prometheus::BuildCounter()
                .Name("workqueue_adds_total")
                .Help("Total number of adds handled by workqueue")
                .Register(registry)
                .Add(labels);
    retries = &prometheus::BuildCounter()
                   .Name("workqueue_retries_total")
                   .Help("Total number of retries handled by workqueue")
                   .Register(registry)
                   .Add(labels);
    queue_duration =
        &prometheus::BuildHistogram()
             .Name("workqueue_queue_duration_seconds")
             .Help("How long in seconds an item stays in workqueue before being requested")
             .Register(registry)
             .Add(labels, buckets);
    work_duration = &prometheus::BuildHistogram()
                         .Name("workqueue_work_duration_seconds")
                         .Help("How long in seconds processing an item from workqueue takes")
                         .Register(registry)
                         .Add(labels, buckets);
    unfinished_work = &prometheus::BuildGauge()
                           .Name("workqueue_unfinished_work_seconds")
                           .Help(
                               "How many seconds of work has been done that is in progress and "
                               "hasn't been observed by work_duration. Large values indicate "
                               "stuck threads.")
                           .Register(registry)
                           .Add(labels);
    longest_running = &prometheus::BuildGauge()
                           .Name("workqueue_longest_running_processor_seconds")
                           .Help(
                               "How many seconds has the longest running processor for "
                               "workqueue been running.")
                           .Register(registry)
                           .Add(labels);
  }

  prometheus::Gauge* depth;
  prometheus::Counter* adds;
  prometheus::Counter* retries;
  prometheus::Histogram* queue_duration;
  prometheus::Histogram* work_duration;
  prometheus::Gauge* unfinished_work;
  prometheus::Gauge* longest_running;
};

struct WorkQueue::State {
  std::deque<std::string> queue;  // added by add(): a change to act on
  // Due keys of addAfter and addRateLimited (polls, retries), handed out when `queue` is empty.
  // Lazily cleaned: an entry whose key is not in `later_keys` (promoted by an add(), or already
  // handed out) is skipped.
  std::deque<std::string> later;
  std::set<std::string> later_keys;
  std::set<std::string> dirty;       // queued, or to be queued again at done()
  std::set<std::string> urgent;      // dirty keys an add() asked for: queued again in `queue`
  std::set<std::string> processing;  // handed to a worker, done() not called yet
  std::map<std::string, common::Clock::TimePoint> waiting_by_key;
  std::set<std::pair<common::Clock::TimePoint, std::string>> waiting;  // ordered by ready time
  std::map<std::string, common::Clock::TimePoint> added_at;            // for queue_duration
  std::map<std::string, common::Clock::TimePoint> started_at;          // for work_duration
  bool shutting_down = false;
};

namespace {
double seconds(common::Clock::Duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

WorkQueue::WorkQueue(Options options)
    : clock_(options.clock != nullptr ? *options.clock : common::SteadyClock::instance()),
      rate_limiter_(options.rate_limiter ? std::move(options.rate_limiter)
                                         : defaultControllerRateLimiter(clock_)),
      metrics_(options.registry != nullptr
                   ? std::make_unique<Metrics>(*options.registry, options.name)
                   : nullptr),
      metrics_refresh_(options.metrics_refresh),
      state_(std::make_unique<State>()) {
  if (metrics_) metrics_thread_ = std::thread([this] { refreshMetricsLoop(); });
}

WorkQueue::~WorkQueue() {
  shutDown();
  if (metrics_thread_.joinable()) metrics_thread_.join();
}

// client-go Type.Add, under the lock, with a priority: `urgent` for add(), not for a delay that
// has passed. Returns whether a key joined a queue.
bool WorkQueue::addLocked(const std::string& key, common::Clock::TimePoint now, bool urgent) {
  State& s = *state_;
  if (s.shutting_down) return false;
  if (s.dirty.contains(key)) {
    if (!urgent || s.urgent.contains(key)) return false;
    // Waiting behind the polls: a change makes it urgent.
    s.urgent.insert(key);
    if (s.later_keys.erase(key) == 0) return false;  // being processed: queued again at done()
    s.queue.push_back(key);
    return true;
  }
  if (metrics_) {
    metrics_->depth->Increment();
    metrics_->adds->Increment();
  }
  s.added_at.try_emplace(key, now);
  s.dirty.insert(key);
  if (urgent) s.urgent.insert(key);
  if (s.processing.contains(key)) return false;  // queued again at done()
  if (urgent) {
    s.queue.push_back(key);
  } else {
    s.later.push_back(key);
    s.later_keys.insert(key);
  }
  return true;
}

void WorkQueue::add(const std::string& key) {
  std::lock_guard lock(mu_);
  if (addLocked(key, clock_.now(), /*urgent=*/true)) {
    cv_.notify_all();
  }
}

void WorkQueue::addAfter(const std::string& key, Duration delay) {
  if (delay <= Duration::zero()) {
    add(key);
    return;
  }
  std::lock_guard lock(mu_);
  State& s = *state_;
  if (s.shutting_down) return;
  const auto ready = clock_.now() + delay;
  auto it = s.waiting_by_key.find(key);
  if (it != s.waiting_by_key.end()) {
    if (it->second <= ready) return;  // already waiting for an earlier time
    s.waiting.erase({it->second, key});
    it->second = ready;
  } else {
    s.waiting_by_key.emplace(key, ready);
  }
  s.waiting.emplace(ready, key);
  cv_.notify_all();  // waiters recompute their deadline
}

void WorkQueue::addRateLimited(const std::string& key) {
  if (metrics_) metrics_->retries->Increment();
  addAfter(key, rate_limiter_->when(key));
}

void WorkQueue::forget(const std::string& key) {
  rate_limiter_->forget(key);
}

int WorkQueue::numRequeues(const std::string& key) const {
  return rate_limiter_->numRequeues(key);
}

std::optional<std::string> WorkQueue::get() {
  return getImpl(std::nullopt);
}

std::optional<std::string> WorkQueue::getUntil(common::Clock::TimePoint deadline) {
  return getImpl(deadline);
}

std::optional<std::string> WorkQueue::getImpl(std::optional<common::Clock::TimePoint> deadline) {
  std::unique_lock lock(mu_);
  State& s = *state_;
  for (;;) {
    if (s.shutting_down) return std::nullopt;
    const auto now = clock_.now();
    // Delayed keys whose time has come join the queue.
    while (!s.waiting.empty() && s.waiting.begin()->first <= now) {
      const std::string key = s.waiting.begin()->second;
      s.waiting.erase(s.waiting.begin());
      s.waiting_by_key.erase(key);
      addLocked(key, now, /*urgent=*/false);
    }
    // Skip the entries of `later` that were promoted or handed out.
    while (!s.later.empty() && !s.later_keys.contains(s.later.front())) s.later.pop_front();
    if (!s.queue.empty() || !s.later.empty()) {
      std::deque<std::string>& from = !s.queue.empty() ? s.queue : s.later;
      std::string key = std::move(from.front());
      from.pop_front();
      s.later_keys.erase(key);
      s.processing.insert(key);
      s.dirty.erase(key);
      s.urgent.erase(key);
      if (metrics_) {
        metrics_->depth->Decrement();
        if (auto it = s.added_at.find(key); it != s.added_at.end()) {
          metrics_->queue_duration->Observe(seconds(now - it->second));
        }
      }
      s.added_at.erase(key);
      s.started_at[key] = now;
      return key;
    }
    if (deadline && now >= *deadline) return std::nullopt;
    std::optional<common::Clock::TimePoint> wake = deadline;
    if (!s.waiting.empty() && (!wake || s.waiting.begin()->first < *wake)) {
      wake = s.waiting.begin()->first;
    }
    if (wake) {
      clock_.waitUntil(cv_, lock, *wake);
    } else {
      cv_.wait(lock);
    }
  }
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard lock(mu_);
  State& s = *state_;
  if (s.processing.erase(key) == 0) return;
  if (auto it = s.started_at.find(key); it != s.started_at.end()) {
    if (metrics_) metrics_->work_duration->Observe(seconds(clock_.now() - it->second));
    s.started_at.erase(it);
  }
  if (s.dirty.contains(key)) {
    if (s.urgent.contains(key)) {
      s.queue.push_back(key);
    } else {
      s.later.push_back(key);
      s.later_keys.insert(key);
    }
    cv_.notify_all();
  }
}

void WorkQueue::shutDown() {
  {
    std::lock_guard lock(mu_);
    state_->shutting_down = true;
  }
  cv_.notify_all();
}

bool WorkQueue::shuttingDown() const {
  std::lock_guard lock(mu_);
  return state_->shutting_down;
}

std::size_t WorkQueue::len() const {
  std::lock_guard lock(mu_);
  const State& s = *state_;
  // Delayed keys that are due count as queued even before a get() moves them.
  std::size_t due = 0;
  const auto now = clock_.now();
  for (const auto& [ready, key] : s.waiting) {
    if (ready > now) break;
    if (!s.dirty.contains(key) && !s.processing.contains(key)) ++due;
  }
  return s.queue.size() + s.later_keys.size() + due;
}

std::size_t WorkQueue::waitingLen() const {
  std::lock_guard lock(mu_);
  const State& s = *state_;
  const auto now = clock_.now();
  std::size_t n = 0;
  for (const auto& [ready, key] : s.waiting) n += ready > now ? 1 : 0;
  return n;
}

void WorkQueue::refreshMetricsLoop() {
  std::unique_lock lock(mu_);
  State& s = *state_;
  while (!s.shutting_down) {
    const auto now = clock_.now();
    double unfinished = 0;
    double longest = 0;
    for (const auto& [key, started] : s.started_at) {
      const double running = seconds(now - started);
      unfinished += running;
      longest = std::max(longest, running);
    }
    metrics_->unfinished_work->Set(unfinished);
    metrics_->longest_running->Set(longest);
    clock_.waitUntil(cv_, lock, now + metrics_refresh_);
  }
}

}  // namespace rtable::op
