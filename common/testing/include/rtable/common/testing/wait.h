// Waiting on a condition with a deadline, instead of sleeping a guessed time.
#pragma once

#include <chrono>
#include <thread>

namespace rtable::common::testing {

// Polls `predicate` every `interval` until it holds or `timeout` passes; returns its last value.
// A predicate that asks a server (an apiserver, a process's HTTP API) wants a longer interval.
template <class Predicate>
bool waitFor(Predicate predicate, std::chrono::milliseconds timeout = std::chrono::seconds(30),
             std::chrono::milliseconds interval = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(interval);
  }
  return predicate();
}

}  // namespace rtable::common::testing
