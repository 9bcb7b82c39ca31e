#include "rtable/backup/testing/fake_storage.h"

#include <fmt/format.h>

#include <cerrno>
#include <fstream>
#include <random>

#include "rtable/common/quoted_excerpt.h"

namespace rtable::backup::testing {
namespace {

using Kind = StorageError::Kind;

// The kinds FilesystemStorage gives the same errno values (local_files.cpp).
Kind kindOf(const std::error_code& ec) {
  switch (ec.value()) {
    case ENOSPC:
    case EDQUOT:
      return Kind::kNoSpace;
    case EACCES:
    case EPERM:
    case EROFS:
      return Kind::kAccessDenied;
    default:
      return Kind::kOther;
  }
}

StorageError localError(const std::string& subject, std::string_view what,
                        const std::filesystem::path& path, const std::error_code& ec) {
  return StorageError{kindOf(ec),
                      fmt::format("{}: {} {}: {}", subject, what, path.string(), ec.message())};
}

}  // namespace

StorageResult<void> FakeStorage::checkName(const std::string& name) const {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(
        StorageError{Kind::kOther, fmt::format("{}: refused the object name {}: {}", location_,
                                               common::quotedExcerpt(name), *problem)});
  }
  return {};
}

StorageResult<std::optional<uint64_t>> FakeStorage::size(const std::string& name) {
  if (auto checked = checkName(name); !checked) return std::unexpected(checked.error());
  std::lock_guard lock(mutex_);
  auto it = objects_.find(name);
  if (it == objects_.end()) return std::nullopt;
  return it->second.size();
}

StorageResult<void> FakeStorage::putFile(const std::string& name,
                                         const std::filesystem::path& source) {
  if (auto checked = checkName(name); !checked) return checked;
  std::ifstream in(source, std::ios::binary);
  if (!in) {
    return std::unexpected(
        localError(location_ + "/" + name, "open", source,
                   std::error_code(errno ? errno : ENOENT, std::generic_category())));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return std::unexpected(localError(location_ + "/" + name, "read", source,
                                      std::error_code(EIO, std::generic_category())));
  }
  return putBytes(name, bytes);
}

StorageResult<void> FakeStorage::putBytes(const std::string& name, std::string_view bytes) {
  if (auto checked = checkName(name); !checked) return checked;
  std::lock_guard lock(mutex_);
  objects_[name] = std::string(bytes);
  return {};
}

StorageResult<std::string> FakeStorage::read(const std::string& name) {
  if (auto checked = checkName(name); !checked) return std::unexpected(checked.error());
  std::lock_guard lock(mutex_);
  auto it = objects_.find(name);
  if (it == objects_.end()) {
    return std::unexpected(
        StorageError{Kind::kNotFound, fmt::format("{}/{}: no such object", location_, name)});
  }
  return it->second;
}

StorageResult<void> FakeStorage::readToFile(const std::string& name,
                                            const std::filesystem::path& target) {
  auto bytes = read(name);
  if (!bytes) return std::unexpected(bytes.error());
  const std::string subject = location_ + "/" + name;
  thread_local std::mt19937_64 random{std::random_device{}()};
  const auto temporary =
      target.parent_path() / fmt::format("{}{:016x}", kTemporaryNamePrefix, random());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.close();
    if (!out) {
      const std::error_code ec(errno ? errno : EIO, std::generic_category());
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      return std::unexpected(localError(subject, "write", temporary, ec));
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, target, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    return std::unexpected(
        StorageError{kindOf(ec), fmt::format("{}: rename {} to {}: {}", subject, temporary.string(),
                                             target.string(), ec.message())});
  }
  return {};
}

StorageResult<std::vector<std::string>> FakeStorage::list(const std::string& prefix) {
  if (auto problem = listPrefixProblem(prefix)) {
    return std::unexpected(
        StorageError{Kind::kOther, fmt::format("{}: refused the list prefix {}: {}", location_,
                                               common::quotedExcerpt(prefix), *problem)});
  }
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && it->first.starts_with(prefix); ++it) {
    names.push_back(it->first);
  }
  return names;
}

StorageResult<void> FakeStorage::remove(const std::string& name) {
  if (auto checked = checkName(name); !checked) return checked;
  std::lock_guard lock(mutex_);
  objects_.erase(name);
  return {};
}

}  // namespace rtable::backup::testing
