#include "rtable/replication_core/async_insert.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "rtable/replication_core/part_store.h"

namespace rtable::core {

std::string flushReasonName(FlushReason reason) {
  switch (reason) {
    case FlushReason::kSize:
      return "size";
    case FlushReason::kCount:
      return "count";
    case FlushReason::kTimeout:
      return "timeout";
    case FlushReason::kStale:
      return "stale";
    case FlushReason::kBurst:
      return "burst";
    case FlushReason::kForced:
      return "forced";
  }
  return "unknown";
}

const AsyncInsertTicket::Outcome& AsyncInsertTicket::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return outcome_.has_value(); });
  return *outcome_;
}

bool AsyncInsertTicket::done() const {
  std::lock_guard lock(mu_);
  return outcome_.has_value();
}

void AsyncInsertTicket::deliver(Outcome outcome) {
  {
    std::lock_guard lock(mu_);
    outcome_ = std::move(outcome);
  }
  cv_.notify_all();
}

AsyncInsertQueue::AsyncInsertQueue(AsyncInsertSettings settings, Commit commit,
                                   metrics::ReplicaMetrics& metrics)
    : settings_(settings), commit_(std::move(commit)), metrics_(metrics) {
  flusher_ = std::thread([this] { flusherLoop(); });
}

AsyncInsertQueue::~AsyncInsertQueue() {
  stop();
}

namespace {

// Batches are kept apart by what the commit does differently for them: the quorum.
std::string batchKey(const InsertOptions& options) {
  return fmt::format("{}/{}/{}", options.quorum, options.quorum_auto,
                     options.quorum_timeout.count());
}

}  // namespace

std::expected<std::shared_ptr<AsyncInsertTicket>, InsertError> AsyncInsertQueue::enqueue(
    std::vector<InsertPiece> pieces, const InsertOptions& options, std::shared_ptr<void> hold) {
  Entry entry;
  for (const auto& piece : pieces) {
    entry.bytes += valueBytes(piece.rows);
    entry.rows += piece.rows.rows();
  }
  entry.pieces = std::move(pieces);
  entry.arrived = std::chrono::steady_clock::now();
  entry.ticket = std::make_shared<AsyncInsertTicket>();
  entry.hold = std::move(hold);
  auto ticket = entry.ticket;
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      return std::unexpected(InsertError{InsertError::Kind::kUnavailable,
                                         "this replica is shutting down; nothing was queued"});
    }
    if (buffered_bytes_ + entry.bytes > settings_.max_buffered_bytes) {
      metrics_.async_insert_rejected.Increment();
      return std::unexpected(InsertError{
          InsertError::Kind::kOverloaded,
          fmt::format("the async insert buffer is full ({} bytes buffered or being flushed, "
                      "the limit is {}: inserts.async.maxBufferedBytes); nothing was queued",
                      buffered_bytes_, settings_.max_buffered_bytes)});
    }
    const std::string key = batchKey(options);
    auto it = open_.find(key);
    // One flush holds at most max_data_size bytes: a batch that would grow past it goes first.
    if (it != open_.end() && it->second.bytes + entry.bytes > settings_.max_data_size) {
      seal(key, FlushReason::kSize);
      it = open_.end();
    }
    if (it == open_.end()) {
      it = open_.emplace(key, Batch{options, {}, 0, entry.arrived, entry.arrived}).first;
    }
    Batch& batch = it->second;
    batch.bytes += entry.bytes;
    batch.last = entry.arrived;
    buffered_bytes_ += entry.bytes;
    ++buffered_inserts_;
    batch.entries.push_back(std::move(entry));
    if (batch.bytes >= settings_.max_data_size) {
      seal(key, FlushReason::kSize);
    } else if (batch.entries.size() >= settings_.max_query_number) {
      seal(key, FlushReason::kCount);
    } else if (burstComplete(key, batch, batch.last)) {
      seal(key, FlushReason::kBurst);
    }
    updateGauges();
  }
  wake_.notify_all();
  return ticket;
}

void AsyncInsertQueue::seal(const std::string& key, FlushReason reason) {
  auto it = open_.find(key);
  if (it == open_.end()) return;
  sealed_.push_back(Sealed{std::move(it->second), reason});
  open_.erase(it);
}

std::size_t AsyncInsertQueue::expectedBurst(const std::string& key,
                                            std::chrono::steady_clock::time_point now) {
  auto it = bursts_.find(key);
  if (it == bursts_.end()) return 0;
  Bursts& bursts = it->second;
  constexpr auto kSecond = std::chrono::seconds(1);
  if (now - bursts.since >= 2 * kSecond) {
    bursts_.erase(it);
    return 0;
  }
  if (now - bursts.since >= kSecond) {
    bursts.previous = bursts.current;
    bursts.current = 0;
    bursts.since += kSecond;
  }
  return std::max(bursts.current, bursts.previous);
}

void AsyncInsertQueue::noteBurst(const std::string& key, std::size_t inserts,
                                 std::chrono::steady_clock::time_point now) {
  expectedBurst(key, now);  // moves the seconds on
  auto [it, added] = bursts_.try_emplace(key, Bursts{now});
  it->second.current = std::max(it->second.current, inserts);
}

bool AsyncInsertQueue::burstComplete(const std::string& key, const Batch& batch,
                                     std::chrono::steady_clock::time_point now) {
  // While a flush runs the batch goes on gathering: sealing it now would only make it wait
  // for the flusher in sealed_ while the next inserts start a batch of their own.
  if (flushing_ || settings_.stale_timeout.count() == 0) return false;
  const std::size_t expected = expectedBurst(key, now);
  return expected > 0 && batch.entries.size() >= expected;
}

std::optional<std::chrono::steady_clock::time_point> AsyncInsertQueue::sealDue(
    std::chrono::steady_clock::time_point now) {
  std::optional<std::chrono::steady_clock::time_point> next;
  std::vector<std::pair<std::string, FlushReason>> due;
  for (const auto& [key, batch] : open_) {
    const auto by_age = batch.first + settings_.busy_timeout;
    if (flush_all_ || stopping_) {
      due.emplace_back(key, FlushReason::kForced);
    } else if (now >= by_age) {
      due.emplace_back(key, FlushReason::kTimeout);
    } else if (settings_.stale_timeout.count() > 0 && now >= batch.last + settings_.stale_timeout) {
      due.emplace_back(key, FlushReason::kStale);
      noteBurst(key, batch.entries.size(), now);
    } else if (burstComplete(key, batch, now)) {
      due.emplace_back(key, FlushReason::kBurst);
    } else {
      auto at = by_age;
      if (settings_.stale_timeout.count() > 0)
        at = std::min(at, batch.last + settings_.stale_timeout);
      next = next ? std::min(*next, at) : at;
    }
  }
  for (const auto& [key, reason] : due) seal(key, reason);
  return next;
}

void AsyncInsertQueue::flusherLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    const auto next = sealDue(std::chrono::steady_clock::now());
    if (!sealed_.empty()) {
      Sealed sealed = std::move(sealed_.front());
      sealed_.pop_front();
      flushing_ = true;
      lock.unlock();
      flush(std::move(sealed));
      lock.lock();
      flushing_ = false;
      flushed_.notify_all();
      continue;
    }
    if (open_.empty()) {
      flush_all_ = false;
      flushed_.notify_all();
      if (stopping_) return;
    }
    if (next) {
      wake_.wait_until(lock, *next);
    } else {
      wake_.wait(lock);
    }
  }
}

void AsyncInsertQueue::flush(Sealed sealed) {
  Batch& batch = sealed.batch;
  // Every piece of every insert, and which insert each came from.
  std::vector<InsertPiece> pieces;
  std::vector<std::size_t> owner;
  for (std::size_t e = 0; e < batch.entries.size(); ++e) {
    for (auto& piece : batch.entries[e].pieces) {
      pieces.push_back(std::move(piece));
      owner.push_back(e);
    }
  }
  std::vector<std::size_t> piece_rows;
  for (const auto& piece : pieces) piece_rows.push_back(piece.rows.rows());
  const std::vector<PieceOutcome> outcomes = commit_(std::move(pieces), batch.options);
  {
    // The rows left with the commit; counted out before the answers go so that a client's next
    // insert does not find them still buffered.
    std::lock_guard lock(mu_);
    buffered_bytes_ -= batch.bytes;
    buffered_inserts_ -= batch.entries.size();
    updateGauges();
  }
  metrics_.asyncInsertFlushes(flushReasonName(sealed.reason)).Increment();
  metrics_.async_insert_inserts_per_flush.Observe(static_cast<double>(batch.entries.size()));

  std::vector<InsertResult> results(batch.entries.size());
  std::vector<std::optional<InsertError>> errors(batch.entries.size());
  for (std::size_t p = 0; p < outcomes.size(); ++p) {
    const std::size_t e = owner[p];
    InsertResult& result = results[e];
    ++result.blocks;
    if (outcomes[p].error) {
      if (!errors[e]) errors[e] = outcomes[p].error;
      continue;
    }
    if (outcomes[p].duplicate) {
      ++result.deduplicated_blocks;
    } else {
      result.rows += piece_rows[p];
    }
    result.parts.push_back(outcomes[p].part);
  }
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t e = 0; e < batch.entries.size(); ++e) {
    Entry& entry = batch.entries[e];
    AsyncInsertTicket::Outcome outcome{results[e], batch.entries.size(), sealed.reason};
    if (errors[e]) {
      InsertError error = *errors[e];
      if (!results[e].parts.empty()) {
        error.message += fmt::format(
            " ({} of {} partitions of this insert were committed; retrying the same insert is "
            "safe)",
            results[e].parts.size(), results[e].blocks);
      }
      metrics_.insert_errors.Increment();
      outcome.result = std::unexpected(std::move(error));
    } else {
      metrics_.inserts.Increment();
      metrics_.inserted_rows.Increment(static_cast<double>(results[e].rows));
      metrics_.insert_deduplicated_blocks.Increment(
          static_cast<double>(results[e].deduplicated_blocks));
    }
    metrics_.async_insert_wait_seconds.Observe(
        std::chrono::duration<double>(now - entry.arrived).count());
    if (errors[e] && entry.ticket.use_count() == 1) {
      // Nobody waits (wait_for_async_insert=0): the log is the only one to tell.
      spdlog::warn("async insert of {} rows was queued but not committed: {}", entry.rows,
                   outcome.result.error().message);
    }
    entry.ticket->deliver(std::move(outcome));
    entry.hold.reset();
  }
}

void AsyncInsertQueue::updateGauges() {
  metrics_.async_insert_buffered_bytes.Set(static_cast<double>(buffered_bytes_));
  metrics_.async_insert_buffered_inserts.Set(static_cast<double>(buffered_inserts_));
}

void AsyncInsertQueue::flushNow() {
  {
    std::lock_guard lock(mu_);
    if (open_.empty()) return;
    flush_all_ = true;
  }
  wake_.notify_all();
}

void AsyncInsertQueue::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (flusher_.joinable()) flusher_.join();
}

std::size_t AsyncInsertQueue::bufferedInserts() const {
  std::lock_guard lock(mu_);
  return buffered_inserts_;
}

}  // namespace rtable::core
