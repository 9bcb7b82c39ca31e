// S3Storage: backups in an S3-compatible bucket (AWS S3, MinIO, SeaweedFS, ...), over libcurl with
// its built-in AWS Signature Version 4. The object "a/b" is the key "<prefix>/a/b", addressed
// path-style: <endpoint>/<bucket>/<prefix>/a/b.
//
// - Every put is one PUT, atomic on S3's side; objects up to 5 GiB (S3's single-PUT limit: larger
//   ones would need a multipart upload, which this class does not do, so it refuses them).
// - A PUT carries the SHA-256 of its payload as x-amz-content-sha256 (signed) and its MD5 as
//   Content-MD5, so a server refuses a body that changed on the way (kCorrupt).
// - kUnavailable (connection refused or reset, timeouts, 5xx, SlowDown) is retried here with
//   doubling backoff, up to `max_attempts` in all; no other kind is. Every request is idempotent
//   (a PUT of a name replaces it whole, a DELETE of a missing key succeeds), so retrying one whose
//   outcome is unknown is safe.
// - readToFile writes a temporary file beside the target and renames it over the target once the
//   whole object arrived.
//
// Thread safety: every method may be called from several threads at once (each request takes a
// curl handle from a small pool). Lifetime: the object must outlive its calls.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "rtable/backup/backup_storage.h"

namespace rtable::backup {

struct S3StorageOptions {
  // "https://s3.eu-west-1.amazonaws.com", "http://minio.backup.svc:9000": http or https, with an
  // optional port and path; a trailing '/' is ignored.
  std::string endpoint;
  std::string bucket;
  // Keys are "<prefix>/<name>"; empty: the bucket's root. Leading and trailing '/' are ignored.
  std::string prefix;
  std::string region = "us-east-1";
  std::string access_key;
  std::string secret_key;

  std::chrono::milliseconds connect_timeout{10'000};
  // A transfer that moves no byte for this long is abandoned (kUnavailable, then retried). No
  // total timeout: a 5 GiB object on a slow link may take long and still be making progress.
  // Whole seconds (libcurl's low-speed limit counts in seconds); at least 1 s.
  std::chrono::seconds stall_timeout{60};
  // Attempts per call for kUnavailable, the first included, with a pause between two that starts
  // at `initial_backoff` and doubles up to `max_backoff`: 100 ms, 200, 400, 800 (1.5 s in all).
  int max_attempts = 5;
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{2000};
  // ListObjectsV2's max-keys; 0: the server's default (1000 on AWS S3). Tests set it small to
  // cover continuation without thousands of objects.
  int list_page_size = 0;
};

class S3Storage final : public BackupStorage {
 public:
  // Checks the options: an http(s) endpoint, a bucket name as S3 allows (3-63 characters of a-z,
  // 0-9, '.', '-'), a prefix whose components are valid names, keys, attempts >= 1. A bad option
  // is kOther naming it.
  static StorageResult<std::unique_ptr<S3Storage>> create(S3StorageOptions options);
  ~S3Storage() override;

  // "s3://bucket" or "s3://bucket/prefix".
  std::string location() const override;
  StorageResult<std::optional<uint64_t>> size(const std::string& name) override;
  StorageResult<void> putFile(const std::string& name,
                              const std::filesystem::path& source) override;
  StorageResult<void> putBytes(const std::string& name, std::string_view bytes) override;
  StorageResult<std::string> read(const std::string& name) override;
  StorageResult<void> readToFile(const std::string& name,
                                 const std::filesystem::path& target) override;
  StorageResult<std::vector<std::string>> list(const std::string& prefix) override;
  StorageResult<void> remove(const std::string& name) override;

  // Test hook: the next PUT's first body byte is flipped after its checksums were computed, as a
  // corrupting link or proxy would; the server must refuse the upload.
  void corruptNextUploadForTest() { corrupt_next_upload_ = true; }

  // Internal: what one request needs and what it gave (s3_storage.cpp).
  struct Request;
  struct Response;

 private:
  class HandlePool;
  explicit S3Storage(S3StorageOptions options);

  // Where `name` is, for messages: "s3://bucket/prefix/name".
  std::string subject(const std::string& name) const;
  std::string objectUrl(const std::string& name) const;
  std::string bucketUrl() const;
  // One request, tried again while it fails with kUnavailable: the 2xx response, or the last
  // attempt's error.
  StorageResult<Response> perform(Request& request);
  // One attempt.
  StorageResult<Response> performOnce(Request& request);
  // A PUT of `request`'s body to `name`.
  StorageResult<void> put(const std::string& name, Request& request);
  // After a HEAD's 404, which has no body to say what is missing: kNoBucket if the bucket is.
  StorageResult<void> checkBucket(const std::string& subject);

  S3StorageOptions options_;
  std::string key_prefix_;  // options_.prefix normalised, with a final '/' unless empty
  std::string sigv4_;       // "aws:amz:<region>:s3"
  std::unique_ptr<HandlePool> handles_;
  std::atomic<bool> corrupt_next_upload_{false};
};

}  // namespace rtable::backup
