// Retries of Keeper requests that failed at the connection level.
//
// Only connection loss, operation timeout and session expiry are retried: the request's outcome is
// unknown, so the same request may be sent again. A semantic answer (no node, node exists, bad
// version, ...) is returned at once, never retried. A retried create or multi may find that its
// first attempt was applied after all (kNodeExists on the retry): deciding what that means is the
// caller's job, as in ClickHouse where modifying requests do not retry inside the client.
#pragma once

#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "rtable/replication_core/keeper.h"

namespace rtable::core {

struct RetryPolicy {
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  int max_attempts = 10;  // including the first
};

using SleepFunction = std::function<void(std::chrono::milliseconds)>;

inline void sleepFor(std::chrono::milliseconds duration) {
  std::this_thread::sleep_for(duration);
}

// Calls `attempt` (returning a KeeperResult) until it succeeds, gives a semantic answer, or
// `max_attempts` connection-level failures happened; the backoff doubles from `initial_backoff` up
// to `max_backoff`. Returns the last result.
template <class Attempt>
auto retryOnConnectionErrors(const RetryPolicy& policy, Attempt&& attempt,
                             const SleepFunction& sleep = sleepFor) -> decltype(attempt()) {
  auto backoff = policy.initial_backoff;
  for (int attempts = 1;; ++attempts) {
    auto result = attempt();
    if (result || !result.error().isConnectionLevel() || attempts >= policy.max_attempts) {
      return result;
    }
    sleep(backoff);
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

}  // namespace rtable::core
