#include "rtable/operator/controller.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

#include "rtable/operator/event_handlers.h"

namespace rtable::op {

// controller-runtime's pkg/internal/controller/metrics.
class Controller::Metrics {
 public:
  Metrics(prometheus::Registry& registry, const std::string& name) {
    const prometheus::Labels labels{{"controller", name}};
    auto& total = prometheus::BuildCounter()
                      .Name("controller_runtime_reconcile_total")
                      .Help("Total number of reconciliations per controller")
                      .Register(registry);
    success = &total.Add({{"controller", name}, {"result", "success"}});
    error = &total.Add({{"controller", name}, {"result", "error"}});
    requeue = &total.Add({{"controller", name}, {"result", "requeue"}});
    requeue_after = &total.Add({{"controller", name}, {"result", "requeue_after"}});
    errors = &prometheus::BuildCounter()
                  .Name("controller_runtime_reconcile_errors_total")
                  .Help("Total number of reconciliation errors per controller")
                  .Register(registry)
                  .Add(labels);
    terminal_errors = &prometheus::BuildCounter()
                           .Name("controller_runtime_terminal_reconcile_errors_total")
                           .Help("Total number of terminal reconciliation errors per controller")
                           .Register(registry)
                           .Add(labels);
    panics = &prometheus::BuildCounter()
                  .Name("controller_runtime_reconcile_panics_total")
                  .Help("Total number of reconciliation panics per controller")
                  .Register(registry)
                  .Add(labels);
    // controller-runtime's buckets: 5 ms .. 60 s.
    const prometheus::Histogram::BucketBoundaries buckets = {
        0.005, 0.01, 0.025, 0.05, 0.1,  0.15, 0.2,  0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6,
        0.7,   0.8,  0.9,   1.0,  1.25, 1.5,  1.75, 2.0,  2.5, 3.0,  3.5, 4.0,  4.5, 5,
        6,     7,    8,     9,    10,   15,   20,   25,   30,  40,   50,  60};
    time = &prometheus::BuildHistogram()
                .Name("controller_runtime_reconcile_time_seconds")
                .Help("Length of time per reconciliation per controller")
                .Register(registry)
                .Add(labels, buckets);
    active_workers = &prometheus::BuildGauge()
                          .Name("controller_runtime_active_workers")
                          .Help("Number of currently used workers per controller")
                          .Register(registry)
                          .Add(labels);
    max_concurrent = &prometheus::BuildGauge()
                          .Name("controller_runtime_max_concurrent_reconciles")
                          .Help("Maximum number of concurrent reconciles per controller")
                          .Register(registry)
                          .Add(labels);
  }

  prometheus::Counter* success;
  prometheus::Counter* error;
  prometheus::Counter* requeue;
  prometheus::Counter* requeue_after;
  prometheus::Counter* errors;
  prometheus::Counter* terminal_errors;
  prometheus::Counter* panics;
  prometheus::Histogram* time;
  prometheus::Gauge* active_workers;
  prometheus::Gauge* max_concurrent;
};

namespace {
WorkQueue::Options queueOptions(ControllerOptions& options) {
  WorkQueue::Options q;
  q.name = options.name;
  q.clock = options.clock;
  q.rate_limiter = std::move(options.rate_limiter);
  q.registry = options.registry;
  return q;
}
}  // namespace

Controller::Controller(ControllerOptions options, ReconcileFunc reconcile)
    : name_(options.name),
      workers_(std::max(1, options.max_concurrent_reconciles)),
      clock_(options.clock != nullptr ? *options.clock : common::SteadyClock::instance()),
      reconcile_(std::move(reconcile)),
      metrics_(options.registry != nullptr ? std::make_unique<Metrics>(*options.registry, name_)
                                           : nullptr),
      queue_(queueOptions(options)) {
  if (metrics_) metrics_->max_concurrent->Set(workers_);
}

Controller::~Controller() {
  stop();
}

void Controller::start() {
  std::lock_guard lifecycle(lifecycle_mu_);
  if (started_) return;
  started_ = true;
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { work(); });
}

void Controller::stop() {
  std::lock_guard lifecycle(lifecycle_mu_);
  queue_.shutDown();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

void Controller::work() {
  while (auto key = queue_.get()) {
    reconcileOne(*key);
    queue_.done(*key);
  }
}

void Controller::reconcileOne(const std::string& key) {
  ++active_workers_;
  if (metrics_) metrics_->active_workers->Increment();
  const auto started = clock_.now();
  ReconcileOutcome outcome;
  try {
    outcome = reconcile_(objectKeyFromString(key));
  } catch (const std::exception& e) {
    // controller-runtime recovers a panicking reconcile and treats it as an error.
    if (metrics_) metrics_->panics->Increment();
    outcome = std::unexpected(ReconcileError::retryable(fmt::format("exception: {}", e.what())));
  }
  if (metrics_) {
    metrics_->time->Observe(std::chrono::duration<double>(clock_.now() - started).count());
    metrics_->active_workers->Decrement();
  }
  --active_workers_;

  if (!outcome) {
    if (metrics_) {
      metrics_->error->Increment();
      metrics_->errors->Increment();
    }
    if (outcome.error().terminal) {
      if (metrics_) metrics_->terminal_errors->Increment();
      queue_.forget(key);
      spdlog::error("controller {}: reconcile {} failed for good: {}", name_, key,
                    outcome.error().message);
    } else {
      spdlog::warn("controller {}: reconcile {} failed (attempt {}): {}", name_, key,
                   queue_.numRequeues(key) + 1, outcome.error().message);
      queue_.addRateLimited(key);
    }
    return;
  }
  if (outcome->requeue_after > common::Clock::Duration::zero()) {
    if (metrics_) metrics_->requeue_after->Increment();
    queue_.forget(key);
    queue_.addAfter(key, outcome->requeue_after);
  } else if (outcome->requeue) {
    if (metrics_) metrics_->requeue->Increment();
    queue_.addRateLimited(key);
  } else {
    if (metrics_) metrics_->success->Increment();
    queue_.forget(key);
  }
}

}  // namespace rtable::op
