// ClickHouse 18.16's ReplicatedMergeTree on a real ZooKeeper, side by side with rtable-inspect:
// the same log_max_index, and seed 002's failure reproduced on ClickHouse itself.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "rtable/common/testing/subprocess.h"
#include "rtable/replication_core/log_entry.h"
#include "rtable/replication_core/part_name.h"
#include "rtable/replication_core/testing/local_clickhouse.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace rtable::core {
namespace {

using testing::LocalClickHouse;
using testing::LocalZooKeeper;

constexpr const char* kTablePath = "/clickhouse/tables/01/events";

class ClickHouseComparison : public ::testing::Test {
 protected:
  void SetUp() override {
    auto zk = LocalZooKeeper::start();
    ASSERT_TRUE(zk) << zk.error();
    zk_ = std::move(*zk);
    auto ch = LocalClickHouse::start("127.0.0.1", zk_->port(), "r1");
    ASSERT_TRUE(ch) << ch.error();
    ch_ = std::move(*ch);
    auto created = ch_->query(fmt::format(
        "CREATE TABLE default.events (d Date, x UInt32) ENGINE = ReplicatedMergeTree('{}', "
        "'{{replica}}') PARTITION BY toYYYYMM(d) ORDER BY x",
        kTablePath));
    ASSERT_TRUE(created) << created.error();
  }

  std::string query(const std::string& sql) {
    auto result = ch_->query(sql);
    EXPECT_TRUE(result) << sql << ": " << result.error();
    return result ? *result : "";
  }

  int64_t clickHouseLogMaxIndex() {
    return std::stoll(query("SELECT log_max_index FROM system.replicas WHERE table = 'events'"));
  }

  nlohmann::json inspectedTable() {
    auto run =
        common::testing::runCommand({RTABLE_INSPECT_BINARY, "--zookeeper", zk_->connectString(),
                                     "--root", "/clickhouse", "--format", "json"},
                                    std::chrono::seconds(60));
    EXPECT_TRUE(run) << run.error();
    EXPECT_NE(run->exit_code, 2) << run->err;
    auto doc = nlohmann::json::parse(run->out);
    EXPECT_EQ(doc["tables"].size(), 1u) << run->out;
    return doc["tables"][0];
  }

  // After a ZooKeeper restart ClickHouse reconnects on its own; wait until the table is writable.
  // An insert right after ZooKeeper's restart may still meet the table's expired session (18.16
  // replaces it lazily, on a loaded machine seconds later), or the table read-only again while it
  // does (code 242, seen once in CI after is_readonly had read 0): retried, as a client would. A
  // retry of an insert that was committed after all is deduplicated.
  void insertAfterRestart(const std::string& sql) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      auto result = ch_->query(sql);
      if (result) return;
      const bool reconnecting =
          result.error().find("session has been expired") != std::string::npos ||
          result.error().find("Table is in readonly mode") != std::string::npos;
      if (!reconnecting || std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << sql << ": " << result.error();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

  bool waitUntilWritable() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      auto readonly = ch_->query("SELECT is_readonly FROM system.replicas WHERE table = 'events'");
      auto zk_answers =
          ch_->query("SELECT count() FROM system.zookeeper WHERE path = '/clickhouse'");
      if (readonly && *readonly == "0\n" && zk_answers) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  std::unique_ptr<LocalZooKeeper> zk_;
  std::unique_ptr<LocalClickHouse> ch_;
};

TEST_F(ClickHouseComparison, InspectReportsClickHousesLogMaxIndex) {
  // One log entry per inserted part: 1 + 2 (two months) + 1 = 4 entries, log_max_index 3.
  query("INSERT INTO default.events VALUES ('2026-01-05', 1)");
  query("INSERT INTO default.events VALUES ('2026-01-06', 2), ('2026-02-01', 3)");
  query("INSERT INTO default.events VALUES ('2026-03-01', 4)");
  const int64_t clickhouse = clickHouseLogMaxIndex();
  EXPECT_EQ(clickhouse, 3);

  auto table = inspectedTable();
  EXPECT_EQ(table["path"], kTablePath);
  EXPECT_EQ(table["log_max_index"], clickhouse);
  EXPECT_EQ(table["log_counter"], clickhouse + 1);
  EXPECT_EQ(table["replicas"], nlohmann::json::array({"r1"}));
}

// The log entries ClickHouse writes parse as rtable's LogEntry: the format is shared.
TEST_F(ClickHouseComparison, RtableParsesClickHousesLogEntries) {
  query("INSERT INTO default.events VALUES ('2026-01-05', 1)");
  query("INSERT INTO default.events VALUES ('2026-01-06', 2)");
  query("OPTIMIZE TABLE default.events PARTITION 202601 FINAL");
  const std::string active_part =
      query("SELECT name FROM system.parts WHERE table = 'events' AND active");

  auto keeper = zk_->connect();
  ASSERT_TRUE(keeper);
  const std::string log = std::string(kTablePath) + "/log";
  // OPTIMIZE returns once the merge entry is in the log.
  auto names = (*keeper)->children(log);
  ASSERT_TRUE(names);
  std::sort(names->names.begin(), names->names.end());
  ASSERT_EQ(names->names.size(), 3u);
  std::vector<LogEntry> entries;
  for (const auto& name : names->names) {
    auto text = (*keeper)->get(log + "/" + name);
    ASSERT_TRUE(text);
    auto entry = LogEntry::parse(text->data);
    ASSERT_TRUE(entry) << entry.error() << "\n" << text->data;
    // Nothing lost: formatting it again gives ClickHouse's text back.
    EXPECT_EQ(entry->format(), text->data);
    entries.push_back(*entry);
  }
  EXPECT_EQ(entries[0].type, LogEntry::Type::kGetPart);
  EXPECT_EQ(entries[0].source_replica, "r1");
  EXPECT_TRUE(entries[0].block_id.starts_with("202601_")) << entries[0].block_id;
  EXPECT_EQ(entries[0].new_part_name, "202601_0_0_0");
  EXPECT_EQ(entries[1].new_part_name, "202601_1_1_0");
  EXPECT_EQ(entries[2].type, LogEntry::Type::kMergeParts);
  EXPECT_EQ(entries[2].source_parts, (std::vector<std::string>{"202601_0_0_0", "202601_1_1_0"}));
  EXPECT_EQ(entries[2].new_part_name + "\n", active_part);
  auto merged = PartName::parse(entries[2].new_part_name);
  ASSERT_TRUE(merged);
  for (const auto& source : entries[2].source_parts)
    EXPECT_TRUE(merged->contains(*PartName::parse(source)));
}

// Seed 002, experiment 28, on ClickHouse 18.16: the counter raised to 2147483644, four inserts
// succeed, the fifth fails with "Node exists" on log/log-, reads still work.
TEST_F(ClickHouseComparison, AnExhaustedCounterStopsClickHouseInsertsAndInspectSeesIt) {
  query("INSERT INTO default.events VALUES ('2026-01-05', 1)");
  ASSERT_TRUE(zk_->setSequentialCounter(std::string(kTablePath) + "/log", 2147483644));
  ASSERT_TRUE(waitUntilWritable());

  for (int month = 1; month <= 4; ++month) {
    insertAfterRestart(fmt::format("INSERT INTO default.events VALUES ('2025-{:02d}-01', {})",
                                   month, 100 + month));
    EXPECT_EQ(clickHouseLogMaxIndex(), 2147483643 + month);
  }
  auto fifth = ch_->query("INSERT INTO default.events VALUES ('2025-05-01', 105)");
  ASSERT_FALSE(fifth);
  std::cout << "ClickHouse 18.16 answered the fifth insert with: " << fifth.error();
  EXPECT_NE(fifth.error().find("Node exists"), std::string::npos) << fifth.error();
  EXPECT_NE(fifth.error().find("/log/log-"), std::string::npos) << fifth.error();

  EXPECT_EQ(query("SELECT count() FROM default.events"), "5\n");
  EXPECT_EQ(clickHouseLogMaxIndex(), 2147483647);
  auto table = inspectedTable();
  EXPECT_EQ(table["log_max_index"], 2147483647);
  EXPECT_EQ(table["exhausted"], true);
  EXPECT_EQ(table["creates_left"], 0);
}

}  // namespace
}  // namespace rtable::core
