// A replica never stays stuck once a fault clears (issue 26). For every step of a fetch (resolve,
// connect, send, the answer's head, its body, the checksums, the local write, fsync, rename, and
// the ZooKeeper registration) and of a merge (read, write, fsync, rename, registration), a fault
// (ENOSPC, EIO, a reset, a stall, a lost answer) is injected while the step runs in the replica's
// real pools. Once it clears, the queue must drain and its executing counts return to zero: an
// entry that failed at any step gave its slot back.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <sys/socket.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <future>
#include <system_error>
#include <thread>

#include "rtable/common/testing/files.h"
#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/fail_points.h"
#include "rtable/replication_core/http_api.h"
#include "rtable/replication_core/table_replica.h"
#include "rtable/replication_core/testing/fake_keeper.h"
#include "rtable/replication_core/testing/hooked_keeper.h"

namespace rtable::core {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using common::testing::waitFor;

constexpr std::string_view kInjectionSecret = "fault-secret";

// A listening socket whose backlog is full: connecting to it hangs, as to a peer that is cut off.
class BlackHole {
 public:
  BlackHole() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(listener_, 0);
    socklen_t length = sizeof(address);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    for (int i = 0; i < 3; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      (void)::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
      fillers_.push_back(fd);
    }
  }
  ~BlackHole() {
    for (int fd : fillers_) ::close(fd);
    ::close(listener_);
  }
  uint16_t port() const { return port_; }

 private:
  int listener_ = -1;
  uint16_t port_ = 0;
  std::vector<int> fillers_;
};

// Two replicas of one table on the fake ZooKeeper: r1, the source, serves part fetches over HTTP
// on loopback; r2 is the replica under faults. Parts are files on disk (no held parts), so every
// file step of a fetch and a merge happens.
class ReplicaFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-faults-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    common::testing::writeFile(root_ / "secret", std::string(kInjectionSecret) + "\n");
  }
  void TearDown() override {
    clearFaultsForTest();
    hooks_->before = nullptr;
    hooks_->after = nullptr;
    servers_.clear();
    replicas_.clear();
    if (!HasFailure()) fs::remove_all(root_);
  }

  TableSpec spec(const std::string& name, uint16_t port) {
    auto parsed = TableSpec::parseYaml(fmt::format(R"(
table: events
columns: [{{name: d, type: Date}}, {{name: x, type: UInt64}}, {{name: s, type: String}}]
partitionBy: toYYYYMM(d)
orderBy: [x]
zookeeper: {{connect: fake}}
replica: {{name: {}, host: 127.0.0.1}}
ports: {{http: {}}}
dataDir: {}
replication: {{secretFile: {}, fetchConnectTimeoutMs: 1000, fetchReceiveTimeoutMs: 2000}}
)",
                                                   name, port, (root_ / name).string(),
                                                   (root_ / "secret").string()));
    EXPECT_TRUE(parsed) << parsed.error();
    return *parsed;
  }

  // A replica with its HTTP server. Its sessions go through hooks_ (r2's) or directly (r1's).
  TableReplica& open(const std::string& name, TableReplicaOptions options, bool hooked) {
    options.parts.journal_part_bytes = 0;  // parts as files: every file step happens
    TableReplica* opened = nullptr;
    for (int attempt = 0; attempt < 5 && !opened; ++attempt) {
      auto port = common::testing::findFreeLoopbackPort();
      EXPECT_TRUE(port) << port.error();
      if (!port) break;
      auto server = server_;
      auto hooks = hooked ? hooks_ : std::make_shared<testing::KeeperHooks>();
      auto table = TableReplica::open(
          spec(name, static_cast<uint16_t>(*port)),
          [server, hooks]() -> KeeperResult<std::unique_ptr<Keeper>> {
            return testing::hookKeeper(std::shared_ptr<Keeper>(server->connect()), hooks);
          },
          *registries_.emplace_back(std::make_unique<prometheus::Registry>()), options);
      EXPECT_TRUE(table) << table.error();
      if (!table) break;
      auto http = ReplicaHttpServer::start(**table, "127.0.0.1", static_cast<uint16_t>(*port), 2);
      if (!http) continue;  // the port was taken meanwhile
      replicas_.push_back(std::move(*table));
      servers_.push_back(std::move(*http));
      opened = replicas_.back().get();
    }
    EXPECT_NE(opened, nullptr);
    return *opened;
  }

  void insert(TableReplica& table, uint64_t x) {
    Block block = table.spec().schema.emptyBlock();
    std::get<std::vector<uint16_t>>(block.columns[0].values).push_back(*parseDate("2026-12-01"));
    std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(x);
    std::get<std::vector<std::string>>(block.columns[2].values).push_back(fmt::format("v{}", x));
    auto pending = table.beginInsert({});
    ASSERT_TRUE(pending->add(std::move(block)));
    auto committed = table.commit(*pending);
    ASSERT_TRUE(committed) << committed.error().message;
  }

  static std::map<std::string, std::string> partsOf(TableReplica& table) {
    std::map<std::string, std::string> parts;
    for (const auto& part : table.activeParts()) {
      parts[part->name.format()] =
          fmt::format("{:016x}{:016x}", part->checksums.total.high, part->checksums.total.low);
    }
    return parts;
  }

  // After the fault cleared: the queue drains, nothing stays executing.
  void expectRecovered(TableReplica& table) {
    EXPECT_TRUE(table.syncQueue(30s)) << "the queue did not drain";
    std::map<std::string, std::size_t> executing;
    EXPECT_TRUE(waitFor(
        [&] {
          executing = table.state().executing;
          return std::all_of(executing.begin(), executing.end(),
                             [](const auto& e) { return e.second == 0; });
        },
        10s))
        << "still executing: fetch " << executing["fetch"] << ", merge " << executing["merge"];
    EXPECT_EQ(table.checkQueueInvariant(), "");
  }

 public:  // for the scenarios, which arm faults through them
  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  std::shared_ptr<testing::KeeperHooks> hooks_ = std::make_shared<testing::KeeperHooks>();

 protected:
  std::vector<std::unique_ptr<prometheus::Registry>> registries_;
  std::vector<std::unique_ptr<TableReplica>> replicas_;
  std::vector<std::unique_ptr<ReplicaHttpServer>> servers_;
  fs::path root_;
};

// How a scenario breaks a step, and how many failed (or stalled) calls show it happened.
struct Breakage {
  std::string name;
  std::function<void(ReplicaFaults&, const fs::path& r2_dir)> arm;
  std::size_t hits = 3;
};

void PrintTo(const Breakage& breakage, std::ostream* out) {
  *out << breakage.name;
}

Fault fault(FailPoint point, std::string where, int error, std::chrono::milliseconds stall = 0ms) {
  Fault f;
  f.op = point;
  f.path_contains = std::move(where);
  f.error = error;
  f.times = error == 0 ? 3 : -1;  // a stall passes after three; an error lasts until cleared
  f.stall = stall;
  return f;
}

Breakage fileBreakage(std::string name, FailPoint point, std::string suffix, int error,
                      std::chrono::milliseconds stall = 0ms) {
  return Breakage{name,
                  [=](ReplicaFaults&, const fs::path& r2_dir) {
                    injectFaultForTest(fault(point, (r2_dir / suffix).string(), error, stall));
                  },
                  error == 0 ? 1u : 3u};
}

Breakage netBreakage(std::string name, FailPoint point, int error,
                     std::chrono::milliseconds stall = 0ms) {
  return Breakage{name,
                  [=](ReplicaFaults&, const fs::path&) {
                    injectFaultForTest(fault(point, "127.0.0.1:", error, stall));
                  },
                  error == 0 ? 1u : 3u};
}

// The multi that registers a part r2 made (its first op creates replicas/r2/parts/<part>):
// `applied` answers the connection as lost after the server applied it, else before.
Breakage registrationBreakage(std::string name, bool applied) {
  return Breakage{
      name,
      [=](ReplicaFaults& test, const fs::path&) {
        auto observer = std::shared_ptr<Keeper>(test.server_->connect());
        auto hits = std::make_shared<std::atomic<int>>(0);
        test.hooks_->before = [observer, hits, applied](
                                  const testing::KeeperCall& call) -> std::optional<KeeperError> {
          if (call.operation != "multi" ||
              call.path.find("/replicas/r2/parts/") == std::string::npos || *hits >= 3) {
            return std::nullopt;
          }
          ++*hits;
          if (applied) (void)observer->multi(*call.ops);
          return KeeperError{KeeperCode::kConnectionLoss, call.path, "connection lost", {}};
        };
      },
      0};
}

std::vector<Breakage> fetchBreakages() {
  return {
      netBreakage("resolve_eio", FailPoint::kResolve, EIO),
      netBreakage("connect_reset", FailPoint::kConnect, ECONNRESET),
      netBreakage("connect_stall", FailPoint::kConnect, 0, 300ms),
      netBreakage("send_reset", FailPoint::kSend, ECONNRESET),
      netBreakage("head_reset", FailPoint::kReceiveHead, ECONNRESET),
      netBreakage("head_stall", FailPoint::kReceiveHead, 0, 300ms),
      netBreakage("body_reset", FailPoint::kReceiveBody, ECONNRESET),
      netBreakage("body_eio", FailPoint::kReceiveBody, EIO),
      netBreakage("body_stall", FailPoint::kReceiveBody, 0, 300ms),
      fileBreakage("mkdir_enospc", FailPoint::kMkdir, "staging/fetch-", ENOSPC),
      fileBreakage("write_enospc", FailPoint::kWrite, "staging/fetch-", ENOSPC),
      fileBreakage("write_eio", FailPoint::kWrite, "staging/fetch-", EIO),
      fileBreakage("write_stall", FailPoint::kWrite, "staging/fetch-", 0, 300ms),
      fileBreakage("fsync_eio", FailPoint::kFsync, "staging/fetch-", EIO),
      fileBreakage("fsync_enospc", FailPoint::kFsync, "staging/fetch-", ENOSPC),
      fileBreakage("rename_enospc", FailPoint::kRename, "202612_", ENOSPC),
      fileBreakage("rename_eio", FailPoint::kRename, "202612_", EIO),
      registrationBreakage("register_lost", false),
      registrationBreakage("register_applied_unanswered", true),
  };
}

class FetchFaults : public ReplicaFaults, public ::testing::WithParamInterface<Breakage> {};

TEST_P(FetchFaults, TheQueueDrainsOnceTheFaultClears) {
  TableReplicaOptions source;
  source.background = false;
  TableReplica& r1 = open("r1", source, /*hooked=*/false);
  for (uint64_t x = 1; x <= 3; ++x) insert(r1, x);
  const Breakage& breakage = GetParam();
  const fs::path r2_dir = root_ / "r2";
  breakage.arm(*this, r2_dir);
  TableReplicaOptions options;
  options.replication.merge_min_parts = 1000;  // fetches only
  TableReplica& r2 = open("r2", options, /*hooked=*/true);
  if (breakage.hits > 0) {
    EXPECT_TRUE(waitFor([&] { return faultHitsForTest() >= breakage.hits; }, 20s))
        << "the fault was hit " << faultHitsForTest() << " times";
  } else {
    EXPECT_TRUE(waitFor(
        [&] {
          const auto state = r2.state();
          return std::any_of(state.queue.begin(), state.queue.end(), [](const QueueEntry& e) {
            return e.num_tries >= 1 && !e.last_exception.empty();
          });
        },
        20s))
        << "no fetch failed";
  }
  clearFaultsForTest();
  hooks_->before = nullptr;
  expectRecovered(r2);
  EXPECT_EQ(partsOf(r2), partsOf(r1));
  EXPECT_EQ(r2.rowCount(), 3u);
}

INSTANTIATE_TEST_SUITE_P(EveryStep, FetchFaults, ::testing::ValuesIn(fetchBreakages()),
                         [](const auto& info) { return info.param.name; });

// The checksums step: the source's file is damaged on disk (same size, one byte flipped), so the
// bytes arrive and fail their hash; once the file is whole again the fetch succeeds.
TEST_F(ReplicaFaults, AFetchOfACorruptPartFailsUntilTheSourceIsWholeAgain) {
  TableReplicaOptions source;
  source.background = false;
  TableReplica& r1 = open("r1", source, /*hooked=*/false);
  insert(r1, 1);
  const fs::path file = root_ / "r1" / "202612_0_0_0" / "x.bin";
  const std::string original = common::testing::readFile(file);
  std::string damaged = original;
  damaged[damaged.size() / 2] ^= 0x5a;
  common::testing::writeFile(file, damaged);
  TableReplicaOptions options;
  options.replication.merge_min_parts = 1000;
  TableReplica& r2 = open("r2", options, /*hooked=*/true);
  EXPECT_TRUE(waitFor(
      [&] {
        const auto state = r2.state();
        return std::any_of(state.queue.begin(), state.queue.end(), [](const QueueEntry& e) {
          return e.num_tries >= 2 && e.last_exception.find("corrupt") != std::string::npos;
        });
      },
      20s))
      << "the corrupt transfer was not refused twice";
  common::testing::writeFile(file, original);
  expectRecovered(r2);
  EXPECT_EQ(partsOf(r2), partsOf(r1));
}

// One source cut off (connect hangs) beside one that has the part: the fetch gives up on the cut
// one after the connect timeout and takes the part from the other in the same attempt; the next
// fetch tries the other first.
// A session that lost its connection (a replica cut off from every ZooKeeper server; the session
// may still live) makes the replica read-only: an insert is refused at once as unavailable, with a
// known outcome (nothing written), instead of failing mid-commit with an unknown one. Connected
// again, it takes inserts.
TEST_F(ReplicaFaults, ADisconnectedSessionMakesTheReplicaReadOnlyUntilItReconnects) {
  TableReplica& r2 = open("r2", {}, /*hooked=*/true);
  insert(r2, 1);
  hooks_->disconnected = true;
  EXPECT_TRUE(r2.state().readonly);
  std::atomic<std::size_t> requests{0};  // the insert's own, not the background threads'
  hooks_->before = [&, inserter = std::this_thread::get_id()](
                       const testing::KeeperCall&) -> std::optional<KeeperError> {
    if (std::this_thread::get_id() == inserter) ++requests;
    return std::nullopt;
  };
  Block block = r2.spec().schema.emptyBlock();
  std::get<std::vector<uint16_t>>(block.columns[0].values).push_back(*parseDate("2026-12-01"));
  std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(2);
  std::get<std::vector<std::string>>(block.columns[2].values).push_back("v2");
  auto pending = r2.beginInsert({});
  ASSERT_TRUE(pending->add(std::move(block)));
  auto refused = r2.commit(*pending);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, InsertError::Kind::kUnavailable) << refused.error().message;
  EXPECT_EQ(requests, 0u) << "a request was sent on a disconnected session";
  hooks_->before = nullptr;
  hooks_->disconnected = false;
  EXPECT_FALSE(r2.state().readonly);
  insert(r2, 3);
  EXPECT_EQ(r2.state().rows, 2u);
}

// Requests beyond the API's queue are refused at once with 503 OVERLOADED and Retry-After, and
// not run: one worker held inside an insert's commit (its ZooKeeper request waits for the test),
// one insert waiting its turn, a third refused. Released, the two run; the refused one's row is
// nowhere.
TEST_F(ReplicaFaults, ARequestBeyondTheQueueIsRefusedOverloadedAndNotRun) {
  TableReplica& r2 = open("r2", {}, /*hooked=*/true);
  std::unique_ptr<ReplicaHttpServer> server;
  uint16_t port = 0;
  for (int attempt = 0; attempt < 5 && !server; ++attempt) {
    auto free_port = common::testing::findFreeLoopbackPort();
    ASSERT_TRUE(free_port) << free_port.error();
    auto started = ReplicaHttpServer::start(r2, "127.0.0.1", static_cast<uint16_t>(*free_port),
                                            /*workers=*/1, /*max_queued=*/1);
    if (started) {
      server = std::move(*started);
      port = static_cast<uint16_t>(*free_port);
    }
  }
  ASSERT_TRUE(server);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> held{0};
  hooks_->before = [&, released](const testing::KeeperCall& call) -> std::optional<KeeperError> {
    // An insert's commit: its multi creates a block number lock.
    bool allocates = false;
    for (const Op& op : call.ops ? *call.ops : std::vector<Op>{}) {
      const auto* create = std::get_if<op::Create>(&op);
      allocates = allocates || (create && create->path.find("block_numbers") != std::string::npos);
    }
    if (allocates) {
      ++held;
      released.wait();
    }
    return std::nullopt;
  };
  auto insert = [&](uint64_t x) {
    return common::testing::httpRequest("127.0.0.1", port, "POST", "/insert?format=TSV",
                                        fmt::format("2026-12-01\t{}\tv{}\n", x, x), 30s);
  };
  auto first = std::async(std::launch::async, insert, 1);
  ASSERT_TRUE(waitFor([&] { return held.load() == 1; }, 10s)) << "the first insert never committed";
  // Two more: one waits its turn, the other finds the queue full and is answered at once.
  auto second = std::async(std::launch::async, insert, 2);
  auto third = std::async(std::launch::async, insert, 3);
  const bool one_answered = waitFor(
      [&] {
        return second.wait_for(0s) == std::future_status::ready ||
               third.wait_for(0s) == std::future_status::ready;
      },
      10s);
  release.set_value();
  ASSERT_TRUE(one_answered) << "neither waiting insert was refused";
  const bool second_refused = second.wait_for(0s) == std::future_status::ready;
  auto refused = (second_refused ? second : third).get();
  auto queued = (second_refused ? third : second).get();
  auto ran = first.get();
  ASSERT_TRUE(refused) << refused.error();
  EXPECT_EQ(refused->status, 503) << refused->body;
  EXPECT_NE(refused->body.find("\"OVERLOADED\""), std::string::npos) << refused->body;
  EXPECT_NE(refused->headers.find("Retry-After: 1"), std::string::npos) << refused->headers;
  ASSERT_TRUE(ran && queued);
  EXPECT_EQ(ran->status, 200) << ran->body;
  EXPECT_EQ(queued->status, 200) << queued->body;
  hooks_->before = nullptr;
  EXPECT_EQ(r2.state().rows, 2u) << "the refused insert ran, or an accepted one did not";
}

// A fetch that meets a full volume (ENOSPC on every write under r2's folder) makes r2 say so in
// ZooKeeper, in an ephemeral <replica>/disk_full holding the error (the operator shows it in the
// table's status); once a part is written again, the node goes.
TEST_F(ReplicaFaults, AFullVolumeIsSaidInZooKeeperUntilAPartIsWrittenAgain) {
  TableReplicaOptions source;
  source.background = false;
  TableReplica& r1 = open("r1", source, /*hooked=*/false);
  insert(r1, 1);
  injectFaultForTest(fault(FailPoint::kWrite, (root_ / "r2").string(), ENOSPC));
  TableReplicaOptions options;
  options.replication.merge_min_parts = 1000;  // fetches only
  TableReplica& r2 = open("r2", options, /*hooked=*/false);
  auto keeper = server_->connect();
  const std::string node = r2.paths().diskFull();
  KeeperResult<GetResult> said = std::unexpected(KeeperError{});
  ASSERT_TRUE(waitFor([&] { return (said = keeper->get(node)).has_value(); }, 20s))
      << "r2 never said its volume is full";
  EXPECT_NE(said->data.find(std::generic_category().message(ENOSPC)), std::string::npos)
      << said->data;
  EXPECT_NE(said->stat.ephemeral_owner, 0);
  clearFaultsForTest();
  expectRecovered(r2);
  EXPECT_TRUE(waitFor(
      [&] {
        auto gone = keeper->exists(node);
        return gone && !gone->has_value();
      },
      20s))
      << "r2's disk_full stayed after a part was written";
}

TEST_F(ReplicaFaults, AnUnreachableSourceIsTriedAfterTheOthersOnceItFailed) {
  BlackHole cut_off;
  TableReplicaOptions source;
  source.background = false;
  TableReplica& r1 = open("r1", source, /*hooked=*/false);
  insert(r1, 1);
  // r0: registered, live, listing the part, at an address that never answers.
  auto observer = server_->connect();
  const TablePaths r0{r1.paths().table_root, 1, "r0"};
  ASSERT_TRUE(observer->create(r0.replicaRoot(), "", CreateMode::kPersistent));
  ASSERT_TRUE(observer->create(r0.host(),
                               fmt::format("host: 127.0.0.1\nport: {}\n", cut_off.port()),
                               CreateMode::kPersistent));
  ASSERT_TRUE(observer->create(r0.isActive(), "", CreateMode::kEphemeral));
  ASSERT_TRUE(observer->create(r0.parts(), "", CreateMode::kPersistent));
  ASSERT_TRUE(observer->create(r0.part("202612_0_0_0"), "", CreateMode::kPersistent));
  ASSERT_TRUE(observer->create(r0.part("202612_1_1_0"), "", CreateMode::kPersistent));
  TableReplicaOptions options;
  options.background = false;  // one fetch at a time, in this thread
  options.replication.merge_min_parts = 1000;
  TableReplica& r2 = open("r2", options, /*hooked=*/true);
  r2.runBackgroundRoundForTest();
  EXPECT_EQ(r2.rowCount(), 1u) << "the part did not come from r1 after r0 failed";
  insert(r1, 2);
  r2.runBackgroundRoundForTest();
  EXPECT_EQ(r2.rowCount(), 2u);
  const auto state = r2.state();
  EXPECT_TRUE(state.queue.empty());
  // r0 was tried once: for the first part. The metric counts failed transfers.
  double fetch_errors = -1;
  for (const auto& family : registries_.back()->Collect()) {
    if (family.name == "rtable_fetch_errors_total")
      fetch_errors = family.metric.front().counter.value;
  }
  EXPECT_EQ(fetch_errors, 1);
}

// Merges: r1 alone (the leader), parts as files. Each step of its merge of three parts fails
// until the fault clears; then the merge is done, and nothing stays executing.
std::vector<Breakage> mergeBreakages() {
  auto on = [](std::string name, FailPoint point, std::string where, int error,
               std::chrono::milliseconds stall = 0ms) {
    return Breakage{name,
                    [=](ReplicaFaults&, const fs::path& dir) {
                      injectFaultForTest(fault(point, (dir / where).string(), error, stall));
                    },
                    error == 0 ? 1u : 2u};
  };
  return {
      on("read_eio", FailPoint::kOpen, "202612_0_0_0/", EIO),
      on("write_enospc", FailPoint::kWrite, "tmp_202612_0_2_1", ENOSPC),
      on("write_eio", FailPoint::kWrite, "tmp_202612_0_2_1", EIO),
      on("write_stall", FailPoint::kWrite, "tmp_202612_0_2_1", 0, 300ms),
      on("fsync_eio", FailPoint::kFsync, "tmp_202612_0_2_1", EIO),
      on("rename_enospc", FailPoint::kRename, "202612_0_2_1", ENOSPC),
      Breakage{"register_lost",
               [](ReplicaFaults& test, const fs::path&) {
                 auto hits = std::make_shared<std::atomic<int>>(0);
                 test.hooks_->before =
                     [hits](const testing::KeeperCall& call) -> std::optional<KeeperError> {
                   if (call.operation != "multi" || !call.path.ends_with("/parts/202612_0_2_1") ||
                       *hits >= 3) {
                     return std::nullopt;
                   }
                   ++*hits;
                   return KeeperError{
                       KeeperCode::kConnectionLoss, call.path, "connection lost", {}};
                 };
               },
               0},
  };
}

class MergeFaults : public ReplicaFaults, public ::testing::WithParamInterface<Breakage> {};

TEST_P(MergeFaults, TheMergeIsDoneOnceTheFaultClears) {
  const Breakage& breakage = GetParam();
  const fs::path dir = root_ / "r1";
  TableReplicaOptions options;
  options.replication.merge_min_parts = 3;
  options.replication.merge_max_parts = 3;
  TableReplica& r1 = open("r1", options, /*hooked=*/true);
  breakage.arm(*this, dir);
  for (uint64_t x = 1; x <= 3; ++x) insert(r1, x);
  if (breakage.hits > 0) {
    EXPECT_TRUE(waitFor([&] { return faultHitsForTest() >= breakage.hits; }, 20s))
        << "the fault was hit " << faultHitsForTest() << " times";
  } else {
    EXPECT_TRUE(waitFor(
        [&] {
          const auto state = r1.state();
          return std::any_of(state.queue.begin(), state.queue.end(), [](const QueueEntry& e) {
            return e.num_tries >= 1 && !e.last_exception.empty();
          });
        },
        20s))
        << "the merge never failed";
  }
  clearFaultsForTest();
  hooks_->before = nullptr;
  expectRecovered(r1);
  EXPECT_EQ(partsOf(r1).size(), 1u);
  EXPECT_TRUE(partsOf(r1).contains("202612_0_2_1"));
  EXPECT_EQ(r1.rowCount(), 3u);
}

INSTANTIATE_TEST_SUITE_P(EveryStep, MergeFaults, ::testing::ValuesIn(mergeBreakages()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace rtable::core
