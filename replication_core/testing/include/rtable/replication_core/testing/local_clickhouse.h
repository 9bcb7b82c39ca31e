// Debian's ClickHouse 18.16 as a local process on free loopback ports, against a given ZooKeeper:
// the reference that rtable's figures are compared with. Config: clickhouse/config.xml.in (merge
// assignment off by default, so the only log entries are the ones a test causes). Each server has
// its own interserver HTTP port on 127.0.0.1, so servers that are replicas of one table fetch parts
// from each other. It can be stopped (SIGTERM) and started again on the same data and ports.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "rtable/common/testing/subprocess.h"

namespace rtable::core::testing {

using common::testing::Subprocess;
using common::testing::TestStatus;

struct LocalClickHouseOptions {
  std::string zookeeper_host = "127.0.0.1";
  int zookeeper_port = 0;
  std::string replica = "r1";  // fills the {replica} macro
  // false: merge_tree/max_replicated_merges_in_queue = 0, no merge is ever assigned (OPTIMIZE
  // still merges). true: ClickHouse's default (16), the leader assigns merges in the background.
  bool assign_merges = false;
};

class LocalClickHouse {
 public:
  static std::expected<std::unique_ptr<LocalClickHouse>, std::string> start(
      LocalClickHouseOptions options);
  // `replica` fills the {replica} macro; merge assignment off.
  static std::expected<std::unique_ptr<LocalClickHouse>, std::string> start(
      const std::string& zookeeper_host, int zookeeper_port, const std::string& replica);
  ~LocalClickHouse();

  int tcpPort() const { return tcp_port_; }
  int httpPort() const { return http_port_; }
  int interserverPort() const { return interserver_port_; }
  const std::filesystem::path& workDir() const { return work_dir_; }
  std::filesystem::path logFile() const { return work_dir_ / "log" / "clickhouse-server.log"; }
  // Runs one statement with clickhouse-client; the result text (TabSeparated) or the server's
  // error message.
  std::expected<std::string, std::string> query(const std::string& sql) const;

  // Starts the process (again, on the same data and ports) and waits until it answers a query.
  TestStatus launch(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // SIGTERM and wait (SIGKILL after 60 s); the exit code, or -1 when killed by a signal.
  int terminate();
  bool running() { return process_ && process_->running(); }

 private:
  LocalClickHouse() = default;

  std::filesystem::path work_dir_;
  int tcp_port_ = 0;
  int http_port_ = 0;
  int interserver_port_ = 0;
  std::optional<Subprocess> process_;
};

}  // namespace rtable::core::testing
