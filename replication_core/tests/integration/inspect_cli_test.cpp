// rtable-inspect as a user runs it: the real binary against a real ZooKeeper.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rtable/common/testing/subprocess.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::core {
namespace {

using common::testing::CommandResult;
using testing::LocalZooKeeper;

class InspectCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto zk = LocalZooKeeper::start();
    ASSERT_TRUE(zk) << zk.error();
    zk_ = std::move(*zk).release();
    auto keeper = zk_->connect();
    ASSERT_TRUE(keeper);
    for (const std::string table : {"/rtable/tables/u1/1", "/clickhouse/tables/01/events"}) {
      ASSERT_TRUE(createAncestorsAndSelf(**keeper, table + "/log"));
      ASSERT_TRUE(createAncestorsAndSelf(**keeper, table + "/replicas/r1"));
      for (int i = 0; i < 7; ++i) {
        ASSERT_TRUE((*keeper)->create(table + "/log/log-", "", CreateMode::kPersistentSequential));
      }
    }
  }
  static void TearDownTestSuite() { delete zk_; }

  static CommandResult inspect(std::vector<std::string> args) {
    args.insert(args.begin(), RTABLE_INSPECT_BINARY);
    auto result = common::testing::runCommand(args, std::chrono::seconds(60));
    EXPECT_TRUE(result) << result.error();
    return result ? *result : CommandResult{};
  }

  static LocalZooKeeper* zk_;
};
LocalZooKeeper* InspectCli::zk_ = nullptr;

TEST_F(InspectCli, ListsEveryTableWithItsCounter) {
  auto json_run = inspect({"--zookeeper", zk_->connectString(), "--format", "json"});
  ASSERT_EQ(json_run.exit_code, 0) << json_run.err;
  auto doc = nlohmann::json::parse(json_run.out);
  ASSERT_EQ(doc["tables"].size(), 2u);
  EXPECT_EQ(doc["root"], "/");
  for (const auto& table : doc["tables"]) {
    EXPECT_EQ(table["log_max_index"], 6);
    EXPECT_EQ(table["log_counter"], 7);
    EXPECT_EQ(table["creates_left"], 2147483641);
    EXPECT_EQ(table["replicas"], nlohmann::json::array({"r1"}));
  }

  auto human = inspect({"--zookeeper", zk_->connectString(), "--root", "/rtable"});
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_NE(human.out.find("TABLE"), std::string::npos);
  EXPECT_NE(human.out.find("/rtable/tables/u1/1"), std::string::npos);
  EXPECT_EQ(human.out.find("/clickhouse"), std::string::npos);
}

TEST_F(InspectCli, ExitsOneWhenATableIsUnderTheThreshold) {
  auto keeper = zk_->connect();
  ASSERT_TRUE(keeper);
  ASSERT_TRUE(createAncestorsAndSelf(**keeper, "/low/t/log"));
  ASSERT_TRUE(createAncestorsAndSelf(**keeper, "/low/t/replicas/r1"));
  keeper->reset();
  ASSERT_TRUE(zk_->setSequentialCounter("/low/t/log", 2147483000));  // 648 left: 0.00003%

  auto below = inspect({"--zookeeper", zk_->connectString(), "--root", "/low", "--format=json"});
  EXPECT_EQ(below.exit_code, 1) << below.err;
  auto doc = nlohmann::json::parse(below.out);
  ASSERT_EQ(doc["tables"].size(), 1u);
  EXPECT_EQ(doc["tables"][0]["creates_left"], 648);
  EXPECT_EQ(doc["tables"][0]["below_threshold"], true);

  auto lenient = inspect(
      {"--zookeeper", zk_->connectString(), "--root", "/low", "--min-headroom-percent", "0"});
  EXPECT_EQ(lenient.exit_code, 0) << lenient.err;
  EXPECT_NE(lenient.out.find("648"), std::string::npos);
}

TEST_F(InspectCli, BadFlagsGiveOneLineAndExitTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--zookeeper", zk_->connectString(), "--bogus", "1"}, "--bogus"},
      {{"--root", "/"}, "--zookeeper"},
      {{"--zookeeper", zk_->connectString(), "--format", "xml"}, "--format"},
      {{"--zookeeper", zk_->connectString(), "--min-headroom-percent", "abc"},
       "--min-headroom-percent"},
      {{"--zookeeper", zk_->connectString(), "--min-headroom-percent", "101"},
       "--min-headroom-percent"},
      {{"--zookeeper", zk_->connectString(), "--root", "relative"}, "--root"},
      {{"--zookeeper"}, "--zookeeper"},
  };
  for (const auto& [args, named] : cases) {
    auto run = inspect(args);
    EXPECT_EQ(run.exit_code, 2) << named;
    EXPECT_TRUE(run.out.empty()) << run.out;
    EXPECT_NE(run.err.find(named), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }
}

TEST_F(InspectCli, UnreachableZooKeeperAndMissingRootExitTwo) {
  auto port = common::testing::findFreeLoopbackPort();
  ASSERT_TRUE(port);
  const std::string nowhere = fmt::format("127.0.0.1:{}", *port);
  auto unreachable = inspect({"--zookeeper", nowhere, "--timeout-ms", "500"});
  EXPECT_EQ(unreachable.exit_code, 2);
  EXPECT_EQ(
      unreachable.err,
      fmt::format("rtable-inspect: cannot connect to ZooKeeper at {} within 500 ms\n", nowhere));

  auto missing = inspect({"--zookeeper", zk_->connectString(), "--root", "/does/not/exist"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("/does/not/exist does not exist"), std::string::npos) << missing.err;
}

// A table whose nodes carry a digest ACL (issue 23): listed as NO_ACCESS without its credential
// (exit 2, the other tables still reported), read with it.
TEST_F(InspectCli, ATableWithAnAclNeedsItsCredential) {
  const ZooKeeperDigest digest{"table-s", "s3cret", "/secured/tables/s"};
  ZooKeeperConfig config{
      zk_->connectString(), std::chrono::seconds(10), std::chrono::seconds(10), {digest}};
  auto owner = ZooKeeperClient::connect(config);
  ASSERT_TRUE(owner);
  ASSERT_TRUE(createAncestorsAndSelf(**owner, "/secured/tables/open/log"));
  ASSERT_TRUE(createAncestorsAndSelf(**owner, "/secured/tables/open/replicas/r1"));
  ASSERT_TRUE(createAncestorsAndSelf(**owner, "/secured/tables/s/1/log"));
  ASSERT_TRUE(createAncestorsAndSelf(**owner, "/secured/tables/s/1/replicas/r1"));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        (*owner)->create("/secured/tables/s/1/log/log-", "", CreateMode::kPersistentSequential));
  }

  auto without =
      inspect({"--zookeeper", zk_->connectString(), "--root", "/secured", "--format", "json"});
  EXPECT_EQ(without.exit_code, 2) << without.err;
  auto doc = nlohmann::json::parse(without.out);
  ASSERT_EQ(doc["tables"].size(), 2u) << without.out;
  EXPECT_EQ(doc["tables"][0]["path"], "/secured/tables/open");
  EXPECT_EQ(doc["tables"][0]["readable"], true);
  EXPECT_EQ(doc["tables"][1]["path"], "/secured/tables/s");
  EXPECT_EQ(doc["tables"][1]["readable"], false);
  auto human = inspect({"--zookeeper", zk_->connectString(), "--root", "/secured"});
  EXPECT_NE(human.out.find("NO_ACCESS"), std::string::npos) << human.out;

  const auto dir = zk_->workDir() / "table-s-credentials";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "username") << "table-s\n";  // as a Secret's file may end
  std::ofstream(dir / "password") << "s3cret\n";
  auto with = inspect({"--zookeeper", zk_->connectString(), "--root", "/secured", "--format",
                       "json", "--zookeeper-credentials", dir.string()});
  EXPECT_EQ(with.exit_code, 0) << with.err;
  doc = nlohmann::json::parse(with.out);
  ASSERT_EQ(doc["tables"].size(), 2u) << with.out;
  EXPECT_EQ(doc["tables"][1]["path"], "/secured/tables/s/1");
  EXPECT_EQ(doc["tables"][1]["log_counter"], 3);

  auto missing = inspect(
      {"--zookeeper", zk_->connectString(), "--zookeeper-credentials", (dir / "nope").string()});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("--zookeeper-credentials: cannot read"), std::string::npos)
      << missing.err;
}

}  // namespace
}  // namespace rtable::core
