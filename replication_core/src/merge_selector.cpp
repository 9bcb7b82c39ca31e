#include "rtable/replication_core/merge_selector.h"

#include <algorithm>

namespace rtable::core {

std::optional<MergeRange> selectMergeRange(const std::vector<MergeCandidate>& parts,
                                           std::size_t min_width, std::size_t max_width,
                                           const std::function<bool(const MergeRange&)>& allowed) {
  const std::size_t n = parts.size();
  const std::size_t low = std::max<std::size_t>(2, std::min(min_width, n));
  const std::size_t high = std::min(std::max(max_width, low), n);
  if (n < 2 || low > high) return std::nullopt;
  // Prefix sums: rows, and parts that may not be merged, over parts[0, i).
  std::vector<uint64_t> rows(n + 1, 0);
  std::vector<std::size_t> blocked(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    rows[i + 1] = rows[i] + parts[i].rows;
    blocked[i + 1] = blocked[i] + (parts[i].mergeable ? 0 : 1);
  }
  struct Scored {
    MergeRange range;
    uint64_t rows;
  };
  std::vector<Scored> candidates;
  for (std::size_t width = low; width <= high; ++width) {
    for (std::size_t start = 0; start + width <= n; ++start) {
      if (blocked[start + width] != blocked[start]) continue;
      candidates.push_back({{start, width}, rows[start + width] - rows[start]});
    }
  }
  // a before b when a writes fewer rows per removed part: a.rows / (a.w - 1) < b.rows / (b.w - 1),
  // compared without division (128-bit products cannot overflow).
  auto better = [](const Scored& a, const Scored& b) {
    const auto lhs = static_cast<unsigned __int128>(a.rows) * (b.range.width - 1);
    const auto rhs = static_cast<unsigned __int128>(b.rows) * (a.range.width - 1);
    if (lhs != rhs) return lhs < rhs;
    if (a.range.width != b.range.width) return a.range.width > b.range.width;
    return a.range.start < b.range.start;
  };
  std::sort(candidates.begin(), candidates.end(), better);
  for (const auto& candidate : candidates) {
    if (!allowed || allowed(candidate.range)) return candidate.range;
  }
  return std::nullopt;
}

}  // namespace rtable::core
