// An rtable-core process serving one replica, for tests and the local launcher: its spec file,
// data directory and free loopback ports. It can be killed (-9), stopped (SIGTERM) and started
// again on the same data and ports.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"

namespace rtable::core::testing {

using common::testing::HttpResponse;
using common::testing::Subprocess;
using common::testing::TestStatus;

struct LocalReplicaOptions {
  std::filesystem::path binary;    // rtable-core
  std::filesystem::path work_dir;  // spec.yaml, data/, replica.log go here
  std::string table_yaml;          // the table part of the spec: table, columns, keys, dedup
  std::string zookeeper;           // connect string
  std::string replica = "r1";
  std::string host = "127.0.0.1";  // listen and advertised address
  int session_timeout_ms = 4000;   // short, so a killed replica's session ends quickly
  std::string interserver_secret = "local-replication-secret";  // shared by a table's replicas
  std::string
      replication_settings;  // more of the spec's replication mapping, e.g. "minLogsToKeep: 3"
  // The replica API's bearer token (spec api.tokensFile); get() and post() send it. Empty: none,
  // the API is open. `api_reads_need_token`: the spec's api.readsNeedToken.
  std::string api_token;
  bool api_reads_need_token = false;
  // The table's ZooKeeper credential (digest ACL on its nodes); empty: none.
  std::string zookeeper_user;
  std::string zookeeper_password;
  // TLS (spec tls.dir, cert-manager's layout); get() and post() then speak HTTPS, trusting the
  // directory's ca.crt. Empty: plain HTTP.
  std::filesystem::path tls_dir;
  // rtable-core --test-stall values ("receive_head:1500"): hold the replica inside a fetch or a
  // merge long enough for a test to kill it there.
  std::vector<std::string> test_stalls = {};
  // Runs rtable-core as this uid (Subprocess::start), its work folder given to it, so that a
  // partition test's firewall rules can name its sockets. `binary` and every folder above
  // work_dir must then be reachable by that uid.
  std::optional<uid_t> run_as_uid = {};
};

class LocalReplica {
 public:
  static std::expected<std::unique_ptr<LocalReplica>, std::string> start(
      LocalReplicaOptions options);
  ~LocalReplica();

  int httpPort() const { return http_port_; }
  int metricsPort() const { return metrics_port_; }
  const std::filesystem::path& dataDir() const { return data_dir_; }
  const std::string& name() const { return options_.replica; }
  std::filesystem::path logFile() const { return options_.work_dir / "replica.log"; }

  std::expected<HttpResponse, std::string> get(const std::string& target) const;
  std::expected<HttpResponse, std::string> post(const std::string& target,
                                                const std::string& body) const;
  std::expected<HttpResponse, std::string> metrics() const;

  // Starts the process (again) and waits until /readyz answers 200.
  TestStatus launch(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  void kill9();
  // SIGTERM; the exit code, or -1 when killed by a signal.
  int terminate();
  bool running() { return process_ && process_->running(); }
  // SIGSTOP / SIGCONT: a replica that is alive (its session too, for a while) but does nothing.
  void freezeForTest();
  void thawForTest();

 private:
  explicit LocalReplica(LocalReplicaOptions options) : options_(std::move(options)) {}
  // spec.yaml with newly found free ports.
  TestStatus writeSpec();
  // The Authorization header line get() and post() send ("" without a token).
  std::string authorization() const;

  // get()/post() to the API: HTTP, or HTTPS with a client context from tls_dir.
  std::expected<HttpResponse, std::string> request(const std::string& method,
                                                   const std::string& target,
                                                   const std::string& body,
                                                   std::chrono::milliseconds timeout) const;

  LocalReplicaOptions options_;
  std::shared_ptr<common::TlsContext> client_tls_;
  std::filesystem::path data_dir_;
  int http_port_ = 0;
  int metrics_port_ = 0;
  std::optional<Subprocess> process_;
};

}  // namespace rtable::core::testing
