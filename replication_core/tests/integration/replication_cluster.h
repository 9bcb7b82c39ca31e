// Three (or more) rtable-core processes of one table on one real ZooKeeper 3.8, shared by the
// replication integration tests: the ZooKeeper, the replicas' setup and the convergence check.
// Each test binary that includes this has its own ZooKeeper (started on first use, one per
// process); a fixture's replicas are stopped at the end of each test.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/testing/retrying_writers.h"

#ifndef RTABLE_CORE_BINARY
#error \
    "RTABLE_CORE_BINARY must name the rtable-core binary (see replication_core/tests/CMakeLists.txt)"
#endif

namespace rtable::core {

inline testing::LocalZooKeeper& zookeeper() {
  static std::unique_ptr<testing::LocalZooKeeper> zk = [] {
    auto started = testing::LocalZooKeeper::start();
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

// A test's replicas, named r1, r2, ... by the test, in a fresh work directory (kept when the
// test fails); the table is named after the test.
class ReplicationCluster : public ::testing::Test {
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

  testing::LocalReplica& addReplica(const std::string& name, const std::string& secret = "s3cret",
                                    const std::string& replication_settings = "",
                                    const std::string& more_table_yaml = "") {
    testing::LocalReplicaOptions options;
    options.binary = binary_;
    options.work_dir = work_dir_ / name;
    options.zookeeper = zookeeperConnect();
    if (auto uid = uids_.find(name); uid != uids_.end()) options.run_as_uid = uid->second;
    options.replica = name;
    options.interserver_secret = secret;
    options.replication_settings = replication_settings;
    if (auto tls = tls_dirs_.find(name); tls != tls_dirs_.end()) options.tls_dir = tls->second;
    if (auto stalls = stalls_.find(name); stalls != stalls_.end())
      options.test_stalls = stalls->second;
    options.table_yaml = fmt::format(R"(table: {}
columns:
  - {{name: id, type: UInt64}}
  - {{name: d, type: Date}}
  - {{name: user, type: String}}
partitionBy: toYYYYMM(d)
orderBy: [id]
{})",
                                     table_, more_table_yaml);
    auto replica = testing::LocalReplica::start(options);
    EXPECT_TRUE(replica) << replica.error();
    if (!replica) throw std::runtime_error(replica.error());
    replicas_[name] = std::move(*replica);
    return *replicas_[name];
  }

  // Row `id` of the table above; ids spread over three monthly partitions.
  static std::string row(uint64_t id) { return testing::idRow(id); }

  void insert(testing::LocalReplica& replica, const std::string& body) {
    auto response = replica.post("/insert?format=JSONEachRow", body);
    ASSERT_TRUE(response) << response.error();
    ASSERT_EQ(response->status, 200) << response->body;
  }

  static std::optional<ReplicaContents> contents(testing::LocalReplica& replica) {
    using nlohmann::json;
    ReplicaContents c;
    auto parts = replica.get("/parts");
    auto state = replica.get("/replica");
    auto count = replica.get("/count");
    if (!parts || !state || !count || parts->status != 200 || state->status != 200)
      return std::nullopt;
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
    const bool converged = common::testing::waitFor(
        [&] {
          std::this_thread::sleep_for(
              std::chrono::milliseconds(100));  // 3 requests per replica a round
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
        },
        timeout);
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

  // The ZooKeeper the replicas use: this binary's own standalone one unless a fixture says.
  virtual std::string zookeeperConnect() { return zookeeper().connectString(); }

  std::string table_;
  std::filesystem::path work_dir_;
  std::filesystem::path binary_ = RTABLE_CORE_BINARY;
  // A replica's uid (LocalReplicaOptions::run_as_uid), set before addReplica; none: this one's.
  std::map<std::string, uid_t> uids_;
  // A replica's TLS directory (spec tls.dir), set before addReplica; none: plain HTTP.
  std::map<std::string, std::filesystem::path> tls_dirs_;
  // A replica's --test-stall values, set before addReplica.
  std::map<std::string, std::vector<std::string>> stalls_;
  std::map<std::string, std::unique_ptr<testing::LocalReplica>> replicas_;
};

}  // namespace rtable::core
