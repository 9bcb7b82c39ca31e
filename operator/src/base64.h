// Standard base64 (RFC 4648 with padding), as kubeconfig *-data fields use it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rtable::op {

// Skips CR, LF and spaces (as Go's decoder skips line breaks). nullopt on any other bad input.
std::optional<std::string> base64Decode(std::string_view text);
std::string base64Encode(std::string_view bytes);

}  // namespace rtable::op
