// A real ZooKeeper 3.8 (Debian's `zookeeper` package) as a standalone local process on a free
// loopback port, for tests and the local launcher. It can be stopped and restarted on the same
// port and data, have a sequential counter raised in its snapshot, and expire a client's session.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

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
  // Starts again on the same port with the same data; sessions that have not timed out survive.
  TestStatus restart();
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
      : work_dir_(std::move(work_dir)),
        owns_work_dir_(owns_work_dir),
        tick_time_ms_(options.tick_time_ms),
        production_jvm_(options.production_jvm) {}

  TestStatus writeConfig();
  TestStatus launch();

  std::filesystem::path work_dir_;
  bool owns_work_dir_;
  int tick_time_ms_;
  bool production_jvm_;
  int port_ = 0;
  std::optional<Subprocess> process_;
};

}  // namespace rtable::core::testing
