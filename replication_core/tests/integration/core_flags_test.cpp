// rtable-core's identity flags (--replica-name, --replica-host, --listen, --data-dir): one spec
// file serves every replica of a StatefulSet, each pod giving its own identity on the command line.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::core {
namespace {

using common::testing::runCommand;
using nlohmann::json;

class CoreFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-core-flags-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  // A spec whose replica section and paths the flags are meant to replace.
  std::filesystem::path writeSpec(const std::string& zookeeper, int http_port, int metrics_port) {
    const auto path = dir_ / "spec.yaml";
    std::ofstream(path) << fmt::format(R"(table: flags
columns:
  - {{name: id, type: UInt64}}
zookeeper: {{connect: "{}", sessionTimeoutMs: 4000}}
replica: {{name: from-file, host: file.example}}
dataDir: {}
listen: 0.0.0.0
ports: {{http: {}, metrics: {}}}
)",
                                       zookeeper, (dir_ / "file-data").string(), http_port,
                                       metrics_port);
    return path;
  }

  // rtable-core's exit code and stderr for arguments that must be refused before it starts.
  std::pair<int, std::string> refused(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {RTABLE_CORE_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    auto result = runCommand(argv, std::chrono::seconds(30));
    EXPECT_TRUE(result) << result.error();
    return result ? std::pair{result->exit_code, result->err} : std::pair{-1, std::string()};
  }

  std::filesystem::path dir_;
};

TEST_F(CoreFlags, FlagsOverrideTheSpecFilesIdentityAddressAndDataDir) {
  ZooKeeperClient::silenceLibraryLog();  // its connection attempts while the server starts
  auto zookeeper = testing::LocalZooKeeper::start();
  ASSERT_TRUE(zookeeper) << zookeeper.error();
  auto http_port = common::testing::findFreeLoopbackPort();
  auto metrics_port = common::testing::findFreeLoopbackPort();
  ASSERT_TRUE(http_port && metrics_port);
  const auto spec = writeSpec((*zookeeper)->connectString(), *http_port, *metrics_port);
  const auto data_dir = dir_ / "pod-data";
  // Both forms, --flag=value and --flag value.
  auto process = common::testing::Subprocess::start(
      {RTABLE_CORE_BINARY, "--config", spec.string(), "--replica-name=flags-2", "--replica-host",
       "flags-2.flags-headless.default.svc", "--listen=127.0.0.1", "--data-dir", data_dir.string()},
      dir_ / "core.log");
  ASSERT_TRUE(process) << process.error();
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        auto ready = common::testing::httpRequest("127.0.0.1", *http_port, "GET", "/readyz", "",
                                                  std::chrono::seconds(2));
        return ready && ready->status == 200;
      },
      std::chrono::seconds(60)))
      << common::testing::tailOfFile(dir_ / "core.log");

  auto replica = common::testing::httpRequest("127.0.0.1", *http_port, "GET", "/replica");
  ASSERT_TRUE(replica && replica->status == 200);
  EXPECT_EQ(json::parse(replica->body)["replica"], "flags-2");
  EXPECT_TRUE(std::filesystem::is_directory(data_dir));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "file-data"));

  // In ZooKeeper, under the flag's name, with the flag's host for the other replicas.
  auto keeper = (*zookeeper)->connect();
  ASSERT_TRUE(keeper);
  TablePaths paths{"/rtable/tables/flags", 1, "flags-2"};
  auto host = (*keeper)->get(paths.host());
  ASSERT_TRUE(host) << paths.host();
  EXPECT_TRUE(host->data.starts_with("host: flags-2.flags-headless.default.svc\nport: " +
                                     std::to_string(*http_port)))
      << host->data;
  auto from_file = (*keeper)->get(TablePaths{"/rtable/tables/flags", 1, "from-file"}.replicaRoot());
  EXPECT_FALSE(from_file);
  keeper->reset();
  auto stopped = process->stop();
  ASSERT_TRUE(stopped);
  EXPECT_TRUE(WIFEXITED(*stopped) && WEXITSTATUS(*stopped) == 0);
}

TEST_F(CoreFlags, ABadValueExitsTwoNamingTheFlag) {
  const auto spec = writeSpec("127.0.0.1:1", 1, 2).string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--config", spec, "--replica-name=a/b"},
       "--replica-name 'a/b': replica.name: 'a/b' must be non-empty and contain no '/'"},
      {{"--config", spec, "--replica-name="}, "--replica-name: needs a value"},
      {{"--config", spec, "--data-dir", ""}, "--data-dir: needs a value"},
      {{"--config", spec, "--replica-host="}, "--replica-host: needs a value"},
      {{"--config", spec, "--listen"}, "--listen needs a value"},
      {{"--config", spec, "--replica"}, "unknown argument '--replica'"},
      {{"--replica-name=r1"}, "--config SPEC.yaml is required"},
  };
  for (const auto& [args, message] : cases) {
    auto [code, err] = refused(args);
    EXPECT_EQ(code, 2) << fmt::format("{}", fmt::join(args, " "));
    EXPECT_NE(err.find(message), std::string::npos) << err << "\nexpected: " << message;
  }
  // The file's own errors still name the file's field, before any flag is looked at.
  std::ofstream(dir_ / "bad.yaml") << "table: t\ncolumns: [{name: x, type: Foo}]\n";
  auto [code, err] = refused({"--config", (dir_ / "bad.yaml").string(), "--replica-name=r1"});
  EXPECT_EQ(code, 2);
  EXPECT_NE(err.find("columns[0].type: unknown type 'Foo'"), std::string::npos) << err;
}

TEST_F(CoreFlags, AMalformedBackupFailPointExitsTwoSayingTheForm) {
  const auto spec = writeSpec("127.0.0.1:1", 1, 2).string();
  for (const char* value :
       {"swap:r1:x", "backup:r1", "backup:r1::", "backup:r1:writing files:5",
        "backup:r1:writing files:pause=soon", "backup:r1:writing files:pause=5s"}) {
    auto result = runCommand({"env", std::string("RTABLE_CORE_FAILPOINT=") + value,
                              RTABLE_CORE_BINARY, "--config", spec, "--replica-name=r1"},
                             std::chrono::seconds(30));
    ASSERT_TRUE(result) << result.error();
    EXPECT_EQ(result->exit_code, 2) << value;
    EXPECT_NE(result->err.find(fmt::format(
                  "RTABLE_CORE_FAILPOINT '{}': expected backup:<replica>:<point>[:pause=<seconds>]",
                  value)),
              std::string::npos)
        << result->err;
  }
}

}  // namespace
}  // namespace rtable::core
