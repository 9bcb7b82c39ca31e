// Three rtable-core processes replicating one table through a real ZooKeeper 3.8 (issue 4): after
// every scenario the queues drain and every replica has the same parts, byte for byte, and the
// same rows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/testing/wait.h"

namespace rtable::core {
namespace {

using nlohmann::json;
using testing::LocalReplica;
using testing::LocalZooKeeper;
using testing::waitFor;

LocalZooKeeper& zookeeper() {
  static std::unique_ptr<LocalZooKeeper> zk = [] {
    auto started = LocalZooKeeper::start();
    if (!started) throw std::runtime_error(started.error());
    return std::move(*started);
  }();
  return *zk;
}

// What one replica holds: its active parts with their checksums, and its rows.
struct ReplicaContents {
  std::map<std::string, std::string> parts;  // name -> checksum
  uint64_t rows = 0;
  std::size_t queue_size = 0;
  friend bool operator==(const ReplicaContents& a, const ReplicaContents& b) {
    return a.parts == b.parts && a.rows == b.rows && a.queue_size == b.queue_size;
  }
};

class Replication : public ::testing::Test {
 protected:
  void SetUp() override {
    table_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    char pattern[] = "/tmp/rtable-replication-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    work_dir_ = pattern;
  }
  void TearDown() override {
    replicas_.clear();
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(work_dir_);
  }

  LocalReplica& addReplica(const std::string& name, const std::string& secret = "s3cret",
                           const std::string& replication_settings = "") {
    testing::LocalReplicaOptions options;
    options.binary = RTABLE_CORE_BINARY;
    options.work_dir = work_dir_ / name;
    options.zookeeper = zookeeper().connectString();
    options.replica = name;
    options.interserver_secret = secret;
    options.replication_settings = replication_settings;
    options.table_yaml = fmt::format(R"(table: {}
columns:
  - {{name: id, type: UInt64}}
  - {{name: d, type: Date}}
  - {{name: user, type: String}}
partitionBy: toYYYYMM(d)
orderBy: [id])", table_);
    auto replica = LocalReplica::start(options);
    EXPECT_TRUE(replica) << replica.error();
    if (!replica) throw std::runtime_error(replica.error());
    replicas_[name] = std::move(*replica);
    return *replicas_[name];
  }

  static std::string row(uint64_t id) {
    return fmt::format(R"({{"id":{},"d":"2026-{:02d}-0{}","user":"u{}"}})", id, 10 + id % 3,
                       1 + id % 9, id % 7) + "\n";
  }

  void insert(LocalReplica& replica, const std::string& body) {
    auto response = replica.post("/insert?format=JSONEachRow", body);
    ASSERT_TRUE(response) << response.error();
    ASSERT_EQ(response->status, 200) << response->body;
  }

  static std::optional<ReplicaContents> contents(LocalReplica& replica) {
    ReplicaContents c;
    auto parts = replica.get("/parts");
    auto state = replica.get("/replica");
    auto count = replica.get("/count");
    if (!parts || !state || !count || parts->status != 200 || state->status != 200) return std::nullopt;
    for (const auto& part : json::parse(parts->body)) {
      c.parts[part["name"].get<std::string>()] = part["checksum"].get<std::string>();
    }
    c.rows = json::parse(count->body)["rows"].get<uint64_t>();
    c.queue_size = json::parse(state->body)["queue"].size();
    return c;
  }

  // The shared check: every running replica drains its queue and ends with the same parts (same
  // checksums) and rows; returns that common content.
  ReplicaContents expectConverged(std::chrono::seconds timeout = std::chrono::seconds(90)) {
    std::map<std::string, std::optional<ReplicaContents>> last;
    const bool converged = waitFor([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // 3 requests per replica a round
      last.clear();
      for (auto& [name, replica] : replicas_) {
        if (replica->running()) last[name] = contents(*replica);
      }
      const auto& first = last.begin()->second;
      if (!first || first->queue_size != 0) return false;
      for (const auto& [name, c] : last) {
        if (!c || !(*c == *first)) return false;
      }
      return true;
    }, timeout);
    if (!converged) {
      std::string report;
      for (const auto& [name, c] : last) {
        report += fmt::format("\n{}: ", name);
        if (!c) {
          report += "unreachable";
          continue;
        }
        report += fmt::format("rows {}, queue {}, parts", c->rows, c->queue_size);
        for (const auto& [part, sum] : c->parts) report += " " + part;
      }
      ADD_FAILURE() << "replicas did not converge:" << report;
      return {};
    }
    return *last.begin()->second;
  }

  std::string table_;
  std::filesystem::path work_dir_;
  std::map<std::string, std::unique_ptr<LocalReplica>> replicas_;
};

TEST_F(Replication, InsertsSpreadOverAllReplicasConverge) {
  std::vector<LocalReplica*> all = {&addReplica("r1"), &addReplica("r2"), &addReplica("r3")};
  // Enough small parts for the leader to assign merges, which every replica then executes.
  for (uint64_t id = 0; id < 60; ++id) {
    insert(*all[id % 3], row(id));
  }
  std::string bulk;
  for (uint64_t id = 1000; id < 6000; ++id) bulk += row(id);
  insert(*all[1], bulk);
  const ReplicaContents common = expectConverged();
  EXPECT_EQ(common.rows, 5060u);
  bool merged = false;
  for (const auto& [name, checksum] : common.parts) merged |= !name.ends_with("_0");
  EXPECT_TRUE(merged) << "no merge ran";

  // Every row on every replica, exactly once.
  for (auto* replica : all) {
    auto selected = replica->get("/select?format=TSV&where=id%20%3C%201000");
    ASSERT_TRUE(selected && selected->status == 200);
    std::set<uint64_t> ids;
    std::size_t lines = 0;
    for (std::size_t start = 0; start < selected->body.size(); ++lines) {
      const std::size_t end = selected->body.find('\n', start);
      ids.insert(std::stoull(selected->body.substr(start, selected->body.find('\t', start) - start)));
      start = end + 1;
    }
    EXPECT_EQ(lines, 60u);
    EXPECT_EQ(ids.size(), 60u);
  }
}

TEST_F(Replication, AStoppedReplicaCatchesUp) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  auto& r3 = addReplica("r3");
  insert(r1, row(1));
  expectConverged();
  ASSERT_EQ(r3.terminate(), 0);
  for (uint64_t id = 2; id < 200; ++id) insert(id % 2 ? r1 : r2, row(id));
  ASSERT_TRUE(r3.launch());
  EXPECT_EQ(expectConverged().rows, 199u);
}

TEST_F(Replication, ANewReplicaClonesAndFetchesEverything) {
  auto& r1 = addReplica("r1");
  for (uint64_t id = 0; id < 30; ++id) insert(r1, row(id));
  // r2 joins a table with history: it starts lost and clones r1.
  addReplica("r2");
  EXPECT_EQ(expectConverged().rows, 30u);
}

TEST_F(Replication, AReplicaOfflineTooLongIsMarkedLostThenClonesAndConverges) {
  // A short log: a replica more than 10 entries behind no longer holds it back.
  const std::string short_log = "minLogsToKeep: 3, maxLogsToKeep: 10, cleanupPeriodSeconds: 1";
  auto& r1 = addReplica("r1", "s3cret", short_log);
  auto& r2 = addReplica("r2", "s3cret", short_log);
  auto& r3 = addReplica("r3", "s3cret", short_log);
  for (uint64_t id = 0; id < 5; ++id) insert(r1, row(id));
  expectConverged();
  ASSERT_EQ(r3.terminate(), 0);
  for (uint64_t id = 5; id < 60; ++id) insert(id % 2 ? r1 : r2, row(id));
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  const std::string root = "/rtable/tables/" + table_ + "/1";
  ASSERT_TRUE(waitFor([&] {
    auto lost = (*keeper)->get(root + "/replicas/r3/is_lost");
    return lost && lost->data == "1";
  }, std::chrono::seconds(30))) << "r3 was not marked lost";
  // The log was trimmed past r3's pointer: replaying it is impossible, cloning is the way back.
  auto pointer = (*keeper)->get(root + "/replicas/r3/log_pointer");
  auto log = (*keeper)->children(root + "/log");
  ASSERT_TRUE(pointer && log);
  int64_t oldest = INT64_MAX;
  for (const auto& name : log->names) oldest = std::min<int64_t>(oldest, std::stoll(name.substr(4)));
  EXPECT_GT(oldest, std::stoll(pointer->data));
  ASSERT_TRUE(r3.launch());
  EXPECT_EQ(expectConverged().rows, 60u);
  auto state = r3.get("/replica");
  ASSERT_TRUE(state);
  EXPECT_FALSE(json::parse(state->body)["lost"].get<bool>());
}

TEST_F(Replication, AFetchNeedsTheSharedSecret) {
  auto& r1 = addReplica("r1", "right");
  insert(r1, row(1));
  auto& r2 = addReplica("r2", "wrong");
  // r2 cannot fetch: its queue keeps the entry, backing off, and says why.
  ASSERT_TRUE(waitFor([&] {
    auto state = r2.get("/replica");
    if (!state || state->status != 200) return false;
    const json body = json::parse(state->body);
    for (const auto& entry : body["queue"]) {
      if (entry["last_exception"].get<std::string>().find("401") != std::string::npos ||
          entry["last_exception"].get<std::string>().find("nauthorized") != std::string::npos) {
        return true;
      }
    }
    return false;
  }, std::chrono::seconds(30))) << r2.get("/replica")->body;
  auto count = r2.get("/count");
  ASSERT_TRUE(count);
  EXPECT_EQ(json::parse(count->body)["rows"].get<uint64_t>(), 0u);
}

}  // namespace
}  // namespace rtable::core
