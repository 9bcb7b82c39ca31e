// Standard base64 (RFC 4648 section 4, with padding), as Kubernetes uses it: a Secret's data,
// kubeconfig's *-data fields, list continue tokens, etcd's JSON gateway. OpenSSL's
// EVP_EncodeBlock/EVP_DecodeBlock do the work; base64Decode adds what EVP_DecodeBlock leaves to
// its caller (padding, '=' in the middle). Pure functions: thread-safe.
#pragma once

#include <expected>
#include <string>
#include <string_view>

namespace rtable::common {

std::string base64Encode(std::string_view bytes);

// The bytes `text` encodes. CR, LF and spaces are skipped (kubeconfig files and YAML folding wrap
// long values). Any other byte outside the alphabet, '=' anywhere but as one or two final padding
// characters, or a length that is not a multiple of 4: an error saying which.
std::expected<std::string, std::string> base64Decode(std::string_view text);

}  // namespace rtable::common
