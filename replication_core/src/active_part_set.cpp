#include "rtable/replication_core/active_part_set.h"

#include <fmt/format.h>

namespace rtable::core {

std::expected<ActiveDataPartSet::AddResult, std::string> ActiveDataPartSet::add(
    const PartName& part) {
  if (containingPart(part)) return AddResult::kAlreadyCovered;
  // The parts `part` contains sit right around where it would go in the order: find that run,
  // check its neighbours do not intersect, and only then change the set.
  auto first = parts_.lower_bound(part);
  while (first != parts_.begin() && part.contains(std::prev(first)->first)) --first;
  if (first != parts_.begin() && !part.isDisjoint(std::prev(first)->first)) {
    return std::unexpected(fmt::format("part {} intersects previous part {}", part.format(),
                                       std::prev(first)->first.format()));
  }
  auto last = first;
  while (last != parts_.end() && part.contains(last->first)) ++last;
  if (last != parts_.end() && !part.isDisjoint(last->first)) {
    return std::unexpected(
        fmt::format("part {} intersects next part {}", part.format(), last->first.format()));
  }
  parts_.erase(first, last);
  parts_.emplace(part, true);
  return AddResult::kAdded;
}

std::optional<PartName> ActiveDataPartSet::containingPart(const PartName& part) const {
  // With disjoint parts, a container is either the first part not below `part` or the one before.
  auto it = parts_.lower_bound(part);
  if (it != parts_.end() && it->first.contains(part)) return it->first;
  if (it != parts_.begin() && std::prev(it)->first.contains(part)) return std::prev(it)->first;
  return std::nullopt;
}

std::vector<PartName> ActiveDataPartSet::partsCoveredBy(const PartName& part) const {
  std::vector<PartName> covered;
  for (const auto& [candidate, unused] : parts_) {
    if (part.contains(candidate)) covered.push_back(candidate);
  }
  return covered;
}

std::vector<PartName> ActiveDataPartSet::parts() const {
  std::vector<PartName> all;
  all.reserve(parts_.size());
  for (const auto& [part, unused] : parts_) all.push_back(part);
  return all;
}

}  // namespace rtable::core
