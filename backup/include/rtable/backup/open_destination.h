// openDestination: the storage a DestinationRef names, opened as a replica opens it. A filesystem
// destination is its directory. A volume destination is a directory inside the replica's mount of
// the PersistentVolumeClaim it names, <volumes_dir>/<claim>/<path> (ReplicatedTable
// spec.backupVolumes lists the claims a table's pods mount). An S3 destination takes its
// credentials from the replica's mount of the Secret it names: <credentials_dir>/<secret>/<key>,
// one file per key, as Kubernetes mounts a Secret volume (ReplicatedTable spec.backupCredentials
// lists the Secrets a table's pods mount). The files are read at each open, so a rotated Secret is
// used from the next backup on.
//
// Thread safety: a free function; the storage it returns is as thread-safe as its class.
#pragma once

#include <filesystem>
#include <memory>
#include <string_view>

#include "rtable/backup/backup_operation.h"
#include "rtable/backup/backup_storage.h"

namespace rtable::backup {

// Where rtable-core looks for mounted credentials unless told otherwise (--backup-credentials-dir).
inline constexpr std::string_view kDefaultCredentialsDir = "/etc/rtable/backup-credentials";
// Where rtable-core looks for mounted backup claims (--backup-volumes-dir).
inline constexpr std::string_view kDefaultVolumesDir = "/var/lib/rtable-backup-volumes";

// Where this replica finds what its pod mounts for backups.
struct ReplicaMounts {
  std::filesystem::path credentials_dir{kDefaultCredentialsDir};  // <dir>/<secret>/<key>
  std::filesystem::path volumes_dir{kDefaultVolumesDir};          // <dir>/<claim>/
};

// Errors: kAccessDenied when the Secret is not mounted here or a key's file is missing or empty
// (the message names the file and what to change); kNoBucket when a claim is not mounted here;
// kOther for a name or path that would leave its mount, or an S3 option S3Storage refuses.
StorageResult<std::unique_ptr<BackupStorage>> openDestination(const DestinationRef& destination,
                                                              const ReplicaMounts& mounts);

}  // namespace rtable::backup
