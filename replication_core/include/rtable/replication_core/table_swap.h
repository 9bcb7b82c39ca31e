// The table swap's shared state in ZooKeeper (DESIGN.md 2.6): the plan the driver (the operator)
// writes, and each replica's acknowledgement of each step.
//
//   <root>/swap                       the plan (SwapPlan text); exists only while a swap runs
//   <root>/swap/<step>-<replica>      a replica's acknowledgement of a step: "ok" or "error: ..."
//
// Steps, in order (each idempotent; a replica that restarts mid-swap catches up to the current
// one before it serves anything):
//   open     every replica opens generation `to` beside `from` (same schema, fresh counters)
//   pause    every replica refuses inserts into `from` (503, Retry-After) once those in flight
//            are done, and `from` assigns no more merges
//   drain    every replica has executed every entry of `from`'s log: all hold the same parts
//   attach   the `attacher` attaches its parts of `from` into `to` (hard links, `attach` log
//            entries) and copies `from`'s dedup window into `to`
//   verify   every replica has executed `to`'s log, and its parts of `to` have the checksums and
//            rows of its parts of `from`
//   switch   the driver has set <root>/active to `to`; replicas serve `to` and take inserts again
//   cleanup  replicas close `from` and remove its files; the driver then removes its subtree
//   abort    (before switch only) replicas take inserts into `from` again and drop `to`
#pragma once

#include <cstdint>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/replication_core/keeper.h"

namespace rtable::core {

enum class SwapStep { kOpen, kPause, kDrain, kAttach, kVerify, kSwitch, kCleanup, kAbort };

std::string_view swapStepName(SwapStep step);
std::optional<SwapStep> parseSwapStep(std::string_view name);

struct SwapPlan {
  int64_t from = 0;
  int64_t to = 0;
  SwapStep step = SwapStep::kOpen;
  std::string attacher;  // the replica that attaches (set from the attach step on)
  // When the driver began the swap, asked the replicas to pause inserts, and switched `active`
  // (ms since the epoch, the driver's clock; 0: not yet). In the plan, so that a driver that
  // restarts still reports the swap's duration and write pause.
  int64_t started_ms = 0;
  int64_t paused_ms = 0;
  int64_t switched_ms = 0;
  // What began the swap, as status.recovery.trigger says it ("headroom", "manual: <value>"). In
  // the plan, so that a driver that dies before it records the swap anywhere else (the operator's
  // status) still knows which manual request the swap answers, and does not start it twice.
  std::string trigger = {};

  // "from: 1\nto: 2\nstep: open\nattacher: r1\nstarted_ms: ...\npaused_ms: ...\nswitched_ms: ...\n
  // trigger: ...\n" (the three times and the trigger are optional in parse(), for plans an earlier
  // version wrote).
  std::string format() const;
  // Refuses a missing or unknown field, to <= from, an unknown step; the error names the line.
  static std::expected<SwapPlan, std::string> parse(std::string_view text);
  friend bool operator==(const SwapPlan&, const SwapPlan&) = default;
};

// <root>/backup: the uid of the cluster backup that copies the table now (backup_operation.h). A
// swap does not begin while it exists, and a backup does not begin while <root>/swap exists.
inline std::string backupLockPath(const std::string& table_root) {
  return table_root + "/backup";
}
inline std::string swapPath(const std::string& table_root) {
  return table_root + "/swap";
}
inline std::string swapAckPath(const std::string& table_root, SwapStep step,
                               const std::string& replica) {
  return swapPath(table_root) + "/" + std::string(swapStepName(step)) + "-" + replica;
}

// Where a swap stands after SwapDriver::advance.
struct SwapProgress {
  std::optional<SwapPlan> plan;  // the step running now; none once the swap ended
  bool ended = false;            // switched and cleaned up, or aborted and cleaned up
  bool aborted = false;
  // The plan of the swap that ended in this call (its last step), for its figures.
  std::optional<SwapPlan> ended_plan;
  // Why the step cannot move on yet ("replica r2 has not acknowledged drain (not live)"), or
  // the error a replica acknowledged with. Empty when it just moved.
  std::string waiting_for;
  std::vector<std::string> acknowledgements;  // "<replica>: <text>" of the step's acks
};

// The swap's steps driven from outside the replicas (the operator), over ZooKeeper only. Every
// call is idempotent and reads its state from ZooKeeper, so a driver that crashes and starts
// again resumes where the plan stands.
class SwapDriver {
 public:
  // `now_ms`: the wall clock the plan's times are taken from (ms since the epoch); default: the
  // system clock. `recorded`, when set, is called right after each write of the plan succeeded
  // (begin's create, every step after it) with what was written: the operator's crash tests kill
  // the process there.
  SwapDriver(Keeper& keeper, std::string table_root, std::function<int64_t()> now_ms = {},
             std::function<void(const SwapPlan&)> recorded = {});

  // Starts moving the active generation g to g+1 (g+1's tree created with g's metadata), unless
  // a swap runs already: then that one's plan. `trigger` goes into a new plan.
  KeeperResult<SwapPlan> begin(std::string trigger = {});
  // Moves the running swap one step on when every replica it needs has acknowledged the current
  // one; a replica's error at verify aborts it (nothing switched, generation g serves on).
  KeeperResult<SwapProgress> advance();
  // Aborts the running swap if it has not switched yet (false: too late, or none runs).
  KeeperResult<bool> abort();

 private:
  KeeperStatus setStep(SwapPlan plan, int32_t version);

  Keeper& keeper_;
  const std::string root_;
  std::function<int64_t()> now_ms_;
  std::function<void(const SwapPlan&)> recorded_;
};

}  // namespace rtable::core
