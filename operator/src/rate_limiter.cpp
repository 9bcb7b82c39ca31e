#include "rtable/operator/rate_limiter.h"

#include <algorithm>
#include <cmath>

namespace rtable::op {

ExponentialFailureRateLimiter::ExponentialFailureRateLimiter(Duration base, Duration max)
    : base_(base), max_(max) {}

RateLimiter::Duration ExponentialFailureRateLimiter::when(const std::string& key) {
  int exponent;
  {
    std::lock_guard lock(mu_);
    exponent = failures_[key]++;
  }
  // In floating point: 2^exponent overflows integers long before the cap stops mattering.
  const double backoff = static_cast<double>(base_.count()) * std::pow(2.0, exponent);
  if (!(backoff < static_cast<double>(max_.count()))) return max_;
  return Duration(static_cast<Duration::rep>(backoff));
}

void ExponentialFailureRateLimiter::forget(const std::string& key) {
  std::lock_guard lock(mu_);
  failures_.erase(key);
}

int ExponentialFailureRateLimiter::numRequeues(const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

BucketRateLimiter::BucketRateLimiter(const common::Clock& clock, double qps, int burst)
    : clock_(clock), qps_(qps), burst_(burst), tokens_(burst), last_(clock.now()) {}

RateLimiter::Duration BucketRateLimiter::when(const std::string&) {
  std::lock_guard lock(mu_);
  // golang.org/x/time/rate Limiter.Reserve: refill for the time since the last reservation, take
  // one token, wait for the deficit if the bucket went negative.
  const auto now = clock_.now();
  if (now > last_) {
    const double elapsed = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(burst_, tokens_ + elapsed * qps_);
    last_ = now;
  }
  tokens_ -= 1;
  if (tokens_ >= 0) return Duration::zero();
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(-tokens_ / qps_));
}

MaxOfRateLimiter::MaxOfRateLimiter(std::vector<std::unique_ptr<RateLimiter>> limiters)
    : limiters_(std::move(limiters)) {}

RateLimiter::Duration MaxOfRateLimiter::when(const std::string& key) {
  Duration longest = Duration::zero();
  for (auto& limiter : limiters_) longest = std::max(longest, limiter->when(key));
  return longest;
}

void MaxOfRateLimiter::forget(const std::string& key) {
  for (auto& limiter : limiters_) limiter->forget(key);
}

int MaxOfRateLimiter::numRequeues(const std::string& key) const {
  int most = 0;
  for (const auto& limiter : limiters_) most = std::max(most, limiter->numRequeues(key));
  return most;
}

std::unique_ptr<RateLimiter> defaultControllerRateLimiter(const common::Clock& clock) {
  std::vector<std::unique_ptr<RateLimiter>> parts;
  parts.push_back(std::make_unique<ExponentialFailureRateLimiter>());
  parts.push_back(std::make_unique<BucketRateLimiter>(clock));
  return std::make_unique<MaxOfRateLimiter>(std::move(parts));
}

}  // namespace rtable::op
