// The wall clock in milliseconds since the epoch, as the backup protocol's nodes and manifests
// record times (private to the backup component).
#pragma once

#include <chrono>
#include <cstdint>

namespace rtable::backup {

inline int64_t wallClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace rtable::backup
