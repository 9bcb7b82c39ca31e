// A secret read from a file: a mounted Kubernetes Secret's key, or a file a user wrote.
#pragma once

#include <expected>
#include <filesystem>
#include <string>
#include <string_view>

namespace rtable::common {

// The file's content without its trailing line breaks (a Secret's file often ends with one that
// is not part of the secret). Errors: "cannot read '<file>'", "'<file>' is empty".
std::expected<std::string, std::string> readSecretFile(const std::filesystem::path& file);

// Whether `presented` is `expected`, in time that does not depend on where they differ (a
// token or secret compared byte by byte would leak its prefix to a timing client). An empty
// `expected` matches nothing.
bool secretsEqual(std::string_view expected, std::string_view presented);

}  // namespace rtable::common
