// The table swap with real parts (issue 20): three rtable-core processes on a real ZooKeeper 3.8,
// the table's log counter raised to the int32 limit with ZooKeeper's own snapshot classes, two
// writers that retry every insert with its insert_deduplication_token, and SwapDriver (what the
// operator runs) moving the table to generation 2. A stuck table recovers by itself: inserts
// answer 503 LOG_COUNTER_EXHAUSTED, then TABLE_SWAP_IN_PROGRESS, then succeed in generation 2;
// every acknowledged row is on every replica exactly once.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "replication_cluster.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/table_swap.h"
#include "rtable/replication_core/testing/local_replica.h"

namespace rtable::core {
namespace {

using common::testing::waitFor;
using nlohmann::json;
using testing::LocalReplica;

class TableSwapProcesses : public ReplicationCluster {
 protected:
  // Inserts row `id` with token t<id> on the replicas in turn until one acknowledges it; the
  // error codes met on the way go to `codes_`.
  void insertRetrying(uint64_t id, const std::atomic<bool>& stop) {
    std::vector<LocalReplica*> all;
    for (auto& [name, replica] : replicas_) all.push_back(replica.get());
    for (std::size_t attempt = 0; !stop || attempt < 400; ++attempt) {
      LocalReplica& target = *all[(id + attempt) % all.size()];
      auto response = target.post(
          fmt::format("/insert?format=JSONEachRow&insert_deduplication_token=t{}", id), row(id));
      if (response && response->status == 200) {
        std::lock_guard lock(mu_);
        acknowledged_.insert(id);
        return;
      }
      if (response) {
        auto body = json::parse(response->body, nullptr, false);
        std::lock_guard lock(mu_);
        if (!body.is_discarded()) codes_.insert(body.value("error", ""));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (stop && attempt >= 400) break;
    }
  }

  std::multiset<uint64_t> idsOn(LocalReplica& replica) {
    std::multiset<uint64_t> ids;
    auto selected = replica.get("/select?format=TSV");
    EXPECT_TRUE(selected && selected->status == 200);
    if (!selected || selected->status != 200) return ids;
    for (std::size_t start = 0; start < selected->body.size();) {
      const std::size_t end = selected->body.find('\n', start);
      ids.insert(
          std::stoull(selected->body.substr(start, selected->body.find('\t', start) - start)));
      start = end == std::string::npos ? selected->body.size() : end + 1;
    }
    return ids;
  }

  std::mutex mu_;
  std::set<uint64_t> acknowledged_;  // guarded by mu_
  std::set<std::string> codes_;      // guarded by mu_
};

TEST_F(TableSwapProcesses, AStuckTableMovesToTheNextGenerationAndTakesInsertsAgain) {
  for (const char* name : {"r1", "r2", "r3"}) addReplica(name);
  const std::string root = "/rtable/tables/" + table_;
  for (uint64_t id = 0; id < 30; ++id) {
    insert(*replicas_.begin()->second, row(id));
    acknowledged_.insert(id);
  }
  expectConverged();

  // Three creates left in generation 1's log: the writers use them up, and it is stuck.
  ASSERT_TRUE(zookeeper().setSequentialCounter(root + "/1/log", 2147483645));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> next_id{1000};
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&] {
      while (!stop) insertRetrying(next_id++, stop);
    });
  }
  ASSERT_TRUE(waitFor(
      [&] {
        std::lock_guard lock(mu_);
        return codes_.contains("LOG_COUNTER_EXHAUSTED");
      },
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
  const std::size_t before = [&] {
    std::lock_guard lock(mu_);
    return acknowledged_.size();
  }();
  EXPECT_TRUE(waitFor(
      [&] {
        std::lock_guard lock(mu_);
        return acknowledged_.size() >= before + 20;
      },
      std::chrono::seconds(60)));
  stop = true;
  for (auto& writer : writers) writer.join();
  {
    std::lock_guard lock(mu_);
    EXPECT_TRUE(codes_.contains("TABLE_SWAP_IN_PROGRESS") || codes_.contains("UNAVAILABLE"))
        << "no insert met the pause";
  }
  const ReplicaContents common = expectConverged();
  const std::multiset<uint64_t> expected(acknowledged_.begin(), acknowledged_.end());
  for (auto& [name, replica] : replicas_) {
    auto state = replica->get("/replica");
    ASSERT_TRUE(state && state->status == 200);
    EXPECT_EQ(json::parse(state->body)["generation"], 2) << name;
    EXPECT_EQ(idsOn(*replica), expected) << name;
  }
  EXPECT_EQ(common.rows, expected.size());
  auto old_tree = (*keeper)->exists(root + "/1");
  ASSERT_TRUE(old_tree);
  EXPECT_FALSE(*old_tree);
}

// kill -9 of a replica while inserts are paused, and of the attacher in the middle of the attach:
// each comes back (its swap state read from ZooKeeper), the swap ends on generation 2, and every
// acknowledged row is on every replica exactly once (a part attached twice would show twice).
TEST_F(TableSwapProcesses, AReplicaKilledDuringThePauseOrTheAttachRejoinsAndTheSwapEnds) {
  for (const char* name : {"r1", "r2", "r3"}) addReplica(name);
  const std::string root = "/rtable/tables/" + table_;
  // Rows in several months: parts in several partitions, so the attach takes several entries.
  for (uint64_t id = 0; id < 40; ++id) {
    insert(*replicas_.begin()->second, row(id));
    acknowledged_.insert(id);
  }
  expectConverged();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> next_id{1000};
  std::thread writer([&] {
    while (!stop) insertRetrying(next_id++, stop);
  });

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

  const std::size_t before = [&] {
    std::lock_guard lock(mu_);
    return acknowledged_.size();
  }();
  EXPECT_TRUE(waitFor(
      [&] {
        std::lock_guard lock(mu_);
        return acknowledged_.size() >= before + 10;
      },
      std::chrono::seconds(60)))
      << "no insert succeeded after the swap";
  stop = true;
  writer.join();
  expectConverged();
  const std::multiset<uint64_t> expected(acknowledged_.begin(), acknowledged_.end());
  for (auto& [name, replica] : replicas_) {
    auto state = replica->get("/replica");
    ASSERT_TRUE(state && state->status == 200);
    EXPECT_EQ(json::parse(state->body)["generation"], 2) << name;
    EXPECT_EQ(idsOn(*replica), expected) << name;
  }
}

}  // namespace
}  // namespace rtable::core
