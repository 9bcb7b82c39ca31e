// Async inserts (async_insert=1, ClickHouse's AsynchronousInsertQueue): the rows of many small
// inserts of one table are gathered in memory and committed together, one part and one log entry
// per partition, so that a thousand clients writing a row each spend the table's int32 log
// counter (seed 002) like one client writing a thousand rows.
//
// Each insert keeps its own dedup id per partition (the id a synchronous insert of the same rows
// would have: a content hash, or its insert_deduplication_token), and the commit creates every id
// in the same multi (InsertCommit::commitPieces): a retried insert is deduplicated whether its
// first try went synchronously, in another batch or to another replica; a duplicate is answered
// as one and left out of the part. Rows are parsed before they are queued, so a bad insert fails
// alone (400) and never reaches a batch.
//
// A batch is flushed when it holds max_data_size bytes of values or max_query_number inserts,
// when its oldest insert has waited busy_timeout, when no insert came for stale_timeout (a burst
// is over), or when asked (shutdown, a table swap's pause). With the stale timeout on, a batch is
// also flushed as soon as it holds as many inserts as the largest burst that ended by the stale
// timeout in the last second or two, if no flush is running: clients that each wait for their
// answer before sending again (the usual client) come back as one burst of the same size, and
// waiting for the stale timeout after the last of them has arrived only adds latency. Only
// stale-ended bursts set that size, so a steady stream (flushed by count or age) is not cut
// into smaller batches, and the size is forgotten two seconds after the last such burst. With wait
// (wait_for_async_insert=1, the default) the client is answered once its rows are committed and
// durable; without, at once: a crash or a failed commit then loses rows the client was told were
// queued. Inserts with different quorum settings go to different batches. Past max_buffered_bytes
// (buffered and being flushed) an insert is refused (kOverloaded: 503 with Retry-After), so memory
// stays bounded.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/insert_commit.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::core {

// Why a batch was flushed (the metric's reason label); kForced: flushNow or stop (a table swap's
// pause, shutdown).
// kBurst: as many inserts as the recent stale-ended bursts held (see above).
enum class FlushReason { kSize, kCount, kTimeout, kStale, kBurst, kForced };
std::string flushReasonName(FlushReason reason);

// One queued insert's outcome, for the client that waits for it.
class AsyncInsertTicket {
 public:
  struct Outcome {
    std::expected<InsertResult, InsertError> result;
    std::size_t inserts_in_flush = 0;  // inserts committed by the same flush
    FlushReason reason = FlushReason::kTimeout;
  };
  // Blocks until the insert's batch was committed (or failed).
  const Outcome& wait();
  bool done() const;

 private:
  friend class AsyncInsertQueue;
  void deliver(Outcome outcome);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Outcome> outcome_;
};

class AsyncInsertQueue {
 public:
  // Commits a batch: InsertCommit::commitPieces.
  using Commit =
      std::function<std::vector<PieceOutcome>(std::vector<InsertPiece>, const InsertOptions&)>;

  // `metrics` must outlive the queue. Starts the flusher thread.
  AsyncInsertQueue(AsyncInsertSettings settings, Commit commit, metrics::ReplicaMetrics& metrics);
  ~AsyncInsertQueue();  // stop()
  AsyncInsertQueue(const AsyncInsertQueue&) = delete;
  AsyncInsertQueue& operator=(const AsyncInsertQueue&) = delete;

  const AsyncInsertSettings& settings() const { return settings_; }

  // Queues one insert's pieces (PendingInsert::takePieces). `hold` is kept until the insert's
  // batch is committed (the table swap's insert lease: its pause waits for buffered rows).
  // kOverloaded when the buffer is full, kUnavailable once stop() began.
  std::expected<std::shared_ptr<AsyncInsertTicket>, InsertError> enqueue(
      std::vector<InsertPiece> pieces, const InsertOptions& options, std::shared_ptr<void> hold);

  // Flushes every batch buffered now without waiting for its size or age (a table swap's pause);
  // returns at once.
  void flushNow();
  // Flushes everything buffered, waits until it is committed, then refuses new inserts.
  // Idempotent.
  void stop();

  std::size_t bufferedInserts() const;

 private:
  struct Entry {
    std::vector<InsertPiece> pieces;
    std::size_t bytes = 0;
    std::size_t rows = 0;
    std::chrono::steady_clock::time_point arrived;
    std::shared_ptr<AsyncInsertTicket> ticket;
    std::shared_ptr<void> hold;
  };
  struct Batch {
    InsertOptions options;
    std::vector<Entry> entries;
    std::size_t bytes = 0;
    std::chrono::steady_clock::time_point first;
    std::chrono::steady_clock::time_point last;
  };
  struct Sealed {
    Batch batch;
    FlushReason reason;
  };
  // The largest stale-ended burst of one batch key in the current and the previous second.
  struct Bursts {
    std::chrono::steady_clock::time_point since;
    std::size_t current = 0;
    std::size_t previous = 0;
  };
  // The inserts a burst of `key` is expected to hold, 0 when none ended lately (mu_ held).
  std::size_t expectedBurst(const std::string& key, std::chrono::steady_clock::time_point now);
  void noteBurst(const std::string& key, std::size_t inserts,
                 std::chrono::steady_clock::time_point now);
  // Whether the open batch of `key` holds a whole burst and the flusher is free (mu_ held).
  bool burstComplete(const std::string& key, const Batch& batch,
                     std::chrono::steady_clock::time_point now);
  // Moves the batch of `key` to sealed_ (mu_ held).
  void seal(const std::string& key, FlushReason reason);
  // Seals the batches that are due; the earliest time another one will be (mu_ held).
  std::optional<std::chrono::steady_clock::time_point> sealDue(
      std::chrono::steady_clock::time_point now);
  void flusherLoop();
  void flush(Sealed sealed);
  void updateGauges();  // mu_ held

  const AsyncInsertSettings settings_;
  const Commit commit_;
  metrics::ReplicaMetrics& metrics_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable flushed_;
  std::map<std::string, Batch> open_;  // by quorum settings
  std::deque<Sealed> sealed_;
  std::size_t buffered_bytes_ = 0;    // open, sealed and flushing
  std::size_t buffered_inserts_ = 0;  // the same
  std::map<std::string, Bursts> bursts_;
  bool flushing_ = false;
  bool flush_all_ = false;
  bool stopping_ = false;
  std::thread flusher_;
};

}  // namespace rtable::core
