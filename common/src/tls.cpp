#include "rtable/common/tls.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>

namespace rtable::common {
namespace fs = std::filesystem;
namespace {

// What tells a changed file from the same one: a renewed Secret is a new file (new inode) behind
// the same path; an edited one has a new mtime or size.
struct FileStamp {
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  timespec modified{};
  bool operator==(const FileStamp& other) const {
    return exists == other.exists && device == other.device && inode == other.inode &&
           size == other.size && modified.tv_sec == other.modified.tv_sec &&
           modified.tv_nsec == other.modified.tv_nsec;
  }
};

FileStamp stampOf(const fs::path& file) {
  FileStamp stamp;
  struct stat st{};
  if (file.empty() || ::stat(file.c_str(), &st) != 0) return stamp;
  stamp.exists = true;
  stamp.device = st.st_dev;
  stamp.inode = st.st_ino;
  stamp.size = st.st_size;
  stamp.modified = st.st_mtim;
  return stamp;
}

using Stamps = std::array<FileStamp, 3>;

// OpenSSL writes to its socket with send() and no MSG_NOSIGNAL: a peer that went away would raise
// SIGPIPE, whose default action ends the process (a client hanging up on a TLS answer would kill
// the replica). So SIGPIPE is blocked on the calling thread for each call that may write, and one
// the call raised is taken off the thread before the old mask returns; the write itself then
// fails with EPIPE, as a plain send with MSG_NOSIGNAL does.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_);
  }
  ~SigpipeBlocked() {
    const int saved_errno = errno;
    if (!sigismember(&old_, SIGPIPE)) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE)) {
        const timespec now{0, 0};
        while (sigtimedwait(&sigpipe_, nullptr, &now) < 0 && errno == EINTR) {
        }
      }
      pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }
    errno = saved_errno;
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t sigpipe_;
  sigset_t old_;
};

Stamps stampsOf(const TlsFiles& files) {
  return {stampOf(files.certificate), stampOf(files.private_key), stampOf(files.ca)};
}

std::shared_ptr<SSL_CTX> makeContext(TlsContext::Side side, const TlsFiles& files,
                                     std::string& error) {
  std::shared_ptr<SSL_CTX> context(
      SSL_CTX_new(side == TlsContext::Side::kServer ? TLS_server_method() : TLS_client_method()),
      SSL_CTX_free);
  if (!context) {
    error = takeTlsErrors("cannot make a TLS context");
    return nullptr;
  }
  SSL_CTX* ctx = context.get();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // A peer that closes without close_notify is a short read, which the HTTP framing (an exact
  // Content-Length) tells from a whole answer: not an error of its own.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
  // Writes of a non-blocking stream resume with a moved buffer (the caller's pointer advances).
  SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  auto fail = [&](const fs::path& file, const char* what) {
    error = fmt::format("{} '{}': {}", what, file.string(),
                        takeTlsErrors(std::strerror(errno ? errno : EINVAL)));
    return nullptr;
  };
  if (side == TlsContext::Side::kServer) {
    errno = 0;
    if (SSL_CTX_use_certificate_chain_file(ctx, files.certificate.c_str()) != 1)
      return fail(files.certificate, "cannot load the TLS certificate chain");
    errno = 0;
    // OpenSSL checks the key against the certificate as it loads it.
    const bool loaded =
        SSL_CTX_use_PrivateKey_file(ctx, files.private_key.c_str(), SSL_FILETYPE_PEM) == 1;
    const bool mismatch =
        !loaded && ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
    if (!loaded && !mismatch) return fail(files.private_key, "cannot load the TLS private key");
    if (mismatch || SSL_CTX_check_private_key(ctx) != 1) {
      error = fmt::format("the TLS private key '{}' does not match the certificate '{}'",
                          files.private_key.string(), files.certificate.string());
      ERR_clear_error();
      return nullptr;
    }
  } else if (side == TlsContext::Side::kUnverifiedClient) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (!files.ca.empty()) {
      errno = 0;
      if (SSL_CTX_load_verify_locations(ctx, files.ca.c_str(), nullptr) != 1)
        return fail(files.ca, "cannot load the TLS CA certificates");
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      error = takeTlsErrors("cannot load the system's CA certificates");
      return nullptr;
    }
  }
  return context;
}

}  // namespace

TlsFiles TlsFiles::inDirectory(const fs::path& dir) {
  TlsFiles files{dir / "tls.crt", dir / "tls.key", {}};
  std::error_code ignored;
  if (fs::exists(dir / "ca.crt", ignored)) files.ca = dir / "ca.crt";
  return files;
}

std::string takeTlsErrors(const std::string& fallback) {
  std::string text;
  while (unsigned long code = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(code, line, sizeof(line));
    if (!text.empty()) text += "; ";
    text += line;
  }
  return text.empty() ? fallback : text;
}

std::expected<void, std::string> checkServerCertificate(std::string_view certificate_pem,
                                                        std::string_view key_pem,
                                                        const std::string& host) {
  auto bio = [](std::string_view pem) {
    return std::unique_ptr<BIO, decltype(&BIO_free)>(
        BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  };
  auto cert_bio = bio(certificate_pem);
  std::unique_ptr<X509, decltype(&X509_free)> certificate(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!certificate) {
    return std::unexpected("tls.crt holds no PEM certificate: " + takeTlsErrors("unreadable"));
  }
  auto key_bio = bio(key_pem);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (!key)
    return std::unexpected("tls.key holds no PEM private key: " + takeTlsErrors("unreadable"));
  if (X509_check_private_key(certificate.get(), key.get()) != 1) {
    ERR_clear_error();
    return std::unexpected("tls.key is not the key of the certificate in tls.crt");
  }
  if (X509_check_host(certificate.get(), host.data(), host.size(),
                      X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS, nullptr) != 1) {
    ERR_clear_error();
    return std::unexpected(fmt::format(
        "the certificate in tls.crt does not name {} (its subjectAltName needs a DNS name that "
        "matches it)",
        host));
  }
  return {};
}

class TlsContext::Impl {
 public:
  Impl(Side side, TlsFiles files, std::chrono::milliseconds recheck, Stamps stamps,
       std::shared_ptr<SSL_CTX> context)
      : side_(side),
        files_(std::move(files)),
        recheck_(recheck),
        stamps_(stamps),
        context_(std::move(context)),
        checked_(std::chrono::steady_clock::now()) {}

  std::shared_ptr<SSL_CTX> get() {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (now - checked_ < recheck_) return context_;
    checked_ = now;
    const Stamps stamps = stampsOf(files_);
    if (stamps == stamps_) return context_;
    stamps_ = stamps;
    std::string error;
    if (auto fresh = makeContext(side_, files_, error)) {
      context_ = std::move(fresh);
      ++loads_;
      spdlog::info("TLS: loaded the changed certificate files ({})",
                   (side_ == Side::kServer ? files_.certificate : files_.ca).string());
    } else {
      // The kubelet swaps all of a Secret's files at once; a half-written set is a user's edit.
      spdlog::error("TLS: the changed certificate files do not load, still using the old ones: {}",
                    error);
    }
    return context_;
  }

  std::size_t loads() const {
    std::lock_guard lock(mu_);
    return loads_;
  }

 private:
  const Side side_;
  const TlsFiles files_;
  const std::chrono::milliseconds recheck_;
  mutable std::mutex mu_;
  Stamps stamps_;
  std::shared_ptr<SSL_CTX> context_;
  std::chrono::steady_clock::time_point checked_;
  std::size_t loads_ = 1;
};

std::expected<std::shared_ptr<TlsContext>, std::string> TlsContext::load(
    Side side, TlsFiles files, std::chrono::milliseconds recheck) {
  const Stamps stamps = stampsOf(files);
  std::string error;
  auto context = makeContext(side, files, error);
  if (!context) return std::unexpected(error);
  return std::make_shared<TlsContext>(
      std::make_unique<Impl>(side, std::move(files), recheck, stamps, std::move(context)));
}

TlsContext::TlsContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsContext::~TlsContext() = default;

std::shared_ptr<SSL_CTX> TlsContext::get() {
  return impl_->get();
}

std::size_t TlsContext::loads() const {
  return impl_->loads();
}

std::expected<TlsStream, std::string> TlsStream::open(TlsContext& context, int fd) {
  auto ctx = context.get();
  SSL* ssl = SSL_new(ctx.get());  // holds its own reference to ctx
  if (!ssl) return std::unexpected(takeTlsErrors("cannot start a TLS connection"));
  TlsStream stream(ssl);
  if (SSL_set_fd(ssl, fd) != 1)
    return std::unexpected(takeTlsErrors("cannot start a TLS connection"));
  return stream;
}

TlsStream::TlsStream(SSL* ssl) : ssl_(ssl) {}

TlsStream::TlsStream(TlsStream&& other) noexcept
    : ssl_(std::exchange(other.ssl_, nullptr)),
      wants_(other.wants_),
      error_(std::move(other.error_)) {}

TlsStream& TlsStream::operator=(TlsStream&& other) noexcept {
  if (this != &other) {
    if (ssl_) SSL_free(ssl_);
    ssl_ = std::exchange(other.ssl_, nullptr);
    wants_ = other.wants_;
    error_ = std::move(other.error_);
  }
  return *this;
}

TlsStream::~TlsStream() {
  if (ssl_) SSL_free(ssl_);
}

std::expected<void, std::string> TlsStream::setPeerName(const std::string& host) {
  in6_addr ip{};
  const bool is_ip =
      inet_pton(AF_INET, host.c_str(), &ip) == 1 || inet_pton(AF_INET6, host.c_str(), &ip) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl_);
  if (is_ip) {
    // SNI carries no addresses (RFC 6066 section 3); the certificate must name it in an IP SAN.
    if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1)
      return std::unexpected(takeTlsErrors("cannot check the peer's address " + host));
    return {};
  }
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (SSL_set_tlsext_host_name(ssl_, host.c_str()) != 1 || SSL_set1_host(ssl_, host.c_str()) != 1)
    return std::unexpected(takeTlsErrors("cannot check the peer's name " + host));
  return {};
}

int TlsStream::result(int rc, const char* what) {
  if (rc > 0) {
    wants_ = Wants::kNothing;
    return rc;
  }
  const int saved_errno = errno;
  switch (SSL_get_error(ssl_, rc)) {
    case SSL_ERROR_ZERO_RETURN:
      wants_ = Wants::kNothing;
      return 0;
    case SSL_ERROR_WANT_READ:
      wants_ = Wants::kRead;
      return -1;
    case SSL_ERROR_WANT_WRITE:
      wants_ = Wants::kWrite;
      return -1;
    case SSL_ERROR_SYSCALL:
      wants_ = Wants::kFailed;
      error_ = fmt::format(
          "{}: {}", what,
          takeTlsErrors(saved_errno ? std::strerror(saved_errno) : "the connection ended"));
      return -1;
    default: {
      wants_ = Wants::kFailed;
      std::string detail = takeTlsErrors("failed");
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        detail = fmt::format("the peer's certificate is not trusted: {}",
                             X509_verify_cert_error_string(verify));
      }
      error_ = fmt::format("{}: {}", what, detail);
      return -1;
    }
  }
}

int TlsStream::accept() {
  SigpipeBlocked blocked;
  ERR_clear_error();
  return result(SSL_accept(ssl_), "TLS handshake");
}

int TlsStream::connect() {
  SigpipeBlocked blocked;
  ERR_clear_error();
  return result(SSL_connect(ssl_), "TLS handshake");
}

ssize_t TlsStream::read(void* data, std::size_t size) {
  SigpipeBlocked blocked;  // a read may answer the peer (a TLS 1.3 key update)
  ERR_clear_error();
  std::size_t got = 0;
  const int rc = SSL_read_ex(ssl_, data, size, &got);
  if (rc == 1) {
    wants_ = Wants::kNothing;
    return static_cast<ssize_t>(got);
  }
  return result(rc, "TLS read");
}

ssize_t TlsStream::write(const void* data, std::size_t size) {
  SigpipeBlocked blocked;
  ERR_clear_error();
  std::size_t put = 0;
  const int rc = SSL_write_ex(ssl_, data, size, &put);
  if (rc == 1) {
    wants_ = Wants::kNothing;
    return static_cast<ssize_t>(put);
  }
  return result(rc, "TLS write");
}

void TlsStream::shutdown() {
  if (SSL_get_shutdown(ssl_) & SSL_SENT_SHUTDOWN) return;
  SigpipeBlocked blocked;
  ERR_clear_error();
  SSL_shutdown(ssl_);
  ERR_clear_error();
}

}  // namespace rtable::common
