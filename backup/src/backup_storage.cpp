#include "rtable/backup/backup_storage.h"

#include <fmt/format.h>

namespace rtable::backup {
namespace {

// S3's limit on a key's length in bytes (the storage's own prefix comes on top).
constexpr std::size_t kMaxNameBytes = 1024;

// The problem of one complete component (one followed by '/', or the last of a name).
std::optional<std::string> componentProblem(std::string_view component) {
  if (component.empty()) return "it has an empty component (a leading, doubled or final '/')";
  if (component == "." || component == "..") {
    return fmt::format("it has a '{}' component", component);
  }
  if (component.starts_with(kTemporaryNamePrefix)) {
    return fmt::format("a component starts with '{}', which marks temporary names",
                       kTemporaryNamePrefix);
  }
  return std::nullopt;
}

std::optional<std::string> characterProblem(std::string_view text) {
  if (text.size() > kMaxNameBytes) {
    return fmt::format("it is {} bytes long, over the limit of {}", text.size(), kMaxNameBytes);
  }
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) return fmt::format("it holds the control character {:#04x}", c);
    if (c == '\\') return "it holds a backslash, which some S3 servers (SeaweedFS) turn into '/'";
  }
  return std::nullopt;
}

}  // namespace

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

std::optional<std::string> objectNameProblem(std::string_view name) {
  if (name.empty()) return "it is empty";
  if (auto problem = characterProblem(name)) return problem;
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = name.find('/', start);
    const std::string_view component = name.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (auto problem = componentProblem(component)) return problem;
    if (slash == std::string_view::npos) return std::nullopt;
    start = slash + 1;
  }
}

std::optional<std::string> listPrefixProblem(std::string_view prefix) {
  if (auto problem = characterProblem(prefix)) return problem;
  // Every component the prefix completes (those before a '/') must be one a name can have; what
  // follows the last '/' is the start of a component and may be anything (even "" or ".").
  std::size_t start = 0;
  for (std::size_t slash; (slash = prefix.find('/', start)) != std::string_view::npos;
       start = slash + 1) {
    if (auto problem = componentProblem(prefix.substr(start, slash - start))) return problem;
  }
  return std::nullopt;
}

}  // namespace rtable::backup
