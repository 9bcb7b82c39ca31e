#include "rtable/replication_core/testing/local_zookeeper.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zookeeper/zookeeper.h>

#include <cerrno>
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
  if (options.run_as_uid) {
    // The server writes its data and its config's dynamic file here as its own uid.
    std::filesystem::permissions(zk->work_dir_, std::filesystem::perms(0755), ec);
    for (const auto& path : {zk->work_dir_, zk->dataDir(), zk->work_dir_ / "conf"}) {
      if (::chown(path.c_str(), *options.run_as_uid, *options.run_as_uid) != 0) {
        return std::unexpected(fmt::format("cannot chown {}: {}", path.string(), strerror(errno)));
      }
    }
  }
  if (options.client_port != 0) {
    // An ensemble member: its ports are the ensemble's; it serves once a quorum runs.
    zk->port_ = options.client_port;
    if (auto written = zk->writeConfig(); !written) return std::unexpected(written.error());
    if (auto launched = zk->launch(/*wait_until_serving=*/false); !launched)
      return std::unexpected(launched.error());
    return zk;
  }
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
  cfg << "tickTime=" << options_.tick_time_ms << "\n"
      << "initLimit=10\nsyncLimit=5\n"
      << "dataDir=" << dataDir().string() << "\n"
      << "clientPort=" << port_ << "\n"
      << "clientPortAddress=127.0.0.1\n"
      << "admin.enableServer=false\n"
      << "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons\n"
      << "maxClientCnxns=0\n";
  for (const auto& line : options_.ensemble_lines) cfg << line << "\n";
  if (!cfg) return std::unexpected("cannot write " + (work_dir_ / "conf" / "zoo.cfg").string());
  if (options_.server_id != 0) {
    std::ofstream myid(dataDir() / "myid");
    myid << options_.server_id << "\n";
    if (!myid) return std::unexpected("cannot write " + (dataDir() / "myid").string());
  }
  return {};
}

TestStatus LocalZooKeeper::launch(bool wait_until_serving) {
  std::vector<std::string> argv = {javaBinary()};
  for (auto& flag : jvmFlags(options_.production_jvm)) argv.push_back(flag);
  argv.insert(argv.end(), {"-cp", serverClassPath(work_dir_ / "conf"),
                           "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                           (work_dir_ / "conf" / "zoo.cfg").string()});
  auto process = Subprocess::start(argv, logFile(), options_.run_as_uid);
  if (!process) return std::unexpected(process.error());
  process_.emplace(std::move(*process));
  if (!wait_until_serving) return {};
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

void LocalZooKeeper::kill9() {
  if (process_) process_->kill();
  process_.reset();
}

TestStatus LocalZooKeeper::restart(bool wait_until_serving) {
  if (auto stopped = stop(); !stopped) return stopped;
  return launch(wait_until_serving);
}

std::expected<std::string, std::string> LocalZooKeeper::fourLetterWord(
    const std::string& word) const {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::unexpected(fmt::format("socket: {}", strerror(errno)));
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port_));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::send(fd, word.data(), word.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(word.size())) {
    const int error = errno;
    ::close(fd);
    return std::unexpected(fmt::format("{} on port {}: {}", word, port_, strerror(error)));
  }
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, n);
  ::close(fd);
  return answer;
}

std::expected<std::string, std::string> LocalZooKeeper::mode() const {
  auto answer = fourLetterWord("srvr");
  if (!answer) return answer;
  const auto at = answer->find("Mode: ");
  if (at == std::string::npos) {
    // "This ZooKeeper instance is not currently serving requests" while it has no quorum.
    return std::unexpected(fmt::format("port {}: {}", port_, answer->substr(0, 200)));
  }
  const auto end = answer->find('\n', at);
  return answer->substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
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

std::expected<std::unique_ptr<LocalZooKeeperEnsemble>, std::string> LocalZooKeeperEnsemble::start(
    LocalZooKeeperEnsembleOptions options) {
  std::unique_ptr<LocalZooKeeperEnsemble> ensemble(new LocalZooKeeperEnsemble());
  std::string pattern =
      (std::filesystem::temp_directory_path() / "rtable-zk-ensemble-XXXXXX").string();
  if (!mkdtemp(pattern.data())) return std::unexpected("mkdtemp failed for " + pattern);
  ensemble->work_dir_ = pattern;
  std::error_code ec;
  // Members running as their own uids reach their folders through this one.
  std::filesystem::permissions(ensemble->work_dir_, std::filesystem::perms(0755), ec);
  std::vector<int> client_ports;
  std::vector<std::string> lines;
  for (int i = 0; i < options.servers; ++i) {
    std::vector<int> ports;
    for (int k = 0; k < 3; ++k) {
      auto port = findFreeLoopbackPort();
      if (!port) return std::unexpected(port.error());
      ports.push_back(*port);
    }
    client_ports.push_back(ports[0]);
    ensemble->peer_ports_.push_back({ports[1], ports[2]});
    lines.push_back(fmt::format("server.{}=127.0.0.1:{}:{}", i + 1, ports[1], ports[2]));
  }
  for (int i = 0; i < options.servers; ++i) {
    LocalZooKeeperOptions member;
    member.work_dir = ensemble->work_dir_ / fmt::format("zk{}", i + 1);
    member.tick_time_ms = options.tick_time_ms;
    if (static_cast<std::size_t>(i) < options.uids.size()) member.run_as_uid = options.uids[i];
    member.server_id = i + 1;
    member.ensemble_lines = lines;
    member.client_port = client_ports[i];
    auto server = LocalZooKeeper::start(member);
    if (!server) return std::unexpected(server.error());
    ensemble->servers_.push_back(std::move(*server));
  }
  if (auto leader = ensemble->waitUntilServing(kStartTimeout); !leader)
    return std::unexpected(leader.error());
  return ensemble;
}

LocalZooKeeperEnsemble::~LocalZooKeeperEnsemble() {
  servers_.clear();
  if (!std::getenv("RTABLE_KEEP_TEST_DIRS")) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
}

std::string LocalZooKeeperEnsemble::connectString() const {
  std::string connect;
  for (const auto& server : servers_) {
    connect += (connect.empty() ? "" : ",") + server->connectString();
  }
  return connect;
}

std::expected<std::size_t, std::string> LocalZooKeeperEnsemble::waitUntilServing(
    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::optional<std::size_t> leader;
    bool all = true;
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      if (!servers_[i]->running()) continue;
      auto mode = servers_[i]->mode();
      if (!mode || (*mode != "leader" && *mode != "follower")) all = false;
      if (mode && *mode == "leader") leader = i;
    }
    if (all && leader) {
      // Serving by srvr is not yet taking sessions everywhere: one session through the lot.
      if (connect(std::chrono::seconds(4))) return *leader;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return std::unexpected(fmt::format("the ZooKeeper ensemble does not serve after {} ms: {}",
                                         timeout.count(), describe()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string LocalZooKeeperEnsemble::describe() const {
  std::string text;
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    auto mode = servers_[i]->mode();
    text += fmt::format("{}server {} ({}): {}", text.empty() ? "" : "; ", i + 1,
                        servers_[i]->connectString(), mode ? *mode : mode.error());
  }
  return text;
}

KeeperResult<std::unique_ptr<ZooKeeperClient>> LocalZooKeeperEnsemble::connect(
    std::chrono::milliseconds session_timeout) const {
  return ZooKeeperClient::connect(
      ZooKeeperConfig{connectString(), session_timeout, std::chrono::seconds(10)});
}

}  // namespace rtable::core::testing
