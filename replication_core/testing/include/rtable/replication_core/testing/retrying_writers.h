// Clients that insert the way the docs ask a client to (docs/runbook-table-swap.md): every block
// carries its own insert_deduplication_token, and a block that failed, timed out or met a 503 is
// sent again, with the same token, to the next replica in turn until one acknowledges it. A block
// that timed out may have landed, so none is given up: what the replicas hold in the end is
// exactly the acknowledged rows, each once, or the table lost or doubled one.
//
// Thread safety: start, stop and the accessors from one thread; the writers are its own threads.
// Lifetime: the destructor stops the writers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rtable/common/testing/subprocess.h"

namespace rtable::core::testing {

// A replica's HTTP API.
struct ReplicaEndpoint {
  std::string host;
  int port = 0;
  // Sent with every request, each line ending in "\r\n" (e.g. the API's bearer token).
  std::string headers = {};
};

struct RetryingWritersOptions {
  std::vector<ReplicaEndpoint> replicas;
  // One JSONEachRow line (with its "\n") of the row with this id; ids are unique and ascending.
  std::function<std::string(uint64_t id)> row;
  uint64_t first_id = 1;
  // Writer w sends blocks of block_sizes[w % size] rows: single rows and batches.
  std::vector<std::size_t> block_sizes = {1, 5};
  int writers = 3;
  std::chrono::milliseconds request_timeout{5000};
  // Pause between a writer's acknowledged block and its next: a steady stream, not a flood.
  std::chrono::milliseconds pause_between_blocks{0};
  // Pause after a failed attempt (a 503 says Retry-After: 1; the next replica may answer sooner).
  std::chrono::milliseconds retry_pause{100};
  // Appended to every insert's query string (e.g. "&async_insert=1").
  std::string insert_settings;
  // Every n-th acknowledged block is sent once more, with its token, to the next replica, as by a
  // client whose answer was lost: the answer must say 0 rows (deduplicated). 0: none.
  std::size_t resend_every = 0;
};

class RetryingWriters {
 public:
  explicit RetryingWriters(RetryingWritersOptions options);
  ~RetryingWriters();
  RetryingWriters(const RetryingWriters&) = delete;
  RetryingWriters& operator=(const RetryingWriters&) = delete;

  void start();
  // Each writer finishes the block in flight (retrying it until acknowledged, at most `timeout`
  // in all), then ends. False when a block was still unacknowledged at the deadline.
  bool stop(std::chrono::milliseconds timeout = std::chrono::seconds(120));

  std::set<uint64_t> acknowledged() const;
  std::size_t acknowledgedBlocks() const;
  // The `error` of every non-200 JSON answer met (LOG_COUNTER_EXHAUSTED, TABLE_SWAP_IN_PROGRESS,
  // ...), and "timeout" or "connection" for attempts with no answer.
  std::set<std::string> errorCodes() const;
  std::size_t retries() const;
  // Blocks sent again after their acknowledgement (resend_every), and those of them whose
  // answer said rows were added: a doubled insert.
  std::size_t resent() const;
  std::size_t resentAndAdded() const;

 private:
  void write(int writer);
  // The acknowledgement's "rows", or nothing when given up.
  std::optional<uint64_t> insertUntilAcknowledged(std::size_t& next_replica,
                                                  const std::string& token,
                                                  const std::string& body);

  RetryingWritersOptions options_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> given_up_{false};
  std::chrono::steady_clock::time_point stop_deadline_;  // set before stopping_
  std::atomic<uint64_t> next_id_{1};
  std::atomic<std::size_t> retries_{0};
  std::atomic<std::size_t> resent_{0};
  std::atomic<std::size_t> resent_and_added_{0};
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::set<uint64_t> acknowledged_;      // guarded by mu_
  std::size_t acknowledged_blocks_ = 0;  // guarded by mu_
  std::set<std::string> codes_;          // guarded by mu_
};

// Row `id` of the tests' table keyed by id (columns id UInt64, d Date, user String; partitioned by
// toYYYYMM(d)) as one JSONEachRow line with its "\n": ids spread over three monthly partitions.
std::string idRow(uint64_t id);

// The first column of each line of a TSV answer (GET /select?format=TSV), as unsigned ids: a
// multiset, so that a row held twice shows.
std::multiset<uint64_t> firstColumnIds(std::string_view tsv);

// Whether the replica of a table keyed by id (idRow's), once it has run its queue (/sync), serves
// `generation` and holds exactly the rows `expected`, each once: its /count and the ids of its
// /select. The error says what differs.
common::testing::TestStatus checkReplicaHolds(const ReplicaEndpoint& replica, int generation,
                                              const std::multiset<uint64_t>& expected);

}  // namespace rtable::core::testing
