#include "rtable/operator/store.h"

#include <mutex>

#include "rtable/operator/kube_client.h"

namespace rtable::op {

bool Store::addIndex(const std::string& name, IndexFunc func) {
  std::unique_lock lock(mu_);
  auto [it, inserted] = indexes_.try_emplace(name);
  if (!inserted) return false;
  it->second.func = std::move(func);
  for (const auto& [key, object] : objects_) {
    for (auto& value : it->second.func(*object)) {
      it->second.keys_by_value[std::move(value)].insert(key);
    }
  }
  return true;
}

ObjectPtr Store::get(const ObjectKey& key) const {
  std::shared_lock lock(mu_);
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<ObjectPtr> Store::list() const {
  std::shared_lock lock(mu_);
  std::vector<ObjectPtr> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(object);
  return out;
}

std::vector<ObjectPtr> Store::list(std::string_view ns) const {
  std::shared_lock lock(mu_);
  std::vector<ObjectPtr> out;
  // Keys sort by namespace first: the namespace is one contiguous range.
  for (auto it = objects_.lower_bound(ObjectKey{std::string(ns), ""});
       it != objects_.end() && it->first.ns == ns; ++it) {
    out.push_back(it->second);
  }
  return out;
}

std::vector<ObjectPtr> Store::byIndex(std::string_view index, std::string_view value) const {
  std::shared_lock lock(mu_);
  std::vector<ObjectPtr> out;
  auto idx = indexes_.find(index);
  if (idx == indexes_.end()) return out;
  auto keys = idx->second.keys_by_value.find(value);
  if (keys == idx->second.keys_by_value.end()) return out;
  for (const auto& key : keys->second) out.push_back(objects_.at(key));
  return out;
}

std::vector<ObjectKey> Store::keys() const {
  std::shared_lock lock(mu_);
  std::vector<ObjectKey> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(key);
  return out;
}

std::size_t Store::size() const {
  std::shared_lock lock(mu_);
  return objects_.size();
}

void Store::indexLocked(const ObjectKey& key, const nlohmann::json& object) {
  for (auto& [name, index] : indexes_) {
    for (auto& value : index.func(object)) index.keys_by_value[std::move(value)].insert(key);
  }
}

void Store::unindexLocked(const ObjectKey& key, const nlohmann::json& object) {
  for (auto& [name, index] : indexes_) {
    for (const auto& value : index.func(object)) {
      auto it = index.keys_by_value.find(value);
      if (it == index.keys_by_value.end()) continue;
      it->second.erase(key);
      if (it->second.empty()) index.keys_by_value.erase(it);
    }
  }
}

ObjectPtr Store::upsert(ObjectPtr object) {
  const ObjectKey key = objectKeyOf(*object);
  std::unique_lock lock(mu_);
  ObjectPtr old;
  if (auto it = objects_.find(key); it != objects_.end()) {
    old = it->second;
    unindexLocked(key, *old);
    it->second = object;
  } else {
    objects_.emplace(key, object);
  }
  indexLocked(key, *object);
  return old;
}

ObjectPtr Store::erase(const ObjectKey& key) {
  std::unique_lock lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return nullptr;
  ObjectPtr old = std::move(it->second);
  objects_.erase(it);
  unindexLocked(key, *old);
  return old;
}

std::vector<StoreChange> Store::replace(std::vector<ObjectPtr> objects) {
  std::map<ObjectKey, ObjectPtr> fresh;
  for (auto& object : objects) {
    ObjectKey key = objectKeyOf(*object);
    fresh.insert_or_assign(std::move(key), std::move(object));
  }
  std::unique_lock lock(mu_);
  std::vector<StoreChange> changes;
  // Both maps are sorted by key: one merge pass yields the changes in key order.
  auto old_it = objects_.begin();
  auto new_it = fresh.begin();
  while (old_it != objects_.end() || new_it != fresh.end()) {
    if (new_it == fresh.end() || (old_it != objects_.end() && old_it->first < new_it->first)) {
      changes.push_back({StoreChange::Kind::kDeleted, old_it->second, nullptr});
      ++old_it;
    } else if (old_it == objects_.end() || new_it->first < old_it->first) {
      changes.push_back({StoreChange::Kind::kAdded, nullptr, new_it->second});
      ++new_it;
    } else {
      if (resourceVersionOf(*old_it->second) != resourceVersionOf(*new_it->second)) {
        changes.push_back({StoreChange::Kind::kUpdated, old_it->second, new_it->second});
      } else {
        new_it->second = old_it->second;  // the same version: keep the instance readers hold
      }
      ++old_it;
      ++new_it;
    }
  }
  objects_ = std::move(fresh);
  for (auto& [name, index] : indexes_) index.keys_by_value.clear();
  for (const auto& [key, object] : objects_) indexLocked(key, *object);
  return changes;
}

namespace indexes {

namespace {
const nlohmann::json* ownerReferences(const nlohmann::json& object) {
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return nullptr;
  auto refs = metadata->find("ownerReferences");
  return refs != metadata->end() && refs->is_array() ? &*refs : nullptr;
}
}  // namespace

IndexFunc byOwnerUid() {
  return [](const nlohmann::json& object) {
    std::vector<std::string> uids;
    if (const auto* refs = ownerReferences(object)) {
      for (const auto& ref : *refs) {
        if (ref.is_object() && ref.contains("uid") && ref["uid"].is_string()) {
          uids.push_back(ref["uid"].get<std::string>());
        }
      }
    }
    return uids;
  };
}

IndexFunc byControllerUid() {
  return [](const nlohmann::json& object) {
    std::vector<std::string> uids;
    if (const auto* refs = ownerReferences(object)) {
      for (const auto& ref : *refs) {
        if (ref.is_object() && ref.value("controller", false) && ref.contains("uid") &&
            ref["uid"].is_string()) {
          uids.push_back(ref["uid"].get<std::string>());
          break;  // the apiserver allows one controller reference
        }
      }
    }
    return uids;
  };
}

IndexFunc byLabel(std::string key) {
  return [key = std::move(key)](const nlohmann::json& object) {
    std::vector<std::string> values;
    auto metadata = object.find("metadata");
    if (metadata == object.end() || !metadata->is_object()) return values;
    auto labels = metadata->find("labels");
    if (labels == metadata->end() || !labels->is_object()) return values;
    auto value = labels->find(key);
    if (value != labels->end() && value->is_string()) values.push_back(value->get<std::string>());
    return values;
  };
}

}  // namespace indexes

}  // namespace rtable::op
