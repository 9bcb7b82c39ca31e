// Fail points for tests (ClickHouse's FailPoint, narrowed to what a disk or a network can do to a
// replica). Every open, write, fsync, fdatasync, syncfs, rename and mkdir of the core's part,
// journal and fetch code goes through one private layer (posix_file.h), and every step of a part
// fetch (resolve, connect, send, the answer's head, its body) through part_exchange.cpp; each asks
// here first. A test arms a fault, and the next matching calls fail with its errno (or stall), as
// the kernel would fail them on a full, broken or slow disk, or a network that resets or hangs.
// Unarmed, a call costs one atomic load.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <expected>
#include <string>
#include <string_view>

namespace rtable::core {

enum class FailPoint {
  // Files: the path of the file (or of the directory, for syncfs; the target, for rename).
  kOpen,
  kWrite,
  kFsync,
  kFdatasync,
  kSyncfs,
  kRename,
  kMkdir,
  // A part fetch: the path is "<host>:<port>/<part>".
  kResolve,
  kConnect,
  kSend,
  kReceiveHead,
  kReceiveBody,
  // A merge, as it starts executing its queue entry: the path is the merged part's name.
  kMerge,
};
std::string_view failPointName(FailPoint op);

struct Fault {
  FailPoint op = FailPoint::kWrite;
  std::string path_contains;           // calls on paths containing this match ("": every path)
  int error = EIO;                     // the errno matching calls fail with; 0: they only stall
  int times = 1;                       // matching calls that fail (or stall); -1: until cleared
  int skip = 0;                        // matching calls let through before the first failure
  std::chrono::milliseconds stall{0};  // slept before the call fails (or proceeds, error 0)
};

// "OP[@PATH]:MS": every call of OP (a failPointName, e.g. "write" or "receive_head") on a path
// containing PATH (any path without it) stalls MS milliseconds, then proceeds. rtable-core's
// --test-stall arms these, so that a process test can hold a replica inside a fetch or a merge
// long enough to kill it there. The error names what is wrong.
std::expected<Fault, std::string> parseStall(std::string_view text);

void injectFaultForTest(Fault fault);
void clearFaultsForTest();
// Calls that a fault failed or stalled since the last clear.
std::size_t faultHitsForTest();

// For the layers above: the errno the call on `path` must fail with (after any stall), 0 to
// proceed.
int faultFor(FailPoint op, std::string_view path);

}  // namespace rtable::core
