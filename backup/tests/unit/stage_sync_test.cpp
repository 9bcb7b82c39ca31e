// The stage barrier (seed 001) on the in-memory ZooKeeper: every host and the initiator reach a
// stage before anyone goes on; an error stops everyone; a host that finished without a stage or
// whose alive node stays missing fails the wait; a session expiry brings the alive node back with
// an alive_tracker bump; a lost answer of join or setStage is taken for success; a waiting host
// and a polled initiator hear a change of the stage nodes at once (a watch), not at their next
// poll.
#include "rtable/backup/stage_sync.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::backup {
namespace {

using namespace std::chrono_literals;

class StageSync : public ::testing::Test {
 protected:
  void SetUp() override {
    auto keeper = server_->connect();
    ASSERT_TRUE(core::createAncestorsAndSelf(*keeper, paths_.stage()));
    ASSERT_TRUE(core::createAncestorsAndSelf(*keeper, paths_.aliveTracker()));
  }
  std::unique_ptr<BackupStageSync> sync(const std::string& host,
                                        std::vector<std::string> hosts = {"r1", "r2"},
                                        std::chrono::milliseconds sync_period = 10ms) {
    StageSyncOptions options;
    options.sync_period = sync_period;
    options.host_lost_timeout = 300ms;
    options.initiator_lost_timeout = 300ms;
    options.stage_timeout = 20s;
    options.retry.initial_backoff = 1ms;
    auto server = server_;
    return std::make_unique<BackupStageSync>(
        [server]() -> core::KeeperResult<std::unique_ptr<core::Keeper>> {
          return server->connect();
        },
        paths_, std::move(hosts), host, options);
  }
  int32_t trackerVersion() {
    auto keeper = server_->connect();
    return (*keeper->get(paths_.aliveTracker())).stat.version;
  }

  std::shared_ptr<core::testing::FakeKeeperServer> server_ =
      core::testing::FakeKeeperServer::create();
  BackupPaths paths_{"/rtable/backups", "u1"};
};

TEST_F(StageSync, NobodyPassesAStageBeforeEveryHostAndTheInitiatorReachedIt) {
  auto r1 = sync("r1"), r2 = sync("r2"), initiator = sync("");
  ASSERT_TRUE(r1->join());
  ASSERT_TRUE(r2->join());
  ASSERT_TRUE(initiator->join());
  ASSERT_TRUE(r1->setStage("extracting data", "one"));
  std::atomic<bool> passed{false};
  std::map<std::string, std::string> results;
  std::thread waiter([&] {
    auto waited = r1->waitForStage("extracting data");
    ASSERT_TRUE(waited) << waited.error().toString();
    results = *waited;
    passed = true;
  });
  ASSERT_TRUE(r2->setStage("extracting data", "two"));
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(passed) << "passed without the initiator";
  ASSERT_TRUE(initiator->setStage("extracting data"));
  waiter.join();
  EXPECT_EQ(results, (std::map<std::string, std::string>{{"", ""}, {"r1", "one"}, {"r2", "two"}}));

  auto state = initiator->readState();
  ASSERT_TRUE(state);
  EXPECT_TRUE(state->hosts["r1"].alive);
  EXPECT_TRUE(state->hosts["r1"].started);
  EXPECT_EQ(state->hosts["r2"].stages["extracting data"], "two");
  ASSERT_TRUE(r1->finish());
  state = initiator->readState();
  EXPECT_TRUE(state->hosts["r1"].finished);
  EXPECT_FALSE(state->hosts["r1"].alive);
}

TEST_F(StageSync, AnErrorStopsEveryWaitingHost) {
  auto r1 = sync("r1"), r2 = sync("r2");
  ASSERT_TRUE(r1->join());
  ASSERT_TRUE(r2->join());
  std::thread waiter([&] {
    auto waited = r1->waitForStage("writing backup");
    ASSERT_FALSE(waited);
    EXPECT_EQ(waited.error(), (BackupError{"r2", "writing backup", "bucket gone", "NoBucket"}));
  });
  r2->setError(BackupError{"r2", "writing backup", "bucket gone", "NoBucket"});
  // The first error wins.
  r1->setError(BackupError{"r1", "writing backup", "later"});
  waiter.join();
}

TEST_F(StageSync, AHostThatFinishedWithoutTheStageOrIsGoneFailsTheWait) {
  auto r1 = sync("r1"), r2 = sync("r2"), initiator = sync("");
  ASSERT_TRUE(r1->join());
  ASSERT_TRUE(r2->join());
  ASSERT_TRUE(initiator->join());
  ASSERT_TRUE(r2->finish());
  auto waited = r1->waitForStage("completed");
  ASSERT_FALSE(waited);
  EXPECT_EQ(waited.error().host, "r2");
  EXPECT_EQ(waited.error().message, "finished without coming to this stage");
}

TEST_F(StageSync, AHostWhoseAliveNodeStaysMissingIsGone) {
  auto r1 = sync("r1"), initiator = sync("");
  ASSERT_TRUE(r1->join());
  ASSERT_TRUE(initiator->join());
  // r2 never joins.
  auto waited = r1->waitForStage("extracting data");
  ASSERT_FALSE(waited);
  EXPECT_EQ(waited.error().host, "r2");
  EXPECT_NE(waited.error().message.find("the replica is gone"), std::string::npos)
      << waited.error().toString();
  // It is in ZooKeeper for everyone.
  auto state = initiator->readState();
  ASSERT_TRUE(state);
  ASSERT_TRUE(state->error);
  EXPECT_EQ(state->error->host, "r2");
}

TEST_F(StageSync, ASessionLossRecreatesTheAliveNodeAndBumpsTheTracker) {
  auto r1 = sync("r1");
  ASSERT_TRUE(r1->join());
  auto keeper = server_->connect();
  auto alive = keeper->exists(paths_.alive("r1"));
  ASSERT_TRUE(alive && *alive);
  int32_t before = trackerVersion();
  server_->expireSession((*alive)->ephemeral_owner);
  EXPECT_FALSE(keeper->exists(paths_.alive("r1"))->has_value());
  // The next request makes a new session and brings the node back first.
  ASSERT_TRUE(r1->readState());
  auto again = keeper->exists(paths_.alive("r1"));
  ASSERT_TRUE(again && *again);
  EXPECT_NE((*again)->ephemeral_owner, (*alive)->ephemeral_owner);
  EXPECT_EQ(trackerVersion(), before + 1);
}

TEST_F(StageSync, ConnectionLossesAreRetriedAndALostAnswerIsSuccess) {
  auto r1 = sync("r1");
  server_->failNextRequestsForTest(2);
  ASSERT_TRUE(r1->join());
  // The multi is applied, its answer lost: the retry finds started| and its own alive node.
  auto r2 = sync("r2");
  server_->loseNextMultiAnswersForTest(1);
  auto joined = r2->join();
  ASSERT_TRUE(joined) << joined.error().toString();
  server_->failNextRequestsForTest(1, 1);
  ASSERT_TRUE(r2->setStage("s", "x"));
}

TEST_F(StageSync, AHostThatStartedBeforeCannotJoinAgain) {
  auto first = sync("r1");
  ASSERT_TRUE(first->join());
  first.reset();  // the process died: its session ends
  auto again = sync("r1");
  auto joined = again->join();
  ASSERT_FALSE(joined);
  EXPECT_NE(joined.error().message.find("joined the operation before"), std::string::npos)
      << joined.error().toString();
}

TEST_F(StageSync, AWaitingHostWakesWhenAHostReachesTheStageNotAtItsNextPoll) {
  // A poll an hour away: only the watch can end this wait in time.
  auto r1 = sync("r1", {"r1", "r2"}, 1h), r2 = sync("r2", {"r1", "r2"}, 1h),
       initiator = sync("", {"r1", "r2"}, 1h);
  ASSERT_TRUE(r1->join());
  ASSERT_TRUE(r2->join());
  ASSERT_TRUE(initiator->join());
  ASSERT_TRUE(r1->setStage("extracting data"));
  ASSERT_TRUE(initiator->setStage("extracting data"));
  auto waited = std::async(std::launch::async, [&] { return r1->waitForStage("extracting data"); });
  std::this_thread::sleep_for(50ms);  // r1 looked once and waits
  ASSERT_TRUE(r2->setStage("extracting data"));
  if (waited.wait_for(10s) != std::future_status::ready) {
    r1->stop();
    FAIL() << "r1 did not wake up when r2 reached the stage";
  }
  auto results = waited.get();
  ASSERT_TRUE(results) << results.error().toString();
  EXPECT_EQ(results->size(), 3u);
}

TEST_F(StageSync, TheChangeListenerHearsEachChangeAfterALook) {
  auto r1 = sync("r1"), initiator = sync("");
  ASSERT_TRUE(r1->join());
  ASSERT_TRUE(initiator->join());
  std::mutex mu;
  std::condition_variable cv;
  int heard = 0;
  initiator->setChangeListener([&] {
    std::lock_guard lock(mu);
    ++heard;
    cv.notify_all();
  });
  auto heardAtLeast = [&](int n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 10s, [&] { return heard >= n; });
  };
  ASSERT_TRUE(initiator->readState());
  ASSERT_TRUE(r1->setStage("extracting data"));
  EXPECT_TRUE(heardAtLeast(1)) << "a host reached a stage unheard";
  ASSERT_TRUE(initiator->readState());  // the poll the wake-up causes arms the next watch
  r1->setError(BackupError{"r1", "writing backup", "disk full", "NoSpace"});
  EXPECT_TRUE(heardAtLeast(2)) << "a host's error unheard";
}

TEST_F(StageSync, StopEndsAWait) {
  auto r1 = sync("r1");
  ASSERT_TRUE(r1->join());
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    r1->stop();
  });
  auto waited = r1->waitForStage("never");
  stopper.join();
  ASSERT_FALSE(waited);
  EXPECT_NE(waited.error().message.find("stopped"), std::string::npos);
}

}  // namespace
}  // namespace rtable::backup
