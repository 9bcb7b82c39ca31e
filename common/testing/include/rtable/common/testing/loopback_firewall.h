// Network partitions between local test processes (issue 24), on this machine's loopback only:
// an nftables table of the test's own whose output chain drops the TCP packets that the sockets of
// given uids send to given ports. Each process under test runs as its own uid
// (Subprocess::start's run_as_uid), so "r3 cannot reach ZooKeeper" is one rule: packets from r3's
// uid to ZooKeeper's port. `drop`, not `reject`: a partition is silence, not a reset.
//
// Needs root and nftables. The table is deleted on destruction; one left by a test process that
// was killed is deleted by the next create() (its name carries the dead pid).
//
// Thread safety: none; one test thread uses it.
#pragma once

#include <sys/types.h>

#include <expected>
#include <memory>
#include <string>
#include <vector>

#include "rtable/common/testing/subprocess.h"

namespace rtable::common::testing {

class LoopbackFirewall {
 public:
  static std::expected<std::unique_ptr<LoopbackFirewall>, std::string> create();
  ~LoopbackFirewall();
  LoopbackFirewall(const LoopbackFirewall&) = delete;
  LoopbackFirewall& operator=(const LoopbackFirewall&) = delete;

  // Drops every TCP packet that a socket owned by one of `uids` sends on loopback to one of
  // `ports`. A connection needs both directions, so one rule cuts it; the reverse rule as well
  // makes the cut hold for connections the other side opens.
  TestStatus drop(const std::vector<uid_t>& uids, const std::vector<int>& ports);
  // Removes every rule: the links heal (connections the rules stalled resume or time out).
  TestStatus heal();
  // The rules in force, as `nft list table` prints them (for a failing test's message).
  std::string describe() const;
  const std::string& table() const { return table_; }

 private:
  explicit LoopbackFirewall(std::string table) : table_(std::move(table)) {}
  std::string table_;
};

// Uids for the processes of one test binary: `count` of them from a base derived from this
// process's pid, so that test binaries running side by side do not share an owner (and so a
// rule). Far above any real user's.
std::vector<uid_t> testUids(int count);

}  // namespace rtable::common::testing
