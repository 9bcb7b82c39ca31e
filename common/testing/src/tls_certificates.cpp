#include "rtable/common/testing/tls_certificates.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>

#include "rtable/common/testing/subprocess.h"

namespace rtable::common::testing {
namespace fs = std::filesystem;
namespace {

std::expected<void, std::string> openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto ran = runCommand(argv, std::chrono::seconds(30));
  if (!ran) return std::unexpected(ran.error());
  if (ran->exit_code != 0) {
    return std::unexpected(
        fmt::format("{} exited {}: {}", fmt::join(argv, " "), ran->exit_code, ran->out + ran->err));
  }
  return {};
}

bool isAddress(const std::string& name) {
  in6_addr address{};
  return inet_pton(AF_INET, name.c_str(), &address) == 1 ||
         inet_pton(AF_INET6, name.c_str(), &address) == 1;
}

}  // namespace

std::expected<void, std::string> makeTestCertificates(const fs::path& dir,
                                                      const std::vector<std::string>& names,
                                                      const fs::path& signer) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return std::unexpected(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  const fs::path ca = signer.empty() ? dir : signer;
  const std::vector<std::string> ec_key = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                                           "-nodes"};
  if (signer.empty()) {
    std::vector<std::string> args = {"req", "-x509"};
    args.insert(args.end(), ec_key.begin(), ec_key.end());
    args.insert(args.end(),
                {"-keyout", (dir / "ca.key").string(), "-out", (dir / "ca.crt").string(), "-days",
                 "1", "-subj", "/CN=rtable test CA " + dir.filename().string()});
    if (auto made = openssl(args); !made) return made;
  } else {
    fs::copy_file(signer / "ca.crt", dir / "ca.crt", fs::copy_options::overwrite_existing, ec);
    if (ec) return std::unexpected(fmt::format("cannot copy the CA: {}", ec.message()));
  }
  std::vector<std::string> alt;
  for (const auto& name : names) alt.push_back((isAddress(name) ? "IP:" : "DNS:") + name);
  const fs::path extensions = dir / "leaf.ext";
  std::ofstream(extensions) << fmt::format(
      "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
      "extendedKeyUsage=serverAuth,clientAuth\n",
      fmt::join(alt, ","));
  std::vector<std::string> request = {"req"};
  request.insert(request.end(), ec_key.begin(), ec_key.end());
  request.insert(request.end(),
                 {"-keyout", (dir / "tls.key").string(), "-out", (dir / "tls.csr").string(),
                  "-subj", "/CN=" + (names.empty() ? std::string("rtable") : names[0])});
  if (auto made = openssl(request); !made) return made;
  if (auto made =
          openssl({"x509", "-req", "-in", (dir / "tls.csr").string(), "-CA",
                   (ca / "ca.crt").string(), "-CAkey", (ca / "ca.key").string(), "-CAcreateserial",
                   "-CAserial", (dir / "ca.srl").string(), "-out", (dir / "tls.crt.new").string(),
                   "-days", "1", "-extfile", extensions.string()});
      !made) {
    return made;
  }
  // Renamed into place, as the kubelet swaps a Secret's files: a reader never sees half of one.
  fs::rename(dir / "tls.crt.new", dir / "tls.crt", ec);
  if (ec) return std::unexpected(fmt::format("cannot rename tls.crt: {}", ec.message()));
  return {};
}

}  // namespace rtable::common::testing
