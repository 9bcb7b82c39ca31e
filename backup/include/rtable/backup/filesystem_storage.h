// FilesystemStorage: backups in a directory every replica mounts (a PersistentVolumeClaim or a
// shared path). The object "a/b/c" is the file <root>/a/b/c; a put writes "<dir>/.tmp-<random>",
// fsyncs it, renames it over the name and fsyncs the directory, so a reader (or a crash) sees the
// old object or the whole new one. Parent directories are created as needed, the root never: a
// missing root is kNoBucket, so a mistyped mount path is an error rather than a new empty folder.
// Directories left empty by remove() stay (removing them would race with a put into them).
//
// Unlike S3, a name cannot be both an object and a folder: putting "a/b" while "a" is an object
// fails (kOther, "Not a directory").
//
// Thread safety: every method may be called from several threads (and processes) at once; the
// object holds no mutable state.
#pragma once

#include <filesystem>

#include "rtable/backup/backup_storage.h"

namespace rtable::backup {

class FilesystemStorage final : public BackupStorage {
 public:
  explicit FilesystemStorage(std::filesystem::path root) : root_(std::move(root)) {}

  std::string location() const override { return root_.string(); }
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
  // The object's path, once its name is valid and the root exists.
  StorageResult<std::filesystem::path> pathOf(const std::string& name) const;
  StorageResult<void> checkRoot() const;
  // Creates the folders between the root and `path`'s parent.
  StorageResult<void> createParents(const std::string& name) const;
  // Opens the object for reading: kNotFound when it is missing or not a regular file.
  StorageResult<int> openObject(const std::string& name) const;
  std::string subject(const std::string& name) const;

  std::filesystem::path root_;
};

}  // namespace rtable::backup
