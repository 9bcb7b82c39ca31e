#include "rtable/replication_core/quorum.h"

#include <gtest/gtest.h>

#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {

TEST(QuorumEntry, FormatsAsClickHouseAndRoundTrips) {
  QuorumEntry entry{"202612_5_5_0", 2, {"r1"}};
  EXPECT_EQ(entry.format(),
            "version: 1\npart_name: 202612_5_5_0\nrequired_number_of_replicas: 2\n"
            "actual_number_of_replicas: 1\nreplicas:\nr1\n");
  for (const auto& e :
       {entry, QuorumEntry{"all_0_0_0", 3, {"a\tb", "c"}}, QuorumEntry{"x_1_1_0", 2, {}}}) {
    auto parsed = QuorumEntry::parse(e.format());
    ASSERT_TRUE(parsed) << parsed.error();
    EXPECT_EQ(*parsed, e);
  }
}

TEST(QuorumEntry, ParseErrorsSayWhat) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"version: 2\n", "unknown version: 2"},
      {"version: 1\npart_name: p\nrequired_number_of_replicas: x\n",
       "bad line 'required_number_of_replicas: x'"},
      {"version: 1\npart_name: p\nrequired_number_of_replicas: 2\nactual_number_of_replicas: "
       "2\nreplicas:\nr1\n",
       "2 replicas announced, 1 listed"},
      {"version: 1\npart_name: p\nrequired_number_of_replicas: 2\nactual_number_of_replicas: "
       "0\nreplicas:\nr1\n",
       "unexpected text after the replicas"},
  };
  for (const auto& [text, why] : cases) {
    auto parsed = QuorumEntry::parse(text);
    ASSERT_FALSE(parsed) << text;
    EXPECT_NE(parsed.error().find(why), std::string::npos) << parsed.error();
  }
}

TEST(Quorum, ReplicasAddThemselvesAndTheLastOneEndsIt) {
  auto server = testing::FakeKeeperServer::create();
  auto keeper = server->connect();
  TablePaths r1{"/t", 1, "r1"};
  ASSERT_TRUE(createTableIfNotExists(*keeper, r1, "m"));
  ASSERT_TRUE(createAncestorsAndSelf(*keeper, r1.quorumParallel()));
  ASSERT_TRUE(keeper->create(r1.quorumParallel("all_1_1_0"),
                             QuorumEntry{"all_1_1_0", 3, {"r1"}}.format(),
                             CreateMode::kPersistent));
  TablePaths r2 = r1, r3 = r1;
  r2.replica = "r2";
  r3.replica = "r3";
  const auto soon = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  auto waiting = waitForQuorum(*keeper, r1, "all_1_1_0", soon);
  ASSERT_TRUE(waiting);
  EXPECT_FALSE(*waiting);  // times out: only r1 has it

  ASSERT_TRUE(addToQuorum(*keeper, r2, "all_1_1_0"));
  ASSERT_TRUE(addToQuorum(*keeper, r2, "all_1_1_0"));  // counted once
  auto node = keeper->get(r1.quorumParallel("all_1_1_0"));
  ASSERT_TRUE(node);
  EXPECT_EQ(QuorumEntry::parse(node->data)->replicas, (std::vector<std::string>{"r1", "r2"}));
  ASSERT_TRUE(addToQuorum(*keeper, r3, "all_1_1_0"));
  EXPECT_FALSE(*keeper->exists(r1.quorumParallel("all_1_1_0")));
  auto reached = waitForQuorum(*keeper, r1, "all_1_1_0", std::chrono::steady_clock::now());
  ASSERT_TRUE(reached);
  EXPECT_TRUE(*reached);
  // A part without a quorum: nothing to do.
  EXPECT_TRUE(addToQuorum(*keeper, r2, "all_2_2_0"));
}

TEST(Quorum, ActiveReplicasAreThoseWithASession) {
  auto server = testing::FakeKeeperServer::create();
  auto keeper = server->connect();
  TablePaths r1{"/t", 1, "r1"}, r2{"/t", 1, "r2"};
  ASSERT_TRUE(createTableIfNotExists(*keeper, r1, "m"));
  ASSERT_TRUE(createReplicaIfNotExists(*keeper, r1));
  ASSERT_TRUE(createReplicaIfNotExists(*keeper, r2));
  ASSERT_TRUE(activateReplica(*keeper, r1, "host: a\n"));
  EXPECT_EQ(countReplicas(*keeper, r1)->active(), 1u);
  auto other = server->connect();
  ASSERT_TRUE(activateReplica(*other, r2, "host: b\n"));
  EXPECT_EQ(countReplicas(*keeper, r1)->active(), 2u);
  other.reset();
  EXPECT_EQ(countReplicas(*keeper, r1)->active(), 1u);
  EXPECT_EQ(countReplicas(*keeper, r1)->total, 2u);
}

TEST(Quorum, AutoIsAMajorityOfTheRegisteredReplicas) {
  EXPECT_EQ(majorityQuorum(1), 1u);
  EXPECT_EQ(majorityQuorum(2), 2u);
  EXPECT_EQ(majorityQuorum(3), 2u);
  EXPECT_EQ(majorityQuorum(4), 3u);
  EXPECT_EQ(majorityQuorum(5), 3u);
}

}  // namespace
}  // namespace rtable::core
