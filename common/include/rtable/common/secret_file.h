// A secret read from a file: a mounted Kubernetes Secret's key, or a file a user wrote.
#pragma once

#include <expected>
#include <filesystem>
#include <string>

namespace rtable::common {

// The file's content without its trailing line breaks (a Secret's file often ends with one that
// is not part of the secret). Errors: "cannot read '<file>'", "'<file>' is empty".
std::expected<std::string, std::string> readSecretFile(const std::filesystem::path& file);

}  // namespace rtable::common
