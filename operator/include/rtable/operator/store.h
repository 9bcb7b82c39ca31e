// Store: an informer's local cache of one resource type, keyed by namespace/name, with secondary
// indexes (client-go's thread-safe Indexer).
//
// Objects are immutable once stored (ObjectPtr = shared_ptr<const json>): a reader keeps a
// consistent object without copying it and without holding a lock. Lists come out sorted by key.
//
// Thread safety: every method may be called from any thread. Only the informer writes.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/operator/resource.h"

namespace rtable::op {

using ObjectPtr = std::shared_ptr<const nlohmann::json>;

// The values an object has for one index (none, one or several: e.g. the uids of its owners).
using IndexFunc = std::function<std::vector<std::string>(const nlohmann::json& object)>;

// What a replace() changed, for the informer's handlers.
struct StoreChange {
  enum class Kind { kAdded, kUpdated, kDeleted };
  Kind kind = Kind::kAdded;
  ObjectPtr old_object;  // kUpdated, kDeleted
  ObjectPtr new_object;  // kAdded, kUpdated
};

class Store {
 public:
  // Adds an index; objects already stored are indexed too. False if the name is taken.
  bool addIndex(const std::string& name, IndexFunc func);

  ObjectPtr get(const ObjectKey& key) const;  // null when absent
  std::vector<ObjectPtr> list() const;
  std::vector<ObjectPtr> list(std::string_view ns) const;  // one namespace
  // Objects with `value` among their values for the index; empty for an unknown index.
  std::vector<ObjectPtr> byIndex(std::string_view index, std::string_view value) const;
  std::vector<ObjectKey> keys() const;
  std::size_t size() const;

  // --- writes (the informer's) ---

  // Inserts or replaces the object under its metadata key; returns the previous one (or null).
  ObjectPtr upsert(ObjectPtr object);
  // Returns the removed object (or null).
  ObjectPtr erase(const ObjectKey& key);
  // Atomically makes `objects` the whole content (after a relist). Returns what changed: objects
  // gone, new, or with another resourceVersion (an equal resourceVersion is the same object
  // version, not a change), in key order.
  std::vector<StoreChange> replace(std::vector<ObjectPtr> objects);

 private:
  struct Index {
    IndexFunc func;
    std::map<std::string, std::set<ObjectKey>, std::less<>> keys_by_value;
  };
  void indexLocked(const ObjectKey& key, const nlohmann::json& object);
  void unindexLocked(const ObjectKey& key, const nlohmann::json& object);

  mutable std::shared_mutex mu_;
  std::map<ObjectKey, ObjectPtr> objects_;
  std::map<std::string, Index, std::less<>> indexes_;
};

// Index functions for Store::addIndex and Informer::addIndex.
namespace indexes {
inline constexpr std::string_view kOwnerUid = "owner-uid";
inline constexpr std::string_view kControllerUid = "controller-uid";

// metadata.ownerReferences[].uid
IndexFunc byOwnerUid();
// The uid of the ownerReference with controller: true, if any.
IndexFunc byControllerUid();
// The value of label `key`, if the object has it.
IndexFunc byLabel(std::string key);
}  // namespace indexes

}  // namespace rtable::op
