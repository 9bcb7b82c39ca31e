#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace rtable::core {

// One active part of a partition, in block order, as the merge selector sees it.
struct MergeCandidate {
  uint64_t rows = 0;
  bool mergeable = false;  // here, and nothing in the queue will change it
};

// A run of neighbouring parts to merge: parts[start, start + width).
struct MergeRange {
  std::size_t start = 0;
  std::size_t width = 0;
  friend bool operator==(const MergeRange&, const MergeRange&) = default;
};

// Chooses the run of `min_width` to `max_width` neighbouring mergeable parts (fewer if the
// partition has fewer parts) that writes the fewest rows per part it removes: rows / (width - 1).
// Many small parts are merged at once (100 single-row parts cost one merge, not eleven), and a big
// part is rewritten only when no run of small ones is left (ClickHouse's SimpleMergeSelector
// weighs the same trade). A run must hold 5 times the rows of its biggest part (1 time once the
// partition has 50 parts, linearly from 10), as ClickHouse's `base`: a big part is not rewritten
// to take in a few small ones. Ties go to the wider run, then the earlier one. `allowed` can veto
// a run (a block inside it is still being inserted); the next best is taken then.
std::optional<MergeRange> selectMergeRange(const std::vector<MergeCandidate>& parts,
                                           std::size_t min_width, std::size_t max_width,
                                           const std::function<bool(const MergeRange&)>& allowed);

}  // namespace rtable::core
