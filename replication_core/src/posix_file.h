// File descriptors for writing durable files: close and fsync with their errors as values, EINTR
// retried. Private to replication_core (part_format.cpp, part_exchange.cpp, table_replica.cpp).
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <expected>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

namespace rtable::core {

inline std::string errnoText(int error) { return std::generic_category().message(error); }

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }
  // close(2)'s own error matters for files just written (a deferred write error).
  std::expected<void, std::string> close() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return std::unexpected(fmt::format("close failed: {}", errnoText(errno)));
    return {};
  }

 private:
  int fd_;
};

inline std::expected<Fd, std::string> openFd(const std::filesystem::path& path, int flags,
                                             mode_t mode = 0) {
  for (;;) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd >= 0) return Fd(fd);
    if (errno != EINTR) return std::unexpected(fmt::format("cannot open: {}", errnoText(errno)));
  }
}

inline std::expected<void, std::string> fsyncFd(int fd) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) return std::unexpected(fmt::format("fsync failed: {}", errnoText(errno)));
  }
  return {};
}

// Makes a directory's entries (created, renamed, removed files) durable.
inline std::expected<void, std::string> fsyncDirectory(const std::filesystem::path& dir) {
  auto fd = openFd(dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return std::unexpected(fmt::format("directory {}: {}", dir.string(), fd.error()));
  if (auto synced = fsyncFd(fd->get()); !synced) {
    return std::unexpected(fmt::format("directory {}: {}", dir.string(), synced.error()));
  }
  return {};
}

// Makes everything written to the file system holding `dir` durable (syncfs).
inline std::expected<void, std::string> syncFileSystem(const std::filesystem::path& dir) {
  auto fd = openFd(dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return std::unexpected(fmt::format("{}: {}", dir.string(), fd.error()));
  if (::syncfs(fd->get()) != 0) {
    return std::unexpected(fmt::format("syncfs of {} failed: {}", dir.string(), errnoText(errno)));
  }
  return {};
}

}  // namespace rtable::core
