#include "rtable/replication_core/testing/local_clickhouse.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace rtable::core::testing {
namespace {

void replaceAll(std::string& text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

}  // namespace

std::expected<std::unique_ptr<LocalClickHouse>, std::string> LocalClickHouse::start(
    const std::string& zookeeper_host, int zookeeper_port, const std::string& replica) {
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
  replaceAll(config, "@PATH@", ch->work_dir_.string() + "/");
  replaceAll(config, "@HTTP_PORT@", ports[0]);
  replaceAll(config, "@TCP_PORT@", ports[1]);
  replaceAll(config, "@INTERSERVER_PORT@", ports[2]);
  replaceAll(config, "@ZK_HOST@", zookeeper_host);
  replaceAll(config, "@ZK_PORT@", std::to_string(zookeeper_port));
  replaceAll(config, "@REPLICA@", replica);
  const auto config_path = ch->work_dir_ / "config.xml";
  std::ofstream(config_path) << config;

  auto process = Subprocess::start(
      {"/usr/sbin/clickhouse-server", "--config-file=" + config_path.string()},
      ch->work_dir_ / "stdout.log");
  if (!process) return std::unexpected(process.error());
  ch->process_.emplace(std::move(*process));
  // Ready when a query answers (the server starts in well under a second).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!ch->process_->running()) {
      return std::unexpected("clickhouse-server exited during start; log tail:\n" +
                             tailOfFile(ch->work_dir_ / "log" / "clickhouse-server.err.log"));
    }
    if (ch->query("SELECT 1")) return ch;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return std::unexpected("clickhouse-server did not answer within 60 s");
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
  if (result->exit_code != 0) return std::unexpected(result->err.empty() ? result->out : result->err);
  return result->out;
}

}  // namespace rtable::core::testing
