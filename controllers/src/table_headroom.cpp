#include "rtable/controllers/table_headroom.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace rtable::controllers {
namespace {

// A listing or read of something removed meanwhile (a dropped partition, a removed replica).
bool gone(const core::KeeperError& error) {
  return error.code == core::KeeperCode::kNoNode;
}

std::string describe(const CounterHeadroom& counter) {
  return fmt::format("{}: {} sequential creates left ({:.4f}% of the int32 counter)", counter.name,
                     counter.creates_left, counter.ratio * 100.0);
}

std::string daysText(double seconds) {
  return fmt::format("{:.1f} days", seconds / 86400.0);
}

}  // namespace

core::KeeperResult<std::vector<WatchedCounter>> readWatchedCounters(core::Keeper& keeper,
                                                                    const core::TablePaths& paths) {
  std::vector<WatchedCounter> counters;
  auto log = core::SequentialCounter::read(keeper, paths.log(), "log-");
  if (!log) return std::unexpected(log.error());
  counters.push_back({"log", *log});
  auto partitions = keeper.children(paths.blockNumbers());
  if (!partitions && !gone(partitions.error())) return std::unexpected(partitions.error());
  if (partitions) {
    for (const auto& partition : partitions->names) {
      auto counter = core::SequentialCounter::read(keeper, paths.blockNumbers(partition), "block-");
      if (!counter && gone(counter.error())) continue;
      if (!counter) return std::unexpected(counter.error());
      counters.push_back({"block_numbers/" + partition, *counter});
    }
  }
  auto replicas = keeper.children(paths.replicas());
  if (!replicas && !gone(replicas.error())) return std::unexpected(replicas.error());
  if (replicas) {
    for (const auto& replica : replicas->names) {
      core::TablePaths of = paths;
      of.replica = replica;
      auto counter = core::SequentialCounter::read(keeper, of.queue(), "queue-");
      if (!counter && gone(counter.error())) continue;
      if (!counter) return std::unexpected(counter.error());
      counters.push_back({"queue/" + replica, *counter});
    }
  }
  return counters;
}

CounterHeadroom counterHeadroom(const WatchedCounter& watched) {
  const core::SequentialCounter& counter = watched.counter;
  const bool exhausted = counter.counter() >= core::SequentialCounter::kLastName;
  return {watched.name, exhausted ? 0 : counter.createsLeft(),
          exhausted ? 0.0 : counter.headroomRatio(), exhausted, std::nullopt};
}

std::string_view headroomReasonName(HeadroomReason reason) {
  switch (reason) {
    case HeadroomReason::kAboveThreshold:
      return "AboveThreshold";
    case HeadroomReason::kExhausted:
      return "Exhausted";
    case HeadroomReason::kBelowThreshold:
      return "BelowThreshold";
    case HeadroomReason::kExhaustionSoon:
      return "ExhaustionSoon";
  }
  return "AboveThreshold";
}

HeadroomVerdict judgeHeadroom(const std::vector<CounterHeadroom>& counters,
                              const HeadroomPolicy& policy) {
  HeadroomVerdict verdict;
  if (counters.empty()) return verdict;
  const CounterHeadroom* lowest = &counters.front();
  const CounterHeadroom* exhausted = nullptr;
  const CounterHeadroom* soonest = nullptr;
  for (const auto& counter : counters) {
    if (counter.ratio < lowest->ratio) lowest = &counter;
    if (counter.exhausted && !exhausted) exhausted = &counter;
    if (counter.exhaustion_seconds &&
        (!soonest || *counter.exhaustion_seconds < *soonest->exhaustion_seconds)) {
      soonest = &counter;
    }
  }
  if (soonest) verdict.exhaustion_seconds = soonest->exhaustion_seconds;
  const double horizon = policy.exhaustion_days * 86400.0;
  if (exhausted) {
    verdict.low = true;
    verdict.reason = HeadroomReason::kExhausted;
    verdict.counter = *exhausted;
    verdict.message = fmt::format(
        "{}: no sequential create is left (its counter reached the last name, 2147483647): the "
        "table needs a new generation",
        exhausted->name);
  } else if (lowest->ratio * 100.0 < policy.threshold_percent) {
    verdict.low = true;
    verdict.reason = HeadroomReason::kBelowThreshold;
    verdict.counter = *lowest;
    verdict.message = fmt::format("{}; threshold {}%", describe(*lowest), policy.threshold_percent);
  } else if (soonest && policy.exhaustion_days > 0 && *soonest->exhaustion_seconds < horizon) {
    verdict.low = true;
    verdict.reason = HeadroomReason::kExhaustionSoon;
    verdict.counter = *soonest;
    verdict.message = fmt::format("{}; at its growth rate it runs out in {} (exhaustionDays {})",
                                  describe(*soonest), daysText(*soonest->exhaustion_seconds),
                                  policy.exhaustion_days);
  } else {
    verdict.counter = *lowest;
    verdict.message = fmt::format("{}; threshold {}%", describe(*lowest), policy.threshold_percent);
    if (soonest) {
      verdict.message += fmt::format("; the first to run out at its growth rate is {} in {}",
                                     soonest->name, daysText(*soonest->exhaustion_seconds));
    }
  }
  return verdict;
}

CounterGrowth::CounterGrowth(std::chrono::seconds window, std::chrono::seconds min_span)
    : window_(window), min_span_(min_span) {}

std::optional<double> CounterGrowth::observe(const std::string& key, int64_t counter,
                                             int64_t creates_left,
                                             std::chrono::system_clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now.time_since_epoch()).count();
  std::lock_guard lock(mu_);
  auto [it, inserted] =
      samples_.try_emplace(key, Samples{metrics::CounterRateEstimator(window_.count()), seconds});
  Samples& samples = it->second;
  samples.estimator.addSample(seconds, counter);
  if (seconds - samples.first_seconds < static_cast<double>(min_span_.count())) return std::nullopt;
  const double left = samples.estimator.secondsToExhaustion(creates_left);
  if (std::isinf(left)) return std::nullopt;  // not growing
  return left;
}

void CounterGrowth::forget(const std::string& prefix) {
  std::lock_guard lock(mu_);
  for (auto it = samples_.lower_bound(prefix);
       it != samples_.end() && it->first.starts_with(prefix);) {
    it = samples_.erase(it);
  }
}

}  // namespace rtable::controllers
