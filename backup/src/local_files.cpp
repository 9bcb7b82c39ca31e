#include "local_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

namespace rtable::backup {
namespace {

LocalError errorOf(std::string_view call, const std::filesystem::path& path) {
  return LocalError{errno, fmt::format("{} {}", call, path.string())};
}

// write(2) until every byte is written (it may write less, and EINTR).
LocalResult writeFully(int fd, std::string_view bytes, const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errorOf("write", path));
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

}  // namespace

StorageError::Kind kindOfErrno(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return StorageError::Kind::kNoSpace;
    case EACCES:
    case EPERM:
    case EROFS:
      return StorageError::Kind::kAccessDenied;
    // An NFS or other network mount that lost its server.
    case ETIMEDOUT:
    case ESTALE:
    case ENOTCONN:
    case EHOSTDOWN:
    case EHOSTUNREACH:
      return StorageError::Kind::kUnavailable;
    default:
      return StorageError::Kind::kOther;
  }
}

StorageError storageErrorOf(std::string_view subject, const LocalError& error) {
  return StorageError{kindOfErrno(error.err),
                      fmt::format("{}: {}: {}", subject, error.what, std::strerror(error.err))};
}

std::string temporaryNameFor() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  return fmt::format("{}{:016x}", kTemporaryNamePrefix, random());
}

LocalResult syncDirectory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return std::unexpected(errorOf("open", dir));
  const bool synced = ::fsync(fd) == 0;
  LocalError error = synced ? LocalError{} : errorOf("fsync", dir);
  ::close(fd);
  if (!synced) return std::unexpected(std::move(error));
  return {};
}

std::expected<AtomicFile, LocalError> AtomicFile::create(std::filesystem::path target) {
  // O_EXCL: a random name that happens to exist is never shared with another put.
  for (int attempt = 0;; ++attempt) {
    auto temporary = target.parent_path() / temporaryNameFor();
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return AtomicFile(std::move(target), std::move(temporary), fd);
    if (errno != EEXIST || attempt == 3) return std::unexpected(errorOf("create", temporary));
  }
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : target_(std::move(other.target_)),
      temporary_(std::move(other.temporary_)),
      fd_(std::exchange(other.fd_, -1)),
      committed_(std::exchange(other.committed_, true)) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

LocalResult AtomicFile::write(std::string_view bytes) {
  return writeFully(fd_, bytes, temporary_);
}

LocalResult AtomicFile::truncate() {
  if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0) {
    return std::unexpected(errorOf("truncate", temporary_));
  }
  return {};
}

LocalResult AtomicFile::commit() {
  // Data before name: without the fsync a crash after the rename could leave `target` empty.
  if (::fsync(fd_) != 0) return std::unexpected(errorOf("fsync", temporary_));
  const int fd = std::exchange(fd_, -1);
  // close(2) reports deferred write errors on some file systems (NFS).
  if (::close(fd) != 0) return std::unexpected(errorOf("close", temporary_));
  if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
    return std::unexpected(
        LocalError{errno, fmt::format("rename {} to {}", temporary_.string(), target_.string())});
  }
  committed_ = true;
  return syncDirectory(target_.parent_path());
}

std::expected<std::string, LocalError> readAll(int fd, const std::filesystem::path& path) {
  std::string bytes;
  struct stat st{};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<std::size_t>(st.st_size));
  char buffer[64 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errorOf("read", path));
    }
    if (n == 0) return bytes;
    bytes.append(buffer, static_cast<std::size_t>(n));
  }
}

LocalResult copyInto(int from, const std::filesystem::path& from_path, AtomicFile& to) {
  // In the kernel when it can (as `cp` does): no trip of every byte through user space, about
  // three times as fast as read and write here. A file system that cannot (EXDEV on older
  // kernels, EINVAL, EOPNOTSUPP, ENOSYS) is copied by read and write, from where it stopped.
  for (;;) {
    const ssize_t n = ::copy_file_range(from, nullptr, to.fd_, nullptr, std::size_t{1} << 26, 0);
    if (n > 0) continue;
    if (n == 0) return {};
    if (errno == EINTR) continue;
    if (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS) break;
    if (errno == EBADF || errno == EIO || errno == ENOSPC || errno == EDQUOT) {
      return std::unexpected(
          LocalError{errno, fmt::format("copy_file_range {} to {}", from_path.string(),
                                        to.temporaryPath().string())});
    }
    break;  // anything else: the plain copy names the call that fails, if one does
  }
  std::string buffer(1 << 20, '\0');
  while (true) {
    const ssize_t n = ::read(from, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errorOf("read", from_path));
    }
    if (n == 0) return {};
    if (auto written = to.write(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
        !written) {
      return written;
    }
  }
}

}  // namespace rtable::backup
