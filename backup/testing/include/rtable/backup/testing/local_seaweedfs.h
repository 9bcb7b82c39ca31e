// A real S3 server for tests: SeaweedFS's `weed server` (master, volume server, filer and S3
// gateway in one process) on free loopback ports, with generated credentials in an s3.json and one
// bucket created. The binary is built and cached by e2e/build-seaweedfs.sh
// (docs/backup-storage.md); $RTABLE_WEED_BINARY overrides the path this build was configured with.
//
// Thread safety: one thread at a time. Lifetime: the process is stopped on destruction, and its
// work directory removed unless RTABLE_KEEP_TEST_DIRS is set.
#pragma once

#include <expected>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rtable/backup/s3_storage.h"
#include "rtable/common/testing/subprocess.h"

namespace rtable::backup::testing {

using common::testing::Subprocess;
using common::testing::TestStatus;

struct LocalSeaweedFsOptions {
  // Empty: $RTABLE_WEED_BINARY, else the cached path of e2e/build-seaweedfs.sh.
  std::filesystem::path binary;
  // Where data/, s3.json and weed.log go. Empty: a new folder under the system temp dir.
  std::filesystem::path work_dir;
  // Created once the server answers.
  std::string bucket = "rtable-test";
};

class LocalSeaweedFs {
 public:
  static std::expected<std::unique_ptr<LocalSeaweedFs>, std::string> start(
      LocalSeaweedFsOptions options = {});
  ~LocalSeaweedFs();
  LocalSeaweedFs(const LocalSeaweedFs&) = delete;
  LocalSeaweedFs& operator=(const LocalSeaweedFs&) = delete;

  // The weed binary the options and the environment select.
  static std::filesystem::path defaultBinary();

  std::string endpoint() const;  // "http://127.0.0.1:<s3 port>"
  const std::string& bucket() const { return bucket_; }
  // The credentials storages use: Read, Write and List, not Admin.
  const std::string& accessKey() const { return access_key_; }
  const std::string& secretKey() const { return secret_key_; }
  std::filesystem::path logFile() const { return work_dir_ / "weed.log"; }
  // Options for an S3Storage on this server's bucket under `prefix`.
  S3StorageOptions storageOptions(const std::string& prefix = "") const;

  // PUT /<bucket>, as the server's administrator.
  TestStatus createBucket(const std::string& bucket);
  // Stops the server (SIGTERM); requests then fail with connection refused.
  TestStatus stop();

 private:
  LocalSeaweedFs(std::filesystem::path binary, std::filesystem::path work_dir, bool owns_work_dir)
      : binary_(std::move(binary)), work_dir_(std::move(work_dir)), owns_work_dir_(owns_work_dir) {}
  TestStatus launch();
  // A request to the S3 port signed as the administrator: the HTTP status, or why there was none.
  std::expected<long, std::string> signedRequest(const std::string& method, const std::string& path,
                                                 std::string_view body = {});

  std::filesystem::path binary_;
  std::filesystem::path work_dir_;
  bool owns_work_dir_;
  std::string bucket_;
  std::string access_key_;
  std::string secret_key_;
  std::string admin_access_key_;
  std::string admin_secret_key_;
  int s3_port_ = 0;
  std::vector<int> grpc_ports_;
  std::optional<Subprocess> process_;
};

}  // namespace rtable::backup::testing
