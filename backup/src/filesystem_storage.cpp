#include "rtable/backup/filesystem_storage.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "local_files.h"
#include "rtable/common/quoted_excerpt.h"

namespace rtable::backup {
namespace {

using Kind = StorageError::Kind;

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

LocalError lastError(std::string_view call, const std::filesystem::path& path) {
  return LocalError{errno, fmt::format("{} {}", call, path.string())};
}

}  // namespace

std::string FilesystemStorage::subject(const std::string& name) const {
  return (root_ / name).string();
}

StorageResult<void> FilesystemStorage::checkRoot() const {
  struct stat st{};
  if (::stat(root_.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return std::unexpected(StorageError{
          Kind::kNoBucket,
          fmt::format("{}: the backup directory does not exist (it is never created by rtable: "
                      "check the volume or path): {}",
                      root_.string(), std::strerror(err))});
    }
    return std::unexpected(
        storageErrorOf(root_.string(), LocalError{err, "stat " + root_.string()}));
  }
  if (!S_ISDIR(st.st_mode)) {
    return std::unexpected(
        StorageError{Kind::kNoBucket,
                     fmt::format("{}: the backup location is not a directory", root_.string())});
  }
  return {};
}

StorageResult<std::filesystem::path> FilesystemStorage::pathOf(const std::string& name) const {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(
        StorageError{Kind::kOther, fmt::format("{}: refused the object name {}: {}", root_.string(),
                                               common::quotedExcerpt(name), *problem)});
  }
  if (auto root = checkRoot(); !root) return std::unexpected(root.error());
  return root_ / name;
}

StorageResult<void> FilesystemStorage::createParents(const std::string& name) const {
  // One component at a time from the root, which exists: mkdir, and fsync the folder that got
  // the new entry, so that the object's path survives a crash with the object.
  std::filesystem::path dir = root_;
  for (std::size_t start = 0, slash; (slash = name.find('/', start)) != std::string::npos;
       start = slash + 1) {
    const std::filesystem::path parent = dir;
    dir /= name.substr(start, slash - start);
    if (::mkdir(dir.c_str(), 0755) == 0) {
      if (auto synced = syncDirectory(parent); !synced) {
        return std::unexpected(storageErrorOf(subject(name), synced.error()));
      }
    } else if (errno != EEXIST) {
      return std::unexpected(storageErrorOf(subject(name), lastError("mkdir", dir)));
    }
  }
  return {};
}

StorageResult<int> FilesystemStorage::openObject(const std::string& name) const {
  auto path = pathOf(name);
  if (!path) return std::unexpected(path.error());
  const int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return std::unexpected(
          StorageError{Kind::kNotFound, fmt::format("{}: no such object", subject(name))});
    }
    return std::unexpected(storageErrorOf(subject(name), lastError("open", *path)));
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    // A folder (the parent of other objects) is no object.
    return std::unexpected(StorageError{
        Kind::kNotFound, fmt::format("{}: no such object (a directory)", subject(name))});
  }
  return fd;
}

StorageResult<std::optional<uint64_t>> FilesystemStorage::size(const std::string& name) {
  auto path = pathOf(name);
  if (!path) return std::unexpected(path.error());
  struct stat st{};
  if (::stat(path->c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    return std::unexpected(storageErrorOf(subject(name), lastError("stat", *path)));
  }
  if (!S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

namespace {

// Writes an object through AtomicFile: the parents, the temporary file, `fill`, the rename.
StorageResult<void> putAtomically(const std::string& subject, const std::filesystem::path& path,
                                  const std::function<LocalResult(AtomicFile&)>& fill) {
  auto file = AtomicFile::create(path);
  if (!file) return std::unexpected(storageErrorOf(subject, file.error()));
  if (auto filled = fill(*file); !filled) {
    return std::unexpected(storageErrorOf(subject, filled.error()));
  }
  if (auto committed = file->commit(); !committed) {
    return std::unexpected(storageErrorOf(subject, committed.error()));
  }
  return {};
}

}  // namespace

StorageResult<void> FilesystemStorage::putFile(const std::string& name,
                                               const std::filesystem::path& source) {
  auto path = pathOf(name);
  if (!path) return std::unexpected(path.error());
  const int fd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::unexpected(storageErrorOf(subject(name), lastError("open", source)));
  FdCloser closer(fd);
  if (auto parents = createParents(name); !parents) return parents;
  return putAtomically(subject(name), *path,
                       [&](AtomicFile& file) { return copyInto(fd, source, file); });
}

StorageResult<void> FilesystemStorage::putBytes(const std::string& name, std::string_view bytes) {
  auto path = pathOf(name);
  if (!path) return std::unexpected(path.error());
  if (auto parents = createParents(name); !parents) return parents;
  return putAtomically(subject(name), *path, [&](AtomicFile& file) { return file.write(bytes); });
}

StorageResult<std::string> FilesystemStorage::read(const std::string& name) {
  auto fd = openObject(name);
  if (!fd) return std::unexpected(fd.error());
  FdCloser closer(*fd);
  auto bytes = readAll(*fd, root_ / name);
  if (!bytes) return std::unexpected(storageErrorOf(subject(name), bytes.error()));
  return std::move(*bytes);
}

StorageResult<void> FilesystemStorage::readToFile(const std::string& name,
                                                  const std::filesystem::path& target) {
  auto fd = openObject(name);
  if (!fd) return std::unexpected(fd.error());
  FdCloser closer(*fd);
  return putAtomically(subject(name), target,
                       [&](AtomicFile& file) { return copyInto(*fd, root_ / name, file); });
}

StorageResult<std::vector<std::string>> FilesystemStorage::list(const std::string& prefix) {
  if (auto problem = listPrefixProblem(prefix)) {
    return std::unexpected(
        StorageError{Kind::kOther, fmt::format("{}: refused the list prefix {}: {}", root_.string(),
                                               common::quotedExcerpt(prefix), *problem)});
  }
  if (auto root = checkRoot(); !root) return std::unexpected(root.error());
  // Only the folder the prefix's complete components name is walked: "data/3f" walks data/.
  const std::string folder = prefix.substr(0, prefix.rfind('/') + 1);
  const std::filesystem::path start = root_ / folder;
  std::vector<std::string> names;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(start, ec);
  if (ec) {
    if (ec.value() == ENOENT || ec.value() == ENOTDIR) return names;
    return std::unexpected(
        storageErrorOf(fmt::format("{} (list {})", root_.string(), common::quotedExcerpt(prefix)),
                       LocalError{ec.value(), "open " + start.string()}));
  }
  for (const std::filesystem::recursive_directory_iterator end; it != end; it.increment(ec)) {
    if (ec) break;
    const auto& entry = *it;
    const std::string filename = entry.path().filename().string();
    if (filename.starts_with(kTemporaryNamePrefix)) {
      if (entry.is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!entry.is_regular_file(ec) || entry.is_symlink(ec)) continue;
    std::string name = folder + entry.path().lexically_relative(start).generic_string();
    if (name.starts_with(prefix)) names.push_back(std::move(name));
  }
  if (ec) {
    return std::unexpected(
        storageErrorOf(fmt::format("{} (list {})", root_.string(), common::quotedExcerpt(prefix)),
                       LocalError{ec.value(), "read the directories under " + start.string()}));
  }
  std::sort(names.begin(), names.end());
  return names;
}

StorageResult<void> FilesystemStorage::remove(const std::string& name) {
  auto path = pathOf(name);
  if (!path) return std::unexpected(path.error());
  if (::unlink(path->c_str()) != 0) {
    // Missing, or a folder (no object): nothing to remove.
    if (errno == ENOENT || errno == ENOTDIR || errno == EISDIR) return {};
    return std::unexpected(storageErrorOf(subject(name), lastError("unlink", *path)));
  }
  if (auto synced = syncDirectory(path->parent_path()); !synced) {
    return std::unexpected(storageErrorOf(subject(name), synced.error()));
  }
  return {};
}

}  // namespace rtable::backup
