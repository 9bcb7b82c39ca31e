// Local file operations both storages share: errno sorted into StorageError kinds, and files
// written under a temporary name and renamed into place (FilesystemStorage's puts, the local
// targets of readToFile). Private to rtable::backup.
#pragma once

#include <expected>
#include <filesystem>
#include <string>
#include <string_view>

#include "rtable/backup/backup_storage.h"

namespace rtable::backup {

// A failed system call: which call on which path, and its errno.
struct LocalError {
  int err = 0;
  std::string what;  // "write /backups/events/.tmp-3fa2c1d0e9b84a67"
};
using LocalResult = std::expected<void, LocalError>;

// ENOSPC/EDQUOT -> kNoSpace, EACCES/EPERM/EROFS -> kAccessDenied, a network file system's
// transient errors (ETIMEDOUT, ESTALE, ...) -> kUnavailable, the rest -> kOther.
StorageError::Kind kindOfErrno(int err);
// "<subject>: <what>: <strerror>", of the kind kindOfErrno gives.
StorageError storageErrorOf(std::string_view subject, const LocalError& error);

// A fresh temporary file name for `target`'s folder: ".tmp-" and 16 random hex digits.
std::string temporaryNameFor();

// fsync of a directory, so that a rename or a new entry in it survives a crash.
LocalResult syncDirectory(const std::filesystem::path& dir);

// A new file written under a temporary name beside `target` and renamed over it by commit(), so
// that a reader of `target` sees the old file or the whole new one, never a prefix. Without
// commit() (an error, an early return) the destructor removes the temporary file.
// Thread safety: one thread at a time per object.
class AtomicFile {
 public:
  static std::expected<AtomicFile, LocalError> create(std::filesystem::path target);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();

  const std::filesystem::path& temporaryPath() const { return temporary_; }
  LocalResult write(std::string_view bytes);
  // Empties the file, for a download that starts again.
  LocalResult truncate();
  // fsync, close, rename over the target, fsync the target's directory.
  LocalResult commit();

 private:
  AtomicFile(std::filesystem::path target, std::filesystem::path temporary, int fd)
      : target_(std::move(target)), temporary_(std::move(temporary)), fd_(fd) {}

  friend LocalResult copyInto(int from, const std::filesystem::path& from_path, AtomicFile& to);

  std::filesystem::path target_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

// Reads the whole of an open file descriptor (`path` names it in errors).
std::expected<std::string, LocalError> readAll(int fd, const std::filesystem::path& path);

// Copies `from` (read to its end) into `to`.
LocalResult copyInto(int from, const std::filesystem::path& from_path, AtomicFile& to);

}  // namespace rtable::backup
