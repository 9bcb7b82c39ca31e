// Debian's ClickHouse 18.16 as a local process on free loopback ports, against a given ZooKeeper:
// the reference that rtable's figures are compared with. Config: clickhouse/config.xml.in (merge
// assignment off, so the only log entries are the ones a test causes).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "rtable/replication_core/testing/subprocess.h"

namespace rtable::core::testing {

class LocalClickHouse {
 public:
  // `replica` fills the {replica} macro.
  static std::expected<std::unique_ptr<LocalClickHouse>, std::string> start(
      const std::string& zookeeper_host, int zookeeper_port, const std::string& replica);
  ~LocalClickHouse();

  int tcpPort() const { return tcp_port_; }
  int httpPort() const { return http_port_; }
  // Runs one statement with clickhouse-client; the result text (TabSeparated) or the server's
  // error message.
  std::expected<std::string, std::string> query(const std::string& sql) const;

 private:
  LocalClickHouse() = default;

  std::filesystem::path work_dir_;
  int tcp_port_ = 0;
  int http_port_ = 0;
  std::optional<Subprocess> process_;
};

}  // namespace rtable::core::testing
