// Three rtable-core processes replicating one table through a real ZooKeeper 3.8 (issue 4): after
// every scenario the queues drain and every replica has the same parts, byte for byte, and the
// same rows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <set>

#include "replication_cluster.h"
#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/tls_certificates.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/part_exchange.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/testing/local_replica.h"

namespace rtable::core {
namespace {

using common::testing::waitFor;
using nlohmann::json;
using testing::LocalReplica;

class Replication : public ReplicationCluster {};

// Whether one of `replica`'s queue entries last failed with a message holding one of `needles`.
bool lastExceptionHas(const LocalReplica& replica,
                      std::initializer_list<std::string_view> needles) {
  auto state = replica.get("/replica");
  if (!state || state->status != 200) return false;
  const json body = json::parse(state->body);  // outlives the loop over its queue
  for (const auto& entry : body["queue"]) {
    const std::string exception = entry["last_exception"].get<std::string>();
    for (const auto needle : needles) {
      if (exception.find(needle) != std::string::npos) return true;
    }
  }
  return false;
}

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

  // The replication metrics (DESIGN.md 4) of a replica that fetched and merged. Gauges follow
  // the queue as entries finish: wait for the drained state to show.
  std::expected<common::testing::HttpResponse, std::string> metrics;
  auto value = [&](const std::string& name) -> double {
    const auto at = metrics->body.find("\n" + name + "{");
    if (at == std::string::npos) return -1;
    const auto end = metrics->body.find('\n', at + 1);
    const std::string line = metrics->body.substr(at + 1, end - at - 1);
    return std::stod(line.substr(line.rfind(' ') + 1));
  };
  ASSERT_TRUE(waitFor(
      [&] {
        metrics = all[0]->metrics();
        return metrics && metrics->status == 200 && value("rtable_replication_queue_size") == 0 &&
               value("rtable_replica_absolute_delay_seconds") == 0;
      },
      std::chrono::seconds(10)))
      << (metrics ? metrics->body : metrics.error());
  EXPECT_GT(value("rtable_fetches_total"), 0);
  EXPECT_GT(value("rtable_fetched_bytes_total"), 0);
  EXPECT_GT(value("rtable_fetch_duration_seconds_count"), 0);
  EXPECT_GT(value("rtable_merges_total"), 0);
  EXPECT_GT(value("rtable_merged_bytes_total"), 0);
  EXPECT_EQ(value("rtable_replication_queue_size"), 0);
  EXPECT_EQ(value("rtable_replica_absolute_delay_seconds"), 0);
  EXPECT_EQ(value("rtable_replica_lost"), 0);
  for (const char* reason :
       {"covered_by_future_part", "merge_source_missing", "intersects_drop_range",
        "fetch_pool_full", "merge_pool_full", "backoff_after_failure", "replica_readonly"}) {
    EXPECT_NE(metrics->body.find(fmt::format("reason=\"{}\"", reason)), std::string::npos)
        << reason;
  }

  // Every row on every replica, exactly once.
  for (auto* replica : all) {
    auto selected = replica->get("/select?format=TSV&where=id%20%3C%201000");
    ASSERT_TRUE(selected && selected->status == 200);
    std::set<uint64_t> ids;
    std::size_t lines = 0;
    for (std::size_t start = 0; start < selected->body.size(); ++lines) {
      const std::size_t end = selected->body.find('\n', start);
      ids.insert(
          std::stoull(selected->body.substr(start, selected->body.find('\t', start) - start)));
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

// A replica stopped right after an insert (a scale-down's pod never comes back) waits, serving
// part fetches, until the others have the part only it has: the acknowledged row does not leave
// with it. r2 is frozen while r1 takes the insert and gets SIGTERM, so without the hand-off r1
// would be gone before r2 could fetch anything.
TEST_F(Replication, AStoppingReplicaHandsItsOnlyPartsToTheOthersFirst) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  insert(r1, row(1));
  expectConverged();
  r2.freezeForTest();
  insert(r1, row(2));
  auto stopped = std::async(std::launch::async, [&] { return r1.terminate(); });
  const bool exited_at_once =
      stopped.wait_for(std::chrono::seconds(1)) == std::future_status::ready;
  r2.thawForTest();
  EXPECT_FALSE(exited_at_once) << "r1 stopped while it had the only copy of row 2";
  EXPECT_EQ(stopped.get(), 0);
  // r1 is gone: r2 has row 2 only if it fetched it during the hand-off (the part registered in
  // ZooKeeper a moment before it is visible).
  EXPECT_TRUE(waitFor(
      [&] {
        auto count = r2.get("/count");
        return count && count->status == 200 &&
               json::parse(count->body)["rows"].get<uint64_t>() == 2u;
      },
      std::chrono::seconds(5)))
      << "r2 lacks the row r1 took with it";
  ASSERT_TRUE(r1.launch());
  EXPECT_EQ(expectConverged().rows, 2u);
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
  ASSERT_TRUE(waitFor(
      [&] {
        auto lost = (*keeper)->get(root + "/replicas/r3/is_lost");
        return lost && lost->data == "1";
      },
      std::chrono::seconds(30)))
      << "r3 was not marked lost";
  // The log was trimmed past r3's pointer: replaying it is impossible, cloning is the way back.
  auto pointer = (*keeper)->get(root + "/replicas/r3/log_pointer");
  auto log = (*keeper)->children(root + "/log");
  ASSERT_TRUE(pointer && log);
  int64_t oldest = INT64_MAX;
  for (const auto& name : log->names)
    oldest = std::min<int64_t>(oldest, std::stoll(name.substr(4)));
  EXPECT_GT(oldest, std::stoll(pointer->data));
  ASSERT_TRUE(r3.launch());
  EXPECT_EQ(expectConverged().rows, 60u);
  auto state = r3.get("/replica");
  ASSERT_TRUE(state);
  EXPECT_FALSE(json::parse(state->body)["lost"].get<bool>());
}

TEST_F(Replication, QuorumInsertsWaitForTheReplicas) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  auto& r3 = addReplica("r3");
  // All up: acknowledged only once all three have the part.
  auto all = r1.post("/insert?format=JSONEachRow&insert_quorum=3", row(1));
  ASSERT_TRUE(all && all->status == 200) << (all ? all->body : all.error());
  const std::string part = json::parse(all->body)["parts"][0].get<std::string>();
  for (auto* other : {&r2, &r3}) {
    auto parts = other->get("/parts");
    ASSERT_TRUE(parts);
    EXPECT_NE(parts->body.find(part), std::string::npos)
        << "acknowledged before this replica had " << part;
  }

  // One down: a quorum of three cannot be reached, and nothing is written.
  ASSERT_EQ(r3.terminate(), 0);
  auto refused = r1.post("/insert?format=JSONEachRow&insert_quorum=3", row(2));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;
  EXPECT_NE(refused->body.find("TOO_FEW_LIVE_REPLICAS"), std::string::npos) << refused->body;

  // r2 alive but stuck: the quorum of two times out cleanly, saying the rows may still appear.
  r2.freezeForTest();
  auto late =
      r1.post("/insert?format=JSONEachRow&insert_quorum=2&insert_quorum_timeout=1500", row(3));
  r2.thawForTest();
  ASSERT_TRUE(late);
  EXPECT_EQ(late->status, 500) << late->body;
  EXPECT_NE(late->body.find("QUORUM_TIMEOUT"), std::string::npos) << late->body;
  EXPECT_NE(late->body.find("may still become visible"), std::string::npos) << late->body;
  // The retry is deduplicated and waits for the same quorum, which r2 now completes.
  auto retried = r1.post("/insert?format=JSONEachRow&insert_quorum=2", row(3));
  ASSERT_TRUE(retried && retried->status == 200) << (retried ? retried->body : retried.error());
  EXPECT_EQ(json::parse(retried->body)["deduplicated_blocks"].get<int>(), 1);

  // auto: a majority of the three registered replicas, two, which r1 and r2 make.
  auto majority = r2.post("/insert?format=JSONEachRow&insert_quorum=auto", row(4));
  ASSERT_TRUE(majority && majority->status == 200)
      << (majority ? majority->body : majority.error());
  auto on_r1 = r1.get("/parts");
  ASSERT_TRUE(on_r1);
  EXPECT_NE(on_r1->body.find(json::parse(majority->body)["parts"][0].get<std::string>()),
            std::string::npos);
  // With r2 down too, one live replica of three is not a majority.
  ASSERT_EQ(r2.terminate(), 0);
  auto minority = r1.post("/insert?format=JSONEachRow&insert_quorum=auto", row(5));
  ASSERT_TRUE(minority);
  EXPECT_EQ(minority->status, 503) << minority->body;
  EXPECT_NE(minority->body.find("a majority of 3 replicas"), std::string::npos) << minority->body;
  auto bad = r1.post("/insert?format=JSONEachRow&insert_quorum=most", row(5));
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_NE(bad->body.find("insert_quorum 'most'"), std::string::npos) << bad->body;
  ASSERT_TRUE(r2.launch());
  ASSERT_TRUE(r3.launch());
  EXPECT_EQ(expectConverged().rows, 3u);
}

// The table's default quorum (spec `inserts:`, what the operator renders from
// ReplicatedTable spec.insertQuorum) applies to inserts that give none; a request's own wins.
TEST_F(Replication, TheTablesInsertQuorumAppliesToInsertsThatGiveNone) {
  auto& r1 = addReplica("r1", "s3cret", "", "inserts: {quorum: 2, quorumTimeoutMs: 1500}");
  auto& r2 = addReplica("r2", "s3cret", "", "inserts: {quorum: 2, quorumTimeoutMs: 1500}");
  auto both = r1.post("/insert?format=JSONEachRow", row(1));
  ASSERT_TRUE(both && both->status == 200) << (both ? both->body : both.error());
  auto on_r2 = r2.get("/parts");
  ASSERT_TRUE(on_r2);
  EXPECT_NE(on_r2->body.find(json::parse(both->body)["parts"][0].get<std::string>()),
            std::string::npos)
      << "acknowledged before r2 had the part";

  r2.freezeForTest();
  auto late = r1.post("/insert?format=JSONEachRow", row(2));
  ASSERT_TRUE(late);
  EXPECT_EQ(late->status, 500) << late->body;
  EXPECT_NE(late->body.find("QUORUM_TIMEOUT"), std::string::npos) << late->body;
  auto alone = r1.post("/insert?format=JSONEachRow&insert_quorum=0", row(3));
  r2.thawForTest();
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->status, 200) << alone->body;
  EXPECT_EQ(expectConverged().rows, 3u);
}

TEST_F(Replication, DropPartitionIsReplicatedAndForgetsItsDedupIds) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  addReplica("r3");
  // row(id) puts id in month 10 + id % 3: 202610, 202611, 202612.
  std::string month_11;
  for (uint64_t id = 0; id < 30; ++id) {
    insert(id % 2 ? r1 : r2, row(id));
    if (id % 3 == 1) month_11 += row(id);
  }
  EXPECT_EQ(expectConverged().rows, 30u);
  auto dropped = r2.post("/drop_partition?partition=202611", "");
  ASSERT_TRUE(dropped && dropped->status == 200) << (dropped ? dropped->body : dropped.error());
  EXPECT_EQ(json::parse(dropped->body)["dropped_range"].get<std::string>().substr(0, 9),
            "202611_0_");
  const ReplicaContents after = expectConverged();
  EXPECT_EQ(after.rows, 20u);
  for (const auto& [part, checksum] : after.parts)
    EXPECT_FALSE(part.starts_with("202611_")) << part;
  // The same rows again are new rows now, not duplicates.
  auto again = r1.post("/insert?format=JSONEachRow", month_11);
  ASSERT_TRUE(again && again->status == 200) << (again ? again->body : again.error());
  EXPECT_EQ(json::parse(again->body)["deduplicated_blocks"].get<int>(), 0);
  EXPECT_EQ(expectConverged().rows, 30u);

  auto bad = r1.post("/drop_partition?partition=20..11", "");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  auto empty = r1.post("/drop_partition?partition=209901", "");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->status, 400) << empty->body;
  EXPECT_NE(empty->body.find("has no data"), std::string::npos) << empty->body;
}

TEST_F(Replication, ARemovedReplicaNoLongerHoldsTheLogAndCanJoinAgain) {
  // A long max: a stopped replica is never marked lost here, it holds the log until removed.
  const std::string settings = "minLogsToKeep: 3, maxLogsToKeep: 100000, cleanupPeriodSeconds: 1";
  auto& r1 = addReplica("r1", "s3cret", settings);
  auto& r2 = addReplica("r2", "s3cret", settings);
  auto& r3 = addReplica("r3", "s3cret", settings);
  for (uint64_t id = 0; id < 5; ++id) insert(r1, row(id));
  expectConverged();

  auto live = r1.post("/drop_replica?name=r2", "");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 409) << live->body;
  EXPECT_NE(live->body.find("is active"), std::string::npos) << live->body;
  auto self = r1.post("/drop_replica?name=r1", "");
  ASSERT_TRUE(self);
  EXPECT_EQ(self->status, 409) << self->body;

  ASSERT_EQ(r3.terminate(), 0);
  for (uint64_t id = 5; id < 25; ++id) insert(id % 2 ? r1 : r2, row(id));
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  const std::string root = "/rtable/tables/" + table_ + "/1";
  const int64_t r3_pointer = std::stoll((*keeper)->get(root + "/replicas/r3/log_pointer")->data);
  auto oldestLogIndex = [&] {
    auto log = (*keeper)->children(root + "/log");
    int64_t oldest = INT64_MAX;
    if (log) {
      for (const auto& name : log->names)
        oldest = std::min<int64_t>(oldest, std::stoll(name.substr(4)));
    }
    return oldest;
  };
  // The stopped replica holds the log at its pointer.
  expectConverged();
  EXPECT_LE(oldestLogIndex(), r3_pointer);

  auto removed = r1.post("/drop_replica?name=r3", "");
  ASSERT_TRUE(removed);
  ASSERT_EQ(removed->status, 200) << removed->body;
  EXPECT_FALSE(*(*keeper)->exists(root + "/replicas/r3"));
  auto again = r1.post("/drop_replica?name=r3", "");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 404) << again->body;
  // Now the log is trimmed past it, down to the newest entries.
  insert(r2, row(100));
  ASSERT_TRUE(waitFor([&] { return oldestLogIndex() > r3_pointer; }, std::chrono::seconds(30)))
      << "oldest log entry " << oldestLogIndex() << ", r3's pointer was " << r3_pointer;

  // Started again, r3 registers as a new replica of a table with history: it clones and catches up.
  ASSERT_TRUE(r3.launch());
  EXPECT_EQ(expectConverged().rows, 26u);
}

TEST_F(Replication, APartNoReplicaHasAnyMoreIsGivenUpNotRetriedForever) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  insert(r1, row(1));
  expectConverged();
  // r2 is away while r1 takes an insert; then r1 loses that part from its disk.
  ASSERT_EQ(r2.terminate(), 0);
  auto response = r1.post("/insert?format=JSONEachRow", row(2));
  ASSERT_TRUE(response && response->status == 200)
      << (response ? response->body : response.error());
  const std::string lost = json::parse(response->body)["parts"][0].get<std::string>();
  ASSERT_EQ(r1.terminate(), 0);
  ASSERT_TRUE(std::filesystem::remove_all(r1.dataDir() / lost) > 0) << lost;
  ASSERT_TRUE(r1.launch());
  ASSERT_TRUE(r2.launch());
  // Both want the part (r1 requeued it at start, r2 has it in its queue); no one has it: both give
  // up on it instead of backing off forever, and agree on what is left.
  EXPECT_EQ(expectConverged().rows, 1u);
  for (auto* replica : {&r1, &r2}) {
    auto metrics = replica->metrics();
    ASSERT_TRUE(metrics);
    const auto at = metrics->body.find("\nrtable_parts_lost_forever_total{");
    ASSERT_NE(at, std::string::npos) << metrics->body;
    const std::string line =
        metrics->body.substr(at + 1, metrics->body.find('\n', at + 1) - at - 1);
    EXPECT_EQ(std::stod(line.substr(line.rfind(' ') + 1)), 1.0) << line;
  }
}

TEST_F(Replication, AFetchNeedsTheSharedSecret) {
  auto& r1 = addReplica("r1", "right");
  insert(r1, row(1));
  auto& r2 = addReplica("r2", "wrong");
  // r2 cannot fetch: its queue keeps the entry, backing off, and says why.
  ASSERT_TRUE(waitFor([&] { return lastExceptionHas(r2, {"401", "nauthorized"}); },
                      std::chrono::seconds(30)))
      << r2.get("/replica")->body;
  auto count = r2.get("/count");
  ASSERT_TRUE(count);
  EXPECT_EQ(json::parse(count->body)["rows"].get<uint64_t>(), 0u);
}

// A fetched part must have the checksum its source recorded in ZooKeeper (issue 23), not only
// agree with the checksums.txt sent along with it, which a part changed on the way (or sent by
// something else than the source) would agree with too. Here the record is made to disagree: r2
// refuses what r1 sends, and takes it once the record matches again.
TEST_F(Replication, AFetchedPartMustHaveTheChecksumItsSourceRecorded) {
  auto& r1 = addReplica("r1");
  auto response = r1.post("/insert?format=JSONEachRow", row(1));
  ASSERT_TRUE(response && response->status == 200)
      << (response ? response->body : response.error());
  const std::string part = json::parse(response->body)["parts"][0].get<std::string>();
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  const TablePaths r1_paths{"/rtable/tables/" + table_, 1, "r1"};
  auto recorded = (*keeper)->get(r1_paths.part(part));
  ASSERT_TRUE(recorded);
  ASSERT_EQ(recorded->data.size(), 32u) << "the insert records the part's total checksum";
  ASSERT_TRUE((*keeper)->set(r1_paths.part(part), std::string(32, '0')));

  auto& r2 = addReplica("r2");
  ASSERT_TRUE(waitFor([&] { return lastExceptionHas(r2, {"recorded in ZooKeeper"}); },
                      std::chrono::seconds(30)))
      << r2.get("/replica")->body;
  auto count = r2.get("/count");
  ASSERT_TRUE(count);
  EXPECT_EQ(json::parse(count->body)["rows"].get<uint64_t>(), 0u);

  ASSERT_TRUE((*keeper)->set(r1_paths.part(part), recorded->data));
  EXPECT_EQ(expectConverged().rows, 1u);
  // r2 records what it verified: a third replica may fetch from it.
  TablePaths r2_paths = r1_paths;
  r2_paths.replica = "r2";
  auto r2_recorded = (*keeper)->get(r2_paths.part(part));
  ASSERT_TRUE(r2_recorded);
  EXPECT_EQ(r2_recorded->data, recorded->data);
}

// A fetch sends a proof of the secret bound to the replica asked (issue 23), never the secret: a
// proof that reached one replica (or a host posing as one) is refused by every other, though they
// share the secret and have the part. Replicas not yet upgraded still send the plain secret.
TEST_F(Replication, AFetchProofMadeForOneReplicaIsRefusedByAnother) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  auto response = r1.post("/insert?format=JSONEachRow", row(1));
  ASSERT_TRUE(response && response->status == 200);
  const std::string part = json::parse(response->body)["parts"][0].get<std::string>();
  expectConverged();  // r2 fetched it with its proof, and has the part too
  const std::string target = "/replication/part?name=" + part;
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const std::string proof_for_r1 =
      fmt::format("{}: {}\r\n", kFetchAuthHeader,
                  signFetch("s3cret", fmt::format("127.0.0.1:{}", r1.httpPort()), target, now));
  auto get = [&](LocalReplica& replica, const std::string& headers) {
    auto answer = common::testing::httpRequest("127.0.0.1", replica.httpPort(), "GET", target, "",
                                               std::chrono::seconds(30), headers);
    EXPECT_TRUE(answer) << answer.error();
    return answer ? *answer : common::testing::HttpResponse{};
  };
  EXPECT_EQ(get(r1, proof_for_r1).status, 200);
  const auto replayed = get(r2, proof_for_r1);
  EXPECT_EQ(replayed.status, 401) << replayed.body;
  EXPECT_NE(replayed.body.find("made for another replica or request"), std::string::npos)
      << replayed.body;
  EXPECT_EQ(get(r2, "").status, 401);
  EXPECT_EQ(get(r2, fmt::format("{}: s3cret\r\n", kInterserverSecretHeader)).status, 200);
  EXPECT_EQ(get(r2, fmt::format("{}: wrong\r\n", kInterserverSecretHeader)).status, 401);
}

// With tls.dir (certificates as cert-manager writes them) a replica's API speaks HTTPS only and
// its part fetches go over TLS to a certificate the table's CA signed for the source's advertised
// host: r2 can only have r1's part by a TLS fetch, since r1 answers nothing else. A replica whose
// certificates come from another CA (a host posing as one of the table's) fetches nothing, and a
// client that does not trust the table's CA, or speaks plain HTTP, gets no answer.
TEST_F(Replication, FetchesGoOverTlsToCertificatesTheTablesCaSigned) {
  namespace fs = std::filesystem;
  using common::testing::makeTestCertificates;
  auto made = makeTestCertificates(work_dir_ / "tls-r1", {"127.0.0.1"});
  ASSERT_TRUE(made) << made.error();
  made = makeTestCertificates(work_dir_ / "tls-r2", {"127.0.0.1"}, work_dir_ / "tls-r1");
  ASSERT_TRUE(made) << made.error();
  made = makeTestCertificates(work_dir_ / "tls-stranger", {"127.0.0.1"});
  ASSERT_TRUE(made) << made.error();
  tls_dirs_ = {{"r1", work_dir_ / "tls-r1"},
               {"r2", work_dir_ / "tls-r2"},
               {"r3", work_dir_ / "tls-stranger"}};
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  insert(r1, row(1));
  insert(r2, row(2));
  EXPECT_EQ(expectConverged().rows, 2u);

  auto plain = common::testing::httpRequest("127.0.0.1", r1.httpPort(), "GET", "/count");
  EXPECT_FALSE(plain && plain->status == 200) << "plain HTTP answered: " << plain->body;
  auto stranger = common::TlsContext::load(
      common::TlsContext::Side::kClient, common::TlsFiles::inDirectory(work_dir_ / "tls-stranger"));
  ASSERT_TRUE(stranger) << stranger.error();
  auto untrusted =
      common::testing::httpsRequest(**stranger, "127.0.0.1", r1.httpPort(), "GET", "/count");
  ASSERT_FALSE(untrusted);
  EXPECT_NE(untrusted.error().find("not trusted"), std::string::npos) << untrusted.error();

  auto& r3 = addReplica("r3");
  EXPECT_TRUE(
      waitFor([&] { return lastExceptionHas(r3, {"not trusted"}); }, std::chrono::seconds(60)))
      << r3.get("/replica").value_or(common::testing::HttpResponse{}).body;
  auto count = r3.get("/count");
  ASSERT_TRUE(count && count->status == 200);
  EXPECT_EQ(json::parse(count->body)["rows"], 0) << "r3 fetched from a replica it cannot trust";
  replicas_.erase("r3");  // it never converges; the others still do
  insert(r1, row(3));
  EXPECT_EQ(expectConverged().rows, 3u);
}

// Rotating the interserver secret one replica at a time (docs/security.md): each replica's secret
// file first says "new, then old" (it signs with the new one, still accepts the old, and tries
// the old one when a source not yet rotated refuses the new), then only "new". At every step
// both replicas keep fetching from each other; a replica still on the old secret alone after the
// others dropped it is refused.
TEST_F(Replication, TheInterserverSecretRotatesOneReplicaAtATimeWithoutAStall) {
  auto& r1 = addReplica("r1", "old-secret");
  auto& r2 = addReplica("r2", "old-secret");
  uint64_t id = 0;
  auto rotate = [&](LocalReplica& replica, const std::string& name, const std::string& content) {
    ASSERT_EQ(replica.terminate(), 0);
    std::ofstream(work_dir_ / name / "interserver-secret") << content;
    ASSERT_TRUE(replica.launch());
    insert(r1, row(++id));
    insert(r2, row(++id));
    EXPECT_EQ(expectConverged().rows, id) << name << " with " << content;
  };
  insert(r1, row(++id));
  expectConverged();
  rotate(r1, "r1", "new-secret\nold-secret\n");  // r1 signs new: r2 refuses, r1 tries old
  rotate(r2, "r2", "new-secret\nold-secret\n");
  rotate(r1, "r1", "new-secret\n");
  rotate(r2, "r2", "new-secret\n");

  // A replica left on the old secret alone fetches nothing any more.
  auto& r3 = addReplica("r3", "old-secret");
  EXPECT_TRUE(
      waitFor([&] { return lastExceptionHas(r3, {"unauthorized"}); }, std::chrono::seconds(60)))
      << r3.get("/replica").value_or(common::testing::HttpResponse{}).body;
  replicas_.erase("r3");
}

}  // namespace
}  // namespace rtable::core
