// A real ZooKeeper 3.8 (Debian's `zookeeper` package) as a standalone local process on a free
// loopback port, for tests and the local launcher. It can be stopped and restarted on the same
// port and data, have a sequential counter raised in its snapshot, and expire a client's session.
// LocalZooKeeperEnsemble runs three (or more) of them as one ensemble.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rtable/common/testing/subprocess.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::core::testing {

using common::testing::Subprocess;
using common::testing::TestStatus;

struct LocalZooKeeperOptions {
  // Where conf/, data/ and zookeeper.log go. Empty: a new folder under the system temp dir,
  // removed on destruction unless RTABLE_KEEP_TEST_DIRS is set.
  std::filesystem::path work_dir;
  // Sessions may last 2..20 ticks (ZooKeeper's bounds): 500 ms ticks allow 1..10 s sessions.
  int tick_time_ms = 500;
  // The JVM as a production server runs it: both JIT compilers, the default collector and a fixed
  // 1 GiB heap (for benchmarks). Off, a small heap and the client compiler only: the server starts
  // faster on two shared cores, and runs slower once warm.
  bool production_jvm = false;
  // Runs the server as this uid (Subprocess::start), its work folder given to it: a partition
  // test's firewall rules can then name the server's sockets.
  std::optional<uid_t> run_as_uid;
  // An ensemble member (set by LocalZooKeeperEnsemble): its id (myid), the ensemble's
  // `server.N=host:peer:election` lines, and its client port. 0/empty: standalone, free port.
  int server_id = 0;
  std::vector<std::string> ensemble_lines;
  int client_port = 0;
};

class LocalZooKeeper {
 public:
  static std::expected<std::unique_ptr<LocalZooKeeper>, std::string> start(
      LocalZooKeeperOptions options = {});
  ~LocalZooKeeper();

  LocalZooKeeper(const LocalZooKeeper&) = delete;
  LocalZooKeeper& operator=(const LocalZooKeeper&) = delete;

  int port() const { return port_; }
  std::string connectString() const;
  const std::filesystem::path& workDir() const { return work_dir_; }
  std::filesystem::path dataDir() const { return work_dir_ / "data"; }
  std::filesystem::path logFile() const { return work_dir_ / "zookeeper.log"; }
  bool running() { return process_ && process_->running(); }

  TestStatus stop();
  // SIGKILL: a server that dies with no goodbye to its peers or clients.
  void kill9();
  // Starts again on the same port with the same data; sessions that have not timed out survive.
  // An ensemble member without a quorum to join cannot serve: `wait_until_serving` false returns
  // once the process runs, and LocalZooKeeperEnsemble waits for the quorum.
  TestStatus restart(bool wait_until_serving = true);
  // The answer to a four-letter word ("srvr", "ruok", "mntr") on the client port.
  std::expected<std::string, std::string> fourLetterWord(const std::string& word) const;
  // "leader", "follower" or "standalone" from `srvr`; an error while the server does not serve
  // (no quorum, not started).
  std::expected<std::string, std::string> mode() const;
  // With the server stopped, sets `path`'s sequential counter in the snapshot with ZooKeeper's own
  // classes (tools/zk-set-counter), then starts it again. Everything after is the real server.
  TestStatus setSequentialCounter(const std::string& path, int32_t counter);
  // Attaches a second client to the session and closes it: the server ends the session and the
  // original client sees it expire.
  TestStatus expireSession(const SessionCredentials& credentials);

  KeeperResult<std::unique_ptr<ZooKeeperClient>> connect(
      std::chrono::milliseconds session_timeout = std::chrono::seconds(10)) const;

 private:
  LocalZooKeeper(std::filesystem::path work_dir, bool owns_work_dir,
                 const LocalZooKeeperOptions& options)
      : work_dir_(std::move(work_dir)), owns_work_dir_(owns_work_dir), options_(options) {}

  TestStatus writeConfig();
  TestStatus launch(bool wait_until_serving = true);

  std::filesystem::path work_dir_;
  bool owns_work_dir_;
  LocalZooKeeperOptions options_;
  int port_ = 0;
  std::optional<Subprocess> process_;
};

struct LocalZooKeeperEnsembleOptions {
  int servers = 3;
  int tick_time_ms = 500;
  // Server i runs as uids[i] when given (LocalZooKeeperOptions::run_as_uid).
  std::vector<uid_t> uids;
};

// A ZooKeeper ensemble on loopback: every member a LocalZooKeeper with its own client, peer and
// election ports and work folder (under one temp folder, removed on destruction unless
// RTABLE_KEEP_TEST_DIRS is set).
class LocalZooKeeperEnsemble {
 public:
  static std::expected<std::unique_ptr<LocalZooKeeperEnsemble>, std::string> start(
      LocalZooKeeperEnsembleOptions options = {});
  ~LocalZooKeeperEnsemble();

  std::size_t size() const { return servers_.size(); }
  LocalZooKeeper& server(std::size_t i) { return *servers_.at(i); }
  // Every member, "127.0.0.1:p1,127.0.0.1:p2,...": a client fails over among them.
  std::string connectString() const;
  // Server i's peer (quorum) and election ports, for firewall rules.
  std::vector<int> peerPorts(std::size_t i) const { return peer_ports_.at(i); }
  // Waits until every running member serves (leader or follower) and one leads; returns the
  // leader's index.
  std::expected<std::size_t, std::string> waitUntilServing(
      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Each member's mode or why it answers none, for a failing test's message.
  std::string describe() const;
  KeeperResult<std::unique_ptr<ZooKeeperClient>> connect(
      std::chrono::milliseconds session_timeout = std::chrono::seconds(10)) const;

 private:
  LocalZooKeeperEnsemble() = default;
  std::filesystem::path work_dir_;
  std::vector<std::unique_ptr<LocalZooKeeper>> servers_;
  std::vector<std::vector<int>> peer_ports_;
};

}  // namespace rtable::core::testing
