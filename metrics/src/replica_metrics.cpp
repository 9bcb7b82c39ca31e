#include "rtable/metrics/replica_metrics.h"

#include <limits>
#include <string>
#include <utility>

namespace rtable::metrics {
namespace {

using Removals = std::map<const void*, std::function<void()>>;

prometheus::Labels base(const ReplicaLabels& l) {
  return {{"table", l.table}, {"replica", l.replica}, {"generation", std::to_string(l.generation)}};
}

// Adds the series and records how to remove it again (the caller holds the lock on `removals`).
template <typename T, typename... Args>
T& addSeries(prometheus::Family<T>& family, const prometheus::Labels& labels, Removals& removals,
             Args&&... args) {
  T& series = family.Add(labels, std::forward<Args>(args)...);
  removals.try_emplace(&series, [&family, &series] { family.Remove(&series); });
  return series;
}

prometheus::Gauge& gauge(prometheus::Registry& r, const ReplicaLabels& l, Removals& removals,
                         const std::string& name, const std::string& help) {
  return addSeries(prometheus::BuildGauge().Name(name).Help(help).Register(r), base(l), removals);
}

// 1 ms .. ~10 min: a small part's fetch or merge takes milliseconds, a big one minutes.
const prometheus::Histogram::BucketBoundaries kDurationBuckets = {0.001, 0.005, 0.025, 0.1, 0.25, 1,
                                                                  2.5,   10,    30,    100, 600};

prometheus::Histogram& histogram(
    prometheus::Registry& r, const ReplicaLabels& l, Removals& removals, const std::string& name,
    const std::string& help,
    const prometheus::Histogram::BucketBoundaries& buckets = kDurationBuckets) {
  return addSeries(prometheus::BuildHistogram().Name(name).Help(help).Register(r), base(l),
                   removals, buckets);
}

prometheus::Counter& counter(prometheus::Registry& r, const ReplicaLabels& l, Removals& removals,
                             const std::string& name, const std::string& help) {
  return addSeries(prometheus::BuildCounter().Name(name).Help(help).Register(r), base(l), removals);
}

}  // namespace

// The constructor runs before any other thread sees this object: removals_ needs no lock yet.
ReplicaMetrics::ReplicaMetrics(prometheus::Registry& r, const ReplicaLabels& l)
    : log_max_index(gauge(r, l, removals_, "rtable_log_max_index",
                          "Highest log entry number handed out (ClickHouse's log_max_index)")),
      log_counter(gauge(r, l, removals_, "rtable_log_counter",
                        "The log node's int32 sequential counter: the next entry's number")),
      log_counter_headroom_ratio(gauge(r, l, removals_, "rtable_log_counter_headroom_ratio",
                                       "Log entries left before 2147483647, as a share of 2^31")),
      log_counter_exhaustion_seconds(
          gauge(r, l, removals_, "rtable_log_counter_exhaustion_seconds",
                "Projected seconds until the log counter is exhausted at the recent rate")),
      inserts(counter(r, l, removals_, "rtable_inserts_total", "Acknowledged insert requests")),
      inserted_rows(
          counter(r, l, removals_, "rtable_inserted_rows_total", "Rows of acknowledged inserts")),
      insert_deduplicated_blocks(counter(r, l, removals_, "rtable_insert_deduplicated_blocks_total",
                                         "Blocks skipped as duplicates of committed ones")),
      insert_errors(
          counter(r, l, removals_, "rtable_insert_errors_total", "Insert requests that failed")),
      slow_insert_commits(counter(r, l, removals_, "rtable_slow_insert_commits_total",
                                  "Parts whose insert commit took a second or more (each logged "
                                  "with where the time went)")),
      async_insert_buffered_bytes(
          gauge(r, l, removals_, "rtable_async_insert_buffered_bytes",
                "Bytes of async inserts waiting in the buffer or being flushed")),
      async_insert_buffered_inserts(gauge(r, l, removals_, "rtable_async_insert_buffered_inserts",
                                          "Async inserts waiting in the buffer or being flushed")),
      async_insert_inserts_per_flush(
          histogram(r, l, removals_, "rtable_async_insert_inserts_per_flush",
                    "Inserts committed together by one flush of the async insert buffer",
                    {1, 2, 4, 8, 16, 32, 64, 128, 256, 450, 1000, 4000})),
      async_insert_wait_seconds(
          histogram(r, l, removals_, "rtable_async_insert_wait_seconds",
                    "Time from an async insert's arrival to its outcome (committed or failed)",
                    {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2.5, 10})),
      async_insert_rejected(counter(r, l, removals_, "rtable_async_insert_rejected_total",
                                    "Async inserts refused with 503 because the buffer was full")),
      parts(gauge(r, l, removals_, "rtable_parts", "Active parts of this replica")),
      merges(counter(r, l, removals_, "rtable_merges_total", "Merges executed by this replica")),
      merged_rows(counter(r, l, removals_, "rtable_merged_rows_total", "Rows written by merges")),
      broken_parts(counter(r, l, removals_, "rtable_broken_parts_total",
                           "Parts that failed verification and were moved to detached/")),
      replica_readonly(gauge(r, l, removals_, "rtable_replica_readonly",
                             "1 while the replica cannot write (no ZooKeeper session)")),
      parts_in_memory(gauge(r, l, removals_, "rtable_parts_in_memory",
                            "Small inserted parts and merge results held in memory, durable in "
                            "the part journal, that no checkpoint has written out and synced "
                            "yet")),
      parts_in_memory_bytes(gauge(r, l, removals_, "rtable_parts_in_memory_bytes",
                                  "Bytes of the parts held in memory, as encoded "
                                  "(about 64 MiB at most)")),
      part_journal_bytes(gauge(r, l, removals_, "rtable_part_journal_bytes",
                               "Bytes appended to the part journal since its last checkpoint that "
                               "succeeded")),
      part_journal_checkpoint_failures(
          counter(r, l, removals_, "rtable_part_journal_checkpoint_failures_total",
                  "Part journal checkpoints that failed (the journal and the parts held in "
                  "memory are kept for the next one)")),
      queue_size(gauge(r, l, removals_, "rtable_replication_queue_size",
                       "Entries in the replication queue")),
      queue_oldest_entry_age_seconds(
          gauge(r, l, removals_, "rtable_replication_queue_oldest_entry_age_seconds",
                "Age of the oldest queue entry (from its log entry's create_time); 0 when empty")),
      replica_lost(gauge(r, l, removals_, "rtable_replica_lost",
                         "1 while the replica is lost and waits to clone a healthy one")),
      fetches(
          counter(r, l, removals_, "rtable_fetches_total", "Parts fetched from other replicas")),
      fetched_bytes(
          counter(r, l, removals_, "rtable_fetched_bytes_total", "Bytes of parts fetched")),
      fetch_errors(counter(r, l, removals_, "rtable_fetch_errors_total",
                           "Part transfers that failed (each source tried counts once)")),
      attached_parts(counter(r, l, removals_, "rtable_attached_parts_total",
                             "Parts of the replaced generation attached into this one by hard link "
                             "(the table swap)")),
      parts_lost_forever(counter(r, l, removals_, "rtable_parts_lost_forever_total",
                                 "Parts that no replica has or can produce any more; their queue "
                                 "entries were given up")),
      fetch_duration_seconds(histogram(r, l, removals_, "rtable_fetch_duration_seconds",
                                       "Time to fetch, verify and register one part")),
      merged_bytes(counter(r, l, removals_, "rtable_merged_bytes_total",
                           "Bytes of parts written by merges")),
      merge_duration_seconds(histogram(r, l, removals_, "rtable_merge_duration_seconds",
                                       "Time to merge and register one part")),
      absolute_delay_seconds(
          gauge(r, l, removals_, "rtable_replica_absolute_delay_seconds",
                "Seconds since the oldest insert not yet fetched here; 0 when none")),
      labels_(l),
      zookeeper_duration_family_(prometheus::BuildHistogram()
                                     .Name("rtable_zookeeper_request_duration_seconds")
                                     .Help("Latency of ZooKeeper requests by operation")
                                     .Register(r)),
      zookeeper_errors_family_(prometheus::BuildCounter()
                                   .Name("rtable_zookeeper_errors_total")
                                   .Help("ZooKeeper requests that failed, by operation and code")
                                   .Register(r)),
      queue_entries_family_(prometheus::BuildGauge()
                                .Name("rtable_replication_queue_entries")
                                .Help("Replication queue entries by type")
                                .Register(r)),
      queue_postponed_family_(prometheus::BuildCounter()
                                  .Name("rtable_replication_queue_postponed_total")
                                  .Help("Queue entries passed over by the selection, by reason")
                                  .Register(r)),
      queue_executing_family_(prometheus::BuildGauge()
                                  .Name("rtable_replication_queue_executing")
                                  .Help("Queue entries executing now, by action (fetch, merge, "
                                        "drop_range): fetches and merges each take a pool slot")
                                  .Register(r)),
      pool_size_family_(prometheus::BuildGauge()
                            .Name("rtable_replication_pool_size")
                            .Help("Slots of the replica's fetch and merge pools (pool label)")
                            .Register(r)),
      async_insert_flushes_family_(
          prometheus::BuildCounter()
              .Name("rtable_async_insert_flushes_total")
              .Help("Flushes of the async insert buffer by reason (size, count, timeout, stale, "
                    "burst, forced: shutdown or a table swap's pause)")
              .Register(r)) {
  log_counter_exhaustion_seconds.Set(std::numeric_limits<double>::infinity());
}

ReplicaMetrics::~ReplicaMetrics() {
  std::lock_guard lock(removals_mu_);
  for (auto& [series, remove] : removals_) remove();
}

prometheus::Histogram& ReplicaMetrics::zookeeperRequestDuration(const std::string& operation) {
  // 0.1 ms .. ~3 s: loopback requests take well under a millisecond, a struggling ensemble seconds.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  auto labels = base(labels_);
  labels["operation"] = operation;
  std::lock_guard lock(removals_mu_);
  return addSeries(zookeeper_duration_family_, labels, removals_, kBuckets);
}

prometheus::Counter& ReplicaMetrics::zookeeperErrors(const std::string& operation,
                                                     const std::string& code) {
  auto labels = base(labels_);
  labels["operation"] = operation;
  labels["code"] = code;
  std::lock_guard lock(removals_mu_);
  return addSeries(zookeeper_errors_family_, labels, removals_);
}

prometheus::Gauge& ReplicaMetrics::queueEntries(const std::string& type) {
  auto labels = base(labels_);
  labels["type"] = type;
  std::lock_guard lock(removals_mu_);
  return addSeries(queue_entries_family_, labels, removals_);
}

prometheus::Counter& ReplicaMetrics::queuePostponed(const std::string& reason) {
  auto labels = base(labels_);
  labels["reason"] = reason;
  std::lock_guard lock(removals_mu_);
  return addSeries(queue_postponed_family_, labels, removals_);
}

prometheus::Gauge& ReplicaMetrics::queueExecuting(const std::string& action) {
  auto labels = base(labels_);
  labels["action"] = action;
  std::lock_guard lock(removals_mu_);
  return addSeries(queue_executing_family_, labels, removals_);
}

prometheus::Gauge& ReplicaMetrics::poolSize(const std::string& pool) {
  auto labels = base(labels_);
  labels["pool"] = pool;
  std::lock_guard lock(removals_mu_);
  return addSeries(pool_size_family_, labels, removals_);
}

prometheus::Counter& ReplicaMetrics::asyncInsertFlushes(const std::string& reason) {
  auto labels = base(labels_);
  labels["reason"] = reason;
  std::lock_guard lock(removals_mu_);
  return addSeries(async_insert_flushes_family_, labels, removals_);
}

void CounterRateEstimator::addSample(double time_seconds, int64_t counter) {
  samples_[time_seconds] = counter;
  while (samples_.size() > 2 && samples_.begin()->first < time_seconds - window_seconds_) {
    samples_.erase(samples_.begin());
  }
}

double CounterRateEstimator::ratePerSecond() const {
  if (samples_.size() < 2) return 0;
  const auto& [t0, c0] = *samples_.begin();
  const auto& [t1, c1] = *samples_.rbegin();
  if (t1 <= t0 || c1 <= c0) return 0;
  return static_cast<double>(c1 - c0) / (t1 - t0);
}

double CounterRateEstimator::secondsToExhaustion(int64_t creates_left) const {
  const double rate = ratePerSecond();
  if (rate <= 0) return std::numeric_limits<double>::infinity();
  return static_cast<double>(creates_left) / rate;
}

}  // namespace rtable::metrics
