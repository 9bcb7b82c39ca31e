// The core's one layer over the file system calls that make parts durable: open, write, fsync,
// fdatasync, syncfs, rename and mkdir, with their errors as values and EINTR retried. Every call
// asks the fail points first (fail_points.h), so a test can fail any of them as a full or broken
// disk would. Private to replication_core.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <expected>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "rtable/replication_core/fail_points.h"

namespace rtable::core {

inline std::string errnoText(int error) {
  return std::generic_category().message(error);
}

// Whether a file error (as this layer words it) is a full file system or an exceeded quota: what
// an operator frees space for, not a bug. File errors are text on their way up; this is the one
// place that reads them back.
inline bool isOutOfSpace(std::string_view message) {
  return message.find(errnoText(ENOSPC)) != std::string_view::npos ||
         message.find(errnoText(EDQUOT)) != std::string_view::npos;
}

// An open file and the path it was opened by (for errors and fail points).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd, std::string path = "") : fd_(fd), path_(std::move(path)) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    std::swap(path_, other.path_);
    return *this;
  }
  int get() const { return fd_; }
  const std::string& path() const { return path_; }
  // close(2)'s own error matters for files just written (a deferred write error).
  std::expected<void, std::string> close() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return std::unexpected(fmt::format("close failed: {}", errnoText(errno)));
    return {};
  }

 private:
  int fd_ = -1;
  std::string path_;
};

inline std::expected<Fd, std::string> openFd(const std::filesystem::path& path, int flags,
                                             mode_t mode = 0) {
  if (int error = faultFor(FailPoint::kOpen, path.native())) {
    return std::unexpected(fmt::format("cannot open: {}", errnoText(error)));
  }
  for (;;) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd >= 0) return Fd(fd, path.native());
    if (errno != EINTR) return std::unexpected(fmt::format("cannot open: {}", errnoText(errno)));
  }
}

// Writes all of `bytes` at the file's offset.
inline std::expected<void, std::string> writeAll(const Fd& fd, std::string_view bytes) {
  if (int error = faultFor(FailPoint::kWrite, fd.path())) {
    return std::unexpected(fmt::format("write failed: {}", errnoText(error)));
  }
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd.get(), bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::unexpected(fmt::format("write failed: {}", errnoText(errno)));
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Writes all of `bytes` at `offset`. `path`: the file's, for the fail points.
inline std::expected<void, std::string> pwriteAll(int fd, std::string_view path,
                                                  std::string_view bytes, uint64_t offset) {
  if (int error = faultFor(FailPoint::kWrite, path)) {
    return std::unexpected(fmt::format("write failed: {}", errnoText(error)));
  }
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::unexpected(fmt::format("write failed: {}", errnoText(errno)));
    bytes.remove_prefix(static_cast<std::size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return {};
}

inline std::expected<void, std::string> fsyncFd(const Fd& fd) {
  if (int error = faultFor(FailPoint::kFsync, fd.path())) {
    return std::unexpected(fmt::format("fsync failed: {}", errnoText(error)));
  }
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) return std::unexpected(fmt::format("fsync failed: {}", errnoText(errno)));
  }
  return {};
}

// `path`: the file's, for the fail points.
inline std::expected<void, std::string> fdatasyncFd(int fd, std::string_view path) {
  if (int error = faultFor(FailPoint::kFdatasync, path)) {
    return std::unexpected(fmt::format("fdatasync failed: {}", errnoText(error)));
  }
  while (::fdatasync(fd) != 0) {
    if (errno != EINTR)
      return std::unexpected(fmt::format("fdatasync failed: {}", errnoText(errno)));
  }
  return {};
}

// Makes a directory's entries (created, renamed, removed files) durable.
inline std::expected<void, std::string> fsyncDirectory(const std::filesystem::path& dir) {
  auto fd = openFd(dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return std::unexpected(fmt::format("directory {}: {}", dir.string(), fd.error()));
  if (auto synced = fsyncFd(*fd); !synced) {
    return std::unexpected(fmt::format("directory {}: {}", dir.string(), synced.error()));
  }
  return {};
}

// Makes everything written to the file system holding `dir` durable (syncfs). A failure means
// some write since the last syncfs may be lost, and a later syncfs that succeeds does not bring it
// back: whatever this one was to make durable must be written again.
inline std::expected<void, std::string> syncFileSystem(const std::filesystem::path& dir) {
  auto fd = openFd(dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return std::unexpected(fmt::format("{}: {}", dir.string(), fd.error()));
  int error = faultFor(FailPoint::kSyncfs, dir.native());
  if (error == 0 && ::syncfs(fd->get()) != 0) error = errno;
  if (error != 0)
    return std::unexpected(fmt::format("syncfs of {} failed: {}", dir.string(), errnoText(error)));
  return {};
}

// rename(2): replaces `to` if it is a file or an empty directory.
inline std::expected<void, std::string> renamePath(const std::filesystem::path& from,
                                                   const std::filesystem::path& to) {
  int error = faultFor(FailPoint::kRename, to.native());
  if (error == 0 && ::rename(from.c_str(), to.c_str()) != 0) error = errno;
  if (error != 0) {
    return std::unexpected(
        fmt::format("cannot rename {} to {}: {}", from.string(), to.string(), errnoText(error)));
  }
  return {};
}

// rename(2) that never replaces `to` (plain rename would replace an empty directory).
inline std::expected<void, std::string> renameNoReplace(const std::filesystem::path& from,
                                                        const std::filesystem::path& to) {
  int error = faultFor(FailPoint::kRename, to.native());
  if (error == 0) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return {};
    error = errno;
  }
  if (error == EINVAL || error == ENOSYS) {
    // A file system without RENAME_NOREPLACE. Check, then rename: a part directory is never
    // empty, so rename(2) itself refuses an existing part that appears in between (ENOTEMPTY).
    std::error_code ec;
    if (std::filesystem::exists(to, ec)) {
      error = EEXIST;
    } else if (::rename(from.c_str(), to.c_str()) == 0) {
      return {};
    } else {
      error = errno;
    }
  }
  return std::unexpected(fmt::format("cannot rename {} to {}: {}", from.string(), to.string(),
                                     error == ENOTEMPTY ? errnoText(EEXIST) : errnoText(error)));
}

// mkdir(2) of one directory: false (no error) when it exists already.
inline std::expected<bool, std::string> makeDirectory(const std::filesystem::path& dir) {
  int error = faultFor(FailPoint::kMkdir, dir.native());
  if (error == 0) {
    if (::mkdir(dir.c_str(), 0755) == 0) return true;
    error = errno;
  }
  if (error == EEXIST) return false;
  return std::unexpected(fmt::format("cannot create {}: {}", dir.string(), errnoText(error)));
}

// makeDirectory of `dir` and of every missing ancestor.
inline std::expected<void, std::string> makeDirectories(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return {};
  if (dir.has_parent_path() && dir.parent_path() != dir) {
    if (auto parent = makeDirectories(dir.parent_path()); !parent) return parent;
  }
  if (auto made = makeDirectory(dir); !made) return std::unexpected(made.error());
  return {};
}

}  // namespace rtable::core
