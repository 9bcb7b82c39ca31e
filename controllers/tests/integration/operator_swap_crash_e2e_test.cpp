// Crash safety of the table swap (issue 20) on the stack of operator_stack.h: the rtable-operator
// process killed by SIGKILL right after it recorded each step of a swap in ZooKeeper, and a fresh
// process finishing the swap, while writers retry every failed block with its dedup token.
//
// One stack, successive manual swaps 1 -> 2 -> ... -> 8, each with the operator killed at another
// step (open, pause, drain, attach, verify, switch, cleanup), then one swap killed at pause and,
// once asked to abort, killed again right after it recorded abort. The kill is the operator's own
// fail point (RTABLE_OPERATOR_FAILPOINT=swap-after-step:<step>,
// controllers/tools/operator_main.cpp): deterministic where a poll-and-kill from outside would miss
// the fast steps. At each kill the plan in ZooKeeper must still show that step (nothing moved it
// on) with both generations' trees there and `active` where that step leaves it; each swap must end
// Succeeded (the abort: Aborted) in the generation expected, and in the end every replica holds
// exactly the acknowledged rows, each once: no block lost, none inserted or attached twice.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "operator_stack.h"
#include "rtable/replication_core/table_swap.h"

namespace rtable::controllers {
namespace {

using namespace testing;  // the stack's names: kNs, eventually, ...
using core::SwapStep;

// A killed operator's Lease lapses in 3 s (default 15 s), so its successor takes over quickly.
const std::vector<std::string> kQuickLease = {"--leader-election-lease-duration=3s",
                                              "--leader-election-renew-deadline=2s",
                                              "--leader-election-retry-period=500ms"};

class SwapCrashEndToEnd : public OperatorStack {
 protected:
  std::optional<core::SwapPlan> plan() {
    auto node = tableKeeper().get(core::swapPath(root()));
    if (!node) return std::nullopt;
    auto parsed = core::SwapPlan::parse(node->data);
    return parsed ? std::optional(*parsed) : std::nullopt;
  }
  std::string planText() {
    auto node = tableKeeper().get(core::swapPath(root()));
    return node ? node->data : node.error().toString();
  }
  std::string active() {
    auto node = tableKeeper().get(root() + "/active");
    return node ? node->data : node.error().toString();
  }
  std::string generationPath(int64_t generation) const {
    return fmt::format("{}/{}", root(), generation);
  }
  void annotate(const std::string& annotation, const std::string& value) {
    {
      auto done = plane_->kubectlOk({"annotate", "--overwrite", "replicatedtable/events", "-n", kNs,
                                     annotation + "=" + value});
      ASSERT_TRUE(done) << done.error();
    }
  }
  void restartOperator(const std::vector<std::string>& env = {}) {
    if (operator_) operator_->stop();
    startOperator(env, kQuickLease);
  }

  // Restarts the operator with its fail point at `step`, calls `trigger`, and waits until the
  // operator killed itself. Then, the operator being dead, the plan still shows `step` of the swap
  // from -> to, both generations' trees exist (nothing deleted) and `active` is `to` only from
  // switch on.
  void killOperatorAt(SwapStep step, int64_t from, const std::function<void()>& trigger) {
    const std::string name(core::swapStepName(step));
    restartOperator({"RTABLE_OPERATOR_FAILPOINT=swap-after-step:" + name});
    trigger();
    ASSERT_TRUE(eventually([&] { return !operator_->running(); }, 180s))
        << "the operator did not die at " << name << "; plan: " << planText() << "; table "
        << tableState();
    const std::optional<int> status = operator_->waitStatus();
    ASSERT_TRUE(status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
        << "the operator ended otherwise: wait status " << status.value_or(-1) << ", see "
        << operatorLog();
    const auto recorded = plan();
    ASSERT_TRUE(recorded) << planText();
    EXPECT_EQ(recorded->step, step) << planText();
    EXPECT_EQ(recorded->from, from);
    EXPECT_EQ(recorded->to, from + 1);
    const bool switched = step == SwapStep::kSwitch || step == SwapStep::kCleanup;
    EXPECT_EQ(active(), std::to_string(switched ? from + 1 : from));
    EXPECT_TRUE(zkExists(generationPath(from))) << "generation " << from << " deleted at " << name;
    EXPECT_TRUE(zkExists(generationPath(from + 1)))
        << "generation " << from + 1 << " deleted at " << name;
  }

  // A fresh operator (no fail point) ends the swap from -> to with `result`.
  void expectSwapEnds(int64_t from, const std::string& result) {
    restartOperator();
    const int64_t serving = result == "Succeeded" ? from + 1 : from;
    ASSERT_TRUE(eventually(
        [&] {
          const json s = status();
          return s.value(json::json_pointer("/recovery/result"), "") == result &&
                 s.value(json::json_pointer("/recovery/toGeneration"), 0) == from + 1 &&
                 s.value("activeGeneration", 0) == serving;
        },
        180s))
        << "plan: " << planText() << "; table " << tableState();
    EXPECT_FALSE(zkExists(core::swapPath(root()))) << planText();
    EXPECT_EQ(active(), std::to_string(serving));
    // The generation given up is gone; the one serving is there.
    EXPECT_FALSE(zkExists(generationPath(result == "Succeeded" ? from : from + 1)));
    EXPECT_TRUE(zkExists(generationPath(serving)));
  }

  // Inserts go on after a swap.
  void expectInsertsGoOn() {
    const std::size_t before = writers_->acknowledgedBlocks();
    ASSERT_TRUE(eventually([&] { return writers_->acknowledgedBlocks() >= before + 5; }, 60s))
        << ::testing::PrintToString(writers_->errorCodes());
  }
};

TEST_F(SwapCrashEndToEnd, TheOperatorKilledAtEveryStepOfASwapResumesItWithoutLosingAnInsert) {
  applyTable();
  if (HasFatalFailure()) return;
  // About 12 blocks a second: eight swaps each attach and verify every part of the table so far.
  startWriters(300ms);
  ASSERT_TRUE(eventually([&] { return writers_->acknowledgedBlocks() >= 20; }, 60s))
      << "inserts do not succeed: " << ::testing::PrintToString(writers_->errorCodes());

  int64_t generation = 1;
  for (SwapStep step : {SwapStep::kOpen, SwapStep::kPause, SwapStep::kDrain, SwapStep::kAttach,
                        SwapStep::kVerify, SwapStep::kSwitch, SwapStep::kCleanup}) {
    SCOPED_TRACE(fmt::format("killed at {}, swap {} -> {}", core::swapStepName(step), generation,
                             generation + 1));
    const auto began = std::chrono::steady_clock::now();
    killOperatorAt(step, generation,
                   [&] { annotate("rtable.io/swap", fmt::format("to-{}", generation + 1)); });
    if (HasFatalFailure()) return;
    expectSwapEnds(generation, "Succeeded");
    if (HasFatalFailure()) return;
    ++generation;
    std::printf("killed at %s: swap to generation %lld done in %.1f s\n",
                std::string(core::swapStepName(step)).c_str(), static_cast<long long>(generation),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
    expectInsertsGoOn();
    if (HasFatalFailure()) return;
  }

  // Killed at pause, asked to abort, killed again right after recording abort: the table stays
  // on its generation, and the one given up goes.
  const auto began = std::chrono::steady_clock::now();
  killOperatorAt(SwapStep::kPause, generation, [&] { annotate("rtable.io/swap", "aborted-one"); });
  if (HasFatalFailure()) return;
  killOperatorAt(SwapStep::kAbort, generation,
                 [&] { annotate("rtable.io/swap-abort", "aborted-one"); });
  if (HasFatalFailure()) return;
  expectSwapEnds(generation, "Aborted");
  if (HasFatalFailure()) return;
  std::printf("killed at pause and abort: swap aborted in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  expectInsertsGoOn();
  if (HasFatalFailure()) return;

  ASSERT_TRUE(writers_->stop()) << "a block was never acknowledged";
  std::printf("%zu rows in %zu blocks acknowledged, %zu retries; errors met: %s\n",
              writers_->acknowledged().size(), writers_->acknowledgedBlocks(), writers_->retries(),
              ::testing::PrintToString(writers_->errorCodes()).c_str());
  expectReplicasHoldExactly(writers_->acknowledged(), generation);
  EXPECT_EQ(generation, 8);
  EXPECT_EQ(active(), std::to_string(generation));
  for (int64_t old = 1; old < generation; ++old) EXPECT_FALSE(zkExists(generationPath(old)));
  EXPECT_FALSE(zkExists(generationPath(generation + 1)));
  EXPECT_FALSE(zkExists(core::swapPath(root()))) << "a swap started again: " << planText();
}

}  // namespace
}  // namespace rtable::controllers
