// The table-level figures the operator decides on, as Prometheus metrics (issue 20; the replicas
// export their own view of the log counter as rtable_log_counter_*):
//
//   rtable_table_generation{namespace,table}                            the active generation
//   rtable_table_counter_headroom_ratio{namespace,table,generation,counter}   per watched counter
//   rtable_table_counter_exhaustion_seconds{...same}   at its sampled growth rate (+Inf: unknown)
//   rtable_table_swap_running{namespace,table}                          1 while a swap runs
//   rtable_table_swap_started_timestamp_seconds{namespace,table}        when the running one began
//   rtable_table_swaps_total{namespace,table,result}                    Succeeded | Aborted
//   rtable_table_swap_duration_seconds{namespace,table}                 histogram, begin to end
//   rtable_table_swap_write_pause_seconds{namespace,table}              histogram, inserts refused
//
// The two histograms (23 series each table) appear with a table's first swap: most tables never
// swap, and at a thousand tables they would be most of /metrics and of its render time.
// A table's series go when it is deleted (forget), and a counter's when it is no longer watched (a
// partition dropped, a generation swapped away). Thread-safe: reconciles of different tables run
// at once.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rtable/controllers/table_headroom.h"

namespace rtable::controllers {

class TableMetrics {
 public:
  explicit TableMetrics(prometheus::Registry& registry);

  // The table's active generation and its watched counters now; series of counters not among
  // `counters` are removed.
  void setCounters(const std::string& ns, const std::string& table, int64_t generation,
                   const std::vector<CounterHeadroom>& counters);
  // A swap running since `started_seconds` (seconds since the epoch), or none.
  void setSwapRunning(const std::string& ns, const std::string& table,
                      std::optional<double> started_seconds);
  // A swap ended: `result` "Succeeded" or "Aborted"; its figures when known.
  void swapEnded(const std::string& ns, const std::string& table, const std::string& result,
                 std::optional<double> duration_seconds, std::optional<double> write_pause_seconds);
  // The table is gone: every series of it.
  void forget(const std::string& ns, const std::string& table);

 private:
  struct Table {
    prometheus::Gauge* generation = nullptr;
    prometheus::Gauge* running = nullptr;
    prometheus::Gauge* started = nullptr;
    prometheus::Histogram* duration = nullptr;
    prometheus::Histogram* write_pause = nullptr;
    std::map<std::string, prometheus::Counter*> swaps;  // by result
    // By "<generation>/<counter>": headroom ratio, exhaustion seconds.
    std::map<std::string, std::pair<prometheus::Gauge*, prometheus::Gauge*>> counters;
  };
  Table& table(const std::string& ns, const std::string& name);

  prometheus::Family<prometheus::Gauge>& generation_;
  prometheus::Family<prometheus::Gauge>& headroom_;
  prometheus::Family<prometheus::Gauge>& exhaustion_;
  prometheus::Family<prometheus::Gauge>& running_;
  prometheus::Family<prometheus::Gauge>& started_;
  prometheus::Family<prometheus::Counter>& swaps_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Histogram>& write_pause_;
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Table> tables_;
};

}  // namespace rtable::controllers
