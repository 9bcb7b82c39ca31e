// A destination as JSON, shared by the protocol objects that name one (BackupOperation, the
// restore request); the error names the field under `where` ("destination.").
#pragma once

#include <expected>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "rtable/backup/backup_operation.h"

namespace rtable::backup {

nlohmann::json destinationToJson(const DestinationRef& destination);
std::expected<DestinationRef, std::string> destinationFromJson(const nlohmann::json& doc,
                                                               std::string_view where);

}  // namespace rtable::backup
