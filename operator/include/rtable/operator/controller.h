// Controller: N workers that take keys from a WorkQueue and reconcile them, with
// controller-runtime's result handling and metrics (sigs.k8s.io/controller-runtime
// pkg/internal/controller).
//
// Results (reconcileHandler): an error requeues the key with the rate limiter's per-key backoff; a
// terminal error does not requeue (a new event brings the key back); requeue_after > 0 forgets
// the backoff and adds the key after that delay; requeue without a delay goes through the rate
// limiter; otherwise the key's backoff is forgotten. The WorkQueue never hands one key to two
// workers at once, so a reconcile of a key never overlaps another of the same key.
//
// Metrics (with a registry), label controller=<name>: controller_runtime_reconcile_total{result=
// success|error|requeue|requeue_after}, controller_runtime_reconcile_errors_total,
// controller_runtime_terminal_reconcile_errors_total, controller_runtime_reconcile_panics_total
// (here: exceptions), controller_runtime_reconcile_time_seconds, controller_runtime_active_workers,
// controller_runtime_max_concurrent_reconciles; plus the queue's workqueue_* metrics.
//
// Thread safety: queue() may be used from any thread (informer handlers add to it); start() and
// stop() from one owner thread. stop() shuts the queue down and waits for running reconciles.
#pragma once

#include <atomic>
#include <expected>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rtable/common/clock.h"
#include "rtable/operator/rate_limiter.h"
#include "rtable/operator/resource.h"
#include "rtable/operator/work_queue.h"

namespace prometheus {
class Registry;
}

namespace rtable::op {

struct ReconcileResult {
  // Reconcile again after the rate limiter's backoff, without counting as an error.
  bool requeue = false;
  // > 0: reconcile again after this long (wins over `requeue`), e.g. to poll an external state.
  common::Clock::Duration requeue_after = common::Clock::Duration::zero();

  static ReconcileResult done() { return {}; }
  static ReconcileResult after(common::Clock::Duration delay) { return {false, delay}; }
};

struct ReconcileError {
  std::string message;
  // Retrying cannot help (an invalid spec): no requeue (controller-runtime's TerminalError).
  bool terminal = false;

  static ReconcileError retryable(std::string message) { return {std::move(message), false}; }
  static ReconcileError terminalError(std::string message) { return {std::move(message), true}; }
};

using ReconcileOutcome = std::expected<ReconcileResult, ReconcileError>;
// Called with the key's namespace and name; must be idempotent (level-based: it reads the current
// state, it is not told what changed).
using ReconcileFunc = std::function<ReconcileOutcome(const ObjectKey& key)>;

struct ControllerOptions {
  std::string name;  // the `controller` label and the queue's `name` label
  int max_concurrent_reconciles = 1;
  const common::Clock* clock = nullptr;       // null: SteadyClock; must outlive the controller
  std::unique_ptr<RateLimiter> rate_limiter;  // null: defaultControllerRateLimiter
  prometheus::Registry* registry = nullptr;   // optional; must outlive the controller
};

class Controller {
 public:
  Controller(ControllerOptions options, ReconcileFunc reconcile);
  ~Controller();  // stops
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Informer handlers add keys here (event_handlers.h), before or after start().
  WorkQueue& queue() { return queue_; }
  const std::string& name() const { return name_; }

  void start();
  // Idempotent: no new reconcile starts; waits for the running ones. Keys still queued are
  // dropped (the next start lists everything again).
  void stop();

  int activeWorkers() const { return active_workers_.load(); }

  class Metrics;

 private:
  void work();
  void reconcileOne(const std::string& key);

  const std::string name_;
  const int workers_;
  const common::Clock& clock_;
  ReconcileFunc reconcile_;
  std::unique_ptr<Metrics> metrics_;
  WorkQueue queue_;
  std::atomic<int> active_workers_{0};
  std::mutex lifecycle_mu_;
  bool started_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace rtable::op
