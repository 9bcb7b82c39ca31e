#include "rtable/replication_core/file_faults.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace rtable::core {
namespace {

struct Armed {
  FileFault fault;
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

std::string_view fileOpName(FileOp op) {
  switch (op) {
    case FileOp::kOpen: return "open";
    case FileOp::kWrite: return "write";
    case FileOp::kFsync: return "fsync";
    case FileOp::kFdatasync: return "fdatasync";
    case FileOp::kSyncfs: return "syncfs";
    case FileOp::kRename: return "rename";
    case FileOp::kMkdir: return "mkdir";
  }
  return "unknown";
}

void injectFileFaultForTest(FileFault fault) {
  std::lock_guard lock(mu);
  armed().push_back(Armed{std::move(fault)});
  any_armed.store(true);
}

void clearFileFaultsForTest() {
  std::lock_guard lock(mu);
  armed().clear();
  hits = 0;
  any_armed.store(false);
}

std::size_t fileFaultHitsForTest() {
  std::lock_guard lock(mu);
  return hits;
}

int fileFaultFor(FileOp op, std::string_view path) {
  if (!any_armed.load(std::memory_order_relaxed)) return 0;
  std::chrono::milliseconds stall{0};
  int error = 0;
  {
    std::lock_guard lock(mu);
    for (auto& a : armed()) {
      const FileFault& f = a.fault;
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
