// Leader election on FakeKubeClient and simulated time: one of two candidates leads; when the
// leader stops renewing the other takes over once the lease has expired by its own observation; a
// release hands over at once; a Conflict decides a race; remote timestamps are never trusted.
#include "rtable/operator/leader_election.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <stdexcept>

#include "rtable/common/testing/fake_clock.h"
#include "rtable/operator/testing/fake_kube_client.h"
#include "runtime_test_support.h"

namespace rtable::op {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using common::testing::FakeClock;
using testing::eventually;
using testing::FakeKubeClient;
using testing::InterceptingKubeClient;

const ObjectKey kLease{"default", "rtable-operator"};

class LeaderElectionTest : public ::testing::Test {
 protected:
  // One candidate: its own client (which a test can cut off) and what its callbacks saw.
  struct Candidate {
    std::string id;
    std::unique_ptr<InterceptingKubeClient> client;
    std::atomic<bool> partitioned{false};
    std::unique_ptr<LeaderElector> elector;
    bool running = false;
    std::mutex mu;
    std::optional<common::Clock::TimePoint> started_at, stopped_at;

    void start() {
      running = true;
      elector->start();
    }
    void stop() {
      elector->stop();
      running = false;
    }
    std::optional<common::Clock::TimePoint> startedAt() {
      std::lock_guard lock(mu);
      return started_at;
    }
    std::optional<common::Clock::TimePoint> stoppedAt() {
      std::lock_guard lock(mu);
      return stopped_at;
    }
  };

  // The fixture owns candidates: they outlive TearDown().
  Candidate* candidate(const std::string& id, bool release_on_cancel = false) {
    auto owned = std::make_unique<Candidate>();
    Candidate* c = owned.get();
    owned_.push_back(std::move(owned));
    c->id = id;
    c->client = std::make_unique<InterceptingKubeClient>(fake_);
    c->client->setHook([c](InterceptingKubeClient::Call) -> std::optional<KubeError> {
      if (c->partitioned) return KubeError::connection("network partition");
      return std::nullopt;
    });
    LeaderElectionOptions o;
    o.lease = kLease;
    o.identity = id;
    o.clock = &clock_;
    o.acquire_jitter = 0;  // deterministic retry times
    o.release_on_cancel = release_on_cancel;
    o.on_started_leading = [this, c] {
      if (++leaders_ > 1) ++violations_;
      std::lock_guard lock(c->mu);
      c->started_at = clock_.now();
    };
    o.on_stopped_leading = [this, c] {
      --leaders_;
      std::lock_guard lock(c->mu);
      c->stopped_at = clock_.now();
    };
    c->elector = std::make_unique<LeaderElector>(*c->client, o);
    candidates_.push_back(c);
    return c;
  }

  // Every running elector has done what is due at the current simulated time.
  void settle() {
    for (Candidate* c : candidates_) {
      if (!c->running) continue;
      ASSERT_TRUE(eventually([&] {
        auto until = c->elector->sleepingUntilForTest();
        return until && *until > clock_.now();
      })) << c->id
          << " did not settle";
    }
  }

  // Advances simulated time in steps, letting the electors catch up after each.
  void advance(common::Clock::Duration total, common::Clock::Duration step = 250ms) {
    for (common::Clock::Duration done{}; done < total; done += step) {
      clock_.advance(step);
      settle();
    }
  }

  // Advances until `predicate` holds; false after `limit`.
  template <class Predicate>
  bool advanceUntil(Predicate predicate, common::Clock::Duration limit,
                    common::Clock::Duration step = 250ms) {
    for (common::Clock::Duration done{}; done < limit; done += step) {
      if (predicate()) return true;
      clock_.advance(step);
      settle();
    }
    return predicate();
  }

  LeaseRecord lease() {
    auto got = fake_.get(resources::leases(), kLease);
    EXPECT_TRUE(got) << got.error().toString();
    return got ? LeaseRecord::fromLease(*got) : LeaseRecord{};
  }

  void TearDown() override {
    for (Candidate* c : candidates_) {
      if (c->running) c->stop();
    }
    EXPECT_EQ(violations_.load(), 0) << "two leaders at once";
  }

  FakeClock clock_;
  FakeKubeClient fake_;
  std::atomic<int> leaders_{0};
  std::atomic<int> violations_{0};
  std::vector<Candidate*> candidates_;
  std::vector<std::unique_ptr<Candidate>> owned_;  // last: electors go before what they use
};

// A renewal that has not been answered by the time the next is due leaves room for the elector to
// see the renew deadline pass: started at most a retry period after the last good one, it gives
// up by the deadline.
TEST(ElectionRequestTimeout, EndsARenewalByTheRenewDeadline) {
  using namespace std::chrono_literals;
  EXPECT_EQ(electionRequestTimeout(10s, 2s), 8000ms);  // client-go's defaults
  EXPECT_EQ(electionRequestTimeout(3s, 1s), 2000ms);
  EXPECT_EQ(electionRequestTimeout(1050ms, 1s), 100ms);  // never below 100 ms
}

TEST_F(LeaderElectionTest, OneOfTwoCandidatesLeads) {
  auto a = candidate("a");
  auto b = candidate("b");
  a->start();
  b->start();
  settle();
  ASSERT_TRUE(eventually([&] { return a->elector->isLeader() != b->elector->isLeader(); }));
  Candidate& leader = a->elector->isLeader() ? *a : *b;
  Candidate& other = a->elector->isLeader() ? *b : *a;
  EXPECT_EQ(lease().holder_identity, leader.id);
  EXPECT_EQ(lease().lease_duration_seconds, 15);
  EXPECT_EQ(lease().lease_transitions, 0);

  // Renewals keep it for as long as the leader runs.
  advance(60s);
  EXPECT_TRUE(leader.elector->isLeader());
  EXPECT_FALSE(other.elector->isLeader());
  EXPECT_EQ(other.elector->observedLeader(), leader.id);
  EXPECT_EQ(lease().holder_identity, leader.id);
  EXPECT_EQ(lease().lease_transitions, 0);
  EXPECT_FALSE(other.startedAt());
}

TEST_F(LeaderElectionTest, TheOtherTakesOverWhenTheLeaderStopsRenewing) {
  auto a = candidate("a");
  auto b = candidate("b");
  a->start();
  settle();
  ASSERT_TRUE(eventually([&] { return a->elector->isLeader(); }));
  b->start();
  advance(3s);
  EXPECT_FALSE(b->elector->isLeader());

  // The leader is cut off from the apiserver: its renewals fail.
  a->partitioned = true;
  const auto cut = clock_.now();
  ASSERT_TRUE(advanceUntil([&] { return b->elector->isLeader(); }, 30s));
  ASSERT_TRUE(a->stoppedAt());
  ASSERT_TRUE(b->startedAt());
  // a gives up within its renew deadline (10 s after its last renewal, at most 2 s before the
  // cut); b waits for the lease duration (15 s) since it saw that renewal.
  EXPECT_LE(*a->stoppedAt() - cut, 10s + 250ms);
  EXPECT_GE(*b->startedAt() - cut, 13s);
  EXPECT_LE(*b->startedAt() - cut, 18s + 250ms);
  EXPECT_LT(*a->stoppedAt(), *b->startedAt());
  EXPECT_FALSE(a->elector->isLeader());
  EXPECT_EQ(lease().holder_identity, "b");
  EXPECT_EQ(lease().lease_transitions, 1);

  // Back online, a sees b as the leader and stays a candidate.
  a->partitioned = false;
  advance(20s);
  EXPECT_FALSE(a->elector->isLeader());
  EXPECT_EQ(a->elector->observedLeader(), "b");
  EXPECT_TRUE(b->elector->isLeader());
}

TEST_F(LeaderElectionTest, ReleaseOnStopHandsOverAtOnce) {
  auto a = candidate("a", /*release_on_cancel=*/true);
  auto b = candidate("b");
  a->start();
  settle();
  ASSERT_TRUE(eventually([&] { return a->elector->isLeader(); }));
  b->start();
  advance(1s);
  a->stop();
  EXPECT_TRUE(a->stoppedAt());
  EXPECT_EQ(lease().holder_identity, "");
  const auto released = clock_.now();
  ASSERT_TRUE(advanceUntil([&] { return b->elector->isLeader(); }, 30s));
  EXPECT_LE(*b->startedAt() - released, 2s + 250ms);  // b's next retry, not the lease time
  EXPECT_EQ(lease().holder_identity, "b");
  EXPECT_EQ(lease().lease_transitions, 1);
}

TEST_F(LeaderElectionTest, StopWithoutReleaseWaitsForExpiry) {
  auto a = candidate("a");
  auto b = candidate("b");
  a->start();
  settle();
  ASSERT_TRUE(eventually([&] { return a->elector->isLeader(); }));
  b->start();
  advance(1s);
  a->stop();
  EXPECT_EQ(lease().holder_identity, "a");
  const auto stopped = clock_.now();
  ASSERT_TRUE(advanceUntil([&] { return b->elector->isLeader(); }, 30s));
  EXPECT_GE(*b->startedAt() - stopped, 13s);
}

TEST_F(LeaderElectionTest, AConflictDecidesARaceForOneLeader) {
  auto b = candidate("b");
  auto a = candidate("a");
  // a's writes are overtaken by b: just before a's write reaches the server, b does its round.
  std::atomic<bool> race{true};
  std::optional<bool> b_won;
  a->client->setHook([&](InterceptingKubeClient::Call call) -> std::optional<KubeError> {
    if ((call == InterceptingKubeClient::Call::kCreate ||
         call == InterceptingKubeClient::Call::kUpdate) &&
        race.exchange(false)) {
      b_won = b->elector->tryAcquireOrRenewForTest();
    }
    return std::nullopt;
  });

  // Both find no lease and create it: b first, a gets AlreadyExists.
  EXPECT_FALSE(a->elector->tryAcquireOrRenewForTest());
  ASSERT_TRUE(b_won);
  EXPECT_TRUE(*b_won);
  EXPECT_EQ(a->elector->lastError()->kind, KubeErrorKind::kAlreadyExists);
  EXPECT_EQ(lease().holder_identity, "b");

  // a sees b's lease unchanged for longer than its duration and takes it over; b renews in
  // between: a's update carries a stale resourceVersion and loses.
  EXPECT_FALSE(a->elector->tryAcquireOrRenewForTest());  // observes b's record
  clock_.advance(16s);
  race = true;
  b_won.reset();
  EXPECT_FALSE(a->elector->tryAcquireOrRenewForTest());
  ASSERT_TRUE(b_won);
  EXPECT_TRUE(*b_won);
  EXPECT_EQ(a->elector->lastError()->kind, KubeErrorKind::kConflict);
  EXPECT_EQ(lease().holder_identity, "b");
  EXPECT_EQ(lease().lease_transitions, 0);

  // Without b's renewal, the same attempt succeeds later.
  clock_.advance(16s);
  EXPECT_FALSE(a->elector->tryAcquireOrRenewForTest());  // b's renewal is new to a
  clock_.advance(16s);
  EXPECT_TRUE(a->elector->tryAcquireOrRenewForTest());
  EXPECT_EQ(lease().holder_identity, "a");
  EXPECT_EQ(lease().lease_transitions, 1);
}

TEST_F(LeaderElectionTest, RemoteTimestampsAreNotTrusted) {
  // A lease renewed by a node whose clock is far behind: its renewTime looks ancient. Only the
  // time this candidate has seen the record unchanged counts.
  json l = {{"apiVersion", "coordination.k8s.io/v1"},
            {"kind", "Lease"},
            {"metadata", {{"name", kLease.name}, {"namespace", kLease.ns}}}};
  LeaseRecord{"skewed", 15, "2000-01-01T00:00:00.000000Z", "2000-01-01T00:00:00.000000Z", 4}
      .toLease(l);
  ASSERT_TRUE(fake_.create(resources::leases(), l));

  LeaderElectionOptions o;
  o.lease = kLease;
  o.identity = "a";
  o.clock = &clock_;
  const auto wall = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));
  o.wall_clock = [wall] { return wall; };
  LeaderElector a(fake_, o);
  EXPECT_FALSE(a.tryAcquireOrRenewForTest());
  EXPECT_EQ(a.observedLeader(), "skewed");
  clock_.advance(14s);
  EXPECT_FALSE(a.tryAcquireOrRenewForTest());
  clock_.advance(1s);
  EXPECT_TRUE(a.tryAcquireOrRenewForTest());
  const LeaseRecord record = lease();
  EXPECT_EQ(record.holder_identity, "a");
  EXPECT_EQ(record.lease_transitions, 5);
  EXPECT_EQ(record.renew_time, "2023-11-14T22:13:20.000000Z");
  EXPECT_EQ(record.acquire_time, record.renew_time);
}

TEST_F(LeaderElectionTest, RenewalKeepsTheAcquireTime) {
  LeaderElectionOptions o;
  o.lease = kLease;
  o.identity = "a";
  o.clock = &clock_;
  auto wall = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));
  o.wall_clock = [&wall] { return wall; };
  LeaderElector a(fake_, o);
  ASSERT_TRUE(a.tryAcquireOrRenewForTest());
  const LeaseRecord first = lease();
  wall += 2s;
  clock_.advance(2s);
  ASSERT_TRUE(a.tryAcquireOrRenewForTest());
  const LeaseRecord second = lease();
  EXPECT_EQ(second.acquire_time, first.acquire_time);
  EXPECT_NE(second.renew_time, first.renew_time);
  EXPECT_EQ(second.lease_transitions, 0);
}

TEST(LeaderElectionOptionsTest, InconsistentTimingsAreRejected) {
  FakeKubeClient fake;
  LeaderElectionOptions o;
  o.lease = kLease;
  o.renew_deadline = 20s;  // not below the 15 s lease
  EXPECT_THROW({ LeaderElector e(fake, o); }, std::invalid_argument);
  o.renew_deadline = 10s;
  o.retry_period = 10s;
  EXPECT_THROW({ LeaderElector e(fake, o); }, std::invalid_argument);
  o.retry_period = 2s;
  o.lease.name.clear();
  EXPECT_THROW({ LeaderElector e(fake, o); }, std::invalid_argument);
  o.lease = kLease;
  LeaderElector ok(fake, o);
  EXPECT_EQ(ok.identity(), defaultLeaderIdentity());
}

TEST(LeaderElectionFormatTest, Identity) {
  const std::string id = defaultLeaderIdentity();
  EXPECT_NE(id.find('_'), std::string::npos);
  EXPECT_TRUE(id.ends_with("_" + std::to_string(getpid()))) << id;
}

}  // namespace
}  // namespace rtable::op
