// Rate limiters of the work queue, with controller-runtime's defaults (client-go
// workqueue.DefaultTypedControllerRateLimiter): the max of a per-key exponential backoff
// (5 ms doubling to 1000 s) and an overall token bucket (10 qps, burst 100).
//
// Thread safety: every limiter may be called from several threads at once.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rtable/common/clock.h"

namespace rtable::op {

class RateLimiter {
 public:
  using Duration = common::Clock::Duration;
  virtual ~RateLimiter() = default;
  // How long `key` should wait before its next attempt; counts one more failure of it.
  virtual Duration when(const std::string& key) = 0;
  // The key succeeded: reset its failures.
  virtual void forget(const std::string& key) = 0;
  virtual int numRequeues(const std::string& key) const = 0;
};

// base * 2^failures, capped (ItemExponentialFailureRateLimiter).
class ExponentialFailureRateLimiter final : public RateLimiter {
 public:
  // controller-runtime's defaults.
  static constexpr std::chrono::milliseconds kDefaultBase{5};
  static constexpr std::chrono::seconds kDefaultMax{1000};

  explicit ExponentialFailureRateLimiter(Duration base = kDefaultBase, Duration max = kDefaultMax);
  Duration when(const std::string& key) override;
  void forget(const std::string& key) override;
  int numRequeues(const std::string& key) const override;

 private:
  const Duration base_;
  const Duration max_;
  mutable std::mutex mu_;
  std::map<std::string, int> failures_;
};

// A token bucket shared by all keys (BucketRateLimiter over golang.org/x/time/rate.Limiter):
// each when() reserves a token and returns how long until it is available.
class BucketRateLimiter final : public RateLimiter {
 public:
  static constexpr double kDefaultQps = 10;
  static constexpr int kDefaultBurst = 100;

  BucketRateLimiter(const common::Clock& clock, double qps = kDefaultQps,
                    int burst = kDefaultBurst);
  Duration when(const std::string& key) override;
  void forget(const std::string&) override {}
  int numRequeues(const std::string&) const override { return 0; }

 private:
  const common::Clock& clock_;
  const double qps_;
  const double burst_;
  std::mutex mu_;
  double tokens_;
  common::Clock::TimePoint last_;
};

// The longest wait of its parts; failures are counted by all of them.
class MaxOfRateLimiter final : public RateLimiter {
 public:
  explicit MaxOfRateLimiter(std::vector<std::unique_ptr<RateLimiter>> limiters);
  Duration when(const std::string& key) override;
  void forget(const std::string& key) override;
  int numRequeues(const std::string& key) const override;

 private:
  std::vector<std::unique_ptr<RateLimiter>> limiters_;
};

// controller-runtime's default: max(exponential 5 ms..1000 s, bucket 10 qps burst 100).
std::unique_ptr<RateLimiter> defaultControllerRateLimiter(const common::Clock& clock);

}  // namespace rtable::op
