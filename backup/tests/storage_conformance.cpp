#include "storage_conformance.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>

#include "rtable/common/testing/files.h"

namespace rtable::backup::testing {
namespace {

using common::testing::readFile;
using common::testing::writeFile;
using Kind = StorageError::Kind;

// Fails the test with the error unless `result` holds a value.
#define ASSERT_STORAGE_OK(result) ASSERT_TRUE((result).has_value()) << describe((result).error())

std::string randomBytes(std::size_t size, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::string bytes(size, '\0');
  for (auto& byte : bytes) byte = static_cast<char>(random());
  return bytes;
}

using Names = std::vector<std::string>;

// list(prefix)'s names, or one line saying its error (so that EXPECT_EQ prints it).
Names listed(BackupStorage& storage, const std::string& prefix) {
  auto names = storage.list(prefix);
  if (!names) return {"list failed: " + describe(names.error())};
  return *names;
}

// The entries of a folder, names only (to see that no temporary file stayed behind).
std::set<std::string> entriesOf(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

}  // namespace

ScratchDir::ScratchDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "rtable-backup-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void StorageConformanceTest::SetUp() {
  subject_ = GetParam().make();
  ASSERT_TRUE(subject_);
}

TEST_P(StorageConformanceTest, PutReadAndSize) {
  ASSERT_STORAGE_OK(storage().putBytes("backups/b1/manifest.json", "{\"parts\": 3}"));
  auto read = storage().read("backups/b1/manifest.json");
  ASSERT_STORAGE_OK(read);
  EXPECT_EQ(*read, "{\"parts\": 3}");
  auto size = storage().size("backups/b1/manifest.json");
  ASSERT_STORAGE_OK(size);
  EXPECT_EQ(*size, std::optional<uint64_t>(12));
}

TEST_P(StorageConformanceTest, MissingObjects) {
  auto size = storage().size("data/missing");
  ASSERT_STORAGE_OK(size);
  EXPECT_EQ(*size, std::nullopt);
  auto read = storage().read("data/missing");
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().kind, Kind::kNotFound) << describe(read.error());
  EXPECT_NE(read.error().message.find("data/missing"), std::string::npos) << read.error().message;
  // A folder-like prefix of other objects is no object either.
  ASSERT_STORAGE_OK(storage().putBytes("data/3f/x", "x"));
  size = storage().size("data/3f");
  ASSERT_STORAGE_OK(size);
  EXPECT_EQ(*size, std::nullopt);
  read = storage().read("data/3f");
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().kind, Kind::kNotFound) << describe(read.error());
}

TEST_P(StorageConformanceTest, EmptyObject) {
  ASSERT_STORAGE_OK(storage().putBytes("empty", ""));
  auto size = storage().size("empty");
  ASSERT_STORAGE_OK(size);
  EXPECT_EQ(*size, std::optional<uint64_t>(0));
  auto read = storage().read("empty");
  ASSERT_STORAGE_OK(read);
  EXPECT_EQ(*read, "");
  EXPECT_EQ(listed(storage(), ""), Names({"empty"}));
}

TEST_P(StorageConformanceTest, PutReplacesWhole) {
  ASSERT_STORAGE_OK(storage().putBytes("a/object", "the first, longer version"));
  ASSERT_STORAGE_OK(storage().putBytes("a/object", "second"));
  auto read = storage().read("a/object");
  ASSERT_STORAGE_OK(read);
  EXPECT_EQ(*read, "second");
  auto size = storage().size("a/object");
  ASSERT_STORAGE_OK(size);
  EXPECT_EQ(*size, std::optional<uint64_t>(6));
  EXPECT_EQ(listed(storage(), "a/"), Names({"a/object"}));
}

TEST_P(StorageConformanceTest, Remove) {
  ASSERT_STORAGE_OK(storage().remove("never/written"));
  ASSERT_STORAGE_OK(storage().putBytes("x/y", "y"));
  ASSERT_STORAGE_OK(storage().putBytes("x/z", "z"));
  ASSERT_STORAGE_OK(storage().remove("x/y"));
  auto size = storage().size("x/y");
  ASSERT_STORAGE_OK(size);
  EXPECT_EQ(*size, std::nullopt);
  EXPECT_EQ(listed(storage(), ""), Names({"x/z"}));
  ASSERT_STORAGE_OK(storage().remove("x/y"));
}

TEST_P(StorageConformanceTest, ListIsSortedAndFiltersByPrefix) {
  // Put in an order that is not the sorted one; a name sorts before its extensions, '/' (0x2f)
  // before '0' (0x30), and bytes compare unsigned (UTF-8 after ASCII).
  const std::vector<std::string> names = {
      "data/3f0a", "data/3f/x", "backups/b2/manifest.json", "data/3f/a/deep", "a",
      "data/3g",   "data/é",    "backups/b1/manifest.json", "data/3",         "data/Z"};
  for (const auto& name : names) ASSERT_STORAGE_OK(storage().putBytes(name, name));
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  auto all = storage().list("");
  ASSERT_STORAGE_OK(all);
  EXPECT_EQ(*all, sorted);
  EXPECT_EQ(all->back(), "data/é");
  EXPECT_EQ(listed(storage(), "data/3f"), Names({"data/3f/a/deep", "data/3f/x", "data/3f0a"}));
  EXPECT_EQ(listed(storage(), "data/3f/"), Names({"data/3f/a/deep", "data/3f/x"}));
  EXPECT_EQ(listed(storage(), "backups/"),
            Names({"backups/b1/manifest.json", "backups/b2/manifest.json"}));
  EXPECT_EQ(listed(storage(), "a"), Names({"a"}));
  EXPECT_EQ(listed(storage(), "data/3f/x"), Names({"data/3f/x"}));
  EXPECT_EQ(listed(storage(), "nothing/"), Names());
  EXPECT_EQ(listed(storage(), "dat"), Names(sorted.begin() + 3, sorted.end()));
}

TEST_P(StorageConformanceTest, ListOfMoreThanAThousandObjects) {
  // 1001: one more than S3's default page (max-keys 1000), so the listing needs a continuation.
  constexpr int kObjects = 1001;
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kObjects; i += kThreads) {
        if (!storage().putBytes(fmt::format("many/{:05d}", i), std::to_string(i))) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(failures, 0);
  ASSERT_STORAGE_OK(storage().putBytes("other/x", "x"));
  auto names = storage().list("many/");
  ASSERT_STORAGE_OK(names);
  ASSERT_EQ(names->size(), static_cast<std::size_t>(kObjects));
  for (int i = 0; i < kObjects; ++i) ASSERT_EQ((*names)[i], fmt::format("many/{:05d}", i));
  auto all = storage().list("");
  ASSERT_STORAGE_OK(all);
  EXPECT_EQ(all->size(), static_cast<std::size_t>(kObjects + 1));
}

TEST_P(StorageConformanceTest, ReadToFile) {
  ASSERT_STORAGE_OK(storage().putBytes("data/part", "the part's bytes"));
  const auto target = scratch() / "part";
  writeFile(target, "an older, longer file that the read replaces");
  ASSERT_STORAGE_OK(storage().readToFile("data/part", target));
  EXPECT_EQ(readFile(target), "the part's bytes");
  // A missing object leaves the target as it was and no temporary file beside it.
  auto missing = storage().readToFile("data/missing", target);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().kind, Kind::kNotFound) << describe(missing.error());
  EXPECT_EQ(readFile(target), "the part's bytes");
  EXPECT_EQ(entriesOf(scratch()), std::set<std::string>{"part"});
  // A new file.
  ASSERT_STORAGE_OK(storage().readToFile("data/part", scratch() / "new"));
  EXPECT_EQ(readFile(scratch() / "new"), "the part's bytes");
}

TEST_P(StorageConformanceTest, PutFileOfSeveralMegabytes) {
  // 6 MiB and 3 bytes: more than one buffer or network read, not a round number.
  const std::string bytes = randomBytes((6 << 20) + 3, /*seed=*/42);
  const auto source = scratch() / "source";
  writeFile(source, bytes);
  ASSERT_STORAGE_OK(storage().putFile("data/big", source));
  auto size = storage().size("data/big");
  ASSERT_STORAGE_OK(size);
  EXPECT_EQ(*size, std::optional<uint64_t>(bytes.size()));
  auto read = storage().read("data/big");
  ASSERT_STORAGE_OK(read);
  EXPECT_TRUE(*read == bytes) << "the object read back differs from the file put";
  const auto target = scratch() / "target";
  ASSERT_STORAGE_OK(storage().readToFile("data/big", target));
  EXPECT_TRUE(readFile(target) == bytes) << "the file read back differs from the file put";
  EXPECT_EQ(entriesOf(scratch()), (std::set<std::string>{"source", "target"}));
}

TEST_P(StorageConformanceTest, PutFileOfAMissingSource) {
  auto put = storage().putFile("data/x", scratch() / "no-such-file");
  ASSERT_FALSE(put);
  EXPECT_NE(put.error().message.find("no-such-file"), std::string::npos) << put.error().message;
  EXPECT_EQ(listed(storage(), ""), Names());
}

TEST_P(StorageConformanceTest, NamesWithSpacesUnicodeAndReservedCharacters) {
  // Each needs encoding somewhere: in a URL path ('%', '?', '#', ' ', '+', non-ASCII), in SigV4's
  // canonical request ('+', '=', '~', '!'), in XML listings ('&', '<', '>', '"', '\'').
  std::vector<std::string> names = {"with space/a b", "unicode/ünïcødé-数据", "plus/a+b",
                                    "percent/100%",   "query?/x=1&y#z",       "xml/<&>\"'",
                                    "tilde~/!$',;",   "colon:at@/[brackets]", "star*/(paren)"};
  for (const auto& name : names) ASSERT_STORAGE_OK(storage().putBytes(name, "content of " + name));
  for (const auto& name : names) {
    auto read = storage().read(name);
    ASSERT_STORAGE_OK(read);
    EXPECT_EQ(*read, "content of " + name);
    auto size = storage().size(name);
    ASSERT_STORAGE_OK(size);
    EXPECT_EQ(*size, std::optional<uint64_t>(name.size() + 11));
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(listed(storage(), ""), names);
  EXPECT_EQ(listed(storage(), "plus/a+"), Names({"plus/a+b"}));
  EXPECT_EQ(listed(storage(), "xml/<&"), Names({"xml/<&>\"'"}));
  for (const auto& name : names) ASSERT_STORAGE_OK(storage().remove(name));
  EXPECT_EQ(listed(storage(), ""), Names());
}

TEST_P(StorageConformanceTest, ConcurrentPuts) {
  // Threads put their own names and all of them one shared name: every object whole, the shared
  // one holding one thread's complete value.
  constexpr int kThreads = 6;
  constexpr int kPutsPerThread = 20;
  std::vector<std::string> values;
  for (int t = 0; t < kThreads; ++t) values.push_back(randomBytes(64 * 1024 + t, t));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPutsPerThread; ++i) {
        if (!storage().putBytes(fmt::format("thread{}/{}", t, i), values[t])) ++failures;
        if (!storage().putBytes("shared", values[t])) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(failures, 0);
  for (int t = 0; t < kThreads; ++t) {
    auto names = storage().list(fmt::format("thread{}/", t));
    ASSERT_STORAGE_OK(names);
    EXPECT_EQ(names->size(), static_cast<std::size_t>(kPutsPerThread));
    auto read = storage().read(fmt::format("thread{}/{}", t, kPutsPerThread - 1));
    ASSERT_STORAGE_OK(read);
    EXPECT_TRUE(*read == values[t]);
  }
  auto shared = storage().read("shared");
  ASSERT_STORAGE_OK(shared);
  EXPECT_NE(std::find(values.begin(), values.end(), *shared), values.end())
      << "the shared object is no thread's whole value (" << shared->size() << " bytes)";
}

TEST_P(StorageConformanceTest, BadNamesAreRefusedAndNothingIsWritten) {
  const std::vector<std::string> bad = {"",
                                        "/absolute",
                                        "../escape",
                                        "a/../../escape",
                                        "a//b",
                                        "a/",
                                        ".",
                                        "a/./b",
                                        "..",
                                        ".tmp-1234",
                                        "a/.tmp-x",
                                        std::string("nul\0x", 5),
                                        "new\nline",
                                        "back\\slash",
                                        std::string(1025, 'n')};
  const auto source = scratch() / "source";
  writeFile(source, "bytes");
  for (const auto& name : bad) {
    SCOPED_TRACE(::testing::PrintToString(name));
    auto put = storage().putBytes(name, "bytes");
    ASSERT_FALSE(put);
    EXPECT_EQ(put.error().kind, Kind::kOther) << describe(put.error());
    EXPECT_NE(put.error().message.find("refused"), std::string::npos) << put.error().message;
    auto put_file = storage().putFile(name, source);
    ASSERT_FALSE(put_file);
    EXPECT_EQ(put_file.error().kind, Kind::kOther) << describe(put_file.error());
    EXPECT_FALSE(storage().read(name));
    EXPECT_FALSE(storage().size(name));
    EXPECT_FALSE(storage().remove(name));
    EXPECT_FALSE(storage().readToFile(name, scratch() / "target"));
  }
  for (const std::string prefix : {"../", "/", "a//", "a/../"}) {
    auto list = storage().list(prefix);
    ASSERT_FALSE(list) << prefix;
    EXPECT_EQ(list.error().kind, Kind::kOther) << describe(list.error());
  }
  EXPECT_EQ(listed(storage(), ""), Names());
  EXPECT_EQ(entriesOf(scratch()), std::set<std::string>{"source"});
}

}  // namespace rtable::backup::testing
