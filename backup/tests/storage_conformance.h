// The conformance suite of BackupStorage (backup_storage.h's contract), one set of value-
// parameterized tests that each implementation's test binary instantiates with a factory:
// FilesystemStorage and FakeStorage in backup_unit_tests, S3Storage on a real SeaweedFS in
// backup_s3_tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "rtable/backup/backup_storage.h"

namespace rtable::backup {

// gtest prints a kind by its name ("NoBucket"), not its bytes.
inline void PrintTo(StorageError::Kind kind, std::ostream* out) {
  *out << storageErrorKindName(kind);
}

}  // namespace rtable::backup

namespace rtable::backup::testing {

// "NoBucket: message", for failure messages.
inline std::string describe(const StorageError& error) {
  return std::string(storageErrorKindName(error.kind)) + ": " + error.message;
}

// An implementation under test: a fresh, empty storage per test, and whatever keeps it alive.
struct StorageUnderTest {
  virtual ~StorageUnderTest() = default;
  virtual BackupStorage& storage() = 0;
};

struct StorageFactory {
  std::string name;  // the instantiation's suffix: "Filesystem", "Fake", "S3"
  std::function<std::unique_ptr<StorageUnderTest>()> make;
};

inline void PrintTo(const StorageFactory& factory, std::ostream* out) {
  *out << factory.name;
}

inline std::string storageFactoryName(const ::testing::TestParamInfo<StorageFactory>& info) {
  return info.param.name;
}

// A folder for local files (putFile sources, readToFile targets), removed after the test.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

class StorageConformanceTest : public ::testing::TestWithParam<StorageFactory> {
 protected:
  void SetUp() override;
  BackupStorage& storage() { return subject_->storage(); }
  const std::filesystem::path& scratch() const { return scratch_.path(); }

 private:
  ScratchDir scratch_;
  std::unique_ptr<StorageUnderTest> subject_;
};

}  // namespace rtable::backup::testing
