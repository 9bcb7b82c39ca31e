#include "rtable/replication_core/testing/local_clickhouse.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "rtable/common/testing/http_client.h"

namespace rtable::core::testing {
namespace {

using common::testing::findFreeLoopbackPort;
using common::testing::httpRequest;
using common::testing::runCommand;
using common::testing::tailOfFile;

void replaceAll(std::string& text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

}  // namespace

std::expected<std::unique_ptr<LocalClickHouse>, std::string> LocalClickHouse::start(
    const std::string& zookeeper_host, int zookeeper_port, const std::string& replica) {
  LocalClickHouseOptions options;
  options.zookeeper_host = zookeeper_host;
  options.zookeeper_port = zookeeper_port;
  options.replica = replica;
  return start(std::move(options));
}

std::expected<std::unique_ptr<LocalClickHouse>, std::string> LocalClickHouse::start(
    LocalClickHouseOptions options) {
  std::unique_ptr<LocalClickHouse> ch(new LocalClickHouse());
  std::string pattern = (std::filesystem::temp_directory_path() / "rtable-ch-XXXXXX").string();
  if (!mkdtemp(pattern.data())) return std::unexpected("mkdtemp failed for " + pattern);
  ch->work_dir_ = pattern;

  std::ifstream in(RTABLE_CLICKHOUSE_CONFIG_TEMPLATE);
  if (!in) return std::unexpected(std::string("cannot read ") + RTABLE_CLICKHOUSE_CONFIG_TEMPLATE);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string config = buffer.str();
  std::string ports[3];
  for (auto& port : ports) {
    auto free_port = findFreeLoopbackPort();
    if (!free_port) return std::unexpected(free_port.error());
    port = std::to_string(*free_port);
  }
  ch->tcp_port_ = std::stoi(ports[1]);
  ch->http_port_ = std::stoi(ports[0]);
  ch->interserver_port_ = std::stoi(ports[2]);
  replaceAll(config, "@PATH@", ch->work_dir_.string() + "/");
  replaceAll(config, "@HTTP_PORT@", ports[0]);
  replaceAll(config, "@TCP_PORT@", ports[1]);
  replaceAll(config, "@INTERSERVER_PORT@", ports[2]);
  replaceAll(config, "@ZK_HOST@", options.zookeeper_host);
  replaceAll(config, "@ZK_PORT@", std::to_string(options.zookeeper_port));
  replaceAll(config, "@REPLICA@", options.replica);
  replaceAll(config, "@MAX_REPLICATED_MERGES_IN_QUEUE@", options.assign_merges ? "16" : "0");
  const auto config_path = ch->work_dir_ / "config.xml";
  std::ofstream(config_path) << config;

  if (auto launched = ch->launch(); !launched) return std::unexpected(launched.error());
  return ch;
}

TestStatus LocalClickHouse::launch(std::chrono::milliseconds timeout) {
  auto process = Subprocess::start(
      {"/usr/sbin/clickhouse-server", "--config-file=" + (work_dir_ / "config.xml").string()},
      work_dir_ / "stdout.log");
  if (!process) return std::unexpected(process.error());
  process_.emplace(std::move(*process));
  // Ready when a query answers (the server starts in well under a second). /ping over HTTP is
  // polled first, cheaply and often; then one clickhouse-client query confirms the TCP port.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool pinged = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->running()) {
      process_.reset();
      return std::unexpected("clickhouse-server exited during start; log tail:\n" +
                             tailOfFile(work_dir_ / "log" / "clickhouse-server.err.log"));
    }
    if (!pinged) {
      auto ping = httpRequest("127.0.0.1", http_port_, "GET", "/ping", "", std::chrono::seconds(5));
      pinged = ping && ping->status == 200;
    }
    if (pinged && query("SELECT 1")) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(pinged ? 100 : 20));
  }
  return std::unexpected(
      fmt::format("clickhouse-server did not answer within {} ms", timeout.count()));
}

int LocalClickHouse::terminate() {
  if (!process_) return -1;
  auto status = process_->stop(std::chrono::seconds(60));
  process_.reset();
  if (!status || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

LocalClickHouse::~LocalClickHouse() {
  if (process_) process_->stop();
  if (!work_dir_.empty() && !std::getenv("RTABLE_KEEP_TEST_DIRS")) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
}

std::expected<std::string, std::string> LocalClickHouse::query(const std::string& sql) const {
  auto result = runCommand({"clickhouse-client", "--host", "127.0.0.1", "--port",
                            std::to_string(tcp_port_), "--query", sql},
                           std::chrono::seconds(60));
  if (!result) return std::unexpected(result.error());
  if (result->exit_code != 0)
    return std::unexpected(result->err.empty() ? result->out : result->err);
  return result->out;
}

}  // namespace rtable::core::testing
