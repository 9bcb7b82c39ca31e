#include "rtable/backup/testing/local_seaweedfs.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

namespace rtable::backup::testing {
namespace {

using common::testing::findFreeLoopbackPort;
using common::testing::tailOfFile;

// weed server on two shared cores answers in about 2 s, and takes its first write about 5 s later:
// a freshly elected master defers allocating volume ids (docs/backup-storage.md).
constexpr auto kStartTimeout = std::chrono::seconds(90);

std::string randomHex(std::size_t digits) {
  static std::mt19937_64 random{std::random_device{}()};
  std::string out;
  while (out.size() < digits) out += fmt::format("{:016x}", random());
  out.resize(digits);
  return out;
}

std::string sha256Hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  std::string out;
  for (unsigned int i = 0; i < size; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

size_t discardBody(char*, size_t size, size_t count, void*) {
  return size * count;
}

}  // namespace

std::filesystem::path LocalSeaweedFs::defaultBinary() {
  if (const char* binary = std::getenv("RTABLE_WEED_BINARY"); binary && *binary) return binary;
  return RTABLE_WEED_BINARY;
}

std::expected<std::unique_ptr<LocalSeaweedFs>, std::string> LocalSeaweedFs::start(
    LocalSeaweedFsOptions options) {
  if (options.binary.empty()) options.binary = defaultBinary();
  if (::access(options.binary.c_str(), X_OK) != 0) {
    return std::unexpected(
        fmt::format("no SeaweedFS binary at {} (build it with e2e/build-seaweedfs.sh, or set "
                    "RTABLE_WEED_BINARY)",
                    options.binary.string()));
  }
  bool owns = false;
  if (options.work_dir.empty()) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "rtable-seaweedfs-XXXXXX").string();
    if (!mkdtemp(pattern.data())) return std::unexpected("mkdtemp failed for " + pattern);
    options.work_dir = pattern;
    owns = true;
  }
  std::unique_ptr<LocalSeaweedFs> server(
      new LocalSeaweedFs(options.binary, options.work_dir, owns));
  server->bucket_ = options.bucket;
  server->access_key_ = "rtable" + randomHex(14);
  server->secret_key_ = randomHex(40);
  server->admin_access_key_ = "admin" + randomHex(15);
  server->admin_secret_key_ = randomHex(40);
  // The ports are free when we look; another process may take one before weed binds, so a few
  // tries with fresh ports.
  std::string last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto launched = server->launch();
    if (launched) return server;
    last_error = launched.error();
  }
  return std::unexpected(last_error);
}

LocalSeaweedFs::~LocalSeaweedFs() {
  (void)stop();
  if (owns_work_dir_ && !std::getenv("RTABLE_KEEP_TEST_DIRS")) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
}

std::string LocalSeaweedFs::endpoint() const {
  return fmt::format("http://127.0.0.1:{}", s3_port_);
}

S3StorageOptions LocalSeaweedFs::storageOptions(const std::string& prefix) const {
  S3StorageOptions options;
  options.endpoint = endpoint();
  options.bucket = bucket_;
  options.prefix = prefix;
  options.access_key = access_key_;
  options.secret_key = secret_key_;
  return options;
}

TestStatus LocalSeaweedFs::launch() {
  (void)stop();  // a failed earlier attempt's process and sockets
  // Every port weed would listen on, chosen here: its defaults (9333, 8080, 8888, 8333 and those
  // plus 10000 for gRPC) would collide with other tests and other users of the machine.
  std::set<int> ports;
  while (ports.size() < 8) {
    auto port = findFreeLoopbackPort();
    if (!port) return std::unexpected(port.error());
    ports.insert(*port);
  }
  auto next = ports.begin();
  const int master = *next++, master_grpc = *next++, volume = *next++, volume_grpc = *next++,
            filer = *next++, filer_grpc = *next++, s3 = *next++, s3_grpc = *next++;
  s3_port_ = s3;
  grpc_ports_ = {master_grpc, volume_grpc, filer_grpc, s3_grpc};

  const auto data_dir = work_dir_ / "data";
  std::error_code ec;
  std::filesystem::remove_all(data_dir, ec);
  std::filesystem::create_directories(data_dir, ec);
  if (ec)
    return std::unexpected(fmt::format("cannot create {}: {}", data_dir.string(), ec.message()));
  // Two identities: the fixture's own administrator, which creates buckets, and the one storages
  // get, with only what a backup needs (Read, Write, List), as a production key would have.
  const nlohmann::json identities = {
      {"identities",
       {{{"name", "admin"},
         {"credentials", {{{"accessKey", admin_access_key_}, {"secretKey", admin_secret_key_}}}},
         {"actions", {"Admin"}}},
        {{"name", "rtable"},
         {"credentials", {{{"accessKey", access_key_}, {"secretKey", secret_key_}}}},
         {"actions", {"Read", "Write", "List"}}}}}};
  const auto s3_config = work_dir_ / "s3.json";
  std::ofstream(s3_config) << identities.dump(2) << "\n";

  auto process = Subprocess::start(
      {binary_.string(), "server", "-dir=" + data_dir.string(), "-ip=127.0.0.1",
       "-ip.bind=127.0.0.1", fmt::format("-master.port={}", master),
       fmt::format("-master.port.grpc={}", master_grpc), fmt::format("-volume.port={}", volume),
       fmt::format("-volume.port.grpc={}", volume_grpc), "-filer",
       fmt::format("-filer.port={}", filer), fmt::format("-filer.port.grpc={}", filer_grpc), "-s3",
       fmt::format("-s3.port={}", s3), fmt::format("-s3.port.grpc={}", s3_grpc),
       "-s3.config=" + s3_config.string(),
       // Nothing else listens, and nothing on fixed ports or paths shared with other instances:
       // the Iceberg and Lance catalogs are off and the unix sockets are in the work dir.
       "-s3.port.iceberg=0", "-s3.port.lance=0",
       "-filer.localSocket=" + (work_dir_ / "filer.sock").string(),
       "-s3.localSocket=" + (work_dir_ / "s3.sock").string(),
       // A missing bucket is NoSuchBucket, as on AWS: SeaweedFS would create it on a PUT (for
       // administrators only, which the storages' identity is not).
       "-s3.autoCreateBucket=false",
       // No usage reports to telemetry.seaweedfs.com from tests.
       "-master.telemetry=false",
       // Stop at once on SIGTERM (the volume server would wait 10 s for clients to move away).
       "-volume.preStopSeconds=0",
       // Small volumes (64 MB each, 8 at most): a test writes megabytes.
       "-master.volumeSizeLimitMB=64"},
      logFile());
  if (!process) return std::unexpected(process.error());
  process_.emplace(std::move(*process));

  // Ready means a signed request is answered and an object can be written: the S3 gateway answers
  // seconds before the master allocates its first volumes.
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  std::string last;
  bool bucket_created = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->running()) {
      process_.reset();
      return std::unexpected(
          fmt::format("weed server (S3 port {}) exited during start; log tail:\n{}", s3,
                      tailOfFile(logFile())));
    }
    if (!bucket_created) {
      auto status = signedRequest("PUT", "/" + bucket_);
      if (status && *status == 200) {
        bucket_created = true;
      } else {
        last = status ? fmt::format("PUT /{}: {}", bucket_, *status) : status.error();
      }
    }
    if (bucket_created) {
      const std::string probe = "/" + bucket_ + "/rtable-ready-probe";
      auto put = signedRequest("PUT", probe, "ready");
      if (put && *put == 200) {
        auto removed = signedRequest("DELETE", probe);
        if (removed && *removed / 100 == 2) return {};
        last = removed ? fmt::format("DELETE {}: {}", probe, *removed) : removed.error();
      } else {
        last = put ? fmt::format("PUT {}: {}", probe, *put) : put.error();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  process_->kill();
  process_.reset();
  return std::unexpected(
      fmt::format("weed server (S3 port {}) not ready after {} s ({}); log "
                  "tail:\n{}",
                  s3, kStartTimeout.count(), last, tailOfFile(logFile())));
}

TestStatus LocalSeaweedFs::createBucket(const std::string& bucket) {
  auto status = signedRequest("PUT", "/" + bucket);
  if (!status) return std::unexpected(status.error());
  if (*status != 200) return std::unexpected(fmt::format("PUT /{}: HTTP {}", bucket, *status));
  return {};
}

TestStatus LocalSeaweedFs::stop() {
  if (process_) {
    // weed answers SIGTERM by stopping its servers, yet the process lingers for good (seen with
    // 4.53): a short grace, then SIGKILL.
    process_->stop(std::chrono::seconds(2));
    process_.reset();
  }
  // The unix sockets weed puts beside its gRPC ports, in $TMPDIR whatever the flags say.
  for (int port : grpc_ports_) {
    for (const char* server : {"master", "volume", "filer", "s3"}) {
      std::error_code ec;
      std::filesystem::remove(std::filesystem::temp_directory_path() /
                                  fmt::format("seaweedfs-{}-grpc-{}.sock", server, port),
                              ec);
    }
  }
  grpc_ports_.clear();
  return {};
}

std::expected<long, std::string> LocalSeaweedFs::signedRequest(const std::string& method,
                                                               const std::string& path,
                                                               std::string_view body) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURL* handle = curl_easy_init();
  if (!handle) return std::unexpected("curl_easy_init failed");
  const std::string url = endpoint() + path;
  char error[CURL_ERROR_SIZE] = "";
  // libcurl 7.88 sends no x-amz-content-sha256; given one, it signs the request with it.
  const std::string sha256 = "x-amz-content-sha256: " + sha256Hex(body);
  curl_slist* headers = curl_slist_append(nullptr, sha256.c_str());
  const std::string sigv4 = "aws:amz:us-east-1:s3";
  curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(handle, CURLOPT_USERNAME, admin_access_key_.c_str());
  curl_easy_setopt(handle, CURLOPT_PASSWORD, admin_secret_key_.c_str());
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, method.c_str());
  // Long enough for the first write, which waits for volume allocation (kStartTimeout).
  curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, 30000L);
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, discardBody);
  if (!body.empty()) {
    curl_easy_setopt(handle, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode code = curl_easy_perform(handle);
  long status = 0;
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(handle);
  if (code != CURLE_OK) {
    return std::unexpected(
        fmt::format("{} {}: {} ({})", method, url, curl_easy_strerror(code), error));
  }
  return status;
}

}  // namespace rtable::backup::testing
