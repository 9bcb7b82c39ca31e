// FilesystemStorage and FakeStorage through the conformance suite, then what only a directory
// has: a missing root, the layout on disk, temporary files, and the errors of a full, read-only or
// forbidden file system, each made real (a tmpfs in a private mount namespace, another user) in a
// child process that runs rtable-backup-storage-probe.
#include "rtable/backup/filesystem_storage.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "../storage_conformance.h"
#include "local_files.h"
#include "rtable/backup/testing/fake_storage.h"
#include "rtable/common/testing/files.h"
#include "rtable/common/testing/subprocess.h"

namespace rtable::backup::testing {
namespace {

using common::testing::readFile;
using common::testing::runCommand;
using common::testing::writeFile;
using Kind = StorageError::Kind;

struct FilesystemUnderTest : StorageUnderTest {
  ScratchDir dir;
  FilesystemStorage storage_{dir.path()};
  BackupStorage& storage() override { return storage_; }
};

struct FakeUnderTest : StorageUnderTest {
  FakeStorage storage_;
  BackupStorage& storage() override { return storage_; }
};

INSTANTIATE_TEST_SUITE_P(
    Filesystem, StorageConformanceTest,
    ::testing::Values(StorageFactory{
        "Filesystem", [] { return std::unique_ptr<StorageUnderTest>(new FilesystemUnderTest); }}),
    storageFactoryName);

INSTANTIATE_TEST_SUITE_P(Fake, StorageConformanceTest,
                         ::testing::Values(StorageFactory{
                             "Fake",
                             [] { return std::unique_ptr<StorageUnderTest>(new FakeUnderTest); }}),
                         storageFactoryName);

TEST(FilesystemStorageTest, CopiesAreMadeInTheKernelOrByReadAndWriteAlike) {
  ScratchDir dir;
  std::string bytes;
  for (int i = 0; bytes.size() < (3u << 20); ++i) bytes += fmt::format("row {}\n", i);
  writeFile(dir.path() / "source", bytes);
  // A file: copy_file_range.
  const int file = ::open((dir.path() / "source").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(file, 0);
  auto copied = AtomicFile::create(dir.path() / "from-file");
  ASSERT_TRUE(copied);
  ASSERT_TRUE(copyInto(file, dir.path() / "source", *copied));
  ::close(file);
  ASSERT_TRUE(copied->commit());
  EXPECT_EQ(readFile(dir.path() / "from-file"), bytes);
  // A pipe, which copy_file_range refuses (EINVAL): read and write.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const std::string piped = "through a pipe\n";
  ASSERT_EQ(::write(pipe_fds[1], piped.data(), piped.size()), static_cast<ssize_t>(piped.size()));
  ::close(pipe_fds[1]);
  auto from_pipe = AtomicFile::create(dir.path() / "from-pipe");
  ASSERT_TRUE(from_pipe);
  ASSERT_TRUE(copyInto(pipe_fds[0], "a pipe", *from_pipe));
  ::close(pipe_fds[0]);
  ASSERT_TRUE(from_pipe->commit());
  EXPECT_EQ(readFile(dir.path() / "from-pipe"), piped);
}

TEST(FilesystemStorageTest, AMissingRootIsNoBucketAndIsNeverCreated) {
  ScratchDir dir;
  const auto root = dir.path() / "backups-typo";
  FilesystemStorage storage(root);
  auto put = storage.putBytes("data/x", "x");
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().kind, Kind::kNoBucket) << describe(put.error());
  EXPECT_NE(put.error().message.find(root.string()), std::string::npos) << put.error().message;
  EXPECT_NE(put.error().message.find("No such file or directory"), std::string::npos)
      << put.error().message;
  EXPECT_EQ(storage.read("data/x").error().kind, Kind::kNoBucket);
  EXPECT_EQ(storage.size("data/x").error().kind, Kind::kNoBucket);
  EXPECT_EQ(storage.list("").error().kind, Kind::kNoBucket);
  EXPECT_EQ(storage.remove("data/x").error().kind, Kind::kNoBucket);
  writeFile(dir.path() / "source", "x");
  EXPECT_EQ(storage.putFile("data/x", dir.path() / "source").error().kind, Kind::kNoBucket);
  EXPECT_FALSE(std::filesystem::exists(root));
}

TEST(FilesystemStorageTest, ARootThatIsAFileIsNoBucket) {
  ScratchDir dir;
  writeFile(dir.path() / "file", "");
  FilesystemStorage storage(dir.path() / "file");
  auto put = storage.putBytes("x", "x");
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().kind, Kind::kNoBucket) << describe(put.error());
}

TEST(FilesystemStorageTest, ObjectsAreFilesUnderTheRoot) {
  ScratchDir dir;
  FilesystemStorage storage(dir.path());
  EXPECT_EQ(storage.location(), dir.path().string());
  ASSERT_TRUE(storage.putBytes("backups/b1/manifest.json", "{}"));
  EXPECT_EQ(readFile(dir.path() / "backups/b1/manifest.json"), "{}");
  // A file another writer put there is an object.
  writeFile(dir.path() / "backups/b1/extra", "e");
  auto names = storage.list("backups/b1/");
  ASSERT_TRUE(names) << describe(names.error());
  EXPECT_EQ(*names, (std::vector<std::string>{"backups/b1/extra", "backups/b1/manifest.json"}));
}

TEST(FilesystemStorageTest, TemporaryFilesAreNeverListed) {
  ScratchDir dir;
  FilesystemStorage storage(dir.path());
  ASSERT_TRUE(storage.putBytes("data/a", "a"));
  // What a put that died between create and rename leaves behind.
  writeFile(dir.path() / ".tmp-0123456789abcdef", "partial");
  writeFile(dir.path() / "data/.tmp-fedcba9876543210", "partial");
  auto names = storage.list("");
  ASSERT_TRUE(names) << describe(names.error());
  EXPECT_EQ(*names, std::vector<std::string>{"data/a"});
  names = storage.list("data/.tmp");
  ASSERT_TRUE(names) << describe(names.error());
  EXPECT_EQ(*names, std::vector<std::string>{});
}

TEST(FilesystemStorageTest, DotDotIsRefusedAndNothingIsWrittenOutsideTheRoot) {
  ScratchDir dir;
  std::filesystem::create_directory(dir.path() / "root");
  FilesystemStorage storage(dir.path() / "root");
  for (const std::string name : {"../escape", "a/../../escape", "/tmp/escape", "..", "a/.."}) {
    auto put = storage.putBytes(name, "x");
    ASSERT_FALSE(put) << name;
    EXPECT_EQ(put.error().kind, Kind::kOther) << describe(put.error());
    EXPECT_NE(put.error().message.find("refused the object name"), std::string::npos)
        << put.error().message;
  }
  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    entries.push_back(entry.path().lexically_relative(dir.path()).string());
  }
  EXPECT_EQ(entries, std::vector<std::string>{"root"});
}

TEST(FilesystemStorageTest, APutUnderAnObjectIsAnError) {
  ScratchDir dir;
  FilesystemStorage storage(dir.path());
  ASSERT_TRUE(storage.putBytes("a", "a"));
  auto put = storage.putBytes("a/b", "b");
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().kind, Kind::kOther) << describe(put.error());
  EXPECT_NE(put.error().message.find("Not a directory"), std::string::npos) << put.error().message;
}

// --- errors of the file system, each in a child process (rtable-backup-storage-probe)

// The probe's output lines for `operations` on `root`, run through `prefix` (a command that
// ends by running the rest of its arguments), from `binary`.
std::vector<std::string> probe(const std::vector<std::string>& prefix,
                               const std::filesystem::path& root,
                               const std::vector<std::string>& operations,
                               const std::filesystem::path& binary = RTABLE_BACKUP_STORAGE_PROBE) {
  std::vector<std::string> argv = prefix;
  argv.push_back(binary.string());
  argv.push_back(root.string());
  argv.insert(argv.end(), operations.begin(), operations.end());
  auto result = runCommand(argv, std::chrono::seconds(60));
  if (!result) return {"probe failed: " + result.error()};
  if (result->exit_code != 0) {
    return {fmt::format("probe exited {}: {}{}", result->exit_code, result->out, result->err)};
  }
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t end; (end = result->out.find('\n', start)) != std::string::npos;
       start = end + 1) {
    lines.push_back(result->out.substr(start, end - start));
  }
  return lines;
}

// A command prefix that mounts a tmpfs with `mount_options` on its first argument in a private
// mount namespace, then runs the rest: the mount is gone when the child exits, whatever happens.
// As root a mount namespace is enough; otherwise a user namespace maps the user to root in it.
std::vector<std::string> inTmpfs(const std::filesystem::path& dir,
                                 const std::string& mount_options) {
  std::vector<std::string> argv = {"unshare"};
  if (geteuid() != 0) argv.insert(argv.end(), {"--user", "--map-root-user"});
  argv.insert(argv.end(), {"--mount", "--propagation", "private", "sh", "-c",
                           "mount -t tmpfs -o \"$1\" rtable-test \"$2\" && shift 2 && exec \"$@\"",
                           "sh", mount_options, dir.string()});
  return argv;
}

bool startsWith(const std::string& line, std::string_view prefix) {
  return line.starts_with(prefix);
}

TEST(FilesystemStorageTest, AFullVolumeIsNoSpaceAndKeepsTheOldObject) {
  ScratchDir dir;
  // 1 MiB of tmpfs: a 64 KiB object fits, a 2 MB one does not.
  const auto lines =
      probe(inTmpfs(dir.path(), "size=1m"), dir.path(),
            {"put:data/part:65536", "put:data/part:2000000", "read:data/part", "entries"});
  ASSERT_EQ(lines.size(), 4u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0], "ok");
  EXPECT_TRUE(startsWith(lines[1], "NoSpace: " + (dir.path() / "data/part").string() + ": write "))
      << lines[1];
  EXPECT_NE(lines[1].find("No space left on device"), std::string::npos) << lines[1];
  // The failed put left the old object whole and removed its temporary file.
  EXPECT_EQ(lines[2], "ok 65536");
  EXPECT_EQ(lines[3], "entries data data/part");
}

TEST(FilesystemStorageTest, AReadOnlyFileSystemIsAccessDenied) {
  ScratchDir dir;
  const auto lines =
      probe(inTmpfs(dir.path(), "ro"), dir.path(), {"put:data/part:10", "list:", "read:x"});
  ASSERT_EQ(lines.size(), 3u) << ::testing::PrintToString(lines);
  EXPECT_TRUE(startsWith(lines[0], "AccessDenied: " + (dir.path() / "data/part").string()))
      << lines[0];
  EXPECT_NE(lines[0].find("Read-only file system"), std::string::npos) << lines[0];
  // Reading a read-only destination works (a restore from a read-only mount).
  EXPECT_EQ(lines[1], "ok");
  EXPECT_TRUE(startsWith(lines[2], "NotFound: ")) << lines[2];
}

TEST(FilesystemStorageTest, ADirectoryWithoutWritePermissionIsAccessDenied) {
  ScratchDir dir;
  const auto root = dir.path() / "root";
  std::filesystem::create_directory(root);
  writeFile(root / "existing", "e");
  std::vector<std::string> prefix;
  std::filesystem::path binary = RTABLE_BACKUP_STORAGE_PROBE;
  if (geteuid() == 0) {
    binary = dir.path() / "probe";
    // Root writes anywhere (CAP_DAC_OVERRIDE): the probe runs as nobody, to whom the folders
    // (root's, mode 0755) are readable and not writable.
    std::filesystem::permissions(dir.path(), std::filesystem::perms(0755));
    prefix = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
    // A copy nobody can run: the build folder may be under a home only root can enter.
    std::filesystem::copy_file(RTABLE_BACKUP_STORAGE_PROBE, binary);
    // Under TSan the probe reads the suppressions file, which may sit in a clone nobody can
    // enter (CI's mktemp -d, mode 0700): a readable copy instead.
    if (const char* options = std::getenv("TSAN_OPTIONS")) {
      std::string text = options;
      const std::string key = "suppressions=";
      if (auto at = text.find(key); at != std::string::npos) {
        const auto end = text.find_first_of(" :", at);
        const std::string file = text.substr(at + key.size(), end - at - key.size());
        const auto copy = dir.path() / "tsan.supp";
        std::filesystem::copy_file(file, copy);
        std::filesystem::permissions(copy, std::filesystem::perms(0644));
        text.replace(at + key.size(), file.size(), copy.string());
        prefix.insert(prefix.end(), {"env", "TSAN_OPTIONS=" + text});
      }
    }
  } else {
    std::filesystem::permissions(root, std::filesystem::perms(0555));
  }
  const auto lines = probe(prefix, root, {"put:data/part:10", "put:x:10", "read:existing"}, binary);
  std::filesystem::permissions(root, std::filesystem::perms(0755));
  ASSERT_EQ(lines.size(), 3u) << ::testing::PrintToString(lines);
  EXPECT_TRUE(startsWith(lines[0], "AccessDenied: ")) << lines[0];
  EXPECT_NE(lines[0].find("mkdir " + (root / "data").string() + ": Permission denied"),
            std::string::npos)
      << lines[0];
  EXPECT_TRUE(startsWith(lines[1], "AccessDenied: ")) << lines[1];
  EXPECT_NE(lines[1].find("Permission denied"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[2], "ok 1");
  EXPECT_EQ(std::filesystem::directory_iterator(root)->path().filename(), "existing");
}

}  // namespace
}  // namespace rtable::backup::testing
