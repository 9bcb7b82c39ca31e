#include "rtable/replication_core/fail_points.h"

#include <fmt/format.h>

#include <atomic>
#include <charconv>
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
    case FailPoint::kMerge:
      return "merge";
  }
  return "unknown";
}

std::expected<Fault, std::string> parseStall(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return std::unexpected(
        fmt::format("stall '{}': {} (expected OP[@PATH]:MS, e.g. receive_head:1500)", text, why));
  };
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("no ':MS'");
  std::string_view what = text.substr(0, colon);
  const std::string_view ms = text.substr(colon + 1);
  Fault fault;
  fault.error = 0;
  fault.times = -1;
  if (const std::size_t at = what.find('@'); at != std::string_view::npos) {
    fault.path_contains = std::string(what.substr(at + 1));
    what = what.substr(0, at);
  }
  bool known = false;
  for (FailPoint op :
       {FailPoint::kOpen, FailPoint::kWrite, FailPoint::kFsync, FailPoint::kFdatasync,
        FailPoint::kSyncfs, FailPoint::kRename, FailPoint::kMkdir, FailPoint::kResolve,
        FailPoint::kConnect, FailPoint::kSend, FailPoint::kReceiveHead, FailPoint::kReceiveBody,
        FailPoint::kMerge}) {
    if (failPointName(op) == what) {
      fault.op = op;
      known = true;
    }
  }
  if (!known) return bad(fmt::format("unknown operation '{}'", what));
  int64_t millis = 0;
  const auto [end, error] = std::from_chars(ms.data(), ms.data() + ms.size(), millis);
  if (ms.empty() || error != std::errc() || end != ms.data() + ms.size() || millis < 1 ||
      millis > 600'000) {
    return bad(fmt::format("'{}' is not a number of milliseconds from 1 to 600000", ms));
  }
  fault.stall = std::chrono::milliseconds(millis);
  return fault;
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
