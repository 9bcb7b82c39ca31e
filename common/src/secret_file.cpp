#include "rtable/common/secret_file.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <fstream>
#include <sstream>

namespace rtable::common {

std::expected<std::string, std::string> readSecretFile(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in) return std::unexpected(fmt::format("cannot read '{}'", file.string()));
  std::string secret = text.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return std::unexpected(fmt::format("'{}' is empty", file.string()));
  return secret;
}

bool secretsEqual(std::string_view expected, std::string_view presented) {
  if (expected.empty() || expected.size() != presented.size()) return false;
  return CRYPTO_memcmp(expected.data(), presented.data(), expected.size()) == 0;
}

}  // namespace rtable::common
