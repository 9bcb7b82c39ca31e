#include "rtable/replication_core/table_inspection.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {

class TableInspection : public ::testing::Test {
 protected:
  void makeTable(const std::string& path, std::vector<std::string> replicas, int entries) {
    ASSERT_TRUE(createAncestorsAndSelf(*keeper_, path + "/log"));
    ASSERT_TRUE(createAncestorsAndSelf(*keeper_, path + "/block_numbers/202612"));
    for (const auto& r : replicas)
      ASSERT_TRUE(createAncestorsAndSelf(*keeper_, path + "/replicas/" + r));
    for (int i = 0; i < entries; ++i) {
      ASSERT_TRUE(keeper_->create(path + "/log/log-", "", CreateMode::kPersistentSequential));
    }
  }
  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  std::unique_ptr<Keeper> keeper_ = server_->connect();
};

TEST_F(TableInspection, FindsTablesOfBothLayoutsAndNothingElse) {
  makeTable("/rtable/tables/uid-1/1", {"r1", "r2"}, 3);
  makeTable("/clickhouse/tables/01/events", {"ch1"}, 5);
  // Has a log but no replicas: not a table.
  ASSERT_TRUE(createAncestorsAndSelf(*keeper_, "/other/log"));
  auto reports = findReplicatedTables(*keeper_, "/", 10);
  ASSERT_TRUE(reports) << reports.error().toString();
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].path, "/clickhouse/tables/01/events");
  EXPECT_EQ((*reports)[0].log->maxIndex(), 4);
  EXPECT_EQ((*reports)[0].replicas, std::vector<std::string>{"ch1"});
  EXPECT_EQ((*reports)[1].path, "/rtable/tables/uid-1/1");
  EXPECT_EQ((*reports)[1].log->counter(), 3);
  EXPECT_EQ((*reports)[1].replicas, (std::vector<std::string>{"r1", "r2"}));
}

TEST_F(TableInspection, RootMayBeATableAndDepthIsBounded) {
  makeTable("/a/b/c/t", {"r1"}, 1);
  auto at_table = findReplicatedTables(*keeper_, "/a/b/c/t", 0);
  ASSERT_TRUE(at_table);
  EXPECT_EQ(at_table->size(), 1u);
  auto shallow = findReplicatedTables(*keeper_, "/a", 2);
  ASSERT_TRUE(shallow);
  EXPECT_TRUE(shallow->empty());
  auto deep = findReplicatedTables(*keeper_, "/a", 3);
  ASSERT_TRUE(deep);
  EXPECT_EQ(deep->size(), 1u);
}

TEST_F(TableInspection, AMissingRootIsAnError) {
  auto reports = findReplicatedTables(*keeper_, "/nope", 5);
  ASSERT_FALSE(reports);
  EXPECT_EQ(reports.error().code, KeeperCode::kNoNode);
  EXPECT_EQ(reports.error().path, "/nope");
}

TEST_F(TableInspection, ReportsFlagTablesUnderTheThreshold) {
  makeTable("/t/low", {"r1"}, 1);
  makeTable("/t/ok", {"r1"}, 1);
  ASSERT_TRUE(server_->setSequentialCounterForTest("/t/low/log", 2100000000));
  auto reports = findReplicatedTables(*keeper_, "/t", 3);
  ASSERT_TRUE(reports);
  const HeadroomThreshold threshold{5.0};
  auto json = nlohmann::json::parse(formatReportsAsJson("/t", *reports, threshold));
  ASSERT_EQ(json["tables"].size(), 2u);
  EXPECT_EQ(json["tables"][0]["path"], "/t/low");
  EXPECT_EQ(json["tables"][0]["log_counter"], 2100000000);
  EXPECT_EQ(json["tables"][0]["creates_left"], 47483648);
  EXPECT_EQ(json["tables"][0]["below_threshold"], true);
  EXPECT_EQ(json["tables"][1]["below_threshold"], false);
  EXPECT_EQ(json["min_headroom_percent"], 5.0);

  const std::string table = formatReportsAsTable(*reports, threshold);
  EXPECT_NE(table.find("LOG_MAX_INDEX"), std::string::npos);
  EXPECT_NE(table.find("2099999999"), std::string::npos);
  EXPECT_NE(table.find("LOW"), std::string::npos);
}

}  // namespace
}  // namespace rtable::core
