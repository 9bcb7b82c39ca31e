#include "rtable/backup/backup_storage.h"

namespace rtable::backup {

std::string_view storageErrorKindName(StorageError::Kind kind) {
  switch (kind) {
    case StorageError::Kind::kNotFound:
      return "NotFound";
    case StorageError::Kind::kAccessDenied:
      return "AccessDenied";
    case StorageError::Kind::kNoBucket:
      return "NoBucket";
    case StorageError::Kind::kNoSpace:
      return "NoSpace";
    case StorageError::Kind::kUnavailable:
      return "Unavailable";
    case StorageError::Kind::kCorrupt:
      return "Corrupt";
    case StorageError::Kind::kOther:
      return "Other";
  }
  return "Other";
}

}  // namespace rtable::backup
