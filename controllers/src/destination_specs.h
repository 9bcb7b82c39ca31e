// Backup locations in a spec (private): a ClusterBackup's destination.s3 and
// destination.persistentVolumeClaim and a ReplicatedTable's restoreFrom.s3 and
// restoreFrom.persistentVolumeClaim share one schema and one reader each.
#pragma once

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "rtable/controllers/backup_specs.h"

namespace rtable::controllers {

// Reads the object at `path`; a bad field throws detail::SpecFailure naming it (json_fields.h).
BackupDestination::S3 parseS3(const nlohmann::json& value, const std::string& path);
// A Secret's name: a DNS-1123 subdomain (the CRDs' pattern).
const std::regex& secretNamePattern();
// Written back with the defaults filled in; parseS3(s3Json(x)) == x.
nlohmann::json s3Json(const BackupDestination::S3& s3);

// A claim's name: a DNS-1123 subdomain. Its subPath stays inside the volume: directory names
// joined by '/' (no '.', '..' or empty component), as rtable-core checks again.
BackupDestination::PersistentVolumeClaim parseVolumeClaim(const nlohmann::json& value,
                                                          const std::string& path);
nlohmann::json volumeClaimJson(const BackupDestination::PersistentVolumeClaim& claim);

}  // namespace rtable::controllers
