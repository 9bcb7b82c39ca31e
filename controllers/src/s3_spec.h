// An S3 location in a spec (private): a ClusterBackup's destination.s3 and a ReplicatedTable's
// restoreFrom.s3 share one schema and one reader.
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

}  // namespace rtable::controllers
