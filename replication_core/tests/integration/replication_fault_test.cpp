// Three rtable-core processes of one table on a real ZooKeeper 3.8, under faults (issue 4): kill -9
// during fetches and during a merge, ZooKeeper restarted under load, an expired ZooKeeper session,
// a corrupted part file, and the first four in a row under one client. Every scenario ends with
// the replicas converged (expectConverged), each acknowledged row once on every replica.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "replication_cluster.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::core {
namespace {

using common::testing::waitFor;
using nlohmann::json;
using testing::LocalReplica;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Rows first.. as TSV with the values of ReplicationCluster::row (a third of its bytes).
std::string tsvRows(uint64_t first, uint64_t count) {
  std::string body;
  body.reserve(count * 24);
  for (uint64_t id = first; id < first + count; ++id) {
    body += fmt::format("{}\t2026-{:02d}-0{}\tu{}\n", id, 10 + id % 3, 1 + id % 9, id % 7);
  }
  return body;
}

// Which ids a client sent and which of those were acknowledged, as (first, count) ranges.
// Thread-safe.
class Ledger {
 public:
  void sent(uint64_t first, uint64_t count) { add(sent_, first, count); }
  void acknowledged(uint64_t first, uint64_t count) { add(acknowledged_, first, count); }
  std::vector<uint64_t> sentIds() const { return ids(sent_); }
  std::vector<uint64_t> acknowledgedIds() const { return ids(acknowledged_); }
  std::size_t acknowledgedInserts() const {
    std::lock_guard lock(mu_);
    return acknowledged_.size();
  }

 private:
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  void add(Ranges& ranges, uint64_t first, uint64_t count) {
    std::lock_guard lock(mu_);
    ranges.emplace_back(first, count);
  }
  std::vector<uint64_t> ids(const Ranges& ranges) const {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> all;
    for (const auto& [first, count] : ranges) {
      for (uint64_t id = first; id < first + count; ++id) all.push_back(id);
    }
    std::sort(all.begin(), all.end());
    return all;
  }
  mutable std::mutex mu_;
  Ranges sent_;
  Ranges acknowledged_;
};

// A client that retries every insert whose answer it did not see, or that failed with 503 or
// 500 UNKNOWN_STATUS_OF_INSERT, until it is acknowledged: the same body has the same dedup id, so
// a retry never doubles a row. A retry goes to the next replica (the last one may be down).
// Thread-safe; the replicas and the ledger must outlive it.
class RetryingInserter {
 public:
  RetryingInserter(std::vector<LocalReplica*> replicas, Ledger& ledger)
      : replicas_(std::move(replicas)), ledger_(ledger) {}

  // Rows first..first+count-1 as one insert, sent first to replicas[first_replica]. True once
  // acknowledged; false on an answer that says the insert failed (kept in failures()), at
  // `deadline`, or once abandoned.
  bool insertRows(uint64_t first, uint64_t count, std::size_t first_replica,
                  Clock::time_point deadline) {
    const std::string body = tsvRows(first, count);
    ledger_.sent(first, count);
    for (std::size_t attempt = 0;; ++attempt) {
      LocalReplica& replica = *replicas_[(first_replica + attempt) % replicas_.size()];
      auto response = replica.post("/insert?format=TSV", body);
      if (response && response->status == 200) {
        ledger_.acknowledged(first, count);
        return true;
      }
      std::string reason = "no answer";
      if (response) {
        const json error = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
        reason = fmt::format("{} {}", response->status,
                             error.is_object() ? error.value("error", "?") : response->body);
      }
      const bool retriable =
          !response || response->status == 503 || reason == "500 UNKNOWN_STATUS_OF_INSERT";
      {
        std::lock_guard lock(mu_);
        if (!retriable) {
          failures_.push_back(fmt::format("ids {}+{}: {}", first, count, response->body));
          return false;
        }
        ++retry_reasons_[reason];
        if (Clock::now() > deadline || abandoned_) {
          failures_.push_back(
              fmt::format("ids {}+{}: not acknowledged in time (last: {})", first, count, reason));
          return false;
        }
      }
      std::this_thread::sleep_for(50ms);  // pacing: a replica that is down refuses at once
    }
  }

  void abandon() { abandoned_ = true; }
  std::vector<std::string> failures() const {
    std::lock_guard lock(mu_);
    return failures_;
  }
  std::string retrySummary() const {
    std::lock_guard lock(mu_);
    std::string text;
    for (const auto& [reason, n] : retry_reasons_) {
      text += fmt::format("{}{} x{}", text.empty() ? "" : ", ", reason, n);
    }
    return text.empty() ? "none" : text;
  }

 private:
  std::vector<LocalReplica*> replicas_;
  Ledger& ledger_;
  std::atomic<bool> abandoned_{false};
  mutable std::mutex mu_;
  std::map<std::string, int> retry_reasons_;
  std::vector<std::string> failures_;
};

// Single-row inserts round-robin over the inserter's replicas, from a thread, each retried until
// acknowledged, until stop(). Ids from `first_id` up.
class InsertLoad {
 public:
  InsertLoad(RetryingInserter& inserter, uint64_t first_id, std::size_t replicas)
      : inserter_(inserter), thread_([this, first_id, replicas] {
          for (uint64_t id = first_id; !stopping_; ++id) {
            inserter_.insertRows(id, 1, id % replicas, Clock::now() + 90s);
          }
        }) {}
  // A test that ends early does not wait for the insert in flight.
  ~InsertLoad() {
    if (thread_.joinable()) inserter_.abandon();
    stop();
  }
  // Lets the insert in flight finish (acknowledged or failed), so the ledger is final.
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  RetryingInserter& inserter_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// ZooKeeper derives a session's password from its id (ZooKeeperServer.generatePasswd:
// java.util.Random seeded with id ^ 0xB3415C00, 16 bytes of nextBytes), so a test that knows the
// id of another process's session can attach to it, and so expire it.
std::string zooKeeperSessionPassword(int64_t session_id) {
  constexpr uint64_t kMultiplier = 0x5DEECE66DULL;  // java.util.Random's LCG
  constexpr uint64_t kMask = (uint64_t{1} << 48) - 1;
  uint64_t seed = (static_cast<uint64_t>(session_id ^ int64_t{0xB3415C00}) ^ kMultiplier) & kMask;
  std::string password(16, '\0');
  for (std::size_t i = 0; i < password.size();) {
    seed = (seed * kMultiplier + 0xBULL) & kMask;
    auto random = static_cast<uint32_t>(seed >> 16);  // nextInt()
    for (std::size_t n = std::min<std::size_t>(password.size() - i, 4); n-- > 0; random >>= 8) {
      password[i++] = static_cast<char>(random & 0xFF);
    }
  }
  return password;
}

std::optional<json> replicaState(LocalReplica& replica) {
  auto state = replica.get("/replica");
  if (!state || state->status != 200) return std::nullopt;
  return json::parse(state->body);
}

// Polls `victim`'s queue and kills it (-9) right after an entry of `type` is seen executing there;
// or, if that is not seen, as soon as `instead` returns a description of another moment, or at
// `timeout`. Returns when it was killed, for the test's output.
std::string killWhileExecuting(
    LocalReplica& victim, const std::string& type,
    const std::function<std::optional<std::string>(const json&)>& instead,
    std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const auto state = replicaState(victim);
    if (!state) continue;
    for (const auto& entry : (*state)["queue"]) {
      if (entry["type"] == type && entry["is_currently_executing"].get<bool>()) {
        victim.kill9();
        return fmt::format("while {} {} was executing", type,
                           entry["new_part_name"].get<std::string>());
      }
    }
    if (auto moment = instead(*state)) {
      victim.kill9();
      return *moment;
    }
  }
  victim.kill9();
  return fmt::format("at the {} s deadline, no {} seen", timeout.count(), type);
}

class ReplicationFaults : public ReplicationCluster {
 protected:
  void SetUp() override {
    // This process's own clients retry while ZooKeeper is down on purpose; the replicas log theirs.
    ZooKeeperClient::silenceLibraryLog();
    ReplicationCluster::SetUp();
    // A test run again in this process (--gtest_repeat) gets a new table: the old one, with its
    // parts listed for r1..r3, is still in this process's ZooKeeper.
    static std::map<std::string, int> runs;
    if (const int run = runs[table_]++; run > 0) table_ += fmt::format("_{}", run);
  }
  void TearDown() override {
    // A test that failed with ZooKeeper stopped must not take the next tests with it.
    if (!zookeeper().running()) (void)zookeeper().restart();
    ReplicationCluster::TearDown();
  }

  std::string tableRoot() const { return "/rtable/tables/" + table_ + "/1"; }

  static std::vector<uint64_t> selectIds(LocalReplica& replica, std::string* error) {
    std::vector<uint64_t> ids;
    auto selected = replica.get("/select?format=TSV");
    if (!selected || selected->status != 200) {
      *error = selected ? selected->body : selected.error();
      return ids;
    }
    const std::string& body = selected->body;
    for (std::size_t start = 0; start < body.size();) {
      std::size_t end = body.find('\n', start);
      if (end == std::string::npos) end = body.size();
      ids.push_back(std::strtoull(body.c_str() + start, nullptr, 10));
      start = end + 1;
    }
    return ids;
  }

  // On every running replica: each acknowledged id exactly once; an id that was sent but never
  // acknowledged at most once (its answer was lost, it may have committed); nothing else.
  void expectEachAcknowledgedRowOnce(const Ledger& ledger) {
    const std::vector<uint64_t> acknowledged = ledger.acknowledgedIds();
    const std::vector<uint64_t> sent = ledger.sentIds();
    ASSERT_FALSE(acknowledged.empty());
    for (auto& [name, replica] : replicas_) {
      if (!replica->running()) continue;
      std::string error;
      const std::vector<uint64_t> ids = selectIds(*replica, &error);
      ASSERT_TRUE(error.empty()) << name << ": " << error;
      std::unordered_map<uint64_t, uint32_t> count;
      count.reserve(ids.size());
      for (uint64_t id : ids) ++count[id];
      std::vector<std::string> problems;
      auto report = [&](std::string problem) {
        if (problems.size() < 10) problems.push_back(std::move(problem));
      };
      std::size_t missing = 0, doubled = 0, unknown = 0;
      for (uint64_t id : acknowledged) {
        auto it = count.find(id);
        if (it == count.end()) {
          ++missing;
          report(fmt::format("acknowledged id {} missing", id));
        }
      }
      for (const auto& [id, n] : count) {
        if (n > 1) {
          ++doubled;
          report(fmt::format("id {} present {} times", id, n));
        }
        if (!std::binary_search(sent.begin(), sent.end(), id)) {
          ++unknown;
          report(fmt::format("id {} was never sent", id));
        }
      }
      EXPECT_EQ(missing + doubled + unknown, 0u)
          << name << ": " << missing << " acknowledged ids missing, " << doubled << " ids doubled, "
          << unknown << " unknown ids, of " << acknowledged.size() << " acknowledged; e.g. "
          << fmt::format("{}", fmt::join(problems, "; "));
    }
  }

  // Expires `replica`'s ZooKeeper session from outside: the session id is in its is_active node.
  // Returns that id once the server has ended the session (its is_active is gone).
  int64_t expireSessionOf(const std::string& replica) {
    auto keeper = zookeeper().connect();
    EXPECT_TRUE(keeper);
    if (!keeper) return 0;
    const std::string path = tableRoot() + "/replicas/" + replica + "/is_active";
    KeeperResult<GetResult> active = std::unexpected(KeeperError{});
    // Right after a ZooKeeper restart the replica may still be re-creating it.
    waitFor([&] { return (active = (*keeper)->get(path)).has_value(); }, 30s);
    EXPECT_TRUE(active) << active.error().toString();
    if (!active) return 0;
    const int64_t session = static_cast<int64_t>(std::stoull(active->data, nullptr, 16));
    EXPECT_EQ(active->stat.ephemeral_owner, session) << "is_active data " << active->data;
    // Attaching to the session takes it from the replica's connection; a replica left running
    // could reconnect and take it back before the close, and the session would live on. Frozen
    // (a stalled process, the usual cause of an expiry) it cannot; its session stays valid the
    // few milliseconds this takes.
    LocalReplica& victim = *replicas_.at(replica);
    victim.freezeForTest();
    auto expired =
        zookeeper().expireSession(SessionCredentials{session, zooKeeperSessionPassword(session)});
    victim.thawForTest();
    EXPECT_TRUE(expired) << expired.error();
    const bool ended = waitFor(
        [&] {
          auto holder = (*keeper)->exists(path);
          return holder && (!*holder || (**holder).ephemeral_owner != session);
        },
        15s);
    EXPECT_TRUE(ended) << fmt::format("session {:x} still holds {}", session, path);
    return ended ? session : 0;
  }

  // Waits until `replica`'s is_active is back, held by a session other than `old_session`; else
  // says why not (the process may have died: its log tail).
  ::testing::AssertionResult waitForNewSession(const std::string& replica, int64_t old_session) {
    auto keeper = zookeeper().connect();
    if (!keeper) return ::testing::AssertionFailure() << keeper.error().toString();
    const std::string path = tableRoot() + "/replicas/" + replica + "/is_active";
    if (waitFor(
            [&] {
              auto active = (*keeper)->exists(path);
              return active && *active && (**active).ephemeral_owner != old_session;
            },
            30s)) {
      return ::testing::AssertionSuccess();
    }
    LocalReplica& process = *replicas_.at(replica);
    return ::testing::AssertionFailure()
           << replica << "'s is_active did not come back within 30 s of the expiry of session "
           << fmt::format("{:x}", old_session) << "; process "
           << (process.running() ? "running" : "DEAD") << "; log tail:\n"
           << common::testing::tailOfFile(process.logFile(), 1500);
  }

  static void note(const std::string& what) {
    fmt::print("[  FAULT   ] {}\n", what);
    std::fflush(stdout);
  }
};

// 1. kill -9 of a replica while it fetches large parts; it restarts, fetches the rest, converges.
TEST_F(ReplicationFaults, AReplicaKilledDuringFetchesRestartsAndConverges) {
  auto& r1 = addReplica("r1");
  addReplica("r2");
  // Each of r3's fetches waits 1.5 s for its answer: the kill surely lands inside one.
  stalls_["r3"] = {"receive_head:1500"};
  auto& r3 = addReplica("r3");
  Ledger ledger;
  RetryingInserter client({&r1}, ledger);
  constexpr uint64_t kBlocks = 3;
  constexpr uint64_t kBlockRows = 200'000;  // 3 parts of ~67k rows each, one per month
  std::atomic<uint64_t> inserts_done{0};
  auto inserts = std::async(std::launch::async, [&] {
    for (uint64_t b = 0; b < kBlocks; ++b) {
      client.insertRows(b * kBlockRows, kBlockRows, 0, Clock::now() + 120s);
      ++inserts_done;
    }
  });
  const std::string when = killWhileExecuting(
      r3, "GET_PART",
      [&](const json&) -> std::optional<std::string> {
        if (inserts_done < kBlocks) return std::nullopt;
        return "right after the last insert was acknowledged (no GET_PART seen executing)";
      },
      120s);
  note("r3 killed " + when);
  EXPECT_NE(when.find("while GET_PART"), std::string::npos) << when;
  inserts.wait();
  EXPECT_EQ(client.failures(), std::vector<std::string>{});
  ASSERT_TRUE(r3.launch());
  EXPECT_EQ(expectConverged().rows, kBlocks * kBlockRows);
  expectEachAcknowledgedRowOnce(ledger);
}

// 2. kill -9 of a replica while it merges; after the restart it merges again (or fetches the
// merged part) and converges.
TEST_F(ReplicationFaults, AReplicaKilledDuringAMergeRestartsAndConverges) {
  auto& r1 = addReplica("r1");
  addReplica("r2");
  // Each of r3's merges waits 1.5 s as it starts (its entry executing). Its fetches are not
  // slowed: a replica that lags fetches the merged part instead of merging.
  stalls_["r3"] = {"merge:1500"};
  auto& r3 = addReplica("r3");
  Ledger ledger;
  RetryingInserter client({&r1}, ledger);
  // 6 parts per partition: the leader assigns one merge of all six per partition, of 120k rows.
  constexpr uint64_t kInserts = 6;
  constexpr uint64_t kInsertRows = 60'000;
  for (uint64_t i = 0; i < kInserts; ++i) {
    ASSERT_TRUE(client.insertRows(i * kInsertRows, kInsertRows, 0, Clock::now() + 60s))
        << fmt::format("{}", fmt::join(client.failures(), "; "));
  }
  // Killed only while a MERGE_PARTS entry executes; not seen within 60 s is a failure, not a kill
  // at another moment.
  const std::string when = killWhileExecuting(
      r3, "MERGE_PARTS", [](const json&) -> std::optional<std::string> { return std::nullopt; },
      60s);
  note("r3 killed " + when);
  EXPECT_NE(when.find("while MERGE_PARTS"), std::string::npos) << when;
  ASSERT_TRUE(r3.launch());
  const ReplicaContents common = expectConverged();
  EXPECT_EQ(common.rows, kInserts * kInsertRows);
  bool merged = false;
  for (const auto& [name, checksum] : common.parts) merged |= !name.ends_with("_0");
  EXPECT_TRUE(merged) << "no merge ran";
  expectEachAcknowledgedRowOnce(ledger);
}

// 3. ZooKeeper stopped for 3 s and restarted (same port and data) while a client inserts single
// rows round-robin over the replicas, retrying what it did not see acknowledged.
TEST_F(ReplicationFaults, ZooKeeperRestartedUnderLoad) {
  std::vector<LocalReplica*> all = {&addReplica("r1"), &addReplica("r2"), &addReplica("r3")};
  Ledger ledger;
  RetryingInserter client(all, ledger);
  InsertLoad load(client, 0, all.size());
  ASSERT_TRUE(waitFor([&] { return ledger.acknowledgedInserts() >= 20; }, 60s));
  ASSERT_TRUE(zookeeper().stop());
  std::this_thread::sleep_for(3s);  // the outage itself, not a wait for a condition
  ASSERT_TRUE(zookeeper().restart());
  const std::size_t before = ledger.acknowledgedInserts();
  EXPECT_TRUE(waitFor([&] { return ledger.acknowledgedInserts() >= before + 20; }, 60s))
      << "inserts did not resume after ZooKeeper came back";
  load.stop();
  note(fmt::format("{} inserts acknowledged; retries: {}", ledger.acknowledgedInserts(),
                   client.retrySummary()));
  EXPECT_EQ(client.failures(), std::vector<std::string>{});
  expectConverged();
  expectEachAcknowledgedRowOnce(ledger);
}

// 4. A replica's ZooKeeper session expires under it: it starts a new session, re-creates its
// ephemeral is_active, keeps replicating, and takes inserts again.
TEST_F(ReplicationFaults, AnExpiredSessionIsRenewedAndTheReplicaKeepsReplicating) {
  // The password derivation that expireSessionOf relies on, checked against a real session.
  {
    auto own = zookeeper().connect();
    ASSERT_TRUE(own);
    const SessionCredentials credentials = (*own)->sessionCredentialsForTest();
    ASSERT_EQ(zooKeeperSessionPassword(credentials.session_id), credentials.password);
  }
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  addReplica("r3");
  Ledger ledger;
  RetryingInserter client({&r2}, ledger);
  for (uint64_t id = 0; id < 10; ++id) ASSERT_TRUE(client.insertRows(id, 1, 0, Clock::now() + 30s));
  expectConverged();

  // Inserts on r2 keep coming while its session goes.
  InsertLoad load(client, 1000, 1);
  ASSERT_TRUE(waitFor([&] { return ledger.acknowledgedInserts() >= 15; }, 30s));
  const int64_t old_session = expireSessionOf("r2");
  ASSERT_NE(old_session, 0);
  ASSERT_TRUE(waitForNewSession("r2", old_session));
  const std::size_t before = ledger.acknowledgedInserts();
  EXPECT_TRUE(waitFor([&] { return ledger.acknowledgedInserts() >= before + 10; }, 30s))
      << "inserts on r2 did not resume";
  load.stop();
  note(fmt::format("r2's session {:x} expired; retries: {}", old_session, client.retrySummary()));
  EXPECT_EQ(client.failures(), std::vector<std::string>{});
  auto state = replicaState(r2);
  ASSERT_TRUE(state);
  EXPECT_FALSE((*state)["readonly"].get<bool>());

  // Inserts on r2 work at once, and r2 still fetches what others insert.
  for (uint64_t id = 2000; id < 2005; ++id) {
    auto response = r2.post("/insert?format=TSV", tsvRows(id, 1));
    ASSERT_TRUE(response) << response.error();
    ASSERT_EQ(response->status, 200) << response->body;
    ledger.sent(id, 1);
    ledger.acknowledged(id, 1);
  }
  RetryingInserter on_r1({&r1}, ledger);
  ASSERT_TRUE(on_r1.insertRows(3000, 100, 0, Clock::now() + 30s));
  expectConverged();
  expectEachAcknowledgedRowOnce(ledger);
}

// 5. A part file corrupted on disk while the replica was down: the start detects it, detaches it
// as broken_<part>, and the replica fetches the part again from another replica.
TEST_F(ReplicationFaults, ACorruptedPartIsDetachedAndFetchedAgain) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  addReplica("r3");
  Ledger ledger;
  RetryingInserter client({&r1}, ledger);
  // 3 parts per partition, fewer than the 6 that start a merge: no merge can cover the broken
  // part and so hide whether the part itself comes back.
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_TRUE(client.insertRows(i * 1000, 1000, 0, Clock::now() + 30s));
  const ReplicaContents before = expectConverged();
  ASSERT_EQ(before.parts.size(), 9u);
  const std::string part = before.parts.begin()->first;

  ASSERT_EQ(r2.terminate(), 0);
  const auto column_file = r2.dataDir() / part / "id.bin";
  {
    std::fstream file(column_file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file) << column_file;
    file.seekg(0, std::ios::end);
    const std::streamoff middle = file.tellg() / 2;
    char byte = 0;
    file.seekg(middle);
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0xFF);
    file.seekp(middle);
    file.write(&byte, 1);
    ASSERT_TRUE(file);
  }
  ASSERT_TRUE(r2.launch());

  auto state = replicaState(r2);
  ASSERT_TRUE(state);
  const json broken = (*state)["broken_parts"];
  ASSERT_EQ(broken.size(), 1u) << broken.dump();
  EXPECT_TRUE(broken[0].get<std::string>().starts_with(part)) << broken.dump();
  EXPECT_TRUE(std::filesystem::exists(r2.dataDir() / "detached" / ("broken_" + part)));
  note(fmt::format("r2 detached {}: {}; lost parts {}", part, broken[0].get<std::string>(),
                   (*state)["lost_parts"].dump()));

  // ZooKeeper listed the part for r2, which no longer has it: r2 must fetch it again from r1 or r3
  // (ClickHouse: removePartAndEnqueueFetch).
  const bool failed_before = ::testing::Test::HasFailure();
  const ReplicaContents after = expectConverged(30s);
  if (!failed_before && ::testing::Test::HasFailure()) {
    state = replicaState(r2);
    ASSERT_TRUE(state);
    auto keeper = zookeeper().connect();
    ASSERT_TRUE(keeper);
    auto listed = (*keeper)->exists(tableRoot() + "/replicas/r2/parts/" + part);
    ADD_FAILURE() << fmt::format(
        "r2 did not fetch the broken part {} again: ZooKeeper {} it under replicas/r2/parts, "
        "r2's /replica lost_parts {}, queue {} entries",
        part, listed && *listed ? "still lists" : "does not list", (*state)["lost_parts"].dump(),
        (*state)["queue"].size());
  } else {
    EXPECT_EQ(after.parts, before.parts);
  }
  expectEachAcknowledgedRowOnce(ledger);
}

// 6. One client inserting single rows round-robin through kill -9 during fetches, kill -9 during
// a merge, a ZooKeeper restart and a session expiry, retrying what it did not see acknowledged:
// every acknowledged row exactly once everywhere.
TEST_F(ReplicationFaults, EveryAcknowledgedRowSurvivesTheFaultsInARow) {
  auto& r1 = addReplica("r1");
  auto& r2 = addReplica("r2");
  auto& r3 = addReplica("r3");
  std::vector<LocalReplica*> all = {&r1, &r2, &r3};
  Ledger ledger;
  RetryingInserter client(all, ledger);
  InsertLoad load(client, 0, all.size());
  auto acknowledgedAtLeast = [&](std::size_t more) {
    const std::size_t target = ledger.acknowledgedInserts() + more;
    return waitFor([&] { return ledger.acknowledgedInserts() >= target; }, 60s);
  };
  ASSERT_TRUE(acknowledgedAtLeast(10));

  // kill -9 during fetches: large blocks on r1, r3 killed while it fetches them.
  {
    RetryingInserter bulk({&r1, &r2}, ledger);
    std::atomic<bool> done{false};
    auto inserts = std::async(std::launch::async, [&] {
      for (uint64_t b = 0; b < 2; ++b)
        bulk.insertRows(10'000'000 + b * 200'000, 200'000, 0, Clock::now() + 120s);
      done = true;
    });
    const std::string when = killWhileExecuting(
        r3, "GET_PART",
        [&](const json&) -> std::optional<std::string> {
          if (!done) return std::nullopt;
          return "right after the large inserts were acknowledged (no GET_PART seen executing)";
        },
        120s);
    note("r3 killed " + when);
    inserts.wait();
    EXPECT_EQ(bulk.failures(), std::vector<std::string>{});
    ASSERT_TRUE(r3.launch());
  }
  ASSERT_TRUE(acknowledgedAtLeast(5));

  // kill -9 during a merge: the single-row parts keep the leader merging.
  {
    const std::string when = killWhileExecuting(
        r2, "MERGE_PARTS",
        [&](const json& state) -> std::optional<std::string> {
          for (const auto& entry : state["queue"]) {
            if (entry["type"] == "MERGE_PARTS")
              return "with a MERGE_PARTS queued, not yet executing";
          }
          return std::nullopt;
        },
        60s);
    note("r2 killed " + when);
    EXPECT_EQ(when.find("deadline"), std::string::npos) << "no merge was assigned to r2 in 60 s";
    ASSERT_TRUE(r2.launch());
  }
  ASSERT_TRUE(acknowledgedAtLeast(5));

  // ZooKeeper down for 3 s.
  ASSERT_TRUE(zookeeper().stop());
  std::this_thread::sleep_for(3s);  // the outage itself
  ASSERT_TRUE(zookeeper().restart());
  ASSERT_TRUE(acknowledgedAtLeast(5)) << "inserts did not resume after ZooKeeper came back";

  // r1's session expires.
  const int64_t old_session = expireSessionOf("r1");
  ASSERT_NE(old_session, 0);
  ASSERT_TRUE(waitForNewSession("r1", old_session));
  ASSERT_TRUE(acknowledgedAtLeast(10));

  load.stop();
  note(fmt::format("{} inserts acknowledged; retries: {}", ledger.acknowledgedInserts(),
                   client.retrySummary()));
  EXPECT_EQ(client.failures(), std::vector<std::string>{});
  expectConverged();
  expectEachAcknowledgedRowOnce(ledger);
}

}  // namespace
}  // namespace rtable::core
