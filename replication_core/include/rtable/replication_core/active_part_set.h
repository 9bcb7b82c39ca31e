// The set of active parts: mutually disjoint, none covered by another (ClickHouse's
// ActiveDataPartSet). Adding a part drops the parts it covers; a part that merely intersects one
// in the set is refused, since no merge can produce it.
//
// Not thread-safe: the owner guards it.
#pragma once

#include <expected>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rtable/replication_core/part_name.h"

namespace rtable::core {

class ActiveDataPartSet {
 public:
  enum class AddResult { kAdded, kAlreadyCovered };

  // kAdded (and the parts it covers are gone), kAlreadyCovered (nothing changed), or an error
  // naming the part it intersects (nothing changed).
  std::expected<AddResult, std::string> add(const PartName& part);
  // The part in the set that contains `part` (possibly `part` itself).
  std::optional<PartName> containingPart(const PartName& part) const;
  // Parts of the set that `part` contains.
  std::vector<PartName> partsCoveredBy(const PartName& part) const;
  bool remove(const PartName& part) { return parts_.erase(part) > 0; }

  std::vector<PartName> parts() const;  // sorted
  std::size_t size() const { return parts_.size(); }
  bool empty() const { return parts_.empty(); }

 private:
  // Value unused: a map keeps ClickHouse's ordering and lower_bound.
  std::map<PartName, bool> parts_;
};

}  // namespace rtable::core
