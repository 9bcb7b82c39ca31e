// The table swap (DESIGN.md 2.6) on the fake ZooKeeper: the plan's text, and the steps driven by
// SwapDriver (as the operator will) through two replicas' TableHosts, with real HTTP between them
// and a writer that retries every insert with its token the whole time.
#include "rtable/replication_core/table_swap.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "rtable/common/testing/files.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/http_api.h"
#include "rtable/replication_core/table_host.h"
#include "rtable/replication_core/testing/fake_keeper.h"
#include "rtable/replication_core/testing/hooked_keeper.h"

namespace rtable::core {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(SwapPlan, RoundTripsAndRefusesWhatIsNoPlan) {
  SwapPlan plan{4, 5, SwapStep::kAttach, "r2", 1764980000000, 1764980000250, 0, "manual: x"};
  EXPECT_EQ(plan.format(),
            "from: 4\nto: 5\nstep: attach\nattacher: r2\nstarted_ms: 1764980000000\n"
            "paused_ms: 1764980000250\nswitched_ms: 0\ntrigger: manual: x\n");
  auto parsed = SwapPlan::parse(plan.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, plan);
  // A plan an earlier version wrote has no times and no trigger.
  auto older = SwapPlan::parse("from: 4\nto: 5\nstep: attach\nattacher: r2\n");
  ASSERT_TRUE(older) << older.error();
  EXPECT_EQ(*older, (SwapPlan{4, 5, SwapStep::kAttach, "r2"}));
  EXPECT_EQ(SwapPlan::parse("from: 1\nto: 2\nstep: open\npaused_ms: -3\n").error(),
            "swap plan line 4 'paused_ms: -3': not a time in ms");
  for (auto step : {SwapStep::kOpen, SwapStep::kPause, SwapStep::kDrain, SwapStep::kAttach,
                    SwapStep::kVerify, SwapStep::kSwitch, SwapStep::kCleanup, SwapStep::kAbort}) {
    EXPECT_EQ(parseSwapStep(swapStepName(step)), step);
  }
  EXPECT_EQ(SwapPlan::parse("from: 1\nto: 2\nstep: jump\n").error(),
            "swap plan line 3 'step: jump': unknown step");
  EXPECT_EQ(SwapPlan::parse("from: 1\nto: x\nstep: open\n").error(),
            "swap plan line 2 'to: x': not a generation number");
  EXPECT_EQ(SwapPlan::parse("from: 2\nto: 2\nstep: open\n").error(),
            "swap plan: to (2) must come after from (2)");
  EXPECT_EQ(SwapPlan::parse("from: 2\nstep: open\n").error(), "swap plan: missing to");
}

constexpr std::string_view kSwapSecret = "swap-secret";
constexpr const char* kSwapRoot = "/rtable/tables/events";

class TableSwap : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-swap-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    common::testing::writeFile(root_ / "secret", std::string(kSwapSecret) + "\n");
  }
  void TearDown() override {
    servers_.clear();
    hosts_.clear();
    if (!HasFailure()) fs::remove_all(root_);
  }

  // `more_yaml`: more of the spec (e.g. inserts:).
  TableHost& open(const std::string& name, const std::string& more_yaml = "") {
    TableHost* opened = nullptr;
    for (int attempt = 0; attempt < 5 && !opened; ++attempt) {
      auto port = common::testing::findFreeLoopbackPort();
      EXPECT_TRUE(port) << port.error();
      if (!port) break;
      auto spec = TableSpec::parseYaml(fmt::format(R"(
table: events
columns: [{{name: d, type: Date}}, {{name: x, type: UInt64}}, {{name: s, type: String}}]
partitionBy: toYYYYMM(d)
orderBy: [x]
zookeeper: {{connect: fake}}
replica: {{name: {}, host: 127.0.0.1}}
ports: {{http: {}}}
dataDir: {}
replication: {{secretFile: {}}}
{}
)",
                                                   name, *port, (root_ / name).string(),
                                                   (root_ / "secret").string(), more_yaml));
      EXPECT_TRUE(spec) << spec.error();
      if (!spec) break;
      auto server = server_;
      TableReplicaOptions options;
      options.replication.merge_min_parts = 4;  // merges run in both generations
      auto host = TableHost::open(
          *spec, [server]() -> KeeperResult<std::unique_ptr<Keeper>> { return server->connect(); },
          *registries_.emplace_back(std::make_unique<prometheus::Registry>()), options);
      EXPECT_TRUE(host) << host.error();
      if (!host) break;
      auto http = ReplicaHttpServer::start(**host, "127.0.0.1", static_cast<uint16_t>(*port), 4);
      if (!http) continue;
      hosts_.push_back(std::move(*host));
      servers_.push_back(std::move(*http));
      opened = hosts_.back().get();
    }
    EXPECT_NE(opened, nullptr);
    return *opened;
  }

  // One insert of row x with token "t<x>" through the host's admission, as the HTTP API does.
  // The error text, or "" once acknowledged.
  static std::string insertOnce(TableHost& host, uint64_t x) {
    auto lease = host.admitInsert();
    if (!lease) return lease.error();
    TableReplica& table = lease->table();
    Block block = table.spec().schema.emptyBlock();
    std::get<std::vector<uint16_t>>(block.columns[0].values)
        .push_back(*parseDate(x % 2 ? "2026-11-01" : "2026-12-01"));
    std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(x);
    std::get<std::vector<std::string>>(block.columns[2].values).push_back(fmt::format("v{}", x));
    auto pending = table.beginInsert(InsertOptions{fmt::format("t{}", x)});
    if (auto added = pending->add(std::move(block)); !added) return added.error();
    auto committed = table.commit(*pending);
    return committed ? std::string() : committed.error().message;
  }

  static std::multiset<uint64_t> ids(TableReplica& table) {
    std::multiset<uint64_t> found;
    for (const auto& part : table.activeParts()) {
      auto block = readDataPart(*part, table.spec().schema);
      EXPECT_TRUE(block) << block.error();
      if (!block) continue;
      for (uint64_t x : std::get<std::vector<uint64_t>>(block->columns[1].values)) {
        found.insert(x);
      }
    }
    return found;
  }

  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  std::unique_ptr<Keeper> observer_ = server_->connect();
  std::vector<std::unique_ptr<prometheus::Registry>> registries_;
  std::vector<std::unique_ptr<TableHost>> hosts_;
  std::vector<std::unique_ptr<ReplicaHttpServer>> servers_;
  fs::path root_;
};

TEST_F(TableSwap, ATableMovesToTheNextGenerationUnderInsertsWithNoRowLostOrDoubled) {
  TableHost& r1 = open("r1");
  TableHost& r2 = open("r2");
  for (uint64_t x = 0; x < 20; ++x) ASSERT_EQ(insertOnce(x % 2 ? r1 : r2, x), "");

  // A writer retries every insert (alternating replicas) until one acknowledges it.
  std::mutex mu;
  std::set<uint64_t> acknowledged;
  std::set<std::string> refusals;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t x = 100; !stop; ++x) {
      for (int attempt = 0; !stop; ++attempt) {
        std::string error = insertOnce(attempt % 2 ? r1 : r2, x);
        std::lock_guard lock(mu);
        if (error.empty()) {
          acknowledged.insert(x);
          break;
        }
        refusals.insert(error.substr(0, 40));
        std::this_thread::sleep_for(5ms);
      }
    }
  });

  int64_t clock_ms = 1000;  // each reading 10 ms later
  // Every plan write is reported once, after it is in ZooKeeper.
  std::vector<std::string> recorded;
  auto on_recorded = [&](const SwapPlan& written) {
    auto stored = observer_->get(swapPath(kSwapRoot));
    ASSERT_TRUE(stored) << stored.error().toString();
    EXPECT_EQ(SwapPlan::parse(stored->data), written);
    recorded.emplace_back(swapStepName(written.step));
  };
  SwapDriver driver(*observer_, kSwapRoot, [&] { return clock_ms += 10; }, on_recorded);
  auto plan = driver.begin("headroom");
  ASSERT_TRUE(plan) << plan.error().toString();
  EXPECT_EQ(plan->trigger, "headroom");
  EXPECT_EQ(plan->from, 1);
  EXPECT_EQ(plan->to, 2);
  EXPECT_EQ(plan->started_ms, 1010);
  std::vector<std::string> steps;
  SwapProgress progress;
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        auto advanced = driver.advance();
        EXPECT_TRUE(advanced) << advanced.error().toString();
        if (!advanced) return true;
        progress = *advanced;
        if (progress.plan) {
          const std::string step(swapStepName(progress.plan->step));
          if (steps.empty() || steps.back() != step) steps.push_back(step);
        }
        if (!progress.ended) std::this_thread::sleep_for(10ms);
        return progress.ended;
      },
      60s))
      << "stuck at " << (steps.empty() ? "" : steps.back()) << ": " << progress.waiting_for;
  EXPECT_FALSE(progress.aborted) << progress.waiting_for;
  EXPECT_EQ(steps, (std::vector<std::string>{"open", "pause", "drain", "attach", "verify", "switch",
                                             "cleanup"}));
  EXPECT_EQ(recorded, steps);
  // The plan kept when the swap began, paused inserts and switched: its duration and write pause.
  ASSERT_TRUE(progress.ended_plan);
  EXPECT_EQ(progress.ended_plan->started_ms, 1010);
  EXPECT_EQ(progress.ended_plan->paused_ms, 1020);
  EXPECT_EQ(progress.ended_plan->switched_ms, 1030);
  EXPECT_EQ(progress.ended_plan->trigger, "headroom");
  std::this_thread::sleep_for(200ms);  // a few inserts into generation 2
  stop = true;
  writer.join();

  // Both serve generation 2, hold every acknowledged row exactly once, and took inserts again.
  ASSERT_EQ(r1.serving()->paths().generation, 2);
  ASSERT_EQ(r2.serving()->paths().generation, 2);
  ASSERT_TRUE(r1.serving()->syncQueue(30s));
  ASSERT_TRUE(r2.serving()->syncQueue(30s));
  std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
  for (uint64_t x = 0; x < 20; ++x) expected.insert(x);
  EXPECT_EQ(ids(*r1.serving()), expected);
  EXPECT_EQ(ids(*r2.serving()), expected);
  EXPECT_TRUE(refusals.contains(
      std::string("the table is moving to a new generation (1 -> 2)").substr(0, 40)))
      << "the writer never met the pause";
  // A client retrying an insert acknowledged in generation 1: deduplicated in generation 2.
  EXPECT_EQ(insertOnce(r1, 3), "");
  EXPECT_EQ(ids(*r1.serving()).count(3), 1u);

  // Generation 1 is gone: its ZooKeeper subtree, its files, the plan.
  auto active = observer_->get(std::string(kSwapRoot) + "/active");
  ASSERT_TRUE(active);
  EXPECT_EQ(active->data, "2");
  auto old_tree = observer_->exists(std::string(kSwapRoot) + "/1");
  ASSERT_TRUE(old_tree);
  EXPECT_FALSE(*old_tree);
  auto swap = observer_->exists(swapPath(kSwapRoot));
  ASSERT_TRUE(swap);
  EXPECT_FALSE(*swap);
  EXPECT_EQ(r1.generation(1), nullptr);
  for (const auto& replica : {"r1", "r2"}) {
    std::vector<std::string> left;
    for (const auto& entry : fs::directory_iterator(root_ / replica)) {
      left.push_back(entry.path().filename().string());
    }
    EXPECT_EQ(left, std::vector<std::string>{"generation-2"}) << replica;
  }
}

// Async inserts buffered when a swap pauses inserts: the pause flushes them into the old
// generation (their leases hold it), and the swap carries their rows to the new one. Buffered for
// ten minutes otherwise: without the flush the pause would wait that long.
TEST_F(TableSwap, ThePauseFlushesBufferedAsyncInsertsIntoTheOldGeneration) {
  TableHost& r1 = open("r1", "inserts: {async: {busyTimeoutMs: 600000, staleTimeoutMs: 0}}");
  std::vector<std::shared_ptr<AsyncInsertTicket>> tickets;
  for (uint64_t x = 1; x <= 3; ++x) {
    auto lease = r1.admitInsert();
    ASSERT_TRUE(lease) << lease.error();
    auto held = std::make_shared<TableHost::InsertLease>(std::move(*lease));
    TableReplica& table = held->table();
    Block block = table.spec().schema.emptyBlock();
    std::get<std::vector<uint16_t>>(block.columns[0].values).push_back(*parseDate("2026-12-01"));
    std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(x);
    std::get<std::vector<std::string>>(block.columns[2].values).push_back("v");
    auto pending = table.beginInsert(InsertOptions{fmt::format("t{}", x)});
    ASSERT_TRUE(pending->add(std::move(block)));
    auto pieces = pending->takePieces();
    ASSERT_TRUE(pieces);
    auto ticket = table.enqueueAsync(std::move(*pieces), pending->options(), held);
    ASSERT_TRUE(ticket) << ticket.error().message;
    tickets.push_back(*ticket);
  }
  EXPECT_FALSE(tickets[0]->done());

  SwapDriver driver(*observer_, kSwapRoot, [] { return int64_t{1000}; });
  ASSERT_TRUE(driver.begin("manual"));
  SwapProgress progress;
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        auto advanced = driver.advance();
        EXPECT_TRUE(advanced) << advanced.error().toString();
        if (!advanced) return true;
        progress = *advanced;
        if (!progress.ended) std::this_thread::sleep_for(10ms);
        return progress.ended;
      },
      60s))
      << "stuck: " << progress.waiting_for;
  EXPECT_FALSE(progress.aborted) << progress.waiting_for;
  for (const auto& ticket : tickets) {
    ASSERT_TRUE(ticket->done());
    const auto& outcome = ticket->wait();
    ASSERT_TRUE(outcome.result) << outcome.result.error().message;
    EXPECT_EQ(outcome.reason, FlushReason::kForced);
    EXPECT_EQ(outcome.inserts_in_flush, 3u);
  }
  ASSERT_EQ(r1.serving()->paths().generation, 2);
  EXPECT_EQ(ids(*r1.serving()), (std::multiset<uint64_t>{1, 2, 3}));
}

TEST_F(TableSwap, ARefusalOfTheHostsOwnerStopsInsertsUntilLifted) {
  TableHost& r1 = open("r1");
  // As a restore not done yet does (backup/restore.h).
  r1.setInsertRefusal("the table is being restored");
  EXPECT_EQ(insertOnce(r1, 1), "the table is being restored");
  EXPECT_TRUE(ids(*r1.serving()).empty());
  r1.setInsertRefusal(std::nullopt);
  EXPECT_EQ(insertOnce(r1, 1), "");
  EXPECT_EQ(ids(*r1.serving()), (std::multiset<uint64_t>{1}));
}

TEST_F(TableSwap, AnAbortedSwapLeavesTheTableAsItWas) {
  TableHost& r1 = open("r1");
  TableHost& r2 = open("r2");
  for (uint64_t x = 0; x < 6; ++x) ASSERT_EQ(insertOnce(x % 2 ? r1 : r2, x), "");
  SwapDriver driver(*observer_, kSwapRoot);
  ASSERT_TRUE(driver.begin());
  // Up to the drain: inserts paused, generation 2 open on both.
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        auto advanced = driver.advance();
        return advanced && advanced->plan && advanced->plan->step == SwapStep::kDrain;
      },
      30s));
  EXPECT_NE(insertOnce(r1, 50).find("moving to a new generation"), std::string::npos);
  auto aborted = driver.abort();
  ASSERT_TRUE(aborted && *aborted);
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        auto advanced = driver.advance();
        return advanced && advanced->ended;
      },
      30s));
  EXPECT_TRUE(common::testing::waitFor(
      [&] { return r1.generation(2) == nullptr && r2.generation(2) == nullptr; }, 10s));
  EXPECT_TRUE(common::testing::waitFor([&] { return insertOnce(r1, 50).empty(); }, 10s));
  EXPECT_EQ(r1.serving()->paths().generation, 1);
  auto next_tree = observer_->exists(std::string(kSwapRoot) + "/2");
  ASSERT_TRUE(next_tree);
  EXPECT_FALSE(*next_tree);
  EXPECT_FALSE(fs::exists(root_ / "r1" / "generation-2"));
  ASSERT_TRUE(r2.serving()->syncQueue(30s));
  EXPECT_EQ(ids(*r2.serving()), (std::multiset<uint64_t>{0, 1, 2, 3, 4, 5, 50}));
}

// The driver (the operator) killed right after one of its ZooKeeper writes, at each step: after
// the write that ends the step (for verify that is the set of `active`, before the plan says
// switch; for cleanup the first removal of generation 1's tree; for begin the next generation's
// tree, before the plan exists). A new driver on a new session takes over from what ZooKeeper
// holds, and the table ends on generation 2 with every row once: nothing attached twice, and
// generation 1 removed only once generation 2 is active.
class TableSwapDriverCrash : public TableSwap,
                             public ::testing::WithParamInterface<std::optional<SwapStep>> {};

TEST_P(TableSwapDriverCrash, ANewDriverResumesTheSwapFromZooKeeper) {
  TableHost& r1 = open("r1");
  TableHost& r2 = open("r2");
  std::multiset<uint64_t> expected;
  for (uint64_t x = 0; x < 12; ++x) {
    ASSERT_EQ(insertOnce(x % 2 ? r1 : r2, x), "");
    expected.insert(x);
  }
  const std::optional<SwapStep> crash_at = GetParam();
  auto hooks = std::make_shared<testing::KeeperHooks>();
  std::atomic<bool> armed{!crash_at.has_value()};  // begin: its first write is the last
  std::atomic<bool> dead{false};
  hooks->before = [&](const testing::KeeperCall& call) -> std::optional<KeeperError> {
    if (dead) return KeeperError{KeeperCode::kConnectionLoss, call.path, "the driver died", {}};
    return std::nullopt;
  };
  hooks->after = [&](const testing::KeeperCall& call) {
    const bool write = call.operation == "create" || call.operation == "set" ||
                       call.operation == "remove" || call.operation == "multi";
    if (write && armed) dead = true;
  };
  auto dying_keeper = testing::hookKeeper(server_->connect(), hooks);
  SwapDriver dying(*dying_keeper, kSwapRoot);
  auto begun = dying.begin();
  ASSERT_EQ(begun.has_value(), crash_at.has_value());
  // Until its first write at `crash_at` kills it.
  for (int call = 0; !dead && call < 3000; ++call) {
    auto advanced = dying.advance();
    ASSERT_TRUE(advanced || dead) << advanced.error().toString();
    if (advanced && advanced->plan && advanced->plan->step == *crash_at) armed = true;
    if (advanced && advanced->ended) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(dead) << "the driver never reached the step";

  // Its successor: begin() returns the running swap (or starts it when none was made).
  SwapDriver next(*observer_, kSwapRoot);
  auto plan = next.begin();
  ASSERT_TRUE(plan) << plan.error().toString();
  EXPECT_EQ(plan->to, 2);
  SwapProgress progress;
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        auto advanced = next.advance();
        EXPECT_TRUE(advanced) << advanced.error().toString();
        if (!advanced) return true;
        progress = *advanced;
        // Generation 1's tree goes only once generation 2 is active.
        auto active = observer_->get(std::string(kSwapRoot) + "/active");
        auto old_tree = observer_->exists(std::string(kSwapRoot) + "/1");
        if (active && old_tree && !*old_tree) {
          EXPECT_EQ(active->data, "2");
        }
        if (!progress.ended) std::this_thread::sleep_for(10ms);
        return progress.ended;
      },
      60s))
      << progress.waiting_for;
  EXPECT_FALSE(progress.aborted) << progress.waiting_for;
  for (TableHost* host : {&r1, &r2}) {
    ASSERT_TRUE(
        common::testing::waitFor([&] { return host->serving()->paths().generation == 2; }, 10s));
    ASSERT_TRUE(host->serving()->syncQueue(30s));
    EXPECT_EQ(ids(*host->serving()), expected);
  }
  auto old_tree = observer_->exists(std::string(kSwapRoot) + "/1");
  ASSERT_TRUE(old_tree);
  EXPECT_FALSE(*old_tree);
  // Inserts go on in generation 2, and a retry of a generation-1 insert is deduplicated there.
  EXPECT_EQ(insertOnce(r1, 100), "");
  EXPECT_EQ(insertOnce(r2, 3), "");
  ASSERT_TRUE(r2.serving()->syncQueue(30s));
  expected.insert(100);
  EXPECT_EQ(ids(*r2.serving()), expected);
}

INSTANTIATE_TEST_SUITE_P(EveryStep, TableSwapDriverCrash,
                         ::testing::Values(std::nullopt, SwapStep::kOpen, SwapStep::kPause,
                                           SwapStep::kDrain, SwapStep::kAttach, SwapStep::kVerify,
                                           SwapStep::kSwitch, SwapStep::kCleanup),
                         [](const ::testing::TestParamInfo<std::optional<SwapStep>>& info) {
                           return info.param ? std::string(swapStepName(*info.param))
                                             : std::string("begin");
                         });

}  // namespace
}  // namespace rtable::core
