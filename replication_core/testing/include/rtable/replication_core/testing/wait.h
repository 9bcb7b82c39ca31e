// Waiting on a condition with a deadline, instead of sleeping a guessed time.
#pragma once

#include <chrono>
#include <thread>

namespace rtable::core::testing {

// Polls `predicate` every 10 ms until it holds or `timeout` passes; returns its last value.
template <class Predicate>
bool waitFor(Predicate predicate, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return predicate();
}

}  // namespace rtable::core::testing
