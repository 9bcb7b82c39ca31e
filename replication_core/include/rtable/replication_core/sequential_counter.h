// The int32 counter behind a sequential parent (seed 002, DESIGN.md 2.5).
//
// ZooKeeper names a sequential child from its parent's int32 counter (prefix + "%010d"). Deletes do
// not lower it. From ZooKeeper 3.6 on, the increment past 2147483647 is dropped, so the counter
// stays there: the next create asks for the name it already gave out and fails with "node exists",
// forever. For a table's log/ that is the end of every insert and merge.
#pragma once

#include <cstdint>
#include <string>

#include "rtable/replication_core/keeper.h"

namespace rtable::core {

class SequentialCounter {
 public:
  // The last name ZooKeeper can give out: INT32_MAX.
  static constexpr int64_t kLastName = 2147483647;
  // Names 0 .. 2^31 - 1 exist in all; headroom is a share of them.
  static constexpr int64_t kNameSpace = int64_t{1} << 31;

  // Decodes the counter from the parent's Stat without listing children. The server reports
  // cversion = counter * 2 - numChildren in int32, which wraps once the counter passes 2^30; the
  // sum taken as uint32 and halved gives the counter back. A counter of kLastName cannot tell from
  // the Stat whether the last name is taken: `last_name_taken` says so (see read()).
  static SequentialCounter fromStat(const Stat& stat, bool last_name_taken = false);

  // Reads `parent`'s Stat, and when the counter is at the limit, whether
  // `parent/<prefix>2147483647` exists. Two requests at most, never a listing.
  static KeeperResult<SequentialCounter> read(Keeper& keeper, const std::string& parent,
                                              const std::string& prefix);

  // The number the next sequential child would get.
  int64_t counter() const { return counter_; }
  // The highest number given out (ClickHouse's log_max_index); -1 when none was.
  int64_t maxIndex() const { return exhausted() ? kLastName : counter_ - 1; }
  bool exhausted() const { return counter_ == kLastName && last_name_taken_; }
  // How many more sequential creates succeed.
  int64_t createsLeft() const { return exhausted() ? 0 : kNameSpace - counter_; }
  // createsLeft() / 2^31: 1.0 for a new parent, 0.0 when stuck.
  double headroomRatio() const;

 private:
  SequentialCounter(int64_t counter, bool last_name_taken)
      : counter_(counter), last_name_taken_(last_name_taken) {}

  int64_t counter_;
  bool last_name_taken_;
};

}  // namespace rtable::core
