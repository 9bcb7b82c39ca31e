// Partial failures (issue 24): links cut between rtable-core replicas and a three-node ZooKeeper
// ensemble, the ensemble itself losing its leader, its quorum and a follower, and one replica's
// disk turned slow. Every process
// runs as its own uid, so a LoopbackFirewall rule cuts exactly one process's links (on loopback
// only; the rules go with the test, even when it fails). Each scenario runs under writers that
// retry every block with its insert_deduplication_token across the replicas, and ends with the
// replicas converged (same parts, same checksums) holding every acknowledged row exactly once.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "replication_cluster.h"
#include "rtable/common/testing/loopback_firewall.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/testing/retrying_writers.h"

namespace rtable::core {
namespace {

using common::testing::LoopbackFirewall;
using common::testing::waitFor;
using nlohmann::json;
using testing::LocalReplica;
using testing::LocalZooKeeperEnsemble;
using namespace std::chrono_literals;

// uids 0..2: replicas r1..r3; 10..12: ZooKeeper servers 1..3.
const std::vector<uid_t>& uids() {
  static const std::vector<uid_t> all = common::testing::testUids(16);
  return all;
}

// One ensemble for the whole binary; a test that stopped members has them restarted by the next
// SetUp.
LocalZooKeeperEnsemble& ensemble() {
  static std::unique_ptr<LocalZooKeeperEnsemble> started = [] {
    testing::LocalZooKeeperEnsembleOptions options;
    options.uids = {uids()[10], uids()[11], uids()[12]};
    auto ensemble = LocalZooKeeperEnsemble::start(options);
    if (!ensemble) throw std::runtime_error(ensemble.error());
    return std::move(*ensemble);
  }();
  return *started;
}

void note(const std::string& what) {
  fmt::print("[  FAULT   ] {}\n", what);
  std::fflush(stdout);
}

class NetworkFaults : public ReplicationCluster {
 protected:
  void SetUp() override {
    ZooKeeperClient::silenceLibraryLog();
    ReplicationCluster::SetUp();
    static std::map<std::string, int> runs;  // --gtest_repeat: a new table each run
    if (const int run = runs[table_]++; run > 0) table_ += fmt::format("_{}", run);
    // The replicas run as other uids: they must reach their folders and their binary (the build
    // folder may sit in a folder only root can enter, as CI's clone does).
    std::filesystem::permissions(work_dir_, std::filesystem::perms(0755));
    const auto bin = work_dir_ / "bin";
    std::filesystem::create_directories(bin);
    std::filesystem::copy_file(RTABLE_CORE_BINARY, bin / "rtable-core");
    binary_ = bin / "rtable-core";
    for (int i = 0; i < 3; ++i) uids_[fmt::format("r{}", i + 1)] = uids()[i];
    // Members a previous test stopped.
    for (std::size_t i = 0; i < ensemble().size(); ++i) {
      if (!ensemble().server(i).running()) {
        ASSERT_TRUE(ensemble().server(i).restart(/*wait_until_serving=*/false));
      }
    }
    auto leader = ensemble().waitUntilServing();
    ASSERT_TRUE(leader) << leader.error();
    auto firewall = LoopbackFirewall::create();
    ASSERT_TRUE(firewall) << firewall.error();
    firewall_ = std::move(*firewall);
  }
  void TearDown() override {
    if (::testing::Test::HasFailure() && firewall_)
      note("rules in force:\n" + firewall_->describe());
    firewall_.reset();  // heals before the replicas stop: their goodbye reaches ZooKeeper
    for (auto& writers : writers_) writers->stop(10s);  // a failed test's do not retry for long
    ReplicationCluster::TearDown();
  }
  std::string zookeeperConnect() override { return ensemble().connectString(); }

  void addReplicas() {
    for (const char* name : {"r1", "r2", "r3"}) addReplica(name);
  }
  uid_t uidOf(const std::string& replica) const { return uids_.at(replica); }
  std::vector<int> zooKeeperClientPorts() {
    std::vector<int> ports;
    for (std::size_t i = 0; i < ensemble().size(); ++i)
      ports.push_back(ensemble().server(i).port());
    return ports;
  }
  // Cuts `a` from `b` both ways: neither's packets reach the other's API (fetches, part checks).
  void cutReplicas(const std::string& a, const std::string& b) {
    ASSERT_TRUE(firewall_->drop({uidOf(a)}, {replicas_.at(b)->httpPort()}));
    ASSERT_TRUE(firewall_->drop({uidOf(b)}, {replicas_.at(a)->httpPort()}));
  }

  // Writers on every replica (or those named); each call's ids (and so tokens) apart from the
  // earlier calls'.
  testing::RetryingWriters& startWriters(const std::set<std::string>& on = {}) {
    testing::RetryingWritersOptions options;
    options.first_id = 1 + 10'000'000 * writers_.size();
    for (auto& [name, replica] : replicas_) {
      if (on.empty() || on.contains(name))
        options.replicas.push_back({"127.0.0.1", replica->httpPort()});
    }
    options.row = testing::idRow;
    options.writers = 3;
    options.block_sizes = {1, 5, 20};
    // About ten blocks a second: each a part that every replica fetches, which the three replicas
    // and three ZooKeeper servers on two cores keep up with (at 40 a second their queues grow by
    // hundreds and the test measures their catching up instead of the faults).
    options.pause_between_blocks = 250ms;
    // A replica behind a cut answers nothing; the writer moves on after this.
    options.request_timeout = 8s;
    writers_.push_back(std::make_unique<testing::RetryingWriters>(options));
    writers_.back()->start();
    return *writers_.back();
  }
  // Waits until `more` blocks beyond those acknowledged now are acknowledged.
  ::testing::AssertionResult writesGoOn(std::size_t more, std::chrono::seconds timeout = 60s) {
    testing::RetryingWriters& writers = *writers_.back();
    const std::size_t before = writers.acknowledgedBlocks();
    if (waitFor([&] { return writers.acknowledgedBlocks() >= before + more; }, timeout)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "writes stalled: " << writers.acknowledgedBlocks() - before << " of " << more
           << " more blocks in " << timeout.count()
           << " s; errors met: " << fmt::format("{}", fmt::join(writers.errorCodes(), ", "));
  }

  // The invariant after healing: writers stopped with nothing unacknowledged, the replicas
  // converged, and each holds exactly the acknowledged rows, each once.
  void expectEveryAcknowledgedRowOnceEverywhere() {
    std::multiset<uint64_t> expected;
    std::size_t blocks = 0, retries = 0;
    std::set<std::string> errors;
    for (auto& writers : writers_) {
      ASSERT_TRUE(writers->stop()) << "a block was still unacknowledged at the deadline";
      for (uint64_t id : writers->acknowledged()) expected.insert(id);
      blocks += writers->acknowledgedBlocks();
      retries += writers->retries();
      errors.merge(writers->errorCodes());
    }
    note(fmt::format("{} blocks ({} rows) acknowledged, {} retries; errors met: {}", blocks,
                     expected.size(), retries, fmt::join(errors, ", ")));
    const auto converging = std::chrono::steady_clock::now();
    expectConverged();
    note(fmt::format("converged in {} ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::steady_clock::now() - converging)
                                               .count()));
    for (auto& [name, replica] : replicas_) {
      auto holds = testing::checkReplicaHolds({"127.0.0.1", replica->httpPort()}, 1, expected);
      EXPECT_TRUE(holds) << name << ": " << holds.error();
    }
  }

  std::optional<json> state(LocalReplica& replica) {
    auto answer = replica.get("/replica");
    if (!answer || answer->status != 200) return std::nullopt;
    return json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
  }
  bool readonly(LocalReplica& replica) {
    auto s = state(replica);
    return s && s->is_object() && s->value("readonly", false);
  }

  std::unique_ptr<LoopbackFirewall> firewall_;
  std::vector<std::unique_ptr<testing::RetryingWriters>> writers_;
};

// A replica cut from ZooKeeper turns read-only and refuses inserts with 503 (the writers go to the
// others); healed, it takes a new session and catches up.
TEST_F(NetworkFaults, AReplicaCutFromZooKeeperTurnsReadOnlyAndCatchesUp) {
  addReplicas();
  LocalReplica& r3 = *replicas_.at("r3");
  startWriters();
  ASSERT_TRUE(writesGoOn(20));
  ASSERT_TRUE(firewall_->drop({uidOf("r3")}, zooKeeperClientPorts()));
  ASSERT_TRUE(waitFor([&] { return readonly(r3); }, 30s)) << "r3 never turned read-only";
  auto refused = r3.post("/insert?format=JSONEachRow", testing::idRow(1'000'000));
  ASSERT_TRUE(refused) << refused.error();
  EXPECT_EQ(refused->status, 503) << refused->body;
  note("r3 cut from ZooKeeper answers: " + refused->body);
  EXPECT_TRUE(writesGoOn(20)) << "the other replicas stopped taking inserts";
  ASSERT_TRUE(firewall_->heal());
  EXPECT_TRUE(waitFor([&] { return !readonly(r3); }, 30s)) << "r3 stayed read-only once healed";
  EXPECT_TRUE(writesGoOn(20));
  expectEveryAcknowledgedRowOnceEverywhere();
}

// A replica that reaches ZooKeeper but not a peer fetches through the other; cut from both peers,
// its fetches fail and are retried (its queue holds them), and it drains once healed. The peers'
// fetches of its own parts wait the same way.
TEST_F(NetworkFaults, AReplicaCutFromItsPeersFetchesThroughTheOthersThenDrains) {
  addReplicas();
  LocalReplica& r3 = *replicas_.at("r3");
  cutReplicas("r3", "r1");
  startWriters();
  ASSERT_TRUE(writesGoOn(30));
  // With r1 out of reach, r3 got r1's parts from r2.
  ASSERT_TRUE(writers_.back()->stop());
  expectConverged();
  auto synced = r3.post("/sync?timeout_seconds=30", "");
  ASSERT_TRUE(synced && synced->status == 200);

  cutReplicas("r3", "r2");
  startWriters();
  std::string failing;
  std::optional<json> last;
  const bool retried = waitFor(
      [&] {
        auto s = last = state(r3);
        if (!s || !s->is_object()) return false;
        for (const auto& entry : (*s)["queue"]) {
          if (entry["type"] == "GET_PART" && entry["num_tries"].get<int>() >= 2 &&
              !entry["last_exception"].get<std::string>().empty()) {
            failing = entry.dump();
            return true;
          }
        }
        return false;
      },
      60s);
  ASSERT_TRUE(retried) << "r3 never retried a fetch while cut from both peers; its state: "
                       << (last ? last->dump(1).substr(0, 3000) : "none");
  note("r3 cut from r1 and r2, a queue entry: " + failing);
  EXPECT_TRUE(writesGoOn(20));
  ASSERT_TRUE(firewall_->heal());
  expectEveryAcknowledgedRowOnceEverywhere();
}

// Links that come and go, and links that work one way only: r3's own packets dropped (it cannot
// reach ZooKeeper or its peers, but they can reach it), then its peers' packets to it dropped (it
// can fetch, they cannot fetch from it), toggled every few seconds.
TEST_F(NetworkFaults, FlappingAndOneWayLinksLoseNothing) {
  addReplicas();
  std::vector<int> r3_reaches = zooKeeperClientPorts();
  r3_reaches.push_back(replicas_.at("r1")->httpPort());
  r3_reaches.push_back(replicas_.at("r2")->httpPort());
  startWriters();
  ASSERT_TRUE(writesGoOn(10));
  // Cuts of 4 s: past the 2.7 s after which r3's ZooKeeper client gives its connection up (2/3 of
  // its 4 s session), short of the session's end; the 1 s ones are not noticed by it.
  for (int round = 0; round < 6; ++round) {
    if (round % 2 == 0) {
      ASSERT_TRUE(firewall_->drop({uidOf("r3")}, r3_reaches));
    } else {
      ASSERT_TRUE(firewall_->drop({uidOf("r1"), uidOf("r2")}, {replicas_.at("r3")->httpPort()}));
    }
    std::this_thread::sleep_for(round < 4 ? 4s : 1s);  // the flap itself, not a wait
    ASSERT_TRUE(firewall_->heal());
    std::this_thread::sleep_for(1s);
  }
  EXPECT_TRUE(writesGoOn(20));
  expectEveryAcknowledgedRowOnceEverywhere();
}

// The ZooKeeper leader killed during inserts: a new one is elected, the replicas' sessions move to
// the survivors, inserts resume.
TEST_F(NetworkFaults, TheZooKeeperLeaderKilledDuringInserts) {
  addReplicas();
  startWriters();
  ASSERT_TRUE(writesGoOn(20));
  auto leader = ensemble().waitUntilServing();
  ASSERT_TRUE(leader) << leader.error();
  ensemble().server(*leader).kill9();
  auto next = ensemble().waitUntilServing();
  ASSERT_TRUE(next) << next.error();
  note(fmt::format("leader {} killed, {} leads", *leader + 1, *next + 1));
  EXPECT_TRUE(writesGoOn(30));
  ASSERT_TRUE(ensemble().server(*leader).restart(/*wait_until_serving=*/false));
  ASSERT_TRUE(ensemble().waitUntilServing());
  expectEveryAcknowledgedRowOnceEverywhere();
  for (auto& [name, replica] : replicas_) EXPECT_FALSE(readonly(*replica)) << name;
}

// Two of three servers gone: the last one serves nobody. Inserts fail with a clear 503 (or
// UNKNOWN_STATUS_OF_INSERT for one caught mid-commit; a retry is safe), and resume with the quorum.
TEST_F(NetworkFaults, QuorumLostInsertsAreRefusedThenResume) {
  addReplicas();
  LocalReplica& r1 = *replicas_.at("r1");
  startWriters();
  ASSERT_TRUE(writesGoOn(20));
  auto leader = ensemble().waitUntilServing();
  ASSERT_TRUE(leader);
  const std::size_t follower = (*leader + 1) % ensemble().size();
  ensemble().server(*leader).kill9();
  ensemble().server(follower).kill9();
  // The writers' blocks now wait; a direct insert says why.
  std::optional<common::testing::HttpResponse> refused;
  ASSERT_TRUE(waitFor(
      [&] {
        auto answer = r1.post("/insert?format=JSONEachRow", testing::idRow(2'000'000));
        if (answer && answer->status == 503) refused = *answer;
        return refused.has_value();
      },
      30s))
      << "r1 kept accepting or never answered 503 without a ZooKeeper quorum";
  note("without a quorum r1 answers: " + refused->body);
  const json error = json::parse(refused->body, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(error.is_object());
  EXPECT_EQ(error.value("error", ""), "UNAVAILABLE");
  EXPECT_NE(refused->headers.find("Retry-After:"), std::string::npos) << refused->headers;
  std::this_thread::sleep_for(3s);  // the outage itself
  ASSERT_TRUE(ensemble().server(*leader).restart(/*wait_until_serving=*/false));
  ASSERT_TRUE(ensemble().server(follower).restart(/*wait_until_serving=*/false));
  auto back = ensemble().waitUntilServing();
  ASSERT_TRUE(back) << back.error();
  EXPECT_TRUE(writesGoOn(30));
  expectEveryAcknowledgedRowOnceEverywhere();
}

// A follower cut from the other two servers drops out of the ensemble (it stops serving); its
// clients move to the others; healed, it rejoins.
TEST_F(NetworkFaults, AZooKeeperFollowerPartitionedFromTheEnsemble) {
  addReplicas();
  startWriters();
  ASSERT_TRUE(writesGoOn(20));
  auto leader = ensemble().waitUntilServing();
  ASSERT_TRUE(leader);
  const std::size_t follower = (*leader + 1) % ensemble().size();
  std::vector<int> others_ports;
  std::vector<uid_t> others;
  for (std::size_t i = 0; i < ensemble().size(); ++i) {
    if (i == follower) continue;
    others.push_back(uids()[10 + i]);
    for (int port : ensemble().peerPorts(i)) others_ports.push_back(port);
  }
  ASSERT_TRUE(firewall_->drop({uids()[10 + follower]}, others_ports));
  ASSERT_TRUE(firewall_->drop(others, ensemble().peerPorts(follower)));
  EXPECT_TRUE(waitFor([&] { return !ensemble().server(follower).mode().has_value(); }, 30s))
      << "the partitioned follower kept serving: " << ensemble().describe();
  EXPECT_TRUE(writesGoOn(30));
  ASSERT_TRUE(firewall_->heal());
  auto back = ensemble().waitUntilServing();
  ASSERT_TRUE(back) << back.error();
  expectEveryAcknowledgedRowOnceEverywhere();
}

// A slow disk on one replica (every fsync, fdatasync and syncfs of r3 held 300 ms, every write
// 5 ms: injected in rtable-core's own file calls with --test-stall, as no block device here can be
// throttled): the other two take inserts and drain their queues as before, r3 lags, and catches up.
TEST_F(NetworkFaults, ASlowDiskOnOneReplicaDoesNotStallTheOthers) {
  stalls_["r3"] = {"fsync:300", "fdatasync:300", "syncfs:300", "write:5"};
  addReplicas();
  LocalReplica& r3 = *replicas_.at("r3");
  startWriters({"r1", "r2"});
  ASSERT_TRUE(writesGoOn(60));
  // r1 and r2 are not held up by r3: each runs its queue empty within the sync timeout while the
  // writers go on; r3 is still behind.
  for (const char* name : {"r1", "r2"}) {
    auto synced = replicas_.at(name)->post("/sync?timeout_seconds=30", "");
    ASSERT_TRUE(synced) << synced.error();
    EXPECT_EQ(synced->status, 200) << name << ": " << synced->body;
  }
  auto behind = state(r3);
  ASSERT_TRUE(behind && behind->is_object());
  note(fmt::format("r3 with a slow disk: {} queue entries while r1 and r2 are synced",
                   (*behind)["queue"].size()));
  EXPECT_FALSE((*behind)["queue"].empty()) << "r3 kept up: its disk was not slow enough to show";
  EXPECT_TRUE(writesGoOn(20));
  expectEveryAcknowledgedRowOnceEverywhere();
}

}  // namespace
}  // namespace rtable::core
