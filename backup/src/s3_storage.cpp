#include "rtable/backup/s3_storage.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "local_files.h"
#include "rtable/common/base64.h"
#include "rtable/common/percent_encoding.h"
#include "rtable/common/quoted_excerpt.h"
#include "s3_xml.h"

namespace rtable::backup {

using Kind = StorageError::Kind;

namespace {

// S3's limit on the payload of one PUT (larger objects need a multipart upload).
constexpr uint64_t kMaxSinglePutBytes = uint64_t{5} << 30;
// Error bodies are small XML documents; more than this is not one.
constexpr std::size_t kMaxErrorBodyBytes = 64 * 1024;
// Idle curl handles kept for reuse (each keeps its connection open): about the threads that call.
constexpr std::size_t kMaxIdleHandles = 8;
// SHA-256 of the empty payload, the x-amz-content-sha256 of requests without a body.
constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string hex(const unsigned char* bytes, std::size_t size) {
  std::string out;
  out.reserve(size * 2);
  for (std::size_t i = 0; i < size; ++i) out += fmt::format("{:02x}", bytes[i]);
  return out;
}

// SHA-256 (hex, for x-amz-content-sha256) and MD5 (base64, for Content-MD5) of a payload, computed
// in one pass.
class PayloadDigests {
 public:
  PayloadDigests() : sha256_(EVP_MD_CTX_new()), md5_(EVP_MD_CTX_new()) {
    EVP_DigestInit_ex(sha256_, EVP_sha256(), nullptr);
    EVP_DigestInit_ex(md5_, EVP_md5(), nullptr);
  }
  ~PayloadDigests() {
    EVP_MD_CTX_free(sha256_);
    EVP_MD_CTX_free(md5_);
  }
  PayloadDigests(const PayloadDigests&) = delete;
  PayloadDigests& operator=(const PayloadDigests&) = delete;

  void update(std::string_view bytes) {
    EVP_DigestUpdate(sha256_, bytes.data(), bytes.size());
    EVP_DigestUpdate(md5_, bytes.data(), bytes.size());
  }
  // Call once.
  std::pair<std::string, std::string> finish() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(sha256_, digest, &size);
    std::string sha256 = hex(digest, size);
    EVP_DigestFinal_ex(md5_, digest, &size);
    std::string md5 =
        common::base64Encode(std::string_view(reinterpret_cast<const char*>(digest), size));
    return {std::move(sha256), std::move(md5)};
  }

 private:
  EVP_MD_CTX* sha256_;
  EVP_MD_CTX* md5_;
};

// A key as a URL path: each '/'-separated segment percent-encoded (RFC 3986: all but the unreserved
// characters). The encoded path is also what libcurl 7.88 puts into the SigV4 canonical request
// (verbatim), and S3 wants exactly that there: the path encoded once, '/' kept.
std::string encodeKeyPath(std::string_view key) {
  std::string out;
  for (std::size_t start = 0;;) {
    const std::size_t slash = key.find('/', start);
    out += common::percentEncode(key.substr(start, slash - start));
    if (slash == std::string_view::npos) return out;
    out += '/';
    start = slash + 1;
  }
}

std::once_flag curl_init_once;
CURLcode curl_init_result = CURLE_OK;

// S3 error codes, sorted by what a user must do (the HTTP status decides the rest).
Kind kindOfCode(std::string_view code) {
  static constexpr std::pair<std::string_view, Kind> kCodes[] = {
      {"NoSuchBucket", Kind::kNoBucket},
      {"NoSuchKey", Kind::kNotFound},
      {"InvalidAccessKeyId", Kind::kAccessDenied},
      {"SignatureDoesNotMatch", Kind::kAccessDenied},
      {"AccessDenied", Kind::kAccessDenied},
      {"AllAccessDisabled", Kind::kAccessDenied},
      {"AccountProblem", Kind::kAccessDenied},
      {"ExpiredToken", Kind::kAccessDenied},
      {"InvalidToken", Kind::kAccessDenied},
      {"EntityTooLarge", Kind::kNoSpace},
      {"QuotaExceeded", Kind::kNoSpace},
      {"XMinioStorageFull", Kind::kNoSpace},
      {"BadDigest", Kind::kCorrupt},
      {"InvalidDigest", Kind::kCorrupt},
      {"XAmzContentSHA256Mismatch", Kind::kCorrupt},
      {"InternalError", Kind::kUnavailable},
      {"ServiceUnavailable", Kind::kUnavailable},
      {"SlowDown", Kind::kUnavailable},
      {"RequestTimeout", Kind::kUnavailable},
      {"IncompleteBody", Kind::kUnavailable},
  };
  for (const auto& [known, kind] : kCodes) {
    if (code == known) return kind;
  }
  return Kind::kOther;
}

Kind kindOfStatus(long status) {
  if (status == 403) return Kind::kAccessDenied;
  if (status == 404) return Kind::kNotFound;
  if (status == 507) return Kind::kNoSpace;  // Insufficient Storage
  if (status >= 500 || status == 408 || status == 429) return Kind::kUnavailable;
  return Kind::kOther;
}

// Transfers that may succeed when tried again.
bool transient(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

}  // namespace

// What one request sends and where its answer goes.
struct S3Storage::Request {
  const char* method = "GET";  // GET, HEAD, PUT, DELETE
  std::string url;
  std::string subject;  // "s3://bucket/prefix/name", for messages
  // A PUT's body: `bytes`, or `body_size` bytes of the file `fd` (named `file`) from offset 0.
  std::string_view bytes;
  int fd = -1;
  std::filesystem::path file;
  uint64_t body_size = 0;
  std::string sha256_hex{kEmptySha256};
  std::string md5_base64;
  // A GET's 2xx body goes here if set, else into Response::body.
  AtomicFile* sink = nullptr;
};

struct S3Storage::Response {
  long status = 0;
  std::string body;             // a 2xx GET's body (without a sink), or the error body
  int64_t content_length = -1;  // a HEAD's Content-Length; -1 when absent
};

class S3Storage::HandlePool {
 public:
  ~HandlePool() {
    for (CURL* handle : idle_) curl_easy_cleanup(handle);
  }
  CURL* acquire() {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        CURL* handle = idle_.back();
        idle_.pop_back();
        return handle;
      }
    }
    return curl_easy_init();
  }
  // curl_easy_reset clears the options but keeps the connection and DNS caches.
  void release(CURL* handle) {
    curl_easy_reset(handle);
    std::lock_guard lock(mutex_);
    if (idle_.size() < kMaxIdleHandles) {
      idle_.push_back(handle);
    } else {
      curl_easy_cleanup(handle);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<CURL*> idle_;
};

namespace {

// The state libcurl's callbacks share during one attempt.
struct Transfer {
  CURL* handle = nullptr;
  S3Storage::Request* request = nullptr;
  std::string* body = nullptr;
  uint64_t upload_offset = 0;
  bool corrupt_first_byte = false;
  std::optional<LocalError> local_error;
};

size_t readBody(char* buffer, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const auto& request = *transfer.request;
  const uint64_t left = request.body_size - transfer.upload_offset;
  const size_t wanted = static_cast<size_t>(std::min<uint64_t>(left, size * count));
  size_t got = 0;
  if (request.fd >= 0) {
    while (got < wanted) {
      const ssize_t n = ::pread(request.fd, buffer + got, wanted - got,
                                static_cast<off_t>(transfer.upload_offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        transfer.local_error = LocalError{errno, "read " + request.file.string()};
        return CURL_READFUNC_ABORT;
      }
      if (n == 0) {
        transfer.local_error =
            LocalError{EIO, fmt::format("read {} (it shrank below {} bytes while being uploaded)",
                                        request.file.string(), request.body_size)};
        return CURL_READFUNC_ABORT;
      }
      got += static_cast<size_t>(n);
    }
  } else {
    std::memcpy(buffer, request.bytes.data() + transfer.upload_offset, wanted);
    got = wanted;
  }
  if (transfer.corrupt_first_byte && transfer.upload_offset == 0 && got > 0) {
    buffer[0] = static_cast<char>(buffer[0] ^ 0x01);
  }
  transfer.upload_offset += got;
  return got;
}

// libcurl rewinds an upload it must send again (a redirect, a reused connection that closed).
int seekBody(void* user, curl_off_t offset, int origin) {
  auto& transfer = *static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 ||
      static_cast<uint64_t>(offset) > transfer.request->body_size) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  transfer.upload_offset = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t writeBody(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const std::string_view bytes(data, size * count);
  long status = 0;
  curl_easy_getinfo(transfer.handle, CURLINFO_RESPONSE_CODE, &status);
  if (status / 100 == 2) {
    if (transfer.request->sink) {
      if (auto written = transfer.request->sink->write(bytes); !written) {
        transfer.local_error = written.error();
        return 0;  // anything but bytes.size() aborts the transfer
      }
    } else {
      transfer.body->append(bytes);
    }
  } else if (transfer.body->size() < kMaxErrorBodyBytes) {
    transfer.body->append(bytes.substr(0, kMaxErrorBodyBytes - transfer.body->size()));
  }
  return bytes.size();
}

// The error of a finished attempt, or nullopt when it succeeded (2xx).
std::optional<StorageError> errorOf(const S3Storage::Request& request,
                                    const S3Storage::Response& response, CURLcode code,
                                    const char* curl_detail,
                                    const std::optional<LocalError>& local_error) {
  if (local_error) return storageErrorOf(request.subject, *local_error);
  if (code != CURLE_OK) {
    const std::string detail = curl_detail[0] ? fmt::format(" ({})", curl_detail) : "";
    return StorageError{transient(code) ? Kind::kUnavailable : Kind::kOther,
                        fmt::format("{}: {} {}: {}{}", request.subject, request.method, request.url,
                                    curl_easy_strerror(code), detail)};
  }
  if (response.status / 100 == 2) return std::nullopt;
  const auto error = s3xml::parseError(response.body);
  Kind kind = error && !error->code.empty() ? kindOfCode(error->code) : Kind::kOther;
  if (kind == Kind::kOther) kind = kindOfStatus(response.status);
  std::string cause;
  if (error) {
    cause = error->code;
    if (!error->message.empty()) cause += ": " + error->message;
  } else if (!response.body.empty()) {
    cause = common::quotedExcerpt(response.body);
  } else {
    cause = "(no error body)";
  }
  return StorageError{
      kind, fmt::format("{}: {} {} {}", request.subject, request.method, response.status, cause)};
}

}  // namespace

StorageResult<std::unique_ptr<S3Storage>> S3Storage::create(S3StorageOptions options) {
  auto bad = [](std::string what) {
    return std::unexpected(StorageError{Kind::kOther, "S3 destination: " + what});
  };
  while (options.endpoint.ends_with('/')) options.endpoint.pop_back();
  if (!options.endpoint.starts_with("http://") && !options.endpoint.starts_with("https://")) {
    return bad(fmt::format("endpoint {} is not an http:// or https:// URL",
                           common::quotedExcerpt(options.endpoint)));
  }
  const auto& bucket = options.bucket;
  const bool bucket_chars_ok = std::all_of(bucket.begin(), bucket.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
  });
  if (bucket.size() < 3 || bucket.size() > 63 || !bucket_chars_ok) {
    return bad(fmt::format(
        "bucket name {} is not one S3 allows (3 to 63 characters of a-z, 0-9, '.' and '-')",
        common::quotedExcerpt(bucket)));
  }
  auto& prefix = options.prefix;
  while (prefix.starts_with('/')) prefix.erase(0, 1);
  while (prefix.ends_with('/')) prefix.pop_back();
  if (!prefix.empty()) {
    if (auto problem = objectNameProblem(prefix)) {
      return bad(fmt::format("prefix {}: {}", common::quotedExcerpt(prefix), *problem));
    }
  }
  if (options.region.empty()) return bad("region is empty");
  if (options.access_key.empty() || options.secret_key.empty()) {
    return bad("access key or secret key is empty");
  }
  if (options.max_attempts < 1) return bad("max_attempts is below 1");
  if (options.stall_timeout.count() < 1) return bad("stall_timeout is below 1 s");
  if (options.list_page_size < 0) return bad("list_page_size is negative");
  // curl_global_init is not thread-safe in libcurl 7.88: once per process, before any handle.
  std::call_once(curl_init_once, [] { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (curl_init_result != CURLE_OK) {
    return bad(fmt::format("curl_global_init failed: {}", curl_easy_strerror(curl_init_result)));
  }
  return std::unique_ptr<S3Storage>(new S3Storage(std::move(options)));
}

S3Storage::S3Storage(S3StorageOptions options)
    : options_(std::move(options)),
      key_prefix_(options_.prefix.empty() ? "" : options_.prefix + "/"),
      sigv4_(fmt::format("aws:amz:{}:s3", options_.region)),
      handles_(std::make_unique<HandlePool>()) {}

S3Storage::~S3Storage() = default;

std::string S3Storage::location() const {
  return options_.prefix.empty() ? fmt::format("s3://{}", options_.bucket)
                                 : fmt::format("s3://{}/{}", options_.bucket, options_.prefix);
}

std::string S3Storage::subject(const std::string& name) const {
  return fmt::format("s3://{}/{}{}", options_.bucket, key_prefix_, name);
}

std::string S3Storage::bucketUrl() const {
  return fmt::format("{}/{}", options_.endpoint, options_.bucket);
}

std::string S3Storage::objectUrl(const std::string& name) const {
  return fmt::format("{}/{}", bucketUrl(), encodeKeyPath(key_prefix_ + name));
}

StorageResult<S3Storage::Response> S3Storage::performOnce(Request& request) {
  CURL* handle = handles_->acquire();
  if (!handle) {
    return std::unexpected(
        StorageError{Kind::kOther, fmt::format("{}: curl_easy_init failed", request.subject)});
  }
  Response response;
  Transfer transfer;
  transfer.handle = handle;
  transfer.request = &request;
  transfer.body = &response.body;
  transfer.corrupt_first_byte =
      std::string_view(request.method) == "PUT" && corrupt_next_upload_.exchange(false);
  char curl_detail[CURL_ERROR_SIZE] = "";

  curl_slist* headers = nullptr;
  // libcurl 7.88 signs with the SHA-256 of POSTFIELDS, or of nothing for every other request (an
  // upload through the read callback included) and sends no x-amz-content-sha256; given this
  // header, it signs it and uses its value as the payload hash (docs/backup-storage.md).
  const std::string sha256_header = "x-amz-content-sha256: " + request.sha256_hex;
  headers = curl_slist_append(headers, sha256_header.c_str());
  const std::string md5_header = "Content-MD5: " + request.md5_base64;
  if (!request.md5_base64.empty()) headers = curl_slist_append(headers, md5_header.c_str());
  // No "Expect:" to spare small PUTs the 100-continue round trip: libcurl 7.88 signs a header it
  // was told to remove (as "expect:") without sending it, and the signature no longer matches.
  const bool upload = std::string_view(request.method) == "PUT";

  curl_easy_setopt(handle, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for timeouts: threads
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, curl_detail);
  curl_easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(handle, CURLOPT_USERNAME, options_.access_key.c_str());
  curl_easy_setopt(handle, CURLOPT_PASSWORD, options_.secret_key.c_str());
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(options_.stall_timeout.count()));
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, writeBody);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &transfer);
  if (upload) {
    curl_easy_setopt(handle, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(handle, CURLOPT_READFUNCTION, readBody);
    curl_easy_setopt(handle, CURLOPT_READDATA, &transfer);
    curl_easy_setopt(handle, CURLOPT_SEEKFUNCTION, seekBody);
    curl_easy_setopt(handle, CURLOPT_SEEKDATA, &transfer);
    curl_easy_setopt(handle, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body_size));
  } else if (std::string_view(request.method) == "HEAD") {
    curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
  } else if (std::string_view(request.method) == "DELETE") {
    curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, "DELETE");
  }

  const CURLcode code = curl_easy_perform(handle);
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &response.status);
  curl_off_t length = -1;
  curl_easy_getinfo(handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  response.content_length = length;
  curl_slist_free_all(headers);
  handles_->release(handle);

  if (auto error = errorOf(request, response, code, curl_detail, transfer.local_error)) {
    return std::unexpected(std::move(*error));
  }
  return response;
}

StorageResult<S3Storage::Response> S3Storage::perform(Request& request) {
  auto backoff = options_.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    if (request.sink) {
      if (auto emptied = request.sink->truncate(); !emptied) {
        return std::unexpected(storageErrorOf(request.subject, emptied.error()));
      }
    }
    auto response = performOnce(request);
    if (response) return response;
    if (response.error().kind != Kind::kUnavailable || attempt >= options_.max_attempts) {
      if (attempt > 1) {
        response.error().message += response.error().kind == Kind::kUnavailable
                                        ? fmt::format(" (gave up after {} attempts)", attempt)
                                        : fmt::format(" (on attempt {})", attempt);
      }
      return response;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

namespace {

StorageError badName(const std::string& location, std::string_view what, const std::string& name,
                     const std::string& problem) {
  return StorageError{Kind::kOther, fmt::format("{}: refused the {} {}: {}", location, what,
                                                common::quotedExcerpt(name), problem)};
}

}  // namespace

StorageResult<void> S3Storage::checkBucket(const std::string& subject) {
  Request request;
  request.method = "HEAD";
  request.url = bucketUrl();
  request.subject = subject;
  auto response = perform(request);
  if (response) return {};
  if (response.error().kind == Kind::kNotFound) {
    return std::unexpected(StorageError{
        Kind::kNoBucket, fmt::format("{}: the bucket {} does not exist ({} {}: 404)", subject,
                                     options_.bucket, request.method, request.url)});
  }
  return std::unexpected(response.error());
}

StorageResult<std::optional<uint64_t>> S3Storage::size(const std::string& name) {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(badName(location(), "object name", name, *problem));
  }
  Request request;
  request.method = "HEAD";
  request.url = objectUrl(name);
  request.subject = subject(name);
  auto response = perform(request);
  if (!response) {
    if (response.error().kind != Kind::kNotFound) return std::unexpected(response.error());
    if (auto bucket = checkBucket(request.subject); !bucket) {
      return std::unexpected(bucket.error());
    }
    return std::nullopt;
  }
  if (response->content_length < 0) {
    return std::unexpected(StorageError{
        Kind::kOther, fmt::format("{}: HEAD answered without a Content-Length", request.subject)});
  }
  return static_cast<uint64_t>(response->content_length);
}

StorageResult<void> S3Storage::put(const std::string& name, Request& request) {
  request.method = "PUT";
  request.url = objectUrl(name);
  request.subject = subject(name);
  if (request.body_size > kMaxSinglePutBytes) {
    return std::unexpected(StorageError{
        Kind::kOther,
        fmt::format("{}: {} bytes is over the 5 GiB a single PUT may carry (multipart uploads "
                    "are not implemented)",
                    request.subject, request.body_size)});
  }
  auto response = perform(request);
  if (!response) return std::unexpected(response.error());
  return {};
}

StorageResult<void> S3Storage::putBytes(const std::string& name, std::string_view bytes) {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(badName(location(), "object name", name, *problem));
  }
  PayloadDigests digests;
  digests.update(bytes);
  Request request;
  request.bytes = bytes;
  request.body_size = bytes.size();
  std::tie(request.sha256_hex, request.md5_base64) = digests.finish();
  return put(name, request);
}

StorageResult<void> S3Storage::putFile(const std::string& name,
                                       const std::filesystem::path& source) {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(badName(location(), "object name", name, *problem));
  }
  const int fd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return std::unexpected(
        storageErrorOf(subject(name), LocalError{errno, "open " + source.string()}));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    return std::unexpected(
        storageErrorOf(subject(name), LocalError{errno, "stat " + source.string()}));
  }
  if (!S_ISREG(st.st_mode)) {
    return std::unexpected(StorageError{
        Kind::kOther, fmt::format("{}: {} is not a regular file", subject(name), source.string())});
  }
  // The digests are read first and sent with the body, so the file is read twice; streaming it
  // keeps memory flat whatever the size. A file that changes in between is refused by the server.
  PayloadDigests digests;
  std::string buffer(1 << 20, '\0');
  for (uint64_t offset = 0; offset < static_cast<uint64_t>(st.st_size);) {
    const ssize_t n = ::pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return std::unexpected(storageErrorOf(
          subject(name), LocalError{n < 0 ? errno : EIO, "read " + source.string()}));
    }
    digests.update(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
    offset += static_cast<uint64_t>(n);
  }
  Request request;
  request.fd = fd;
  request.file = source;
  request.body_size = static_cast<uint64_t>(st.st_size);
  std::tie(request.sha256_hex, request.md5_base64) = digests.finish();
  return put(name, request);
}

StorageResult<std::string> S3Storage::read(const std::string& name) {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(badName(location(), "object name", name, *problem));
  }
  Request request;
  request.url = objectUrl(name);
  request.subject = subject(name);
  auto response = perform(request);
  if (!response) return std::unexpected(response.error());
  return std::move(response->body);
}

StorageResult<void> S3Storage::readToFile(const std::string& name,
                                          const std::filesystem::path& target) {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(badName(location(), "object name", name, *problem));
  }
  auto file = AtomicFile::create(target);
  if (!file) return std::unexpected(storageErrorOf(subject(name), file.error()));
  Request request;
  request.url = objectUrl(name);
  request.subject = subject(name);
  request.sink = &*file;
  auto response = perform(request);
  if (!response) return std::unexpected(response.error());
  if (auto committed = file->commit(); !committed) {
    return std::unexpected(storageErrorOf(request.subject, committed.error()));
  }
  return {};
}

StorageResult<std::vector<std::string>> S3Storage::list(const std::string& prefix) {
  if (auto problem = listPrefixProblem(prefix)) {
    return std::unexpected(badName(location(), "list prefix", prefix, *problem));
  }
  std::vector<std::string> names;
  std::string token;
  const std::string key_prefix = key_prefix_ + prefix;
  while (true) {
    // The parameters in byte order: libcurl 7.88 signs the query as it is, and SigV4's canonical
    // query string is sorted.
    std::string query;
    if (!token.empty()) query += "continuation-token=" + common::percentEncode(token) + "&";
    query += "list-type=2";
    if (options_.list_page_size > 0) {
      query += fmt::format("&max-keys={}", options_.list_page_size);
    }
    if (!key_prefix.empty()) query += "&prefix=" + common::percentEncode(key_prefix);
    Request request;
    request.url = bucketUrl() + "?" + query;
    request.subject = fmt::format("{} (list {})", location(), common::quotedExcerpt(prefix));
    auto response = perform(request);
    if (!response) return std::unexpected(response.error());
    auto page = s3xml::parseListPage(response->body);
    if (!page) {
      return std::unexpected(StorageError{
          Kind::kOther, fmt::format("{}: GET {}: the answer is no ListObjectsV2 page: {}",
                                    request.subject, request.url, page.error())});
    }
    for (auto& key : page->keys) {
      if (key.starts_with(key_prefix)) names.push_back(key.substr(key_prefix_.size()));
    }
    if (!page->truncated) break;
    if (page->next_continuation_token == token) {
      return std::unexpected(StorageError{
          Kind::kOther, fmt::format("{}: GET {}: the server gave the same continuation token "
                                    "again",
                                    request.subject, request.url)});
    }
    token = std::move(page->next_continuation_token);
  }
  std::sort(names.begin(), names.end());
  return names;
}

StorageResult<void> S3Storage::remove(const std::string& name) {
  if (auto problem = objectNameProblem(name)) {
    return std::unexpected(badName(location(), "object name", name, *problem));
  }
  Request request;
  request.method = "DELETE";
  request.url = objectUrl(name);
  request.subject = subject(name);
  auto response = perform(request);
  // S3 answers 204 for a missing key; some compatible servers answer NoSuchKey.
  if (!response && response.error().kind != Kind::kNotFound) {
    return std::unexpected(response.error());
  }
  return {};
}

}  // namespace rtable::backup
