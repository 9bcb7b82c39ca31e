// One replica of a table across its generations (DESIGN.md 2.6): the generation it serves (the one
// <root>/active names) and, while a table swap runs, the next one open beside it. It follows the
// swap's plan in ZooKeeper (table_swap.h): opens the next generation, pauses inserts, drains,
// attaches (as the attacher), verifies, switches, cleans up or aborts, acknowledging each step.
// The HTTP API serves whatever serving() returns at the moment of each request.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "rtable/replication_core/table_replica.h"
#include "rtable/replication_core/table_swap.h"

namespace rtable::core {

class TableHost {
 public:
  // Opens the active generation (TableReplica::open with generation 0), catches up with a swap
  // in progress, and starts following the swap's plan. `options.generation` must be 0.
  static std::expected<std::unique_ptr<TableHost>, std::string> open(
      const TableSpec& spec, KeeperFactory keeper_factory, prometheus::Registry& registry,
      TableReplicaOptions options = {});
  ~TableHost();

  const TableSpec& spec() const { return spec_; }
  // The generation that takes inserts and answers reads now.
  std::shared_ptr<TableReplica> serving() const;
  // An open generation (part transfers name theirs), or null.
  std::shared_ptr<TableReplica> generation(int64_t generation) const;

  // An insert's admission: while a swap pauses inserts, the reason (answer 503 with Retry-After);
  // otherwise a lease on the serving generation that the pause waits out before acknowledging.
  class InsertLease {
   public:
    InsertLease(InsertLease&& other) noexcept
        : host_(std::exchange(other.host_, nullptr)), table_(std::move(other.table_)) {}
    InsertLease& operator=(InsertLease&&) = delete;
    ~InsertLease();
    TableReplica& table() const { return *table_; }
    std::shared_ptr<TableReplica> shared() const { return table_; }

   private:
    friend class TableHost;
    InsertLease(TableHost* host, std::shared_ptr<TableReplica> table)
        : host_(host), table_(std::move(table)) {}
    TableHost* host_;
    std::shared_ptr<TableReplica> table_;
  };
  std::expected<InsertLease, std::string> admitInsert();
  // Refuses inserts for a reason of the caller's (a restore not done yet: restore.h) until
  // called with nullopt; independent of a swap's pause.
  void setInsertRefusal(std::optional<std::string> reason);
  bool insertsRefused() const;

  // The swap step this replica acknowledged last ("" when no swap runs), for /replica.
  std::string swapState() const;

  // Runs the plan's current step now, in this thread (tests without the follower thread).
  std::expected<void, std::string> followForTest() { return follow(); }

  std::vector<std::string> handOff(std::chrono::milliseconds timeout);
  void shutdown();

 private:
  TableHost(TableSpec spec, KeeperFactory factory, prometheus::Registry& registry,
            TableReplicaOptions options);
  // One look at <root>/active and <root>/swap, and whatever they ask of this replica.
  std::expected<void, std::string> follow();
  std::expected<void, std::string> apply(Keeper& keeper, const SwapPlan& plan);
  std::expected<void, std::string> openNext(int64_t generation);
  // Waits until no insert holds a lease (inserts are refused meanwhile).
  void waitForInserts();
  std::expected<void, std::string> acknowledge(Keeper& keeper, const SwapPlan& plan,
                                               const std::string& outcome);
  std::expected<std::shared_ptr<Keeper>, std::string> keeper();
  void followLoop();

  const TableSpec spec_;
  const KeeperFactory factory_;
  prometheus::Registry& registry_;
  const TableReplicaOptions options_;

  mutable std::mutex mu_;
  std::condition_variable inserts_done_;
  std::map<int64_t, std::shared_ptr<TableReplica>> generations_;  // guarded by mu_
  int64_t serving_ = 0;                                           // guarded by mu_
  std::optional<std::string> paused_;   // guarded by mu_: why inserts are refused
  std::optional<std::string> refused_;  // guarded by mu_: setInsertRefusal's reason
  std::size_t inserts_in_flight_ = 0;   // guarded by mu_
  std::string swap_state_;              // guarded by mu_
  std::optional<SwapPlan> acked_;       // guarded by mu_: the plan step acknowledged "ok" last

  std::mutex follow_mu_;            // one follow() at a time
  std::shared_ptr<Keeper> keeper_;  // guarded by follow_mu_: the host's own session
  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool wake_requested_ = false;  // guarded by wake_mu_
  bool stopping_ = false;        // guarded by wake_mu_
  std::thread follower_;
};

}  // namespace rtable::core
