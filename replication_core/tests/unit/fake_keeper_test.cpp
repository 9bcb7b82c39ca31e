// What only the fake has: fault injection and synchronous watch delivery. Its ZooKeeper semantics
// are covered by the conformance suite, which runs it against a real server.
#include "rtable/replication_core/testing/fake_keeper.h"

#include <gtest/gtest.h>

namespace rtable::core::testing {
namespace {

TEST(FakeKeeper, InjectedFailuresAreNotApplied) {
  auto server = FakeKeeperServer::create();
  auto keeper = server->connect();
  server->failNextRequestsForTest(1);
  auto lost = keeper->create("/a", "", CreateMode::kPersistent);
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().code, KeeperCode::kConnectionLoss);
  EXPECT_FALSE(keeper->exists("/a")->has_value());
  EXPECT_TRUE(keeper->create("/a", "", CreateMode::kPersistent));
}

TEST(FakeKeeper, InvalidPathsAreBadArguments) {
  auto server = FakeKeeperServer::create();
  auto keeper = server->connect();
  for (const char* bad : {"", "a", "/a/", "//a", "/a/./b", "/a/../b"}) {
    auto created = keeper->create(bad, "", CreateMode::kPersistent);
    ASSERT_FALSE(created) << bad;
    EXPECT_EQ(created.error().code, KeeperCode::kBadArguments) << bad;
  }
  ASSERT_TRUE(keeper->create("/q", "", CreateMode::kPersistent));
  // A trailing slash is fine for a sequential create: the suffix completes the name.
  auto seq = keeper->create("/q/", "", CreateMode::kPersistentSequential);
  ASSERT_TRUE(seq);
  EXPECT_EQ(*seq, "/q/0000000000");
  EXPECT_EQ(keeper->remove("/").error().code, KeeperCode::kBadArguments);
}

TEST(FakeKeeper, ExpiryOfOneSessionLeavesOthersAlone) {
  auto server = FakeKeeperServer::create();
  auto a = server->connect();
  auto b = server->connect();
  ASSERT_TRUE(a->create("/a", "", CreateMode::kEphemeral));
  ASSERT_TRUE(b->create("/b", "", CreateMode::kEphemeral));
  server->expireSession(a->sessionId());
  EXPECT_TRUE(a->expired());
  EXPECT_FALSE(b->expired());
  EXPECT_FALSE(b->exists("/a")->has_value());
  EXPECT_TRUE(b->exists("/b")->has_value());
}

}  // namespace
}  // namespace rtable::core::testing
