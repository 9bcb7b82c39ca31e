// FakeStorage: an in-memory BackupStorage for unit tests, held to the same conformance suite as
// the filesystem and S3 sides (backup/tests): names checked alike, list sorted bytewise, a put
// replaces whole, remove of a missing name succeeds, readToFile writes its local target under a
// temporary name and renames it.
//
// Thread safety: every method may be called from several threads at once (one mutex).
#pragma once

#include <map>
#include <mutex>

#include "rtable/backup/backup_storage.h"

namespace rtable::backup::testing {

class FakeStorage final : public BackupStorage {
 public:
  explicit FakeStorage(std::string location = "memory://fake") : location_(std::move(location)) {}

  std::string location() const override { return location_; }
  StorageResult<std::optional<uint64_t>> size(const std::string& name) override;
  StorageResult<void> putFile(const std::string& name,
                              const std::filesystem::path& source) override;
  StorageResult<void> putBytes(const std::string& name, std::string_view bytes) override;
  StorageResult<std::string> read(const std::string& name) override;
  StorageResult<void> readToFile(const std::string& name,
                                 const std::filesystem::path& target) override;
  StorageResult<std::vector<std::string>> list(const std::string& prefix) override;
  StorageResult<void> remove(const std::string& name) override;

 private:
  StorageResult<void> checkName(const std::string& name) const;

  const std::string location_;
  std::mutex mutex_;
  std::map<std::string, std::string> objects_;  // std::map: bytewise order, as list() returns
};

}  // namespace rtable::backup::testing
