// Certificates for TLS tests, made by the openssl command line tool (Debian's openssl): a CA and
// a certificate it signs, written as cert-manager writes a Secret (tls.crt, tls.key, ca.crt), so
// that a test mounts or names the directory as a user names a cert-manager Secret.
#pragma once

#include <expected>
#include <filesystem>
#include <string>
#include <vector>

namespace rtable::common::testing {

// Into `dir` (created): tls.crt (EC P-256, valid one day) for `names`, each a DNS name or an IP
// address (its subjectAltName), tls.key, and ca.crt. The CA is a new one, its key left as ca.key,
// unless `signer` names a directory made before: then that CA signs (a renewal, or another
// replica of the same table) and its ca.crt is copied.
std::expected<void, std::string> makeTestCertificates(const std::filesystem::path& dir,
                                                      const std::vector<std::string>& names,
                                                      const std::filesystem::path& signer = {});

}  // namespace rtable::common::testing
