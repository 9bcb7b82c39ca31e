#include "rtable/controllers/table_metrics.h"

#include <limits>
#include <set>

namespace rtable::controllers {
namespace {

using prometheus::Labels;

// A swap takes seconds on a small table and minutes on a large one (every part is linked and
// checked); its write pause should stay under a few seconds.
const prometheus::Histogram::BucketBoundaries kDurationBuckets = {1,   2,   5,   10,   30,  60,
                                                                  120, 300, 600, 1800, 3600};
const prometheus::Histogram::BucketBoundaries kPauseBuckets = {0.1, 0.25, 0.5, 1,  2,
                                                               5,   10,   30,  60, 300};

template <typename Builder>
auto& family(Builder builder, prometheus::Registry& registry, const char* name, const char* help) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

TableMetrics::TableMetrics(prometheus::Registry& registry)
    : generation_(family(prometheus::BuildGauge(), registry, "rtable_table_generation",
                         "The table's active generation (the table swap moves it on)")),
      headroom_(family(prometheus::BuildGauge(), registry, "rtable_table_counter_headroom_ratio",
                       "Creates left / 2^31 of a ZooKeeper sequential counter that stops the table "
                       "(log, block_numbers/<partition>, queue/<replica>)")),
      exhaustion_(family(prometheus::BuildGauge(), registry,
                         "rtable_table_counter_exhaustion_seconds",
                         "Seconds until the counter runs out at the growth rate the operator "
                         "sampled (+Inf: not growing, or not sampled long enough)")),
      running_(family(prometheus::BuildGauge(), registry, "rtable_table_swap_running",
                      "1 while a table swap to a new generation runs")),
      started_(family(prometheus::BuildGauge(), registry,
                      "rtable_table_swap_started_timestamp_seconds",
                      "When the running table swap began (0: none runs)")),
      swaps_(family(prometheus::BuildCounter(), registry, "rtable_table_swaps_total",
                    "Table swaps that ended, by result (Succeeded, Aborted)")),
      duration_(family(prometheus::BuildHistogram(), registry, "rtable_table_swap_duration_seconds",
                       "Table swaps from begin to end")),
      write_pause_(family(prometheus::BuildHistogram(), registry,
                          "rtable_table_swap_write_pause_seconds",
                          "How long a table swap refused inserts (pause to switch, or abort)")) {}

TableMetrics::Table& TableMetrics::table(const std::string& ns, const std::string& name) {
  auto [it, inserted] = tables_.try_emplace({ns, name});
  Table& t = it->second;
  if (inserted) {
    const Labels labels{{"namespace", ns}, {"table", name}};
    t.generation = &generation_.Add(labels);
    t.running = &running_.Add(labels);
    t.started = &started_.Add(labels);
    // Both results from 0: increase() over a window sees the first swap of either.
    for (const char* result : {"Succeeded", "Aborted"}) {
      t.swaps[result] = &swaps_.Add({{"namespace", ns}, {"table", name}, {"result", result}});
    }
  }
  return t;
}

void TableMetrics::setCounters(const std::string& ns, const std::string& name, int64_t generation,
                               const std::vector<CounterHeadroom>& counters) {
  std::lock_guard lock(mu_);
  Table& t = table(ns, name);
  t.generation->Set(static_cast<double>(generation));
  std::set<std::string> now;
  for (const auto& counter : counters) {
    const std::string key = std::to_string(generation) + "/" + counter.name;
    now.insert(key);
    auto [it, inserted] = t.counters.try_emplace(key);
    if (inserted) {
      const Labels labels{{"namespace", ns},
                          {"table", name},
                          {"generation", std::to_string(generation)},
                          {"counter", counter.name}};
      it->second = {&headroom_.Add(labels), &exhaustion_.Add(labels)};
    }
    it->second.first->Set(counter.ratio);
    it->second.second->Set(
        counter.exhaustion_seconds.value_or(std::numeric_limits<double>::infinity()));
  }
  for (auto it = t.counters.begin(); it != t.counters.end();) {
    if (now.contains(it->first)) {
      ++it;
      continue;
    }
    headroom_.Remove(it->second.first);
    exhaustion_.Remove(it->second.second);
    it = t.counters.erase(it);
  }
}

void TableMetrics::setSwapRunning(const std::string& ns, const std::string& name,
                                  std::optional<double> started_seconds) {
  std::lock_guard lock(mu_);
  Table& t = table(ns, name);
  t.running->Set(started_seconds ? 1 : 0);
  t.started->Set(started_seconds.value_or(0));
}

void TableMetrics::swapEnded(const std::string& ns, const std::string& name,
                             const std::string& result, std::optional<double> duration_seconds,
                             std::optional<double> write_pause_seconds) {
  std::lock_guard lock(mu_);
  Table& t = table(ns, name);
  auto it = t.swaps.find(result);
  if (it == t.swaps.end()) {
    it = t.swaps
             .emplace(result, &swaps_.Add({{"namespace", ns}, {"table", name}, {"result", result}}))
             .first;
  }
  it->second->Increment();
  if (!t.duration) {
    const Labels labels{{"namespace", ns}, {"table", name}};
    t.duration = &duration_.Add(labels, kDurationBuckets);
    t.write_pause = &write_pause_.Add(labels, kPauseBuckets);
  }
  if (duration_seconds) t.duration->Observe(*duration_seconds);
  if (write_pause_seconds) t.write_pause->Observe(*write_pause_seconds);
}

void TableMetrics::forget(const std::string& ns, const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = tables_.find({ns, name});
  if (it == tables_.end()) return;
  Table& t = it->second;
  generation_.Remove(t.generation);
  running_.Remove(t.running);
  started_.Remove(t.started);
  if (t.duration) duration_.Remove(t.duration);
  if (t.write_pause) write_pause_.Remove(t.write_pause);
  for (auto& [result, counter] : t.swaps) swaps_.Remove(counter);
  for (auto& [key, gauges] : t.counters) {
    headroom_.Remove(gauges.first);
    exhaustion_.Remove(gauges.second);
  }
  tables_.erase(it);
}

}  // namespace rtable::controllers
