#include "rtable/replication_core/fail_points.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace rtable::core {
namespace {

struct Armed {
  Fault fault;
  int skipped = 0;
  int fired = 0;
};

std::atomic<bool> any_armed{false};
std::mutex mu;
std::vector<Armed>& armed() {
  static std::vector<Armed> faults;
  return faults;
}
std::size_t hits = 0;

}  // namespace

std::string_view failPointName(FailPoint op) {
  switch (op) {
    case FailPoint::kOpen:
      return "open";
    case FailPoint::kWrite:
      return "write";
    case FailPoint::kFsync:
      return "fsync";
    case FailPoint::kFdatasync:
      return "fdatasync";
    case FailPoint::kSyncfs:
      return "syncfs";
    case FailPoint::kRename:
      return "rename";
    case FailPoint::kMkdir:
      return "mkdir";
    case FailPoint::kResolve:
      return "resolve";
    case FailPoint::kConnect:
      return "connect";
    case FailPoint::kSend:
      return "send";
    case FailPoint::kReceiveHead:
      return "receive_head";
    case FailPoint::kReceiveBody:
      return "receive_body";
  }
  return "unknown";
}

void injectFaultForTest(Fault fault) {
  std::lock_guard lock(mu);
  armed().push_back(Armed{std::move(fault)});
  any_armed.store(true);
}

void clearFaultsForTest() {
  std::lock_guard lock(mu);
  armed().clear();
  hits = 0;
  any_armed.store(false);
}

std::size_t faultHitsForTest() {
  std::lock_guard lock(mu);
  return hits;
}

int faultFor(FailPoint op, std::string_view path) {
  if (!any_armed.load(std::memory_order_relaxed)) return 0;
  std::chrono::milliseconds stall{0};
  int error = 0;
  {
    std::lock_guard lock(mu);
    for (auto& a : armed()) {
      const Fault& f = a.fault;
      if (f.op != op || path.find(f.path_contains) == std::string_view::npos) continue;
      if (f.times >= 0 && a.fired >= f.times) continue;
      if (a.skipped < f.skip) {
        ++a.skipped;
        continue;
      }
      ++a.fired;
      ++hits;
      stall = f.stall;
      error = f.error;
      break;
    }
  }
  if (stall.count() > 0) std::this_thread::sleep_for(stall);
  return error;
}

}  // namespace rtable::core
