// What giving a table's ZooKeeper tree its ACL costs (ZooKeeperClient::restrictSubtree: the
// migration of a table made before ACLs, and each step of a password rotation, docs/security.md).
// The walk is sequential: per node a getAcl, a setAcl where it differs, and a getChildren. A real
// ZooKeeper 3.8 on loopback, a tree shaped like a table's (its dedup window's block nodes
// dominate: 10000 by default), timed three ways: every node open (the migration), every node
// already right (a walk that changes nothing), and every node naming an old password (a rotation).
//
//   rtable-acl-walk-bench [--nodes N]     (default 12000)
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace {

using namespace rtable;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: rtable-acl-walk-bench [--nodes N]\n"
    "Times ZooKeeperClient::restrictSubtree over a table-shaped tree of N nodes (default 12000)\n"
    "on a local ZooKeeper 3.8.\n";

int run(int64_t nodes) {
  auto zk = core::testing::LocalZooKeeper::start();
  if (!zk) {
    std::fprintf(stderr, "ZooKeeper: %s\n", zk.error().c_str());
    return 1;
  }
  const std::string root = "/rtable/tables/bench.events";
  auto connect = [&](std::vector<core::ZooKeeperDigest> digests) {
    return core::ZooKeeperClient::connect(core::ZooKeeperConfig{
        (*zk)->connectString(), std::chrono::seconds(30), std::chrono::seconds(10), digests});
  };
  auto anonymous = connect({});
  if (!anonymous) {
    std::fprintf(stderr, "connect: %s\n", anonymous.error().toString().c_str());
    return 1;
  }
  // A table's shape: most nodes are the dedup window's blocks, then log entries and a replica's
  // queue; about 20 inner nodes.
  const int64_t log_entries = std::min<int64_t>(1000, nodes / 10);
  const int64_t queue = std::min<int64_t>(200, nodes / 50);
  const int64_t blocks = nodes - log_entries - queue - 20;
  for (const std::string& dir : {root + "/1/blocks", root + "/1/log", root + "/1/replicas/r1/queue",
                                 root + "/1/block_numbers", root + "/1/quorum"}) {
    if (auto made = core::createAncestorsAndSelf(**anonymous, dir); !made) {
      std::fprintf(stderr, "%s\n", made.error().toString().c_str());
      return 1;
    }
  }
  auto fill = [&](const std::string& dir, const char* prefix, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      auto made = (*anonymous)
                      ->create(fmt::format("{}/{}{:010}", dir, prefix, i), "x",
                               core::CreateMode::kPersistent);
      if (!made) return false;
    }
    return true;
  };
  const auto filling = Clock::now();
  if (!fill(root + "/1/blocks", "all_", blocks) || !fill(root + "/1/log", "log-", log_entries) ||
      !fill(root + "/1/replicas/r1/queue", "queue-", queue)) {
    std::fprintf(stderr, "creating the tree failed\n");
    return 1;
  }
  const double fill_s = std::chrono::duration<double>(Clock::now() - filling).count();

  auto walk = [&](core::ZooKeeperClient& session, const char* what) -> bool {
    const auto start = Clock::now();
    auto changed = session.restrictSubtree(root);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!changed) {
      std::fprintf(stderr, "%s: %s\n", what, changed.error().toString().c_str());
      return false;
    }
    std::printf("%-44s %8zu changed  %7.2f s  %8.0f nodes/s\n", what, *changed, seconds,
                static_cast<double>(nodes) / seconds);
    return true;
  };
  const core::ZooKeeperDigest old_identity{"bench.events", "old-password", root};
  core::ZooKeeperDigest rotating{"bench.events", "new-password", root};
  rotating.previous_password = "old-password";
  const core::ZooKeeperDigest new_identity{"bench.events", "new-password", root};
  auto session = connect({old_identity});
  if (!session) return 1;
  std::printf(
      "tree of %lld nodes (%lld blocks, %lld log entries, %lld queue entries), "
      "created in %.2f s\n",
      static_cast<long long>(nodes), static_cast<long long>(blocks),
      static_cast<long long>(log_entries), static_cast<long long>(queue), fill_s);
  if (!walk(**session, "migration: every node open") ||
      !walk(**session, "again: every node right already")) {
    return 1;
  }
  if (!(*session)->addDigest(rotating) || !walk(**session, "rotation step 1: old -> old and new") ||
      !(*session)->addDigest(new_identity) || !walk(**session, "rotation step 2: -> new alone")) {
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (rtable::bench::wantsHelp(argc, argv)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (auto paired = rtable::bench::pairedFlags(argc, argv); !paired) {
    std::fprintf(stderr, "%s\n%s", paired.error().c_str(), kUsage);
    return 2;
  }
  int64_t nodes = 12000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--nodes") {
      auto value = rtable::bench::wholeNumber(flag, argv[i + 1], 100, 10'000'000);
      if (!value) {
        std::fprintf(stderr, "%s\n", value.error().c_str());
        return 2;
      }
      nodes = *value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  return run(nodes);
}
