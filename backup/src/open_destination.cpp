#include "rtable/backup/open_destination.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <string>

#include "rtable/backup/filesystem_storage.h"
#include "rtable/backup/s3_storage.h"

namespace rtable::backup {
namespace {

namespace fs = std::filesystem;

StorageError denied(std::string message) {
  return StorageError{StorageError::Kind::kAccessDenied, std::move(message)};
}

// A Secret's name or key as one path component: the names come from ZooKeeper, and a file outside
// the credentials directory must never be read.
bool plainComponent(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

// A key's value as mounted: trailing whitespace dropped (a Secret made from `echo` output ends in a
// newline, which no credential holds).
StorageResult<std::string> readKey(const fs::path& dir, const std::string& secret,
                                   const std::string& key) {
  if (!plainComponent(key)) {
    return std::unexpected(denied(fmt::format("Secret {}: '{}' is not a key name", secret, key)));
  }
  const fs::path file = dir / key;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return std::unexpected(
        denied(fmt::format("the S3 credentials are not mounted on this replica: no file {} "
                           "(the Secret {} needs a key '{}', and the table must list the Secret "
                           "in spec.backupCredentials)",
                           file.string(), secret, key)));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  std::string value = bytes.str();
  while (!value.empty() && (value.back() == '\n' || value.back() == '\r' || value.back() == ' ' ||
                            value.back() == '\t')) {
    value.pop_back();
  }
  if (value.empty()) {
    return std::unexpected(
        denied(fmt::format("Secret {}: key '{}' is empty ({})", secret, key, file.string())));
  }
  return value;
}

// A claim's directory: the claim's root must be mounted (an unmounted path would put the backup on
// the pod's own filesystem, lost with it); the directory inside it is made, as a subPath is.
StorageResult<std::unique_ptr<BackupStorage>> openVolume(const DestinationRef& destination,
                                                         const fs::path& volumes_dir) {
  if (!plainComponent(destination.claim_name)) {
    return std::unexpected(StorageError{
        StorageError::Kind::kOther,
        fmt::format("'{}' is not a PersistentVolumeClaim's name", destination.claim_name)});
  }
  if (auto problem = volumePathProblem(destination.path)) {
    return std::unexpected(StorageError{
        StorageError::Kind::kOther,
        fmt::format("{}: '{}' {}", destination.location(), destination.path, *problem)});
  }
  const fs::path root = volumes_dir / destination.claim_name;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return std::unexpected(StorageError{
        StorageError::Kind::kNoBucket,
        fmt::format("the PersistentVolumeClaim {} is not mounted on this replica: no directory {} "
                    "(the table must list the claim in spec.backupVolumes)",
                    destination.claim_name, root.string())});
  }
  fs::path dir = root;
  if (!destination.path.empty()) {
    dir /= destination.path;
    fs::create_directories(dir, ec);
    if (ec) {
      return std::unexpected(
          StorageError{ec == std::errc::no_space_on_device  ? StorageError::Kind::kNoSpace
                       : ec == std::errc::permission_denied ? StorageError::Kind::kAccessDenied
                                                            : StorageError::Kind::kOther,
                       fmt::format("{}: cannot make {}: {}", destination.location(), dir.string(),
                                   ec.message())});
    }
  }
  return std::make_unique<FilesystemStorage>(dir);
}

}  // namespace

StorageResult<std::unique_ptr<BackupStorage>> openDestination(const DestinationRef& destination,
                                                              const ReplicaMounts& mounts) {
  if (destination.kind == DestinationRef::Kind::kFilesystem) {
    return std::make_unique<FilesystemStorage>(destination.path);
  }
  if (destination.kind == DestinationRef::Kind::kVolume) {
    return openVolume(destination, mounts.volumes_dir);
  }
  if (destination.credentials_secret.empty()) {
    return std::unexpected(denied(fmt::format(
        "{}: no credentials Secret is named (spec.destination.s3.credentials.secretName)",
        destination.location())));
  }
  if (!plainComponent(destination.credentials_secret)) {
    return std::unexpected(
        denied(fmt::format("'{}' is not a Secret's name", destination.credentials_secret)));
  }
  const fs::path dir = mounts.credentials_dir / destination.credentials_secret;
  S3StorageOptions options;
  options.endpoint = destination.endpoint;
  options.bucket = destination.bucket;
  options.prefix = destination.prefix;
  if (!destination.region.empty()) options.region = destination.region;
  auto access_key = readKey(dir, destination.credentials_secret, destination.access_key_id_key);
  if (!access_key) return std::unexpected(access_key.error());
  auto secret_key = readKey(dir, destination.credentials_secret, destination.secret_access_key_key);
  if (!secret_key) return std::unexpected(secret_key.error());
  options.access_key = std::move(*access_key);
  options.secret_key = std::move(*secret_key);
  auto storage = S3Storage::create(std::move(options));
  if (!storage) return std::unexpected(storage.error());
  return std::unique_ptr<BackupStorage>(std::move(*storage));
}

}  // namespace rtable::backup
