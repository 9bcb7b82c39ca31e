// The images, for real (issue 23): scripts/build-image.sh builds both from Debian 12's packages
// without a daemon (mmdebstrap, buildah), and podman (runc) runs them as they run in a pod: as
// uid 65532 with a read-only root file system and no tmpfs. Each binary answers --version in
// both images, and rtable-core serves a replica against a real ZooKeeper: /healthz, /readyz, an
// insert written to its mounted data directory, while writes to its root file system fail.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/common/version.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace rtable::controllers {
namespace {

using namespace std::chrono_literals;
using common::testing::runCommand;

const std::string kTag = "test";

// podman with the flags these machines need (../shared/reference/containers-here.md): runc, not
// crun (hybrid cgroups), and ulimits within the machine's hard limits.
std::vector<std::string> podman(std::vector<std::string> args) {
  std::vector<std::string> argv = {"podman", "--runtime", "runc"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// `podman run` as a pod with runAsUser 65532 and readOnlyRootFilesystem: nothing writable but
// what is mounted (no tmpfs on /tmp either, as in Kubernetes).
std::vector<std::string> runAsPod(std::vector<std::string> args) {
  std::vector<std::string> argv =
      podman({"run", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--user",
              "65532:65532", "--read-only", "--read-only-tmpfs=false"});
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::string describe(const std::expected<common::testing::CommandResult, std::string>& result) {
  if (!result) return result.error();
  return fmt::format("exit {}\n{}{}", result->exit_code, result->out, result->err);
}

class Images : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto built = runCommand(
        {"bash", RTABLE_SOURCE_DIR "/scripts/build-image.sh", RTABLE_BIN_DIR, kTag}, 900s);
    built_ = built && built->exit_code == 0;
    build_log_ = describe(built);
  }

  static inline bool built_ = false;
  static inline std::string build_log_;
};

TEST_F(Images, EveryBinaryRunsAsUser65532OnAReadOnlyRootInBothImages) {
  ASSERT_TRUE(built_) << build_log_;
  for (const std::string image : {"localhost/rtable", "localhost/rtable-operator"}) {
    const std::string name = image + ":" + kTag;
    auto user = runCommand(podman({"image", "inspect", "--format", "{{.Config.User}}", name}), 60s);
    ASSERT_TRUE(user && user->exit_code == 0) << describe(user);
    EXPECT_EQ(user->out, "65532:65532\n") << name;
    for (const std::string binary : {"rtable-core", "rtable-operator", "rtable-inspect"}) {
      SCOPED_TRACE(name + " " + binary);
      auto version = runCommand(
          runAsPod({"--rm", "--entrypoint", "/usr/local/bin/" + binary, name, "--version"}), 120s);
      ASSERT_TRUE(version) << version.error();
      EXPECT_EQ(version->exit_code, 0) << describe(version);
      EXPECT_EQ(version->out, fmt::format("{} {}\n", binary, common::version()));
    }
  }
  // Each image's entrypoint is its own binary (the StatefulSet gives rtable-core only args).
  auto core = runCommand(runAsPod({"--rm", "localhost/rtable:" + kTag, "--version"}), 120s);
  ASSERT_TRUE(core && core->exit_code == 0) << describe(core);
  EXPECT_TRUE(core->out.starts_with("rtable-core ")) << core->out;
  auto op = runCommand(runAsPod({"--rm", "localhost/rtable-operator:" + kTag, "--version"}), 120s);
  ASSERT_TRUE(op && op->exit_code == 0) << describe(op);
  EXPECT_TRUE(op->out.starts_with("rtable-operator ")) << op->out;
}

TEST_F(Images, RtableCoreServesAReplicaAgainstZooKeeperAsUser65532) {
  ASSERT_TRUE(built_) << build_log_;
  auto zookeeper = core::testing::LocalZooKeeper::start();
  ASSERT_TRUE(zookeeper) << zookeeper.error();
  auto http = common::testing::findFreeLoopbackPort();
  auto metrics = common::testing::findFreeLoopbackPort();
  ASSERT_TRUE(http && metrics);

  // The ConfigMap and the PersistentVolumeClaim of a pod, as host directories.
  char pattern[] = "/tmp/rtable-image-test-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::filesystem::path work = pattern;
  std::filesystem::create_directories(work / "config");
  std::filesystem::create_directories(work / "data");
  std::filesystem::permissions(work, std::filesystem::perms::owner_all |
                                         std::filesystem::perms::group_exec |
                                         std::filesystem::perms::others_exec);
  ASSERT_EQ(::chown((work / "data").c_str(), 65532, 65532), 0);
  std::ofstream(work / "config" / "core.yaml")
      << "table: events\n"
         "columns:\n  - {name: id, type: UInt64}\n"
         "orderBy: [id]\n"
      << fmt::format("zookeeper: {{connect: \"{}\"}}\n", (*zookeeper)->connectString())
      << "replica: {name: r1, host: 127.0.0.1}\n"
         "dataDir: /var/lib/rtable\n"
         "listen: 127.0.0.1\n"
      << fmt::format("ports: {{http: {}, metrics: {}}}\n", *http, *metrics);
  std::filesystem::permissions(work / "config" / "core.yaml",
                               std::filesystem::perms::owner_read |
                                   std::filesystem::perms::group_read |
                                   std::filesystem::perms::others_read);

  const std::string container = fmt::format("rtable-image-test-{}", ::getpid());
  // Removed however the test ends.
  struct Cleanup {
    std::string container;
    std::filesystem::path work;
    ~Cleanup() {
      (void)runCommand(podman({"rm", "--force", "--time", "5", container}), 60s);
      std::error_code ignored;
      std::filesystem::remove_all(work, ignored);
    }
  } cleanup{container, work};
  auto started =
      runCommand(runAsPod({"--detach", "--name", container, "--network", "host", "--volume",
                           (work / "config").string() + ":/etc/rtable/config:ro", "--volume",
                           (work / "data").string() + ":/var/lib/rtable",
                           "localhost/rtable:" + kTag, "--config", "/etc/rtable/config/core.yaml"}),
                 120s);
  ASSERT_TRUE(started && started->exit_code == 0) << describe(started);

  auto logs = [&] { return describe(runCommand(podman({"logs", container}), 30s)); };
  bool ready = false;
  for (auto deadline = std::chrono::steady_clock::now() + 60s;
       !ready && std::chrono::steady_clock::now() < deadline;) {
    auto answer = common::testing::httpRequest("127.0.0.1", *http, "GET", "/readyz", "", 2s);
    ready = answer && answer->status == 200;
    if (!ready) std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(ready) << logs();
  auto health = common::testing::httpRequest("127.0.0.1", *http, "GET", "/healthz", "", 5s);
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  // The process runs as 65532, not root.
  auto pid = runCommand(podman({"inspect", "--format", "{{.State.Pid}}", container}), 30s);
  ASSERT_TRUE(pid && pid->exit_code == 0) << describe(pid);
  std::ifstream status("/proc/" + pid->out.substr(0, pid->out.find('\n')) + "/status");
  std::string line;
  std::string uid;
  while (std::getline(status, line)) {
    if (line.starts_with("Uid:")) uid = line;
  }
  EXPECT_EQ(uid, "Uid:\t65532\t65532\t65532\t65532");

  // It writes its data where the volume is, and nowhere else.
  auto inserted = common::testing::httpRequest("127.0.0.1", *http, "POST",
                                               "/insert?format=JSONEachRow", "{\"id\":7}\n", 30s);
  ASSERT_TRUE(inserted);
  EXPECT_EQ(inserted->status, 200) << inserted->body << logs();
  auto count = common::testing::httpRequest("127.0.0.1", *http, "GET", "/count", "", 10s);
  ASSERT_TRUE(count);
  EXPECT_NE(count->body.find("\"rows\":1"), std::string::npos) << count->body;
  EXPECT_FALSE(std::filesystem::is_empty(work / "data"));
  auto written = runCommand(podman({"exec", container, "/usr/bin/touch", "/usr/local/bin/x"}), 60s);
  ASSERT_TRUE(written) << written.error();
  EXPECT_NE(written->exit_code, 0) << "the root file system took a write";
  EXPECT_NE(written->err.find("Read-only file system"), std::string::npos) << describe(written);
}

}  // namespace
}  // namespace rtable::controllers
