#include "rtable/replication_core/sequential_counter.h"

#include <fmt/format.h>

namespace rtable::core {

SequentialCounter SequentialCounter::fromStat(const Stat& stat, bool last_name_taken) {
  const auto sum = static_cast<uint32_t>(static_cast<int64_t>(stat.cversion) + stat.num_children);
  const int64_t counter = sum / 2;
  return SequentialCounter(counter, counter == kLastName && last_name_taken);
}

KeeperResult<SequentialCounter> SequentialCounter::read(Keeper& keeper, const std::string& parent,
                                                        const std::string& prefix) {
  auto stat = keeper.exists(parent);
  if (!stat) return std::unexpected(stat.error());
  if (!*stat) return std::unexpected(KeeperError{KeeperCode::kNoNode, parent, {}, {}});
  SequentialCounter counter = fromStat(**stat);
  if (counter.counter_ != kLastName) return counter;
  auto last = keeper.exists(joinPath(parent, prefix + fmt::format("{:010d}", kLastName)));
  if (!last) return std::unexpected(last.error());
  return fromStat(**stat, last->has_value());
}

double SequentialCounter::headroomRatio() const {
  return static_cast<double>(createsLeft()) / static_cast<double>(kNameSpace);
}

}  // namespace rtable::core
