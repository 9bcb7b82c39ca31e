#include "rtable/replication_core/testing/local_zookeeper.h"

#include <fmt/format.h>
#include <zookeeper/zookeeper.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace rtable::core::testing {
namespace {

using common::testing::findFreeLoopbackPort;
using common::testing::runCommand;
using common::testing::tailOfFile;

constexpr auto kStartTimeout = std::chrono::seconds(60);

std::string javaBinary() {
  const char* java_home = std::getenv("JAVA_HOME");
  return java_home ? std::string(java_home) + "/bin/java" : "java";
}

// The jars Debian's zookeeper.jar names in its manifest come along; slf4j-simple gives a log.
std::string serverClassPath(const std::filesystem::path& conf_dir) {
  return fmt::format("{}:{}:/usr/share/java/slf4j-simple.jar", conf_dir.string(),
                     RTABLE_ZOOKEEPER_JAR);
}

std::vector<std::string> jvmFlags(bool production) {
  // ZooKeeper's administrator guide: a fixed heap, so that the server never waits on a resize.
  if (production) return {"-Xms1g", "-Xmx1g", "-Dzookeeper.jmx.log4j.disable=true"};
  // A small heap and the client compiler: a test server starts faster on two shared cores.
  return {"-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
          "-Dzookeeper.jmx.log4j.disable=true"};
}

}  // namespace

std::expected<std::unique_ptr<LocalZooKeeper>, std::string> LocalZooKeeper::start(
    LocalZooKeeperOptions options) {
  bool owns = false;
  if (options.work_dir.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "rtable-zk-XXXXXX").string();
    if (!mkdtemp(pattern.data())) return std::unexpected("mkdtemp failed for " + pattern);
    options.work_dir = pattern;
    owns = true;
  }
  std::unique_ptr<LocalZooKeeper> zk(new LocalZooKeeper(options.work_dir, owns, options));
  std::error_code ec;
  std::filesystem::create_directories(zk->dataDir(), ec);
  std::filesystem::create_directories(zk->work_dir_ / "conf", ec);
  if (ec)
    return std::unexpected(
        fmt::format("cannot create {}: {}", zk->work_dir_.string(), ec.message()));
  // The port is free when we look; another process may take it before ZooKeeper binds, so a few
  // tries with fresh ports.
  std::string last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto port = findFreeLoopbackPort();
    if (!port) return std::unexpected(port.error());
    zk->port_ = *port;
    if (auto written = zk->writeConfig(); !written) return std::unexpected(written.error());
    auto launched = zk->launch();
    if (launched) return zk;
    last_error = launched.error();
  }
  return std::unexpected(last_error);
}

LocalZooKeeper::~LocalZooKeeper() {
  (void)stop();
  if (owns_work_dir_ && !std::getenv("RTABLE_KEEP_TEST_DIRS")) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
}

std::string LocalZooKeeper::connectString() const {
  return fmt::format("127.0.0.1:{}", port_);
}

TestStatus LocalZooKeeper::writeConfig() {
  std::ofstream cfg(work_dir_ / "conf" / "zoo.cfg");
  cfg << "tickTime=" << tick_time_ms_ << "\n"
      << "initLimit=10\nsyncLimit=5\n"
      << "dataDir=" << dataDir().string() << "\n"
      << "clientPort=" << port_ << "\n"
      << "clientPortAddress=127.0.0.1\n"
      << "admin.enableServer=false\n"
      << "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons\n"
      << "maxClientCnxns=0\n";
  if (!cfg) return std::unexpected("cannot write " + (work_dir_ / "conf" / "zoo.cfg").string());
  return {};
}

TestStatus LocalZooKeeper::launch() {
  std::vector<std::string> argv = {javaBinary()};
  for (auto& flag : jvmFlags(production_jvm_)) argv.push_back(flag);
  argv.insert(argv.end(), {"-cp", serverClassPath(work_dir_ / "conf"),
                           "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                           (work_dir_ / "conf" / "zoo.cfg").string()});
  auto process = Subprocess::start(argv, logFile());
  if (!process) return std::unexpected(process.error());
  process_.emplace(std::move(*process));
  // Ready means a session can be established, not just that the port is open.
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->running()) {
      process_.reset();
      return std::unexpected(fmt::format("ZooKeeper on port {} exited during start; log tail:\n{}",
                                         port_, tailOfFile(logFile())));
    }
    ZooKeeperConfig config{connectString(), std::chrono::seconds(4), std::chrono::seconds(1)};
    if (auto client = ZooKeeperClient::connect(config)) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  process_->kill();
  process_.reset();
  return std::unexpected(fmt::format("ZooKeeper on port {} not ready after {} s; log tail:\n{}",
                                     port_, kStartTimeout.count(), tailOfFile(logFile())));
}

TestStatus LocalZooKeeper::stop() {
  if (process_) {
    process_->stop();
    process_.reset();
  }
  return {};
}

TestStatus LocalZooKeeper::restart() {
  if (auto stopped = stop(); !stopped) return stopped;
  return launch();
}

TestStatus LocalZooKeeper::setSequentialCounter(const std::string& path, int32_t counter) {
  if (auto stopped = stop(); !stopped) return stopped;
  auto result = runCommand(
      {javaBinary(), "-cp", fmt::format("{}:{}", RTABLE_ZK_TOOLS_JAR, RTABLE_ZOOKEEPER_JAR),
       "io.rtable.tools.SetSequentialCounter", dataDir().string(), path, std::to_string(counter)},
      std::chrono::seconds(120));
  if (!result) return std::unexpected(result.error());
  if (result->exit_code != 0) {
    return std::unexpected(fmt::format("SetSequentialCounter {} {} failed (exit {}): {}{}", path,
                                       counter, result->exit_code, result->out, result->err));
  }
  return launch();
}

TestStatus LocalZooKeeper::expireSession(const SessionCredentials& credentials) {
  clientid_t id{};
  id.client_id = credentials.session_id;
  std::memcpy(id.passwd, credentials.password.data(),
              std::min(credentials.password.size(), sizeof(id.passwd)));
  // Attaching moves the session to this connection, and closing it closes the session for every
  // connection. But the owner, cut off by the move, may reconnect and move the session back
  // before the close is sent; the server then refuses the close (session moved) and the session
  // lives on. So: attach again until the server says the session is expired.
  constexpr int kAttempts = 5;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    zhandle_t* handle = zookeeper_init(connectString().c_str(), nullptr, 10000, &id, nullptr, 0);
    if (!handle) return std::unexpected("zookeeper_init failed");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    int state = 0;
    while ((state = zoo_state(handle)) != ZOO_CONNECTED_STATE &&
           state != ZOO_EXPIRED_SESSION_STATE) {
      if (std::chrono::steady_clock::now() > deadline) {
        zookeeper_close(handle);
        return std::unexpected(
            fmt::format("could not attach to session {:#x}", credentials.session_id));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    zookeeper_close(handle);
    if (state == ZOO_EXPIRED_SESSION_STATE) return {};
  }
  return std::unexpected(
      fmt::format("session {:#x} survived {} closes", credentials.session_id, kAttempts));
}

KeeperResult<std::unique_ptr<ZooKeeperClient>> LocalZooKeeper::connect(
    std::chrono::milliseconds session_timeout) const {
  return ZooKeeperClient::connect(
      ZooKeeperConfig{connectString(), session_timeout, std::chrono::seconds(10)});
}

}  // namespace rtable::core::testing
