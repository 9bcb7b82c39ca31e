// WorkQueue: the rate-limited, deduplicating queue between informers and reconcile workers
// (client-go's workqueue, as controller-runtime uses it).
//
// Invariants: a key is queued at most once (an add while queued is merged); a key is handed to at
// most one worker at a time (an add while it is being processed queues it again at done(), so
// the change is not lost). Keys come out in the order they were added, with one priority: a key
// of add() (a change an informer saw) goes before every key whose addAfter or addRateLimited
// delay has passed (a poll, a retry), so that a new table is not served behind the periodic polls
// of a thousand others; an add() of a key waiting there moves it up. After shutDown() get() returns
// nullopt at once, even with keys queued: the operator stops promptly and the next leader re-lists
// everything (level-based).
//
// Thread safety: every method may be called from any thread. The queue must outlive its users.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "rtable/common/clock.h"
#include "rtable/operator/rate_limiter.h"

namespace prometheus {
class Registry;
}

namespace rtable::op {

class WorkQueue {
 public:
  using Duration = common::Clock::Duration;

  struct Options {
    std::string name;                           // the `name` label of the metrics
    const common::Clock* clock = nullptr;       // null: SteadyClock; must outlive the queue
    std::unique_ptr<RateLimiter> rate_limiter;  // null: defaultControllerRateLimiter(clock)
    // Optional: workqueue_* metrics with label name=<name> (client-go names).
    prometheus::Registry* registry = nullptr;
    // How often the in-flight gauges (unfinished work, longest running processor) are refreshed
    // when a registry is given; client-go refreshes every 500 ms.
    Duration metrics_refresh = std::chrono::milliseconds(500);
  };

  explicit WorkQueue(Options options);
  ~WorkQueue();  // shuts down
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void add(const std::string& key);
  // Adds `key` once `delay` has passed on the clock. A key waiting twice keeps the earlier time.
  void addAfter(const std::string& key, Duration delay);
  // addAfter(key, rate_limiter.when(key)): after a failure.
  void addRateLimited(const std::string& key);
  // The key succeeded: reset its backoff (does not remove it from the queue).
  void forget(const std::string& key);
  int numRequeues(const std::string& key) const;

  // Blocks until a key is ready or the queue shuts down (nullopt). Every key returned must be
  // passed to done().
  std::optional<std::string> get();
  // Like get() but gives up at `deadline` on the queue's clock (nullopt).
  std::optional<std::string> getUntil(common::Clock::TimePoint deadline);
  void done(const std::string& key);

  // Wakes every waiter; later adds are ignored.
  void shutDown();
  bool shuttingDown() const;

  // Keys queued and ready (not counting keys being processed or waiting for their delay).
  std::size_t len() const;
  // Keys waiting for an addAfter delay.
  std::size_t waitingLen() const;

  class Metrics;

 private:
  struct State;
  bool addLocked(const std::string& key, common::Clock::TimePoint now, bool urgent);
  std::optional<std::string> getImpl(std::optional<common::Clock::TimePoint> deadline);
  void refreshMetricsLoop();

  const common::Clock& clock_;
  std::unique_ptr<RateLimiter> rate_limiter_;
  std::unique_ptr<Metrics> metrics_;
  const Duration metrics_refresh_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<State> state_;
  std::thread metrics_thread_;
};

}  // namespace rtable::op
