// Fail points on the core's file system calls, for tests (ClickHouse's FailPoint, narrowed to the
// calls that make parts durable). Every open, write, fsync, fdatasync, syncfs, rename and mkdir of
// the core's part, journal and fetch code goes through one private layer (posix_file.h), which asks
// here first: a test arms a fault, the next matching calls fail with its errno (or stall), as the
// kernel would fail them on a full, broken or slow disk. Unarmed, a call costs one atomic load.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace rtable::core {

enum class FileOp { kOpen, kWrite, kFsync, kFdatasync, kSyncfs, kRename, kMkdir };
std::string_view fileOpName(FileOp op);

struct FileFault {
  FileOp op = FileOp::kWrite;
  std::string path_contains;  // calls on paths containing this match ("": every path)
  int error = EIO;            // the errno matching calls fail with; 0: they only stall
  int times = 1;              // matching calls that fail (or stall); -1: until cleared
  int skip = 0;               // matching calls let through before the first failure
  std::chrono::milliseconds stall{0};  // slept before the call fails (or proceeds, error 0)
};

void injectFileFaultForTest(FileFault fault);
void clearFileFaultsForTest();
// Calls that a fault failed or stalled since the last clear.
std::size_t fileFaultHitsForTest();

// For posix_file.h: the errno the call on `path` must fail with (after any stall), 0 to proceed.
int fileFaultFor(FileOp op, std::string_view path);

}  // namespace rtable::core
