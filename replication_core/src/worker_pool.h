// A fixed number of threads running submitted tasks in order: a replica's fetch and merge pools.
// Private to replication_core.
//
// Thread safety: all methods may be called from any thread; stop() (and the destructor) must not
// be called from one of the pool's own tasks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rtable::core {

class WorkerPool {
 public:
  explicit WorkerPool(std::size_t threads, std::size_t max_queued = SIZE_MAX)
      : max_queued_(max_queued) {
    for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~WorkerPool() { stop(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False when stopped or `max_queued` tasks are waiting already; the task is then destroyed
  // without running (a task that owns something must release it in its destructor).
  bool submit(std::move_only_function<void()> task) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ || queue_.size() >= max_queued_) return false;
      queue_.push_back(std::move(task));
      ++in_flight_;
    }
    wake_.notify_one();
    return true;
  }

  // Waits until every submitted task has finished, or the timeout.
  bool waitIdle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return idle_.wait_for(lock, timeout, [this] { return in_flight_ == 0; });
  }

  // Running tasks finish; tasks not started are destroyed without running. Idempotent.
  void stop() {
    std::deque<std::move_only_function<void()>> dropped;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      in_flight_ -= queue_.size();
      dropped.swap(queue_);
    }
    dropped.clear();  // outside the lock: a task's destructor may call back into its owner
    wake_.notify_all();
    idle_.notify_all();
    for (auto& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      if (--in_flight_ == 0) idle_.notify_all();
    }
  }

  const std::size_t max_queued_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::move_only_function<void()>> queue_;
  std::size_t in_flight_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace rtable::core
