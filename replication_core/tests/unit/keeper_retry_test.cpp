#include "rtable/replication_core/keeper_retry.h"

#include <gtest/gtest.h>

#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {

using namespace std::chrono_literals;

class KeeperRetry : public ::testing::Test {
 protected:
  SleepFunction recordSleeps() {
    return [this](std::chrono::milliseconds d) { sleeps_.push_back(d); };
  }
  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  std::unique_ptr<Keeper> keeper_ = server_->connect();
  std::vector<std::chrono::milliseconds> sleeps_;
};

TEST_F(KeeperRetry, RetriesConnectionLossWithDoublingBackoff) {
  server_->failNextRequestsForTest(3);
  int attempts = 0;
  auto result = retryOnConnectionErrors(
      RetryPolicy{100ms, 5000ms, 10},
      [&] {
        ++attempts;
        return keeper_->create("/a", "", CreateMode::kPersistent);
      },
      recordSleeps());
  ASSERT_TRUE(result) << result.error().toString();
  EXPECT_EQ(attempts, 4);
  EXPECT_EQ(sleeps_, (std::vector<std::chrono::milliseconds>{100ms, 200ms, 400ms}));
}

TEST_F(KeeperRetry, BackoffStopsAtTheCapAndAttemptsRunOut) {
  server_->failNextRequestsForTest(100);
  int attempts = 0;
  auto result = retryOnConnectionErrors(
      RetryPolicy{100ms, 300ms, 5},
      [&] {
        ++attempts;
        return keeper_->get("/");
      },
      recordSleeps());
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, KeeperCode::kConnectionLoss);
  EXPECT_EQ(attempts, 5);
  EXPECT_EQ(sleeps_, (std::vector<std::chrono::milliseconds>{100ms, 200ms, 300ms, 300ms}));
}

TEST_F(KeeperRetry, NeverRetriesASemanticAnswer) {
  ASSERT_TRUE(keeper_->create("/a", "", CreateMode::kPersistent));
  for (auto answer : {KeeperCode::kNodeExists, KeeperCode::kNoNode, KeeperCode::kBadVersion}) {
    int attempts = 0;
    auto result = retryOnConnectionErrors(
        RetryPolicy{},
        [&]() -> KeeperResult<std::string> {
          ++attempts;
          if (answer == KeeperCode::kNodeExists)
            return keeper_->create("/a", "", CreateMode::kPersistent);
          if (answer == KeeperCode::kNoNode)
            return keeper_->create("/x/y", "", CreateMode::kPersistent);
          auto set = keeper_->set("/a", "", 42);
          if (!set) return std::unexpected(set.error());
          return std::string();
        },
        recordSleeps());
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().code, answer);
    EXPECT_EQ(attempts, 1);
  }
  EXPECT_TRUE(sleeps_.empty());
}

TEST_F(KeeperRetry, AnAttemptMayRenewAnExpiredSession) {
  server_->expireSession(keeper_->sessionId());
  int attempts = 0;
  auto result = retryOnConnectionErrors(
      RetryPolicy{1ms, 1ms, 3},
      [&]() -> KeeperResult<std::string> {
        ++attempts;
        if (keeper_->expired()) {
          auto fresh = keeper_->startNewSession();
          if (!fresh) return std::unexpected(fresh.error());
          auto refused = keeper_->create("/b", "", CreateMode::kPersistent);  // still the old one
          keeper_ = std::move(*fresh);
          return refused;
        }
        return keeper_->create("/b", "", CreateMode::kPersistent);
      },
      recordSleeps());
  ASSERT_TRUE(result) << result.error().toString();
  EXPECT_EQ(attempts, 2);
}

}  // namespace
}  // namespace rtable::core
