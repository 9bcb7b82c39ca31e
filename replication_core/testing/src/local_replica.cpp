#include "rtable/replication_core/testing/local_replica.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>
#include <vector>

namespace rtable::core::testing {

using common::testing::findFreeLoopbackPort;
using common::testing::httpRequest;
using common::testing::tailOfFile;

std::expected<std::unique_ptr<LocalReplica>, std::string> LocalReplica::start(
    LocalReplicaOptions options) {
  std::unique_ptr<LocalReplica> replica(new LocalReplica(std::move(options)));
  auto& o = replica->options_;
  std::error_code ec;
  std::filesystem::create_directories(o.work_dir, ec);
  if (ec)
    return std::unexpected(fmt::format("cannot create {}: {}", o.work_dir.string(), ec.message()));
  replica->data_dir_ = o.work_dir / "data";
  if (!o.tls_dir.empty()) {
    auto tls = common::TlsContext::load(common::TlsContext::Side::kClient,
                                        common::TlsFiles::inDirectory(o.tls_dir));
    if (!tls) return std::unexpected(tls.error());
    replica->client_tls_ = std::move(*tls);
  }
  // A port found free may be taken by someone else before rtable-core binds it (the machine is
  // shared): a first start that fails on it gets new ports; nobody knows the old ones yet.
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    if (auto written = replica->writeSpec(); !written) return std::unexpected(written.error());
    auto launched = replica->launch();
    if (launched) return replica;
    if (attempt == kAttempts ||
        launched.error().find("Address already in use") == std::string::npos) {
      return std::unexpected(launched.error());
    }
  }
}

TestStatus LocalReplica::writeSpec() {
  const auto& o = options_;
  auto http = findFreeLoopbackPort();
  auto metrics = findFreeLoopbackPort();
  if (!http || !metrics) return std::unexpected("no free port");
  http_port_ = *http;
  metrics_port_ = *metrics;
  std::string credentials;
  if (!o.zookeeper_user.empty()) {
    // As the operator mounts the table's Secret: one file per key.
    const auto dir = o.work_dir / "zookeeper-credentials";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "username") << o.zookeeper_user;
    std::ofstream(dir / "password") << o.zookeeper_password;
    credentials = fmt::format(", credentialsDir: {}", dir.string());
  }
  std::ofstream(o.work_dir / "spec.yaml")
      << o.table_yaml << "\n"
      << fmt::format("zookeeper: {{connect: \"{}\", sessionTimeoutMs: {}{}}}\n", o.zookeeper,
                     o.session_timeout_ms, credentials)
      << fmt::format("replica: {{name: {}, host: {}}}\n", o.replica, o.host)
      << fmt::format("dataDir: {}\n", data_dir_.string()) << fmt::format("listen: {}\n", o.host)
      << fmt::format("ports: {{http: {}, metrics: {}}}\n", http_port_, metrics_port_);
  if (!o.api_token.empty()) {
    const auto tokens = o.work_dir / "api-tokens";
    std::ofstream(tokens) << o.api_token << "\n";
    std::ofstream(o.work_dir / "spec.yaml", std::ios::app) << fmt::format(
        "api: {{tokensFile: {}, readsNeedToken: {}}}\n", tokens.string(), o.api_reads_need_token);
  }
  if (!o.tls_dir.empty()) {
    std::ofstream(o.work_dir / "spec.yaml", std::ios::app)
        << fmt::format("tls: {{dir: {}}}\n", o.tls_dir.string());
  }
  std::vector<std::string> replication;
  if (!o.interserver_secret.empty()) {
    const auto secret_file = o.work_dir / "interserver-secret";
    std::ofstream(secret_file) << o.interserver_secret << "\n";
    replication.push_back(fmt::format("secretFile: {}", secret_file.string()));
  }
  if (!o.replication_settings.empty()) replication.push_back(o.replication_settings);
  if (!replication.empty()) {
    std::ofstream(o.work_dir / "spec.yaml", std::ios::app)
        << fmt::format("replication: {{{}}}\n", fmt::join(replication, ", "));
  }
  return {};
}

LocalReplica::~LocalReplica() {
  if (process_) process_->stop(std::chrono::seconds(10));
}

TestStatus LocalReplica::launch(std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = {options_.binary.string(), "--config",
                                   (options_.work_dir / "spec.yaml").string()};
  for (const auto& stall : options_.test_stalls) argv.push_back("--test-stall=" + stall);
  if (options_.run_as_uid) {
    // The replica's own files, made here by root, become its uid's.
    std::error_code ec;
    std::filesystem::create_directories(data_dir_, ec);
    for (const auto& entry : std::filesystem::recursive_directory_iterator(options_.work_dir, ec)) {
      if (::chown(entry.path().c_str(), *options_.run_as_uid, *options_.run_as_uid) != 0) {
        return std::unexpected("cannot chown " + entry.path().string());
      }
    }
    if (ec || ::chown(options_.work_dir.c_str(), *options_.run_as_uid, *options_.run_as_uid) != 0)
      return std::unexpected("cannot give " + options_.work_dir.string() + " to its uid");
  }
  auto process = Subprocess::start(argv, logFile(), options_.run_as_uid);
  if (!process) return std::unexpected(process.error());
  process_.emplace(std::move(*process));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->running()) {
      process_.reset();
      return std::unexpected("rtable-core exited during start; log tail:\n" +
                             tailOfFile(logFile()));
    }
    auto ready = get("/readyz");
    if (ready && ready->status == 200) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::unexpected("rtable-core not ready in time; log tail:\n" + tailOfFile(logFile()));
}

std::expected<HttpResponse, std::string> LocalReplica::get(const std::string& target) const {
  return request("GET", target, "", std::chrono::seconds(30));
}

std::expected<HttpResponse, std::string> LocalReplica::post(const std::string& target,
                                                            const std::string& body) const {
  return request("POST", target, body, std::chrono::seconds(60));
}

std::expected<HttpResponse, std::string> LocalReplica::request(
    const std::string& method, const std::string& target, const std::string& body,
    std::chrono::milliseconds timeout) const {
  if (!client_tls_) {
    return httpRequest(options_.host, http_port_, method, target, body, timeout, authorization());
  }
  return common::testing::httpsRequest(*client_tls_, options_.host, http_port_, method, target,
                                       body, timeout, authorization());
}

std::string LocalReplica::authorization() const {
  if (options_.api_token.empty()) return "";
  return fmt::format("Authorization: Bearer {}\r\n", options_.api_token);
}

std::expected<HttpResponse, std::string> LocalReplica::metrics() const {
  return httpRequest(options_.host, metrics_port_, "GET", "/metrics");
}

void LocalReplica::freezeForTest() {
  if (process_) ::kill(process_->pid(), SIGSTOP);
}

void LocalReplica::thawForTest() {
  if (process_) ::kill(process_->pid(), SIGCONT);
}

void LocalReplica::kill9() {
  if (process_) process_->kill();
  process_.reset();
}

int LocalReplica::terminate() {
  if (!process_) return -1;
  auto status = process_->stop(std::chrono::seconds(40));
  process_.reset();
  if (!status || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

}  // namespace rtable::core::testing
