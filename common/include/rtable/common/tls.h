// TLS for rtable's own HTTP: the replica API's server side, part fetches, and the test client
// (OpenSSL 3). Certificates come as cert-manager writes them into a Secret and Kubernetes mounts
// it: a directory with tls.crt (the chain, leaf first), tls.key and, optionally, ca.crt.
//
// A mounted Secret changes in place when cert-manager renews it (the kubelet swaps a symlink), so
// a TlsContext looks at its files again (at most every `recheck`) and loads them anew when they
// changed: renewed certificates are served without a restart. Files that do not load keep the
// context it had, and the error is logged once per change.
//
// Thread safety: TlsContext::get() from any thread; a TlsStream by one thread at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <expected>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

struct ssl_ctx_st;
struct ssl_st;

namespace rtable::common {

struct TlsFiles {
  std::filesystem::path certificate;  // PEM chain, leaf first; empty for a client
  std::filesystem::path private_key;  // PEM; empty for a client
  std::filesystem::path ca;           // PEM roots to trust; empty: the system's

  // cert-manager's layout: tls.crt, tls.key, and ca.crt when the directory has one.
  static TlsFiles inDirectory(const std::filesystem::path& dir);
};

class TlsContext {
 public:
  // kUnverifiedClient: encryption without checking who answers, as a kubelet's HTTPS probe does
  // (the test kubelet's); nothing else of rtable uses it.
  enum class Side { kServer, kClient, kUnverifiedClient };
  static constexpr std::chrono::milliseconds kDefaultRecheck{10000};

  // A server presents `files.certificate` with its key (which must match); a client trusts
  // `files.ca` (or the system's roots) and checks the peer's name (TlsStream::setPeerName). TLS 1.2
  // or later. Errors name the file and what is wrong with it.
  static std::expected<std::shared_ptr<TlsContext>, std::string> load(
      Side side, TlsFiles files, std::chrono::milliseconds recheck = kDefaultRecheck);

  // The context for a new connection: the files' current content.
  std::shared_ptr<ssl_ctx_st> get();
  // How many times the files were loaded (1 after load()): for tests and logs.
  std::size_t loads() const;

  class Impl;
  explicit TlsContext(std::unique_ptr<Impl> impl);
  ~TlsContext();

 private:
  std::unique_ptr<Impl> impl_;
};

// One TLS connection over a connected socket, blocking or not. read/write return what recv/send
// would: bytes (> 0), 0 at a clean end (read), or -1 with wants() telling a non-blocking caller
// what to poll for (kRead/kWrite) or that the connection failed (kFailed: error() says why).
class TlsStream {
 public:
  enum class Wants { kNothing, kRead, kWrite, kFailed };

  // The stream does not own `fd`.
  static std::expected<TlsStream, std::string> open(TlsContext& context, int fd);
  TlsStream(TlsStream&&) noexcept;
  TlsStream& operator=(TlsStream&&) noexcept;
  ~TlsStream();

  // A client's: the name to send (SNI, for a DNS name) and to find in the peer's certificate (a
  // DNS name, or an IP address in its IP SANs).
  std::expected<void, std::string> setPeerName(const std::string& host);
  // 1 when done, else -1 (wants()).
  int accept();
  int connect();
  ssize_t read(void* data, std::size_t size);
  ssize_t write(const void* data, std::size_t size);
  // Sends close_notify (once; a peer gone is no error).
  void shutdown();

  Wants wants() const { return wants_; }
  const std::string& error() const { return error_; }

 private:
  explicit TlsStream(ssl_st* ssl);
  int result(int rc, const char* what);
  ssl_st* ssl_ = nullptr;
  Wants wants_ = Wants::kNothing;
  std::string error_;
};

// Whether a certificate (PEM, leaf first) and key (PEM) could serve `host`: both parse, the key is
// the certificate's, and the leaf names `host` (a DNS SAN, wildcards as TLS matches them). For a
// check before use (the operator reading a Secret); errors say which of the three fails.
std::expected<void, std::string> checkServerCertificate(std::string_view certificate_pem,
                                                        std::string_view key_pem,
                                                        const std::string& host);

// OpenSSL's queued errors as one line (and the queue emptied); `fallback` when there are none.
std::string takeTlsErrors(const std::string& fallback);

}  // namespace rtable::common
