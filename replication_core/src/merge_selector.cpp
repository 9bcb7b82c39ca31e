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
  struct Scored {
    MergeRange range;
    uint64_t rows;
  };
  // ClickHouse's SimpleMergeSelector: a run is worth merging only if it holds `base` times the
  // rows of its biggest part, so a row is rewritten O(log) times, not once per few small parts
  // (without it, a partition with one big part rewrote it every five single-row inserts). Many
  // parts lower the bar, from 5 at 10 parts to 1 at 50 (min_parts_to_lower_base,
  // max_parts_to_lower_base), so the part count stays bounded.
  constexpr double kBase = 5.0;
  constexpr std::size_t kLowerFrom = 10;
  constexpr std::size_t kLowerTo = 50;
  // Never above the narrowest run: `low` equal parts are always worth merging.
  const double base =
      std::min(static_cast<double>(low),
               n <= kLowerFrom ? kBase
               : n >= kLowerTo ? 1.0
                               : kBase - (kBase - 1.0) * static_cast<double>(n - kLowerFrom) /
                                             static_cast<double>(kLowerTo - kLowerFrom));
  std::vector<Scored> candidates;
  // Each run grows from its start one part at a time, so its rows and biggest part are running
  // values, and a part that may not be merged ends every run through it.
  for (std::size_t start = 0; start + low <= n; ++start) {
    uint64_t total = 0;
    uint64_t biggest = 0;
    for (std::size_t width = 1; width <= high && start + width <= n; ++width) {
      const MergeCandidate& part = parts[start + width - 1];
      if (!part.mergeable) break;
      total += part.rows;
      biggest = std::max(biggest, part.rows);
      if (width < low || static_cast<double>(total) < base * static_cast<double>(biggest)) continue;
      candidates.push_back({{start, width}, total});
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
