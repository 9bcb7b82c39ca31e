// Informer handlers that turn object events into work-queue keys (controller-runtime's
// handler.EnqueueRequestForObject and handler.EnqueueRequestForOwner).
//
// A key is ObjectKey::toString(): "namespace/name", or "name" for a cluster-scoped object;
// objectKeyFromString() reads it back. The queue must outlive the informer the handlers go to.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "rtable/operator/informer.h"
#include "rtable/operator/resource.h"
#include "rtable/operator/work_queue.h"

namespace rtable::op {

// Inverse of ObjectKey::toString(): the part before the first '/' is the namespace.
ObjectKey objectKeyFromString(std::string_view key);

// The object's own key, on add, update and delete.
ResourceEventHandlers enqueueObject(WorkQueue& queue);

// Which ownerReferences lead to the objects a controller reconciles.
struct OwnerFilter {
  std::string group;  // of the owner's apiVersion ("" for the core group); the version is ignored
  std::string kind;   // e.g. "ReplicatedTable"
  // An owner is in the owned object's namespace; a cluster-scoped owner's key has no namespace.
  bool namespaced = true;
  // Only the reference with controller: true (controller-runtime's OnlyControllerOwner()).
  bool controller_only = true;
};

// Keys of the owners of `object` that match `filter`.
std::vector<ObjectKey> ownerKeysOf(const nlohmann::json& object, const OwnerFilter& filter);

// The owners' keys; on update those of both the old and the new object (an ownerReference that
// was removed still tells its former owner).
ResourceEventHandlers enqueueOwner(WorkQueue& queue, OwnerFilter filter);

}  // namespace rtable::op
