// S3Storage against a real S3 server, SeaweedFS (LocalSeaweedFs): the conformance suite, each test
// under its own key prefix on one server, then the errors a user meets: wrong credentials, a
// missing bucket, a stopped server, a corrupted upload.
#include "rtable/backup/s3_storage.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "../storage_conformance.h"
#include "rtable/backup/testing/local_seaweedfs.h"
#include "rtable/common/testing/files.h"

namespace rtable::backup::testing {
namespace {

using common::testing::writeFile;
using Kind = StorageError::Kind;

// One server for the whole binary (about 4 s to start), stopped at exit.
LocalSeaweedFs& sharedServer() {
  static std::unique_ptr<LocalSeaweedFs> server = [] {
    auto started = LocalSeaweedFs::start();
    if (!started) {
      ADD_FAILURE() << "SeaweedFS did not start: " << started.error();
      std::abort();
    }
    return std::move(*started);
  }();
  return *server;
}

std::unique_ptr<S3Storage> storageOn(const S3StorageOptions& options) {
  auto storage = S3Storage::create(options);
  if (!storage) {
    ADD_FAILURE() << describe(storage.error());
    return nullptr;
  }
  return std::move(*storage);
}

// A fresh prefix per test: the tests share the bucket, and each sees only its own objects.
std::string uniquePrefix() {
  static std::atomic<int> next{0};
  return fmt::format("conformance/t{}", next++);
}

struct S3UnderTest : StorageUnderTest {
  std::unique_ptr<S3Storage> storage_ = storageOn(sharedServer().storageOptions(uniquePrefix()));
  BackupStorage& storage() override { return *storage_; }
};

INSTANTIATE_TEST_SUITE_P(S3, StorageConformanceTest,
                         ::testing::Values(StorageFactory{
                             "S3",
                             [] { return std::unique_ptr<StorageUnderTest>(new S3UnderTest); }}),
                         storageFactoryName);

TEST(S3StorageTest, LocationAndOptionChecks) {
  auto options = sharedServer().storageOptions("/backups/events/");
  auto storage = storageOn(options);
  ASSERT_TRUE(storage);
  EXPECT_EQ(storage->location(), "s3://rtable-test/backups/events");
  auto bad = options;
  bad.endpoint = "ftp://example.com";
  EXPECT_FALSE(S3Storage::create(bad));
  bad = options;
  bad.bucket = "Has_Capitals";
  EXPECT_FALSE(S3Storage::create(bad));
  bad = options;
  bad.prefix = "a/../b";
  EXPECT_FALSE(S3Storage::create(bad));
  bad = options;
  bad.secret_key = "";
  EXPECT_FALSE(S3Storage::create(bad));
}

TEST(S3StorageTest, ObjectsAreKeysUnderThePrefix) {
  auto& server = sharedServer();
  auto storage = storageOn(server.storageOptions("layout/pfx"));
  auto root = storageOn(server.storageOptions(""));
  ASSERT_TRUE(storage && root);
  ASSERT_TRUE(storage->putBytes("data/x", "x"));
  auto names = root->list("layout/");
  ASSERT_TRUE(names) << describe(names.error());
  EXPECT_EQ(*names, std::vector<std::string>{"layout/pfx/data/x"});
}

TEST(S3StorageTest, ListingContinuesAcrossManySmallPages) {
  auto options = sharedServer().storageOptions("paging");
  options.list_page_size = 7;
  auto storage = storageOn(options);
  ASSERT_TRUE(storage);
  std::vector<std::string> expected;
  for (int i = 0; i < 50; ++i) {
    expected.push_back(fmt::format("p/{:03d}", i));
    ASSERT_TRUE(storage->putBytes(expected.back(), "x"));
  }
  auto names = storage->list("p/");
  ASSERT_TRUE(names) << describe(names.error());
  EXPECT_EQ(*names, expected);
}

TEST(S3StorageTest, AWrongSecretKeyIsAccessDenied) {
  auto options = sharedServer().storageOptions("credentials");
  options.secret_key = "not-the-secret";
  auto storage = storageOn(options);
  ASSERT_TRUE(storage);
  auto put = storage->putBytes("data/x", "x");
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().kind, Kind::kAccessDenied) << describe(put.error());
  EXPECT_NE(put.error().message.find("s3://rtable-test/credentials/data/x: PUT 403 "
                                     "SignatureDoesNotMatch"),
            std::string::npos)
      << put.error().message;
  auto list = storage->list("");
  ASSERT_FALSE(list);
  EXPECT_EQ(list.error().kind, Kind::kAccessDenied) << describe(list.error());
  EXPECT_NE(list.error().message.find("s3://rtable-test/credentials"), std::string::npos);
  auto size = storage->size("data/x");
  ASSERT_FALSE(size);
  EXPECT_EQ(size.error().kind, Kind::kAccessDenied) << describe(size.error());

  options.access_key = "AKIANOSUCHKEY";
  storage = storageOn(options);
  auto read = storage->read("data/x");
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().kind, Kind::kAccessDenied) << describe(read.error());
  EXPECT_NE(read.error().message.find("403 InvalidAccessKeyId"), std::string::npos)
      << read.error().message;
}

TEST(S3StorageTest, AMissingBucketIsNoBucket) {
  auto options = sharedServer().storageOptions("");
  options.bucket = "no-such-bucket";
  auto storage = storageOn(options);
  ASSERT_TRUE(storage);
  auto put = storage->putBytes("data/x", "x");
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().kind, Kind::kNoBucket) << describe(put.error());
  EXPECT_NE(put.error().message.find("s3://no-such-bucket/data/x"), std::string::npos)
      << put.error().message;
  EXPECT_NE(put.error().message.find("NoSuchBucket"), std::string::npos) << put.error().message;
  auto read = storage->read("data/x");
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().kind, Kind::kNoBucket) << describe(read.error());
  auto size = storage->size("data/x");
  ASSERT_FALSE(size);
  EXPECT_EQ(size.error().kind, Kind::kNoBucket) << describe(size.error());
  auto list = storage->list("");
  ASSERT_FALSE(list);
  EXPECT_EQ(list.error().kind, Kind::kNoBucket) << describe(list.error());
  // No remove: AWS answers a DELETE in a missing bucket with NoSuchBucket, SeaweedFS with 204.
}

TEST(S3StorageTest, ACorruptedUploadIsRefused) {
  auto storage = storageOn(sharedServer().storageOptions("integrity"));
  ASSERT_TRUE(storage);
  ASSERT_TRUE(storage->putBytes("data/part", "the good version"));
  storage->corruptNextUploadForTest();
  auto put = storage->putBytes("data/part", "a version the link corrupts");
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().kind, Kind::kCorrupt) << describe(put.error());
  auto read = storage->read("data/part");
  ASSERT_TRUE(read) << describe(read.error());
  EXPECT_EQ(*read, "the good version");

  // The same through putFile's streaming upload.
  ScratchDir dir;
  writeFile(dir.path() / "part", std::string(3 << 20, 'p'));
  storage->corruptNextUploadForTest();
  put = storage->putFile("data/part", dir.path() / "part");
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().kind, Kind::kCorrupt) << describe(put.error());
  read = storage->read("data/part");
  ASSERT_TRUE(read) << describe(read.error());
  EXPECT_EQ(*read, "the good version");
}

TEST(S3StorageTest, AStoppedServerIsUnavailableAfterRetries) {
  // A server of its own, so that stopping it leaves the others' alone.
  auto server = LocalSeaweedFs::start();
  ASSERT_TRUE(server) << server.error();
  auto options = (*server)->storageOptions("stopped");
  options.max_attempts = 4;
  options.initial_backoff = std::chrono::milliseconds(50);
  auto storage = storageOn(options);
  ASSERT_TRUE(storage);
  ASSERT_TRUE(storage->putBytes("data/x", "x"));
  ASSERT_TRUE((*server)->stop());

  const auto start = std::chrono::steady_clock::now();
  auto read = storage->read("data/x");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().kind, Kind::kUnavailable) << describe(read.error());
  EXPECT_NE(
      read.error().message.find("s3://rtable-test/stopped/data/x: GET " + (*server)->endpoint()),
      std::string::npos)
      << read.error().message;
  EXPECT_NE(read.error().message.find("(gave up after 4 attempts)"), std::string::npos)
      << read.error().message;
  // Backoff 50 + 100 + 200 ms between the four attempts.
  EXPECT_GE(elapsed, std::chrono::milliseconds(350));
  for (auto kind :
       {storage->putBytes("data/y", "y").error().kind, storage->size("data/x").error().kind,
        storage->list("").error().kind, storage->remove("data/x").error().kind}) {
    EXPECT_EQ(kind, Kind::kUnavailable);
  }
}

}  // namespace
}  // namespace rtable::backup::testing
