// BackupStorage: where a backup's files go (DESIGN.md 2.7): a directory every replica mounts (a
// PersistentVolumeClaim or a shared path) or an S3-compatible bucket. Names are relative keys with
// '/' separators ("data/3f/3f0a...-4096", "backups/<name>/manifest.json"); the same name means the
// same object on every replica.
//
// Contract every implementation keeps (one conformance suite holds the filesystem, the S3 and the
// in-memory side to it):
//   - a put is atomic: a reader sees the whole new object or none (never a prefix), so a backup
//     that died half-way leaves no object that looks complete;
//   - a put of an existing name replaces it; remove of a missing name succeeds;
//   - list(prefix) returns every name that starts with `prefix`, sorted (bytewise, as S3 does);
//   - a name objectNameProblem() refuses is a kOther error, and nothing is read or written;
//   - errors are values whose kind says what a user must fix (credentials, bucket, space) and
//     whose message names the object and the cause.
//
// Thread safety: every method may be called from several threads at once.
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::backup {

struct StorageError {
  enum class Kind {
    kNotFound,      // the object (read) does not exist
    kAccessDenied,  // credentials refused, or no permission on the path
    kNoBucket,      // the bucket (or the destination's root directory) does not exist
    kNoSpace,       // the volume or the quota is full
    kUnavailable,   // connection refused, timeout, 5xx: may succeed later (callers retry)
    kCorrupt,       // what was read is not what was written (size or checksum mismatch)
    kOther,
  };
  Kind kind = Kind::kOther;
  std::string message;  // "s3://bkt/pfx/data/3f/...: 403 SignatureDoesNotMatch: ..."
};
std::string_view storageErrorKindName(StorageError::Kind kind);  // "AccessDenied", ...

// Why `name` cannot be an object's name, or nullopt when it can. A name is relative and
// '/'-separated; its components are non-empty and neither "." nor "..", and none starts with
// ".tmp-" (the temporary names of puts in flight, which list() never returns); it holds no control
// character (bytes 0-31 and 127, which S3's XML listings cannot carry) and no backslash (which
// SeaweedFS stores as '/'), and is at most 1024 bytes (S3's key limit). Every implementation
// refuses such a name with kOther and touches nothing, so a name can never reach outside the
// destination.
std::optional<std::string> objectNameProblem(std::string_view name);
// The same for list()'s `prefix`, which may also be empty, end with '/' or end inside a component.
std::optional<std::string> listPrefixProblem(std::string_view prefix);
// The prefix of temporary names (see objectNameProblem).
inline constexpr std::string_view kTemporaryNamePrefix = ".tmp-";

template <class T>
using StorageResult = std::expected<T, StorageError>;

class BackupStorage {
 public:
  virtual ~BackupStorage() = default;

  // Where it is, for status and messages: "/backups/events" or "s3://bucket/prefix".
  virtual std::string location() const = 0;

  // The object's size, or nullopt when it does not exist.
  virtual StorageResult<std::optional<uint64_t>> size(const std::string& name) = 0;
  // Writes the object from a local file / from memory, atomically.
  virtual StorageResult<void> putFile(const std::string& name,
                                      const std::filesystem::path& source) = 0;
  virtual StorageResult<void> putBytes(const std::string& name, std::string_view bytes) = 0;
  // The whole object (kNotFound when missing).
  virtual StorageResult<std::string> read(const std::string& name) = 0;
  // The object into a local file, which is created or replaced (kNotFound when missing).
  virtual StorageResult<void> readToFile(const std::string& name,
                                         const std::filesystem::path& target) = 0;
  // Every name starting with `prefix`, sorted.
  virtual StorageResult<std::vector<std::string>> list(const std::string& prefix) = 0;
  virtual StorageResult<void> remove(const std::string& name) = 0;
};

}  // namespace rtable::backup
