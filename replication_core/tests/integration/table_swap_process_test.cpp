// The table swap with real parts (issue 20): three rtable-core processes on a real ZooKeeper 3.8,
// the table's log counter raised to the int32 limit with ZooKeeper's own snapshot classes, two
// writers that retry every insert with its insert_deduplication_token, and SwapDriver (what the
// operator runs) moving the table to generation 2. A stuck table recovers by itself: inserts
// answer 503 LOG_COUNTER_EXHAUSTED, then TABLE_SWAP_IN_PROGRESS, then succeed in generation 2;
// every acknowledged row is on every replica exactly once.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "replication_cluster.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/table_swap.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/retrying_writers.h"

namespace rtable::core {
namespace {

using common::testing::waitFor;
using nlohmann::json;
using testing::firstColumnIds;
using testing::LocalReplica;
using testing::ReplicaEndpoint;
using testing::RetryingWriters;
using testing::RetryingWritersOptions;

class TableSwapProcesses : public ReplicationCluster {
 protected:
  // Two writers of single rows that retry each with its token on the replicas in turn.
  std::unique_ptr<RetryingWriters> startWriters() {
    RetryingWritersOptions options;
    for (auto& [name, replica] : replicas_) {
      options.replicas.push_back(ReplicaEndpoint{"127.0.0.1", replica->httpPort()});
    }
    options.row = row;
    options.first_id = 1000;
    options.block_sizes = {1};
    options.writers = 2;
    options.retry_pause = std::chrono::milliseconds(20);
    auto writers = std::make_unique<RetryingWriters>(options);
    writers->start();
    return writers;
  }

  std::multiset<uint64_t> idsOn(LocalReplica& replica) {
    auto selected = replica.get("/select?format=TSV");
    EXPECT_TRUE(selected && selected->status == 200);
    if (!selected || selected->status != 200) return {};
    return firstColumnIds(selected->body);
  }

  // Three replicas r1..r3 holding rows 0..rows-1 (ids below the writers' first_id); those ids.
  std::set<uint64_t> startWithRows(uint64_t rows) {
    for (const char* name : {"r1", "r2", "r3"}) addReplica(name);
    std::set<uint64_t> acknowledged;
    for (uint64_t id = 0; id < rows; ++id) {
      insert(*replicas_.begin()->second, row(id));
      acknowledged.insert(id);
    }
    expectConverged();
    return acknowledged;
  }

  // After the swap: inserts are acknowledged again, then every replica serves generation 2 and
  // holds every acknowledged row (`acknowledged` and the writers') exactly once. The converged
  // contents.
  ReplicaContents expectGeneration2WithEveryRowOnce(RetryingWriters& writers,
                                                    std::set<uint64_t> acknowledged,
                                                    std::size_t inserts_after) {
    const std::size_t before = writers.acknowledgedBlocks();
    EXPECT_TRUE(waitFor([&] { return writers.acknowledgedBlocks() >= before + inserts_after; },
                        std::chrono::seconds(60)))
        << "no insert succeeded after the swap";
    EXPECT_TRUE(writers.stop()) << "an insert was never acknowledged";
    for (uint64_t id : writers.acknowledged()) acknowledged.insert(id);
    const ReplicaContents common = expectConverged();
    const std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
    for (auto& [name, replica] : replicas_) {
      auto state = replica->get("/replica");
      EXPECT_TRUE(state && state->status == 200) << name;
      if (!state || state->status != 200) continue;
      EXPECT_EQ(json::parse(state->body)["generation"], 2) << name;
      EXPECT_EQ(idsOn(*replica), expected) << name;
    }
    EXPECT_EQ(common.rows, expected.size());
    return common;
  }
};

TEST_F(TableSwapProcesses, AStuckTableMovesToTheNextGenerationAndTakesInsertsAgain) {
  const std::set<uint64_t> acknowledged = startWithRows(30);
  const std::string root = "/rtable/tables/" + table_;

  // Three creates left in generation 1's log: the writers use them up, and it is stuck.
  ASSERT_TRUE(zookeeper().setSequentialCounter(root + "/1/log", 2147483645));
  auto writers = startWriters();
  ASSERT_TRUE(waitFor([&] { return writers->errorCodes().contains("LOG_COUNTER_EXHAUSTED"); },
                      std::chrono::seconds(60)))
      << "the log never ran out";

  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper) << keeper.error().toString();
  SwapDriver driver(**keeper, root);
  auto plan = driver.begin();
  ASSERT_TRUE(plan) << plan.error().toString();
  const auto started = std::chrono::steady_clock::now();
  SwapProgress progress;
  const bool ended = waitFor(
      [&] {
        auto advanced = driver.advance();
        if (!advanced) return false;  // ZooKeeper busy: look again
        progress = *advanced;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return progress.ended;
      },
      std::chrono::seconds(120));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_TRUE(ended) << "the swap stopped at "
                     << (progress.plan ? swapStepName(progress.plan->step) : "?") << ": "
                     << progress.waiting_for;
  EXPECT_FALSE(progress.aborted);
  std::printf("table swap of a stuck table with 3 replicas: %.2f s\n", took);

  // Inserts succeed again, in generation 2.
  expectGeneration2WithEveryRowOnce(*writers, acknowledged, 20);
  const std::set<std::string> codes = writers->errorCodes();
  EXPECT_TRUE(codes.contains("TABLE_SWAP_IN_PROGRESS") || codes.contains("UNAVAILABLE"))
      << "no insert met the pause";
  auto old_tree = (*keeper)->exists(root + "/1");
  ASSERT_TRUE(old_tree);
  EXPECT_FALSE(*old_tree);
}

// kill -9 of a replica while inserts are paused, and of the attacher in the middle of the attach:
// each comes back (its swap state read from ZooKeeper), the swap ends on generation 2, and every
// acknowledged row is on every replica exactly once (a part attached twice would show twice).
TEST_F(TableSwapProcesses, AReplicaKilledDuringThePauseOrTheAttachRejoinsAndTheSwapEnds) {
  // Rows in several months: parts in several partitions, so the attach takes several entries.
  // (A relaunched replica has new ports: the writers' requests to its old one fail and go on to
  // the next replica.)
  const std::set<uint64_t> acknowledged = startWithRows(40);
  const std::string root = "/rtable/tables/" + table_;
  auto writers = startWriters();

  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper) << keeper.error().toString();
  SwapDriver driver(**keeper, root);
  ASSERT_TRUE(driver.begin());
  std::set<std::string> killed;   // "<step>: <replica>"
  std::vector<std::string> said;  // what the steps waited for, in order
  SwapProgress progress;
  const bool ended = waitFor(
      [&] {
        auto advanced = driver.advance();
        if (!advanced) return false;  // ZooKeeper busy: look again
        progress = *advanced;
        if (!progress.waiting_for.empty() &&
            (said.empty() || said.back() != progress.waiting_for)) {
          said.push_back(progress.waiting_for);
        }
        if (progress.plan) {
          const SwapStep step = progress.plan->step;
          std::string victim;
          if (step == SwapStep::kPause) victim = "r3";
          if (step == SwapStep::kAttach) victim = progress.plan->attacher;
          const std::string key = fmt::format("{}: {}", swapStepName(step), victim);
          if (!victim.empty() && !killed.contains(key)) {
            killed.insert(key);
            LocalReplica& replica = *replicas_.at(victim);
            replica.kill9();
            auto launched = replica.launch();
            EXPECT_TRUE(launched) << victim << ": " << launched.error();
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return progress.ended;
      },
      std::chrono::seconds(180));
  ASSERT_TRUE(ended) << "the swap stopped at "
                     << (progress.plan ? swapStepName(progress.plan->step) : "?") << ": "
                     << progress.waiting_for;
  EXPECT_FALSE(progress.aborted) << fmt::format("{}", fmt::join(said, "\n"));
  EXPECT_EQ(killed.size(), 2u) << fmt::format("{}", fmt::join(killed, ", "));

  expectGeneration2WithEveryRowOnce(*writers, acknowledged, 10);
}

}  // namespace
}  // namespace rtable::core
