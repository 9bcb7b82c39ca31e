// LeaderElector: leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection
// package does it for controller-runtime.
//
// A candidate takes the Lease when it is absent, released (empty holderIdentity) or expired, and
// the leader renews it every retry_period. Expiry is judged by this process's own clock: a Lease
// is expired when its record (holder, times, transitions) has not changed for
// leaseDurationSeconds since this elector *observed* the last change. Remote timestamps are never
// compared with the local clock, which makes the election immune to clock skew between nodes.
// Every write carries the resourceVersion that was read: a Conflict (another candidate wrote
// first) loses that round, so two candidates can never both succeed.
//
// The leader stops leading (on_stopped_leading) when it sees another holder, or when it could not
// renew for renew_deadline since its last successful renewal; renew_deadline < lease_duration
// leaves the gap in which the old leader has given up before anyone may take over. After losing,
// it campaigns again (on_started_leading may come again). stop() with release_on_cancel clears the
// holder so that another candidate takes over at its next retry instead of after the lease time.
//
// Callbacks run on the elector's thread and must not block (hand off to another thread) or call
// stop(). Thread safety: all public methods may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "rtable/common/clock.h"
#include "rtable/operator/kube_client.h"

namespace rtable::op {

struct LeaderElectionOptions {
  ObjectKey lease;       // namespace and name of the Lease
  std::string identity;  // empty: defaultLeaderIdentity()
  // controller-runtime's defaults.
  common::Clock::Duration lease_duration = std::chrono::seconds(15);
  common::Clock::Duration renew_deadline = std::chrono::seconds(10);
  common::Clock::Duration retry_period = std::chrono::seconds(2);
  // Candidates retry after retry_period * (1 + jitter * U[0,1)) (client-go: 1.2) so that they do
  // not all ask at once; the leader renews every retry_period exactly.
  double acquire_jitter = 1.2;
  // On stop(), a leader clears the holder so that the next leader need not wait for expiry
  // (controller-runtime's LeaderElectionReleaseOnCancel; off there by default).
  bool release_on_cancel = false;
  const common::Clock* clock = nullptr;  // null: SteadyClock; must outlive the elector
  // Stamps acquireTime and renewTime (for people and tools; decisions never read them).
  std::function<std::chrono::system_clock::time_point()> wall_clock;
  std::function<void()> on_started_leading;
  std::function<void()> on_stopped_leading;
  // The observed holder changed (also to this elector, or to "" on a release).
  std::function<void(const std::string& holder)> on_new_leader;
};

// The Lease spec fields leader election uses (coordination.k8s.io/v1 LeaseSpec).
struct LeaseRecord {
  std::string holder_identity;
  int64_t lease_duration_seconds = 0;
  std::string acquire_time;  // MicroTime, RFC 3339 with microseconds
  std::string renew_time;
  int64_t lease_transitions = 0;

  static LeaseRecord fromLease(const nlohmann::json& lease);
  // Writes the fields into lease["spec"].
  void toLease(nlohmann::json& lease) const;
  friend bool operator==(const LeaseRecord&, const LeaseRecord&) = default;
};

// "<hostname>_<pid>": unique per process, and readable in `kubectl get lease`.
std::string defaultLeaderIdentity();

// The longest a Lease request may wait for its answer: a renewal starts at most retry_period
// after the last good one, so one that gives up by then leaves the elector to notice the renew
// deadline on time, before the Lease expires for the others. At least 100 ms.
std::chrono::milliseconds electionRequestTimeout(common::Clock::Duration renew_deadline,
                                                 common::Clock::Duration retry_period);

class LeaderElector {
 public:
  // Throws std::invalid_argument for a missing lease name or inconsistent timings (start-up
  // configuration): retry_period < renew_deadline < lease_duration.
  LeaderElector(KubeClient& client, LeaderElectionOptions options);
  ~LeaderElector();  // stops
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  void start();
  // Idempotent. Ends leadership (releasing the Lease if configured, then on_stopped_leading)
  // before it returns.
  void stop();
  // The next stop() leaves the Lease held (to expire on its own) even with release_on_cancel:
  // for a process whose work may still be running, so that no other leader starts beside it.
  void keepLeaseOnStop() { release_on_stop_.store(false); }

  // Leading, and the last renewal is within renew_deadline by this clock.
  bool isLeader() const;
  const std::string& identity() const { return options_.identity; }
  // The holder this elector last saw in the Lease ("" if none).
  std::string observedLeader() const;
  std::optional<KubeError> lastError() const;

  // --- test hooks ---
  // One round of the protocol without the loop (nothing may be running): true when the Lease is
  // now held by this elector. Calls on_new_leader only.
  bool tryAcquireOrRenewForTest();
  // While the loop sleeps: until when. nullopt while it works (or before start()). After a clock
  // advance, `sleepingUntil > now` means the elector has caught up.
  std::optional<common::Clock::TimePoint> sleepingUntilForTest() const;

 private:
  void run();
  bool tryAcquireOrRenew();
  void release();
  bool sleepUntil(common::Clock::TimePoint deadline);
  std::chrono::system_clock::time_point wallNow() const;

  KubeClient& client_;
  LeaderElectionOptions options_;
  const common::Clock& clock_;
  std::mt19937_64 random_;

  std::mutex lifecycle_mu_;
  bool started_ = false;
  std::thread thread_;
  std::atomic<bool> release_on_stop_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool leading_ = false;
  common::Clock::TimePoint last_renew_{};
  std::optional<common::Clock::TimePoint> sleeping_until_;
  LeaseRecord observed_record_;
  common::Clock::TimePoint observed_time_{};
  std::optional<KubeError> last_error_;
};

}  // namespace rtable::op
