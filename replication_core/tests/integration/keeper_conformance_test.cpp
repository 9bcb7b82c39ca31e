// One suite, two servers: every case runs against the in-memory fake and against a real
// ZooKeeper 3.8. Where they differ, the fake is wrong.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/sequential_counter.h"
#include "rtable/replication_core/testing/fake_keeper.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::core {
namespace {

using common::testing::waitFor;
using testing::FakeKeeperServer;
using testing::LocalZooKeeper;

class KeeperEnvironment {
 public:
  virtual ~KeeperEnvironment() = default;
  virtual std::unique_ptr<Keeper> connect() = 0;
  virtual void expire(Keeper& keeper) = 0;
  virtual void setSequentialCounter(const std::string& path, int32_t counter) = 0;
};

class FakeEnvironment : public KeeperEnvironment {
 public:
  std::unique_ptr<Keeper> connect() override { return server_->connect(); }
  void expire(Keeper& keeper) override { server_->expireSession(keeper.sessionId()); }
  void setSequentialCounter(const std::string& path, int32_t counter) override {
    ASSERT_TRUE(server_->setSequentialCounterForTest(path, counter));
  }

 private:
  std::shared_ptr<FakeKeeperServer> server_ = FakeKeeperServer::create();
};

class RealEnvironment : public KeeperEnvironment {
 public:
  RealEnvironment() {
    auto zk = LocalZooKeeper::start();
    if (!zk) throw std::runtime_error("local ZooKeeper did not start: " + zk.error());
    zk_ = std::move(*zk);
  }
  std::unique_ptr<Keeper> connect() override {
    auto client = zk_->connect();
    EXPECT_TRUE(client) << client.error().toString();
    return client ? std::move(*client) : nullptr;
  }
  void expire(Keeper& keeper) override {
    auto& client = dynamic_cast<ZooKeeperClient&>(keeper);
    ASSERT_TRUE(zk_->expireSession(client.sessionCredentialsForTest()));
  }
  void setSequentialCounter(const std::string& path, int32_t counter) override {
    auto set = zk_->setSequentialCounter(path, counter);
    ASSERT_TRUE(set) << set.error();
  }
  LocalZooKeeper& server() { return *zk_; }

 private:
  std::unique_ptr<LocalZooKeeper> zk_;
};

// One real server for the whole binary: a JVM start per case would dominate the run time.
RealEnvironment& realEnvironment() {
  static RealEnvironment env;
  return env;
}

// A session on the real server holding `digests` (the ACL tests), sharing `shared` and inheriting
// below `inheriting_roots`; null after a failed expectation.
std::unique_ptr<ZooKeeperClient> connectAs(std::vector<ZooKeeperDigest> digests = {},
                                           std::vector<SharedSubtree> shared = {},
                                           std::vector<std::string> inheriting_roots = {}) {
  ZooKeeperConfig config{realEnvironment().server().connectString(),
                         std::chrono::seconds(10),
                         std::chrono::seconds(10),
                         std::move(digests),
                         std::move(shared),
                         std::move(inheriting_roots)};
  auto client = ZooKeeperClient::connect(config);
  EXPECT_TRUE(client) << client.error().toString();
  return client ? std::move(*client) : nullptr;
}

// Whether a request was refused for want of permission.
template <class Result>
bool refused(const Result& result) {
  return !result && result.error().code == KeeperCode::kNoAuth;
}

// Collects watch events from any thread.
class EventLog {
 public:
  WatchCallback callback() {
    return [this](const WatchEvent& event) {
      std::lock_guard lock(mu_);
      events_.push_back(event);
    };
  }
  std::vector<WatchEvent> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::size_t size() const { return events().size(); }

 private:
  mutable std::mutex mu_;
  std::vector<WatchEvent> events_;
};

class KeeperConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "fake") {
      fake_ = std::make_unique<FakeEnvironment>();
      env_ = fake_.get();
    } else {
      env_ = &realEnvironment();
    }
    keeper_ = env_->connect();
    ASSERT_NE(keeper_, nullptr);
    // Each case works under its own root, so cases share one real server without interfering.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fmt::format("/conformance/{}", info->name());
    std::replace(root_.begin() + 1, root_.end(), '/', '_');
    ASSERT_TRUE(createAncestorsAndSelf(*keeper_, root_));
  }

  std::string path(std::string_view child) const { return joinPath(root_, child); }

  std::unique_ptr<FakeEnvironment> fake_;
  KeeperEnvironment* env_ = nullptr;
  std::unique_ptr<Keeper> keeper_;
  std::string root_;
};

TEST_P(KeeperConformance, CreateGetSetRemoveWithVersions) {
  auto created = keeper_->create(path("a"), "one", CreateMode::kPersistent);
  ASSERT_TRUE(created) << created.error().toString();
  EXPECT_EQ(*created, path("a"));

  auto got = keeper_->get(path("a"));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->data, "one");
  EXPECT_EQ(got->stat.version, 0);
  EXPECT_EQ(got->stat.data_length, 3);
  EXPECT_EQ(got->stat.ephemeral_owner, 0);

  auto set = keeper_->set(path("a"), "two", 0);
  ASSERT_TRUE(set);
  EXPECT_EQ(set->version, 1);
  EXPECT_GT(set->mzxid, got->stat.mzxid);
  EXPECT_EQ(keeper_->get(path("a"))->data, "two");

  auto stale = keeper_->set(path("a"), "three", 0);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, KeeperCode::kBadVersion);
  EXPECT_FALSE(stale.error().isConnectionLevel());

  auto stale_remove = keeper_->remove(path("a"), 0);
  ASSERT_FALSE(stale_remove);
  EXPECT_EQ(stale_remove.error().code, KeeperCode::kBadVersion);

  ASSERT_TRUE(keeper_->remove(path("a"), 1));
  auto gone = keeper_->exists(path("a"));
  ASSERT_TRUE(gone);
  EXPECT_FALSE(gone->has_value());
}

TEST_P(KeeperConformance, LargeValuesRoundTrip) {
  const std::string big(300 * 1024, 'x');
  ASSERT_TRUE(keeper_->create(path("big"), big, CreateMode::kPersistent));
  auto got = keeper_->get(path("big"));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->data, big);
  ASSERT_TRUE(keeper_->create(path("empty"), "", CreateMode::kPersistent));
  EXPECT_EQ(keeper_->get(path("empty"))->data, "");
}

TEST_P(KeeperConformance, GetManyAnswersEveryPathInOrder) {
  // More than one batch of the log puller, values of different sizes (one over the C client's
  // first-read buffer), and missing nodes between them.
  std::vector<std::string> paths;
  std::vector<std::string> values;
  for (int i = 0; i < 150; ++i) {
    paths.push_back(path(fmt::format("n{:03d}", i)));
    values.push_back(i == 7 ? std::string(100 * 1024, 'b') : fmt::format("value {}", i));
    if (i % 10 != 3) {
      ASSERT_TRUE(keeper_->create(paths.back(), values.back(), CreateMode::kPersistent));
    }
  }
  ASSERT_TRUE(keeper_->set(paths[0], "changed"));
  auto results = keeper_->getMany(paths);
  ASSERT_EQ(results.size(), paths.size());
  for (int i = 0; i < 150; ++i) {
    if (i % 10 == 3) {
      ASSERT_FALSE(results[i]) << i;
      EXPECT_EQ(results[i].error().code, KeeperCode::kNoNode);
      EXPECT_EQ(results[i].error().path, paths[i]);
      continue;
    }
    ASSERT_TRUE(results[i]) << i << ": " << results[i].error().toString();
    EXPECT_EQ(results[i]->data, i == 0 ? "changed" : values[i]) << i;
    EXPECT_EQ(results[i]->stat.version, i == 0 ? 1 : 0) << i;
  }
  EXPECT_TRUE(keeper_->getMany({}).empty());
}

TEST_P(KeeperConformance, SemanticErrorsAreAnswers) {
  auto no_node = keeper_->get(path("missing"));
  ASSERT_FALSE(no_node);
  EXPECT_EQ(no_node.error().code, KeeperCode::kNoNode);
  EXPECT_EQ(no_node.error().path, path("missing"));
  EXPECT_FALSE(no_node.error().isConnectionLevel());

  auto orphan = keeper_->create(path("missing/child"), "", CreateMode::kPersistent);
  ASSERT_FALSE(orphan);
  EXPECT_EQ(orphan.error().code, KeeperCode::kNoNode);

  ASSERT_TRUE(keeper_->create(path("p"), "", CreateMode::kPersistent));
  auto twice = keeper_->create(path("p"), "", CreateMode::kPersistent);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code, KeeperCode::kNodeExists);

  ASSERT_TRUE(keeper_->create(path("p/c"), "", CreateMode::kPersistent));
  auto not_empty = keeper_->remove(path("p"));
  ASSERT_FALSE(not_empty);
  EXPECT_EQ(not_empty.error().code, KeeperCode::kNotEmpty);

  ASSERT_TRUE(keeper_->create(path("eph"), "", CreateMode::kEphemeral));
  auto under_ephemeral = keeper_->create(path("eph/c"), "", CreateMode::kPersistent);
  ASSERT_FALSE(under_ephemeral);
  EXPECT_EQ(under_ephemeral.error().code, KeeperCode::kNoChildrenForEphemerals);

  auto listed_missing = keeper_->children(path("missing"));
  ASSERT_FALSE(listed_missing);
  EXPECT_EQ(listed_missing.error().code, KeeperCode::kNoNode);
}

TEST_P(KeeperConformance, SequentialNamesComeFromTheParentsCounter) {
  ASSERT_TRUE(keeper_->create(path("log"), "", CreateMode::kPersistent));
  for (int i = 0; i < 3; ++i) {
    auto created = keeper_->create(path("log/log-"), "", CreateMode::kPersistentSequential);
    ASSERT_TRUE(created);
    EXPECT_EQ(*created, path(fmt::format("log/log-{:010d}", i)));
  }
  // A delete does not lower the counter; a plain create raises it too.
  ASSERT_TRUE(keeper_->remove(path("log/log-0000000002")));
  ASSERT_TRUE(keeper_->create(path("log/plain"), "", CreateMode::kPersistent));
  auto next = keeper_->create(path("log/log-"), "", CreateMode::kPersistentSequential);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, path("log/log-0000000004"));

  // Four creates, one delete: counter 5, numChildren 4, reported cversion 5 * 2 - 4.
  auto stat = keeper_->exists(path("log"));
  ASSERT_TRUE(stat && *stat);
  EXPECT_EQ((*stat)->num_children, 4);
  EXPECT_EQ((*stat)->cversion, 6);
  EXPECT_EQ(SequentialCounter::fromStat(**stat).counter(), 5);
  EXPECT_EQ(SequentialCounter::fromStat(**stat).maxIndex(), 4);

  auto listed = keeper_->children(path("log"));
  ASSERT_TRUE(listed);
  std::sort(listed->names.begin(), listed->names.end());
  EXPECT_EQ(listed->names, (std::vector<std::string>{"log-0000000000", "log-0000000001",
                                                     "log-0000000004", "plain"}));
  EXPECT_EQ(listed->stat.num_children, 4);
}

TEST_P(KeeperConformance, EphemeralNodesLiveAndDieWithTheirSession) {
  auto other = env_->connect();
  ASSERT_TRUE(other->create(path("lock-"), "", CreateMode::kEphemeralSequential));
  auto owned = keeper_->children(root_);
  ASSERT_TRUE(owned);
  ASSERT_EQ(owned->names.size(), 1u);
  auto stat = keeper_->exists(path(owned->names[0]));
  ASSERT_TRUE(stat && *stat);
  EXPECT_EQ((*stat)->ephemeral_owner, other->sessionId());
  EXPECT_NE(other->sessionId(), keeper_->sessionId());

  other.reset();  // closes the session
  EXPECT_TRUE(waitFor([&] { return keeper_->children(root_)->names.empty(); }));
}

TEST_P(KeeperConformance, MultiIsAtomicAndNamesTheFailedOp) {
  ASSERT_TRUE(keeper_->create(path("v"), "", CreateMode::kPersistent));
  auto failed = keeper_->multi({
      op::Create{path("x"), "", CreateMode::kPersistent},
      op::Create{path("seq-"), "", CreateMode::kPersistentSequential},
      op::Set{path("v"), "new", 7},
      op::Create{path("y"), "", CreateMode::kPersistent},
  });
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, KeeperCode::kBadVersion);
  ASSERT_TRUE(failed.error().failed_op_index.has_value());
  EXPECT_EQ(*failed.error().failed_op_index, 2u);
  EXPECT_EQ(failed.error().path, path("v"));
  EXPECT_FALSE(keeper_->exists(path("x"))->has_value());
  EXPECT_EQ(keeper_->children(root_)->names, std::vector<std::string>{"v"});
  // Nothing of the failed multi stayed, not even the counter bump of its sequential create.
  auto counter = SequentialCounter::fromStat(**keeper_->exists(root_));
  EXPECT_EQ(counter.counter(), 1);

  auto applied = keeper_->multi({
      op::Create{path("seq-"), "a", CreateMode::kPersistentSequential},
      op::Set{path("v"), "new", 0},
      op::Check{path("v"), 1},
      op::Remove{path("seq-0000000001"), -1},
  });
  ASSERT_TRUE(applied) << applied.error().toString();
  ASSERT_EQ(applied->size(), 4u);
  EXPECT_EQ((*applied)[0].path_created, path("seq-0000000001"));
  EXPECT_EQ((*applied)[1].stat.version, 1);
  EXPECT_FALSE(keeper_->exists(path("seq-0000000001"))->has_value());

  // One transaction, one zxid.
  auto v = keeper_->exists(path("v"));
  EXPECT_EQ((*v)->mzxid, (*keeper_->exists(root_))->pzxid);
}

TEST_P(KeeperConformance, CheckNotExistsGuardsABlockNumberAllocation) {
  // The insert path's first multi (DESIGN.md 2.3): dedup check + block number in one request.
  ASSERT_TRUE(createAncestorsAndSelf(*keeper_, path("deduplication_hashes")));
  ASSERT_TRUE(createAncestorsAndSelf(*keeper_, path("block_numbers/202612")));
  const std::string dedup = path("deduplication_hashes/202612_1_2");
  const std::vector<Op> allocate = {
      op::CheckNotExists{dedup},
      op::Create{path("block_numbers/202612/block-"), "", CreateMode::kEphemeralSequential},
  };
  auto first = keeper_->multi(allocate);
  ASSERT_TRUE(first) << first.error().toString();
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].path_created, "");
  EXPECT_EQ((*first)[1].path_created, path("block_numbers/202612/block-0000000000"));
  EXPECT_FALSE(keeper_->exists(dedup)->has_value());
  // The emulation is a real create + delete: the dedup parent's counter moved by one.
  EXPECT_EQ(SequentialCounter::fromStat(**keeper_->exists(path("deduplication_hashes"))).counter(),
            1);

  ASSERT_TRUE(keeper_->create(dedup, "202612_0_0_0", CreateMode::kPersistent));
  auto duplicate = keeper_->multi(allocate);
  ASSERT_FALSE(duplicate);
  EXPECT_EQ(duplicate.error().code, KeeperCode::kNodeExists);
  EXPECT_EQ(duplicate.error().failed_op_index, std::optional<std::size_t>(0));
  EXPECT_EQ(duplicate.error().path, dedup);
  EXPECT_EQ(keeper_->children(path("block_numbers/202612"))->names.size(), 1u);

  // The op index maps back to the caller's numbering past an expanded check.
  auto later = keeper_->multi({
      op::CheckNotExists{path("deduplication_hashes/other")},
      op::Create{path("block_numbers/202612/block-"), "", CreateMode::kEphemeralSequential},
      op::Check{path("nowhere")},
  });
  ASSERT_FALSE(later);
  EXPECT_EQ(later.error().code, KeeperCode::kNoNode);
  EXPECT_EQ(later.error().failed_op_index, std::optional<std::size_t>(2));
}

TEST_P(KeeperConformance, WatchesFireOnceForTheirEvent) {
  ASSERT_TRUE(keeper_->create(path("w"), "", CreateMode::kPersistent));
  auto writer = env_->connect();

  EventLog data_events;
  ASSERT_TRUE(keeper_->get(path("w"), data_events.callback()));
  ASSERT_TRUE(writer->set(path("w"), "1"));
  ASSERT_TRUE(waitFor([&] { return data_events.size() == 1; }));
  EXPECT_EQ(data_events.events()[0].type, WatchEvent::Type::kChanged);
  EXPECT_EQ(data_events.events()[0].path, path("w"));
  ASSERT_TRUE(writer->set(path("w"), "2"));  // one-shot: no second event

  EventLog child_events;
  ASSERT_TRUE(keeper_->children(path("w"), child_events.callback()));
  ASSERT_TRUE(writer->create(path("w/c"), "", CreateMode::kPersistent));
  ASSERT_TRUE(waitFor([&] { return child_events.size() == 1; }));
  EXPECT_EQ(child_events.events()[0].type, WatchEvent::Type::kChild);

  EventLog creation_events;
  auto absent = keeper_->exists(path("later"), creation_events.callback());
  ASSERT_TRUE(absent);
  EXPECT_FALSE(absent->has_value());
  ASSERT_TRUE(writer->create(path("later"), "", CreateMode::kPersistent));
  ASSERT_TRUE(waitFor([&] { return creation_events.size() == 1; }));
  EXPECT_EQ(creation_events.events()[0].type, WatchEvent::Type::kCreated);

  EventLog deletion_events;
  ASSERT_TRUE(keeper_->exists(path("later"), deletion_events.callback()));
  ASSERT_TRUE(writer->remove(path("later")));
  ASSERT_TRUE(waitFor([&] { return deletion_events.size() == 1; }));
  EXPECT_EQ(deletion_events.events()[0].type, WatchEvent::Type::kDeleted);

  // A get on a missing node fails and sets no watch.
  EventLog none;
  ASSERT_FALSE(keeper_->get(path("never"), none.callback()));
  ASSERT_TRUE(writer->create(path("never"), "", CreateMode::kPersistent));
  // A round trip on the watching session orders it after any event the server would have sent.
  ASSERT_TRUE(keeper_->exists(path("never")));
  EXPECT_EQ(data_events.size(), 1u);
  EXPECT_EQ(none.size(), 0u);
}

TEST_P(KeeperConformance, AnExpiredSessionIsDetectedAndReplaced) {
  ASSERT_TRUE(keeper_->create(path("mine"), "", CreateMode::kEphemeral));
  EventLog watch;
  ASSERT_TRUE(keeper_->exists(path("nothing-yet"), watch.callback()));
  auto observer = env_->connect();

  env_->expire(*keeper_);
  ASSERT_TRUE(waitFor([&] { return keeper_->expired(); }));
  auto refused = keeper_->get(root_);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, KeeperCode::kSessionExpired);
  EXPECT_TRUE(refused.error().isConnectionLevel());
  ASSERT_TRUE(waitFor([&] { return watch.size() == 1; }));
  EXPECT_EQ(watch.events()[0].type, WatchEvent::Type::kSessionExpired);
  EXPECT_TRUE(waitFor([&] { return !observer->exists(path("mine"))->has_value(); }));

  auto fresh = keeper_->startNewSession();
  ASSERT_TRUE(fresh) << fresh.error().toString();
  EXPECT_FALSE((*fresh)->expired());
  EXPECT_NE((*fresh)->sessionId(), keeper_->sessionId());
  EXPECT_TRUE((*fresh)->create(path("mine"), "", CreateMode::kEphemeral));
}

// Seed 002 on the real server: the counter raised to 2147483644 gives exactly four more names,
// then every create fails with "node exists" on log/log-.
TEST_P(KeeperConformance, TheLogCounterStallsAtInt32Max) {
  ASSERT_TRUE(keeper_->create(path("log"), "", CreateMode::kPersistent));
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(keeper_->create(path("log/log-"), "", CreateMode::kPersistentSequential));
  }
  keeper_.reset();
  env_->setSequentialCounter(path("log"), 2147483644);
  keeper_ = env_->connect();

  auto stat = keeper_->exists(path("log"));
  ASSERT_TRUE(stat && *stat);
  // The seed's figures: zkCli shows cversion = -18, numChildren = 10.
  EXPECT_EQ((*stat)->cversion, -18);
  EXPECT_EQ((*stat)->num_children, 10);
  auto before = SequentialCounter::read(*keeper_, path("log"), "log-");
  ASSERT_TRUE(before);
  EXPECT_EQ(before->counter(), 2147483644);
  EXPECT_EQ(before->createsLeft(), 4);
  EXPECT_EQ(before->maxIndex(), 2147483643);

  for (int64_t expected = 2147483644; expected <= 2147483647; ++expected) {
    auto created = keeper_->create(path("log/log-"), "", CreateMode::kPersistentSequential);
    ASSERT_TRUE(created) << created.error().toString();
    EXPECT_EQ(*created, path(fmt::format("log/log-{}", expected)));
  }
  auto fifth = keeper_->create(path("log/log-"), "", CreateMode::kPersistentSequential);
  ASSERT_FALSE(fifth);
  EXPECT_EQ(fifth.error().code, KeeperCode::kNodeExists);
  EXPECT_EQ(fifth.error().path, path("log/log-"));
  // The same in a multi, as ClickHouse's commit fails: op #0 names log/log-.
  auto commit = keeper_->multi({op::Create{path("log/log-"), "", CreateMode::kPersistentSequential},
                                op::Create{path("part"), "", CreateMode::kPersistent}});
  ASSERT_FALSE(commit);
  EXPECT_EQ(commit.error().code, KeeperCode::kNodeExists);
  EXPECT_EQ(commit.error().failed_op_index, std::optional<std::size_t>(0));

  auto after = keeper_->exists(path("log"));
  EXPECT_LT((*after)->cversion, 0);
  auto stuck = SequentialCounter::read(*keeper_, path("log"), "log-");
  ASSERT_TRUE(stuck);
  EXPECT_EQ(stuck->counter(), 2147483647);
  EXPECT_TRUE(stuck->exhausted());
  EXPECT_EQ(stuck->maxIndex(), 2147483647);
  EXPECT_EQ(stuck->createsLeft(), 0);
  EXPECT_EQ(stuck->headroomRatio(), 0.0);
  // Reads still work.
  EXPECT_EQ(keeper_->children(path("log"))->names.size(), 14u);
}

INSTANTIATE_TEST_SUITE_P(Servers, KeeperConformance, ::testing::Values("fake", "zookeeper"),
                         [](const auto& info) { return info.param; });

// Real-server behaviour the fake does not model: the server going away and coming back.
TEST(RealZooKeeper, RequestsFailAtConnectionLevelWhileTheServerIsDownAndTheSessionSurvives) {
  auto& env = realEnvironment();
  auto client = env.server().connect(std::chrono::seconds(10));
  ASSERT_TRUE(client);
  ASSERT_TRUE(createAncestorsAndSelf(**client, "/restart"));
  ASSERT_TRUE((*client)->create("/restart/eph", "", CreateMode::kEphemeral));
  const int64_t session = (*client)->sessionId();

  ASSERT_TRUE(env.server().stop());
  auto during = (*client)->get("/restart");
  ASSERT_FALSE(during);
  EXPECT_TRUE(during.error().isConnectionLevel()) << during.error().toString();
  EXPECT_FALSE(during.error().code == KeeperCode::kSessionExpired);
  // A pipelined read ends too, with a connection-level error for every path.
  auto many = (*client)->getMany({"/restart", "/restart/eph"});
  ASSERT_EQ(many.size(), 2u);
  for (const auto& result : many) {
    ASSERT_FALSE(result);
    EXPECT_TRUE(result.error().isConnectionLevel()) << result.error().toString();
  }

  auto restarted = env.server().restart();
  ASSERT_TRUE(restarted) << restarted.error();
  // The client reconnects with its session; the ephemeral node is still there.
  ASSERT_TRUE(waitFor([&] { return (*client)->exists("/restart/eph").has_value(); }));
  EXPECT_EQ((*client)->sessionId(), session);
  EXPECT_FALSE((*client)->expired());
  EXPECT_TRUE((*(*client)->exists("/restart/eph")).has_value());
}

// ZooKeeper answers a session's requests in order. A big pipelined read keeps only a window of
// requests outstanding, so another request of the same session (an insert's commit) waits behind
// that window, not behind the whole batch. Compared within the run: the other request's wait
// against the batch's whole time (with every read sent as fast as the client could, a request
// sent 200 ms into a batch of 30,000 reads waited 1.1 to 1.3 s of the batch's 1.3 to 1.7 s).
TEST(RealZooKeeper, AManyNodeReadLetsTheSessionsOtherRequestsThrough) {
  auto& env = realEnvironment();
  auto client = env.server().connect(std::chrono::seconds(10));
  ASSERT_TRUE(client);
  Keeper& keeper = **client;
  ASSERT_TRUE(createAncestorsAndSelf(keeper, "/many"));
  constexpr int kNodes = 30000;
  std::vector<std::string> paths;
  for (int i = 0; i < kNodes; ++i) paths.push_back(fmt::format("/many/id_{:05d}", i));
  for (int first = 0; first < kNodes; first += 1000) {
    std::vector<Op> creates;
    for (int i = first; i < first + 1000; ++i) creates.push_back(op::Create{paths[i], "x"});
    ASSERT_TRUE(keeper.multi(creates));
  }
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> reading{false};
  Clock::duration batch_took{};
  std::thread batch([&] {
    reading = true;
    const auto started = Clock::now();
    auto results = keeper.getMany(paths);
    batch_took = Clock::now() - started;
    EXPECT_EQ(results.size(), paths.size());
    for (const auto& result : results) EXPECT_TRUE(result);
  });
  // Long enough for the client to have sent much of the batch (it sends faster than the server
  // answers), well before the batch ends (about a second here).
  while (!reading) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto started = Clock::now();
  EXPECT_TRUE(keeper.get("/many"));
  const auto other_took = Clock::now() - started;
  batch.join();
  EXPECT_LT(other_took * 4, batch_took)
      << "the other request waited "
      << std::chrono::duration_cast<std::chrono::milliseconds>(other_took).count()
      << " ms, the batch of " << kNodes << " reads took "
      << std::chrono::duration_cast<std::chrono::milliseconds>(batch_took).count() << " ms";
}

// Digest ACLs (issue 23): a table's nodes are created for its own identity only; the shared
// parents above stay open so that other tables can create their subtrees beside it.
TEST(RealZooKeeper, ATablesNodesRefuseEveryoneWithoutItsCredential) {
  const ZooKeeperDigest a{"table-a", "secret-a", "/acl/tables/a"};
  const ZooKeeperDigest b{"table-b", "secret-b", "/acl/tables/b"};
  auto owner = connectAs({a});
  ASSERT_TRUE(owner);
  ASSERT_TRUE(createAncestorsAndSelf(*owner, "/acl/tables/a/log"));
  ASSERT_TRUE(owner->create("/acl/tables/a/log/log-", "entry", CreateMode::kPersistentSequential));
  ASSERT_TRUE(owner->multi({op::Create{"/acl/tables/a/blocks", "in a multi"}}));

  auto other = connectAs({b});
  auto anonymous = connectAs({});
  auto guessing = connectAs({{"table-a", "guess", "/acl/tables/a"}});
  ASSERT_TRUE(other && anonymous && guessing);
  ASSERT_TRUE(createAncestorsAndSelf(*other, "/acl/tables/b/log"));  // the parents are open
  for (Keeper* intruder : {other.get(), anonymous.get(), guessing.get()}) {
    for (const std::string path : {"/acl/tables/a", "/acl/tables/a/log", "/acl/tables/a/blocks"}) {
      SCOPED_TRACE(path);
      EXPECT_TRUE(refused(intruder->get(path)));
      EXPECT_TRUE(refused(intruder->children(path)));
      EXPECT_TRUE(refused(intruder->set(path, "rewritten")));
      EXPECT_TRUE(refused(intruder->create(path + "/planted", "", CreateMode::kPersistent)));
      EXPECT_TRUE(refused(intruder->multi({op::Create{path + "/planted", ""}})));
    }
    EXPECT_TRUE(refused(intruder->remove("/acl/tables/a/blocks")));
  }
  const auto error = anonymous->get("/acl/tables/a/log");
  ASSERT_FALSE(error);
  EXPECT_NE(error.error().toString().find("not authorized"), std::string::npos);

  // The owner's identity works from any session (a replica's next session, the operator).
  auto again = connectAs({a});
  ASSERT_TRUE(again);
  auto entries = again->children("/acl/tables/a/log");
  ASSERT_TRUE(entries);
  EXPECT_EQ(entries->names.size(), 1u);
  EXPECT_TRUE(again->set("/acl/tables/a/blocks", "changed"));
  EXPECT_TRUE(again->remove("/acl/tables/a/blocks"));
  // One session can hold several identities (the operator: every table it manages).
  auto both = connectAs({a, b});
  ASSERT_TRUE(both);
  EXPECT_TRUE(both->get("/acl/tables/a/log"));
  EXPECT_TRUE(both->get("/acl/tables/b/log"));
  EXPECT_EQ(digestAclId("table-a", "secret-a"), "table-a:MyAEt0jVsMDeKqS9NNipSU39cLg=");
}

TEST(RealZooKeeper, ASessionLearnsATablesCredentialAndLocksItsOldOpenNodes) {
  // A table made before ACLs: every node open.
  auto anonymous = connectAs();
  ASSERT_TRUE(anonymous);
  ASSERT_TRUE(createAncestorsAndSelf(*anonymous, "/migrate/tables/t/log"));
  ASSERT_TRUE(
      anonymous->create("/migrate/tables/t/log/log-", "entry", CreateMode::kPersistentSequential));
  ASSERT_TRUE(createAncestorsAndSelf(*anonymous, "/migrate/tables/t/replicas/r1/queue"));
  ASSERT_TRUE(createAncestorsAndSelf(*anonymous, "/migrate/tables/u/log"));

  // One session for many tables (the operator's): it learns the credential at run time.
  const ZooKeeperDigest t{"t", "secret-t", "/migrate/tables/t"};
  auto operator_session = connectAs();
  ASSERT_TRUE(operator_session);
  const auto unknown = operator_session->restrictSubtree(t.subtree);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, KeeperCode::kBadArguments);
  ASSERT_TRUE(operator_session->addDigest(t));
  ASSERT_TRUE(operator_session->addDigest(t));  // again: nothing changes
  // Nodes it creates in the subtree from now on are the table's alone.
  ASSERT_TRUE(operator_session->create("/migrate/tables/t/blocks", "", CreateMode::kPersistent));
  EXPECT_TRUE(refused(anonymous->get("/migrate/tables/t/blocks")));
  EXPECT_TRUE(anonymous->get("/migrate/tables/t/log"));  // still open until the migration

  auto changed = operator_session->restrictSubtree(t.subtree);
  ASSERT_TRUE(changed) << changed.error().toString();
  // t, log, its entry, replicas, r1, queue: blocks had the ACL already.
  EXPECT_EQ(*changed, 6u);
  for (const std::string path :
       {"/migrate/tables/t", "/migrate/tables/t/log", "/migrate/tables/t/log/log-0000000000",
        "/migrate/tables/t/replicas/r1/queue"}) {
    SCOPED_TRACE(path);
    EXPECT_TRUE(refused(anonymous->get(path)));
    EXPECT_TRUE(refused(anonymous->set(path, "x")));
    EXPECT_TRUE(refused(anonymous->create(path + "/planted", "", CreateMode::kPersistent)));
  }
  EXPECT_TRUE(anonymous->get("/migrate/tables/u/log"));  // another table is not touched
  EXPECT_TRUE(anonymous->get("/migrate/tables"));        // nor the shared parents
  auto again = operator_session->restrictSubtree(t.subtree);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, 0u);
  // The table's replicas, with the credential from their own sessions, keep working.
  auto replica = connectAs({t});
  ASSERT_TRUE(replica);
  EXPECT_TRUE(replica->children("/migrate/tables/t/log"));
  EXPECT_TRUE(
      replica->create("/migrate/tables/t/log/log-", "next", CreateMode::kPersistentSequential));
  // A session made by startNewSession keeps the identities learnt at run time.
  auto renewed = operator_session->startNewSession();
  ASSERT_TRUE(renewed);
  EXPECT_TRUE((*renewed)->get("/migrate/tables/t/log"));
}

// A password rotation (docs/security.md): while a table's identity carries its previous password
// too, new nodes name both and restrictSubtree gives both to the old ones, so replicas with
// either password keep access; once it carries the new one alone, the walk leaves the old
// password nothing.
TEST(RealZooKeeper, APasswordRotatesWithoutLockingOutEitherSide) {
  const std::string root = "/rotate/tables/t";
  const ZooKeeperDigest old_only{"t", "old-pw", root};
  ZooKeeperDigest rotating{"t", "new-pw", root};
  rotating.previous_password = "old-pw";
  const ZooKeeperDigest new_only{"t", "new-pw", root};

  auto old_replica = connectAs({old_only});
  ASSERT_TRUE(old_replica);
  ASSERT_TRUE(createAncestorsAndSelf(*old_replica, root + "/log"));
  ASSERT_TRUE(old_replica->create(root + "/log/log-", "a", CreateMode::kPersistentSequential));

  // Step 1: the operator's long-lived session learns both passwords; a rolled replica has both.
  auto operator_session = connectAs({old_only});
  ASSERT_TRUE(operator_session);
  ASSERT_TRUE(operator_session->addDigest(rotating));
  auto rolled = connectAs({rotating});
  ASSERT_TRUE(rolled);
  ASSERT_TRUE(rolled->create(root + "/log/log-", "b", CreateMode::kPersistentSequential));
  EXPECT_TRUE(old_replica->get(root + "/log/log-0000000001")) << "a node of a rolled replica";
  auto changed = operator_session->restrictSubtree(root);
  ASSERT_TRUE(changed) << changed.error().toString();
  EXPECT_EQ(*changed, 3u);  // t, log and the first entry named the old password alone
  auto new_replica = connectAs({new_only});
  ASSERT_TRUE(new_replica);
  for (const std::string& path : {root, root + "/log", root + "/log/log-0000000000"}) {
    EXPECT_TRUE(new_replica->get(path)) << path;
    EXPECT_TRUE(old_replica->get(path)) << path;
  }

  // Step 2: the new password alone.
  ASSERT_TRUE(operator_session->addDigest(new_only));
  ASSERT_TRUE(operator_session->create(root + "/blocks", "", CreateMode::kPersistent));
  EXPECT_TRUE(refused(old_replica->get(root + "/blocks")));
  changed = operator_session->restrictSubtree(root);
  ASSERT_TRUE(changed) << changed.error().toString();
  EXPECT_EQ(*changed, 4u);  // t, log and both entries
  for (const std::string& path : {root, root + "/log", root + "/log/log-0000000001"}) {
    EXPECT_TRUE(new_replica->get(path)) << path;
    EXPECT_TRUE(refused(old_replica->get(path))) << path;
  }
  auto again = operator_session->restrictSubtree(root);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, 0u);

  // Undone (the previous password put back): the session's policy follows, though it holds
  // that digest already.
  ASSERT_TRUE(operator_session->addDigest(rotating));
  changed = operator_session->restrictSubtree(root);
  ASSERT_TRUE(changed) << changed.error().toString();
  EXPECT_EQ(*changed, 5u);  // t, log, both entries and blocks
  EXPECT_TRUE(old_replica->get(root + "/blocks"));
}

// A cluster backup's operation covers tables A and B: the operator (holding both identities) makes
// it shared by their ids; replicas of A and B, each holding only its own identity, create their
// nodes below it with the same ACL (inherited); table C's replica and a session without identity
// may read it (a deleting replica looks for live backups on its destination) but change nothing.
TEST(RealZooKeeper, ABackupOperationIsWrittenByItsTablesOnlyAndReadByAll) {
  const ZooKeeperDigest a{"table-a", "secret-a", "/acl-backups/tables/a"};
  const ZooKeeperDigest b{"table-b", "secret-b", "/acl-backups/tables/b", "old-secret-b"};
  const ZooKeeperDigest c{"table-c", "secret-c", "/acl-backups/tables/c"};
  const std::string root = "/acl-backups/backups";
  const std::string operation = root + "/backup-u1";
  std::vector<std::string> ids = digestAclIds(a);
  for (const auto& id : digestAclIds(b)) ids.push_back(id);
  ASSERT_EQ(ids.size(), 3u);  // b's previous password too: its replicas may hold either

  auto initiator = connectAs({a, b}, {{operation, ids}}, {root});
  ASSERT_TRUE(initiator);
  ASSERT_TRUE(createAncestorsAndSelf(*initiator, root + "/destinations"));
  auto made =
      initiator->multi({op::Create{operation, "plan"}, op::Create{operation + "/stage", ""}});
  ASSERT_TRUE(made) << made.error().toString();

  auto replica_a = connectAs({a}, {}, {root});
  auto replica_b_old =
      connectAs({{"table-b", "old-secret-b", "/acl-backups/tables/b"}}, {}, {root});
  auto replica_c = connectAs({c}, {}, {root});
  auto anonymous = connectAs();
  ASSERT_TRUE(replica_a && replica_b_old && replica_c && anonymous);
  for (auto* replica : {replica_a.get(), replica_b_old.get()}) {
    const std::string node = fmt::format("{}/stage/alive|{}", operation, replica->sessionId());
    auto created = replica->create(node, "", CreateMode::kEphemeral);
    ASSERT_TRUE(created) << created.error().toString();
    EXPECT_TRUE(replica->set(operation + "/stage", "moved"));
    EXPECT_TRUE(replica->multi({op::Create{operation + "/stage/current|x", ""},
                                op::Remove{operation + "/stage/current|x"}}));
  }
  const std::string a_node = fmt::format("{}/stage/alive|{}", operation, replica_a->sessionId());
  for (Keeper* outsider : {replica_c.get(), anonymous.get()}) {
    // Read: the plan and who is alive.
    EXPECT_TRUE(outsider->get(operation));
    auto stage = outsider->children(operation + "/stage");
    ASSERT_TRUE(stage);
    EXPECT_EQ(stage->names.size(), 2u);
    // Not changed: the inherited node refuses as the operation does.
    for (const std::string& path : {operation, operation + "/stage", a_node}) {
      SCOPED_TRACE(path);
      EXPECT_TRUE(refused(outsider->set(path, "rewritten")));
      EXPECT_TRUE(refused(outsider->create(path + "/planted", "", CreateMode::kPersistent)));
    }
    EXPECT_TRUE(refused(outsider->remove(a_node)));
  }
  // The inheritance is from the operation (one level below the root), not a fixed policy: a
  // node below an open child of the root stays open.
  ASSERT_TRUE(replica_a->create(root + "/destinations/k", "", CreateMode::kEphemeral));
  EXPECT_TRUE(anonymous->set(root + "/destinations/k", "anyone"));
  // A create below an operation that is gone fails as any create under a missing parent does.
  auto orphan = replica_a->create(root + "/backup-gone/stage", "", CreateMode::kPersistent);
  ASSERT_FALSE(orphan);
  EXPECT_EQ(orphan.error().code, KeeperCode::kNoNode);
  // The initiator cleans up the whole operation.
  replica_a.reset();
  replica_b_old.reset();
  EXPECT_TRUE(removeRecursive(*initiator, operation));
}

TEST(RealZooKeeper, ConnectingToNothingFailsWithinTheTimeout) {
  auto port = common::testing::findFreeLoopbackPort();
  ASSERT_TRUE(port);
  const auto started = std::chrono::steady_clock::now();
  auto client = ZooKeeperClient::connect(ZooKeeperConfig{
      fmt::format("127.0.0.1:{}", *port), std::chrono::seconds(4), std::chrono::milliseconds(500)});
  ASSERT_FALSE(client);
  EXPECT_EQ(client.error().code, KeeperCode::kConnectionLoss);
  EXPECT_NE(client.error().detail.find("127.0.0.1"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

}  // namespace
}  // namespace rtable::core
