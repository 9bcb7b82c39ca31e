#include "rtable/replication_core/async_insert.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "rtable/common/testing/wait.h"

namespace rtable::core {
namespace {

using namespace std::chrono_literals;

// The queue with a commit of the test's own: it records each batch and answers every piece as
// committed (or as the test says). Time-based flushes are checked by what happened, not by when.
class AsyncInsertQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto schema = TableSchema::create({{"x", *DataType::parse("UInt64")}}, PartitionKey{}, {});
    ASSERT_TRUE(schema) << schema.error();
    schema_ = *schema;
  }

  void start(AsyncInsertSettings settings) {
    queue_ = std::make_unique<AsyncInsertQueue>(
        settings,
        [this](std::vector<InsertPiece> pieces, const InsertOptions&) {
          std::unique_lock lock(mu_);
          ++commits_entered_;
          gate_cv_.notify_all();
          gate_cv_.wait(lock, [this] { return open_gate_; });
          std::vector<std::string> ids;
          std::vector<PieceOutcome> outcomes;
          for (const auto& piece : pieces) {
            ids.push_back(piece.dedup_id);
            PieceOutcome outcome;
            outcome.part = fmt::format("all_{}_{}_0", batches_.size(), batches_.size());
            if (duplicates_.contains(piece.dedup_id)) outcome.duplicate = true;
            if (failing_.contains(piece.dedup_id))
              outcome.error = InsertError{InsertError::Kind::kUnavailable, "no ZooKeeper"};
            outcomes.push_back(outcome);
          }
          batches_.push_back(ids);
          return outcomes;
        },
        *metrics_);
  }

  // An insert of `rows` rows (values of 8 bytes each) identified by `id`.
  std::vector<InsertPiece> piece(const std::string& id, std::size_t rows = 1) {
    Block block = schema_.emptyBlock();
    for (std::size_t i = 0; i < rows; ++i)
      std::get<std::vector<uint64_t>>(block.columns[0].values).push_back(i);
    std::vector<InsertPiece> pieces;
    pieces.push_back(InsertPiece{"all", std::move(block), id});
    return pieces;
  }

  std::shared_ptr<AsyncInsertTicket> enqueue(const std::string& id, std::size_t rows = 1,
                                             std::shared_ptr<void> hold = nullptr) {
    auto ticket = queue_->enqueue(piece(id, rows), InsertOptions{}, std::move(hold));
    EXPECT_TRUE(ticket) << ticket.error().message;
    return ticket ? *ticket : nullptr;
  }

  std::vector<std::vector<std::string>> batches() {
    std::lock_guard lock(mu_);
    return batches_;
  }
  void setGate(bool open) {
    {
      std::lock_guard lock(mu_);
      open_gate_ = open;
    }
    gate_cv_.notify_all();
  }
  // Waits until `n` commits have begun (a closed gate holds them there).
  void awaitCommits(int n) {
    std::unique_lock lock(mu_);
    gate_cv_.wait(lock, [&] { return commits_entered_ >= n; });
  }
  std::string metricsText() { return prometheus::TextSerializer().Serialize(registry_.Collect()); }

  TableSchema schema_;
  prometheus::Registry registry_;
  std::unique_ptr<metrics::ReplicaMetrics> metrics_ =
      std::make_unique<metrics::ReplicaMetrics>(registry_, metrics::ReplicaLabels{"t", "r1", 1});
  std::mutex mu_;
  std::condition_variable gate_cv_;
  bool open_gate_ = true;
  int commits_entered_ = 0;
  std::vector<std::vector<std::string>> batches_;
  std::set<std::string> duplicates_;
  std::set<std::string> failing_;
  std::unique_ptr<AsyncInsertQueue> queue_;
};

AsyncInsertSettings neverByTime() {
  AsyncInsertSettings settings;
  settings.busy_timeout = std::chrono::hours(1);
  settings.stale_timeout = 0ms;
  return settings;
}

TEST_F(AsyncInsertQueueTest, InsertsUpToTheQueryNumberAreCommittedTogether) {
  AsyncInsertSettings settings = neverByTime();
  settings.max_query_number = 3;
  start(settings);
  auto a = enqueue("a");
  auto b = enqueue("b");
  EXPECT_FALSE(a->done());  // neither the count nor any time has come
  auto c = enqueue("c");
  const auto& outcome = c->wait();
  ASSERT_TRUE(outcome.result) << outcome.result.error().message;
  EXPECT_EQ(outcome.inserts_in_flush, 3u);
  EXPECT_EQ(outcome.reason, FlushReason::kCount);
  EXPECT_EQ(outcome.result->rows, 1u);
  EXPECT_EQ(outcome.result->parts, std::vector<std::string>{"all_0_0_0"});
  ASSERT_TRUE(a->wait().result);
  EXPECT_EQ(batches(), (std::vector<std::vector<std::string>>{{"a", "b", "c"}}));
  EXPECT_NE(
      metricsText().find("rtable_async_insert_flushes_total{generation=\"1\",reason=\"count\""),
      std::string::npos);
}

TEST_F(AsyncInsertQueueTest, ABatchNeverHoldsMoreThanTheDataSize) {
  AsyncInsertSettings settings = neverByTime();
  settings.max_data_size = 8 * 10;  // ten rows of one UInt64
  start(settings);
  auto a = enqueue("a", 6);
  auto b = enqueue("b", 6);  // would make 96 bytes: the batch of a goes first, alone
  const auto& first = a->wait();
  EXPECT_EQ(first.reason, FlushReason::kSize);
  EXPECT_EQ(first.inserts_in_flush, 1u);
  auto c = enqueue("c", 4);  // 80 bytes with b: full, flushed at once
  EXPECT_EQ(c->wait().reason, FlushReason::kSize);
  EXPECT_EQ(batches(), (std::vector<std::vector<std::string>>{{"a"}, {"b", "c"}}));
}

TEST_F(AsyncInsertQueueTest, ABurstIsFlushedOnceNoInsertCameForTheStaleTimeout) {
  AsyncInsertSettings settings = neverByTime();
  settings.stale_timeout = 20ms;
  start(settings);
  auto a = enqueue("a");
  auto b = enqueue("b");
  EXPECT_EQ(a->wait().reason, FlushReason::kStale);
  EXPECT_EQ(batches(), (std::vector<std::vector<std::string>>{{"a", "b"}}));
}

// The stale timeout is long here, so that a flush by it or before it tells which rule acted.
AsyncInsertSettings staleAfterOneSecond() {
  AsyncInsertSettings settings = neverByTime();
  settings.stale_timeout = 1s;
  return settings;
}

TEST_F(AsyncInsertQueueTest, ABurstAsLargeAsTheLastOneIsFlushedWithoutWaitingForTheStaleTimeout) {
  start(staleAfterOneSecond());
  auto a = enqueue("a");
  auto b = enqueue("b");
  auto c = enqueue("c");
  EXPECT_EQ(a->wait().reason, FlushReason::kStale);  // the first burst: its size is not known
  // The same clients come back: once the third is in, nobody else is expected.
  auto d = enqueue("d");
  auto e = enqueue("e");
  EXPECT_FALSE(d->done());
  auto f = enqueue("f");
  const auto& outcome = d->wait();
  EXPECT_EQ(outcome.reason, FlushReason::kBurst);
  EXPECT_EQ(outcome.inserts_in_flush, 3u);
  EXPECT_EQ(batches(), (std::vector<std::vector<std::string>>{{"a", "b", "c"}, {"d", "e", "f"}}));
  EXPECT_NE(
      metricsText().find("rtable_async_insert_flushes_total{generation=\"1\",reason=\"burst\""),
      std::string::npos);
}

TEST_F(AsyncInsertQueueTest, ABurstGoesOnGatheringWhileAFlushRuns) {
  start(staleAfterOneSecond());
  enqueue("a");
  enqueue("b")->wait();  // a burst of two, ended by the stale timeout
  setGate(false);
  auto c = enqueue("c");
  enqueue("d");  // a whole burst: flushed, and its commit held
  awaitCommits(2);
  // Two more are as many as a burst, but the flusher is busy: they wait for it with the next.
  auto e = enqueue("e");
  auto f = enqueue("f");
  auto g = enqueue("g");
  setGate(true);
  EXPECT_EQ(c->wait().reason, FlushReason::kBurst);
  const auto& outcome = e->wait();
  EXPECT_EQ(outcome.reason, FlushReason::kBurst);  // due at once when the flusher came back
  EXPECT_EQ(batches(),
            (std::vector<std::vector<std::string>>{{"a", "b"}, {"c", "d"}, {"e", "f", "g"}}));
}

TEST_F(AsyncInsertQueueTest, ABurstSizeIsForgottenTwoSecondsAfterTheLastStaleFlush) {
  AsyncInsertSettings settings = neverByTime();
  settings.stale_timeout = 200ms;
  start(settings);
  enqueue("a")->wait();  // a burst of one
  std::this_thread::sleep_for(2100ms);
  auto b = enqueue("b");
  EXPECT_EQ(b->wait().reason, FlushReason::kStale);
}

TEST_F(AsyncInsertQueueTest, TheOldestInsertWaitsNoLongerThanTheBusyTimeout) {
  AsyncInsertSettings settings;
  settings.busy_timeout = 30ms;
  settings.stale_timeout = 0ms;
  start(settings);
  auto a = enqueue("a");
  EXPECT_EQ(a->wait().reason, FlushReason::kTimeout);
}

TEST_F(AsyncInsertQueueTest, EachInsertLearnsItsOwnOutcome) {
  AsyncInsertSettings settings = neverByTime();
  settings.max_query_number = 3;
  start(settings);
  duplicates_ = {"dup"};
  failing_ = {"bad"};
  auto fresh = enqueue("fresh", 2);
  auto dup = enqueue("dup", 2);
  auto bad = enqueue("bad", 2);
  const auto& f = fresh->wait();
  ASSERT_TRUE(f.result);
  EXPECT_EQ(f.result->rows, 2u);
  EXPECT_EQ(f.result->deduplicated_blocks, 0u);
  const auto& d = dup->wait();
  ASSERT_TRUE(d.result);
  EXPECT_EQ(d.result->rows, 0u);
  EXPECT_EQ(d.result->deduplicated_blocks, 1u);
  const auto& b = bad->wait();
  ASSERT_FALSE(b.result);
  EXPECT_EQ(b.result.error().kind, InsertError::Kind::kUnavailable);
}

TEST_F(AsyncInsertQueueTest, AFullBufferRefusesInsertsUntilAFlushFreesIt) {
  AsyncInsertSettings settings = neverByTime();
  settings.max_query_number = 1;  // each insert is flushed at once...
  settings.max_data_size = 80;
  settings.max_buffered_bytes = 160;
  start(settings);
  setGate(false);  // ...but its commit does not return
  auto a = enqueue("a", 10);
  auto b = enqueue("b", 10);
  auto refused = queue_->enqueue(piece("c", 1), InsertOptions{}, nullptr);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, InsertError::Kind::kOverloaded);
  EXPECT_NE(refused.error().message.find("maxBufferedBytes"), std::string::npos);
  EXPECT_NE(metricsText().find("rtable_async_insert_buffered_bytes{generation=\"1\",replica=\"r1\","
                               "table=\"t\"} 160"),
            std::string::npos)
      << metricsText();
  setGate(true);
  ASSERT_TRUE(a->wait().result);
  ASSERT_TRUE(b->wait().result);
  EXPECT_TRUE(common::testing::waitFor([&] { return queue_->bufferedInserts() == 0; }, 10s));
  EXPECT_TRUE(queue_->enqueue(piece("c", 1), InsertOptions{}, nullptr));
}

TEST_F(AsyncInsertQueueTest, StopCommitsWhatIsBufferedAndRefusesMore) {
  start(neverByTime());
  auto hold = std::make_shared<int>(1);
  std::weak_ptr<int> held = hold;
  auto a = enqueue("a", 1, std::move(hold));
  EXPECT_FALSE(held.expired());  // kept while the rows are only buffered
  queue_->stop();
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->wait().reason, FlushReason::kForced);
  EXPECT_TRUE(held.expired());
  auto refused = queue_->enqueue(piece("b"), InsertOptions{}, nullptr);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, InsertError::Kind::kUnavailable);
}

TEST_F(AsyncInsertQueueTest, FlushNowCommitsWithoutWaitingForSizeOrAge) {
  start(neverByTime());
  auto a = enqueue("a");
  queue_->flushNow();
  EXPECT_EQ(a->wait().reason, FlushReason::kForced);
}

TEST_F(AsyncInsertQueueTest, InsertsOfOtherQuorumSettingsAreNotBatchedTogether) {
  AsyncInsertSettings settings = neverByTime();
  settings.max_query_number = 2;
  start(settings);
  InsertOptions quorum;
  quorum.quorum = 2;
  auto a = queue_->enqueue(piece("a"), InsertOptions{}, nullptr);
  auto b = queue_->enqueue(piece("b"), quorum, nullptr);
  auto c = queue_->enqueue(piece("c"), InsertOptions{}, nullptr);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ((*a)->wait().inserts_in_flush, 2u);
  queue_->stop();
  EXPECT_EQ(batches(), (std::vector<std::vector<std::string>>{{"a", "c"}, {"b"}}));
}

}  // namespace
}  // namespace rtable::core
