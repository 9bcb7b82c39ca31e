// The operator's view of the ZooKeeper counters that can stop a table (DESIGN.md 2.5, issue 20),
// and its decision to swap the table to a new generation.
//
// Three kinds of int32 sequential counter stop a table, or a replica of it, at 2^31 - 1:
//   log                          every insert and merge of the table (log/log-N)
//   block_numbers/<partition>    every insert into that partition (the block number locks)
//   queue/<replica>              every entry that replica pulls from the log
// All three live in the generation's tree, so a swap gives each a fresh start.
//
// judgeHeadroom() decides from the readings and the table's HeadroomPolicy; CounterGrowth samples
// each counter over time for the projected exhaustion. Pure functions and plain data, apart from
// CounterGrowth, which is thread-safe (a mutex: reconciles of different tables run at once).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/sequential_counter.h"
#include "rtable/replication_core/table_paths.h"

namespace rtable::controllers {

struct WatchedCounter {
  std::string name;  // "log", "block_numbers/202612", "queue/events-1"
  core::SequentialCounter counter;
};

// Reads the log's counter, each partition's under block_numbers/ and each replica's queue/: one
// Stat each (two at the limit) and two listings. A partition or replica removed while it reads is
// left out.
core::KeeperResult<std::vector<WatchedCounter>> readWatchedCounters(core::Keeper& keeper,
                                                                    const core::TablePaths& paths);

// One counter's headroom as the decision sees it.
struct CounterHeadroom {
  std::string name;
  int64_t creates_left = 0;
  double ratio = 1.0;  // creates_left / 2^31
  bool exhausted = false;
  // At its sampled growth rate (CounterGrowth); unset: not growing, or not sampled long enough.
  std::optional<double> exhaustion_seconds;
};

// What the decision takes of a counter read by readWatchedCounters. A counter that reached the last
// name (2147483647) is exhausted, with no creates left, whether or not <prefix>2147483647 exists:
// ZooKeeper never moves it on (the increment past it is dropped), so that one name is all it has,
// and the log cleaner's delete of log-2147483647 gives it back for a single create at most. The
// name's absence must not turn a stuck table into one merely BelowThreshold.
CounterHeadroom counterHeadroom(const WatchedCounter& watched);

enum class HeadroomReason {
  kAboveThreshold,  // nothing to do
  kExhausted,       // a counter reached its last name (counterHeadroom): swap at once
  kBelowThreshold,  // a counter's ratio is under thresholdPercent
  kExhaustionSoon,  // a counter runs out within exhaustionDays at its growth rate
};

struct HeadroomVerdict {
  bool low = false;  // a swap is due (when autoRecover is on)
  HeadroomReason reason = HeadroomReason::kAboveThreshold;
  // The counter the verdict is about: the one that triggered it, or else the one with the least
  // headroom.
  CounterHeadroom counter;
  // The soonest any counter runs out (unset: none grows, or none sampled long enough).
  std::optional<double> exhaustion_seconds;
  std::string message;  // for the HeadroomLow condition and the SwapStarted Event
};

// "AboveThreshold", "Exhausted", "BelowThreshold", "ExhaustionSoon": the condition's reason.
std::string_view headroomReasonName(HeadroomReason reason);

// `counters` non-empty (the log is always among them). Exhausted beats BelowThreshold beats
// ExhaustionSoon; within one reason the counter with the least headroom (or the soonest) is named.
HeadroomVerdict judgeHeadroom(const std::vector<CounterHeadroom>& counters,
                              const HeadroomPolicy& policy);

// Growth rate of each counter, sampled at every reconcile: the rate over the last `window`,
// trusted once the samples span `min_span` (a rate from a few seconds would turn any burst into an
// emergency). In memory: an operator that restarts samples again from its first reconcile.
class CounterGrowth {
 public:
  CounterGrowth(std::chrono::seconds window, std::chrono::seconds min_span);

  // Records `counter` of `key` (table, generation and counter name) at `now`; the projected seconds
  // to exhaustion of `creates_left`, when known.
  std::optional<double> observe(const std::string& key, int64_t counter, int64_t creates_left,
                                std::chrono::system_clock::time_point now);
  // Drops every key that starts with `prefix` (a deleted table, a generation swapped away).
  void forget(const std::string& prefix);

 private:
  struct Samples {
    metrics::CounterRateEstimator estimator;
    double first_seconds = 0;
  };
  const std::chrono::seconds window_;
  const std::chrono::seconds min_span_;
  std::mutex mu_;
  std::map<std::string, Samples> samples_;
};

}  // namespace rtable::controllers
