// The metrics one replica exports on its /metrics port (DESIGN.md 4). Names are in the `rtable_`
// namespace; every series carries the labels table, replica and generation.
//
// Thread safety: prometheus-cpp metrics may be updated from any thread.
// Lifetime: the registry outlives the ReplicaMetrics; destroying one removes every series it added
// (a closed generation stops reporting: its stale headroom would keep the alert firing). At most
// one ReplicaMetrics of the same labels lives in a registry at a time.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace rtable::metrics {

struct ReplicaLabels {
  std::string table;
  std::string replica;
  int64_t generation = 1;
};

class ReplicaMetrics {
 public:
  ReplicaMetrics(prometheus::Registry& registry, const ReplicaLabels& labels);
  ~ReplicaMetrics();
  ReplicaMetrics(const ReplicaMetrics&) = delete;
  ReplicaMetrics& operator=(const ReplicaMetrics&) = delete;

 private:
  // Declared first: the metric members below record their removal here as they are initialized.
  // Keyed by the series, so a series added twice is removed once. Guarded by removals_mu_.
  std::mutex removals_mu_;
  std::map<const void*, std::function<void()>> removals_;

 public:
  // The table's log counter (DESIGN.md 2.5).
  prometheus::Gauge& log_max_index;
  prometheus::Gauge& log_counter;
  prometheus::Gauge& log_counter_headroom_ratio;
  // Projected seconds until the counter reaches 2147483647 at the recent rate; +Inf when idle.
  prometheus::Gauge& log_counter_exhaustion_seconds;

  prometheus::Counter& inserts;
  prometheus::Counter& inserted_rows;
  prometheus::Counter& insert_deduplicated_blocks;
  prometheus::Counter& insert_errors;
  prometheus::Counter& slow_insert_commits;
  // Async inserts (async_insert=1): what waits in the buffer now, how many inserts each flush
  // committed together (one part and one log entry per partition), the time from an insert's
  // arrival to its outcome, and inserts refused because the buffer was full (503).
  prometheus::Gauge& async_insert_buffered_bytes;
  prometheus::Gauge& async_insert_buffered_inserts;
  prometheus::Histogram& async_insert_inserts_per_flush;
  prometheus::Histogram& async_insert_wait_seconds;
  prometheus::Counter& async_insert_rejected;
  // Flushes by reason: size, count, timeout, stale, burst, forced (shutdown, a table swap's
  // pause).
  prometheus::Counter& asyncInsertFlushes(const std::string& reason);
  prometheus::Gauge& parts;
  prometheus::Counter& merges;
  prometheus::Counter& merged_rows;
  prometheus::Counter& broken_parts;  // parts found broken on start and moved to detached/
  prometheus::Gauge& replica_readonly;
  // The part journal (docs/formats.md "Part journal"), as of the last background round: small
  // inserted parts and merge results held in memory until a checkpoint writes them out, the
  // bytes journaled since the last checkpoint that succeeded, and checkpoints that failed. While
  // checkpoints fail, the first two grow.
  prometheus::Gauge& parts_in_memory;
  prometheus::Gauge& parts_in_memory_bytes;
  prometheus::Gauge& part_journal_bytes;
  prometheus::Counter& part_journal_checkpoint_failures;

  // Replication (DESIGN.md 2.4): the queue, and what it did.
  prometheus::Gauge& queue_size;
  prometheus::Gauge& queue_oldest_entry_age_seconds;
  prometheus::Gauge& replica_lost;  // 1 while waiting to clone a healthy replica
  prometheus::Counter& fetches;
  prometheus::Counter& fetched_bytes;
  prometheus::Counter& fetch_errors;  // failed transfers (each source tried counts)
  // Parts of the replaced generation attached into this one by hard link (the table swap).
  prometheus::Counter& attached_parts;
  // Parts no replica has or can make any more, given up (ClickHouse's "lost forever").
  prometheus::Counter& parts_lost_forever;
  prometheus::Histogram& fetch_duration_seconds;
  prometheus::Counter& merged_bytes;
  prometheus::Histogram& merge_duration_seconds;
  // ClickHouse's absolute_delay: seconds since the oldest insert this replica has not fetched yet.
  prometheus::Gauge& absolute_delay_seconds;
  // Queue entries by type (get, merge, drop_range, attach).
  prometheus::Gauge& queueEntries(const std::string& type);
  // Entries passed over by the queue's selection, by reason (covered_by_future_part, ...).
  prometheus::Counter& queuePostponed(const std::string& reason);
  // Entries executing now, by action (fetch, merge, drop_range); and the pools' slots (fetch,
  // merge). A queue whose executing fetches sit at the pool size while its oldest entry ages does
  // not progress (the alert RtableReplicationQueueStuck).
  prometheus::Gauge& queueExecuting(const std::string& action);
  prometheus::Gauge& poolSize(const std::string& pool);

  // Latency of one ZooKeeper request by operation (get, exists, children, create, set, remove,
  // multi; get_many: one pipelined batch of gets).
  prometheus::Histogram& zookeeperRequestDuration(const std::string& operation);
  prometheus::Counter& zookeeperErrors(const std::string& operation, const std::string& code);

 private:
  ReplicaLabels labels_;
  prometheus::Family<prometheus::Histogram>& zookeeper_duration_family_;
  prometheus::Family<prometheus::Counter>& zookeeper_errors_family_;
  prometheus::Family<prometheus::Gauge>& queue_entries_family_;
  prometheus::Family<prometheus::Counter>& queue_postponed_family_;
  prometheus::Family<prometheus::Gauge>& queue_executing_family_;
  prometheus::Family<prometheus::Gauge>& pool_size_family_;
  prometheus::Family<prometheus::Counter>& async_insert_flushes_family_;
};

// Exhaustion projection from counter samples over a sliding window: counter growth per second and
// the seconds left at that rate. Not thread-safe.
class CounterRateEstimator {
 public:
  explicit CounterRateEstimator(double window_seconds = 3600) : window_seconds_(window_seconds) {}
  void addSample(double time_seconds, int64_t counter);
  // Growth per second over the window; 0 with fewer than two samples.
  double ratePerSecond() const;
  // Seconds until `creates_left` is used up at ratePerSecond(); +Inf when the rate is 0.
  double secondsToExhaustion(int64_t creates_left) const;

 private:
  double window_seconds_;
  std::map<double, int64_t> samples_;
};

}  // namespace rtable::metrics
