// Replication of rtable-core and ClickHouse 18.16 (ReplicatedMergeTree, same schema) side by side
// on one fresh ZooKeeper 3.8, three replicas r1, r2, r3 of one table each, in one run (issue 4):
//   - catch-up: replica 3 stopped, N sequential single-row inserts on replica 1, replica 3 started
//     again; the time from its process launch until it counts all N rows;
//   - fetch throughput: replica 2 stopped, about --fetch-mb MiB of JSONEachRow (long random
//     strings) inserted on replica 1 in a few large inserts; replica 2 started again; the time from
//     its launch until it has every row, and the on-disk bytes of those parts per second.
// Merges are on for both systems (rtable-core always assigns them; ClickHouse with its default
// max_replicated_merges_in_queue = 16). The systems run one after the other, each with only its
// own three servers alive, so neither competes with the other's idle processes.
// Usage: rtable-replication-bench [--inserts N] [--fetch-mb N] [--only rtable|clickhouse]
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "rtable/replication_core/testing/local_clickhouse.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace {

using namespace rtable::core::testing;
using Clock = std::chrono::steady_clock;

constexpr const char* kTableYaml = R"(table: bench
columns:
  - {name: id, type: UInt64}
  - {name: d, type: Date}
  - {name: user, type: String}
  - {name: value, type: Float64}
  - {name: n, type: Nullable(UInt32)}
partitionBy: toYYYYMM(d)
orderBy: [id])";

constexpr const char* kClickHouseTable =
    "CREATE TABLE default.bench (id UInt64, d Date, user String, value Float64, n "
    "Nullable(UInt32)) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/01/bench', '{replica}') "
    "PARTITION BY toYYYYMM(d) ORDER BY id";

// The fetch phase's rows go to partitions 202701..202703, apart from the catch-up rows (2026).
constexpr const char* kFetchPartitionPrefix = "2027";
constexpr std::size_t kFetchStringLength = 1000;
constexpr double kMiB = 1024.0 * 1024.0;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The same row as rtable-insert-bench: catch-up inserts.
std::string row(uint64_t id) {
  return fmt::format(R"({{"id":{},"d":"2026-{:02d}-{:02d}","user":"user-{}","value":{},"n":{}}})",
                     id, 10 + id % 3, 1 + id % 28, id % 1000, static_cast<double>(id) * 0.25,
                     id % 5 == 0 ? std::string("null") : std::to_string(id % 100000)) +
         "\n";
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One large insert of the fetch phase: rows with a 1000-character random string (64-letter
// alphabet, 6 bits per byte: LZ4 keeps it whole, zstd gets ~3/4), all in one partition
// (202701 + chunk % 3), so each insert is one part and no partition gets the 6 parts after which
// rtable-core merges. Deterministic: both systems get the same bytes.
std::string fetchChunk(int chunk, std::size_t target_bytes, uint64_t* rows) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string body;
  body.reserve(target_bytes + 2 * kFetchStringLength);
  uint64_t state = 0x5eed0000ULL + static_cast<uint64_t>(chunk);
  const int month = 1 + chunk % 3;
  std::string user(kFetchStringLength, ' ');
  *rows = 0;
  for (uint64_t id = 100'000'000ULL + static_cast<uint64_t>(chunk) * 10'000'000ULL;
       body.size() < target_bytes; ++id) {
    for (std::size_t i = 0; i < user.size();) {
      uint64_t bits = splitmix64(state);
      for (int k = 0; k < 10 && i < user.size(); ++k, bits >>= 6) user[i++] = kAlphabet[bits & 63];
    }
    body += fmt::format(R"({{"id":{},"d":"2027-{:02d}-{:02d}","user":"{}","value":{},"n":{}}})", id,
                        month, 1 + id % 28, user, static_cast<double>(id) * 0.5,
                        id % 7 == 0 ? std::string("null") : std::to_string(id % 1000000));
    body += '\n';
    ++*rows;
  }
  return body;
}

struct Reply {
  int status = 0;
  std::string body;
};

// A keep-alive HTTP/1.1 client that sends each request in one write with TCP_NODELAY (as in
// rtable-insert-bench); reconnects on the next request after a failure (a restarted server).
class KeepAliveClient {
 public:
  KeepAliveClient(std::string name, int port) : name_(std::move(name)), port_(port) {}
  KeepAliveClient(KeepAliveClient&& other) noexcept
      : name_(std::move(other.name_)),
        port_(other.port_),
        fd_(other.fd_),
        buffer_(std::move(other.buffer_)) {
    other.fd_ = -1;
  }
  ~KeepAliveClient() {
    if (fd_ >= 0) close(fd_);
  }

  // Quiet: a refused connection is expected while a server starts. A kept-alive connection that
  // the server has closed meanwhile (ClickHouse after keep_alive_timeout, 3 s) is opened again
  // and the request sent once more, before any of an answer has arrived.
  std::optional<Reply> request(const std::string& method, const std::string& target,
                               const std::string& body = "") {
    const bool reused = fd_ >= 0;
    bool answered = false;
    auto reply = attempt(method, target, body, &answered);
    if (!reply && reused && !answered) reply = attempt(method, target, body, &answered);
    return reply;
  }

  // A request that must answer 200; otherwise says why on stderr.
  std::optional<std::string> ok(const std::string& method, const std::string& target,
                                const std::string& body = "") {
    auto reply = request(method, target, body);
    if (!reply) {
      fmt::print(stderr, "{}: {} {}: no answer\n", name_, method, target.substr(0, 80));
      return std::nullopt;
    }
    if (reply->status != 200) {
      fmt::print(stderr, "{}: {} {}: HTTP {} {}\n", name_, method, target.substr(0, 80),
                 reply->status, reply->body.substr(0, 500));
      return std::nullopt;
    }
    return std::move(reply->body);
  }

 private:
  std::optional<Reply> attempt(const std::string& method, const std::string& target,
                               const std::string& body, bool* answered) {
    if (fd_ < 0 && !connectSocket()) return std::nullopt;
    std::string request = fmt::format(
        "{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
        method, target, body.size());
    request += body;
    for (std::size_t sent = 0; sent < request.size();) {
      const ssize_t n = send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return fail();
      sent += static_cast<std::size_t>(n);
    }
    std::size_t header_end;
    while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!readMore()) return fail();
      *answered = true;
    }
    const std::string headers = buffer_.substr(0, header_end);
    buffer_.erase(0, header_end + 4);
    Reply reply;
    std::sscanf(headers.c_str(), "HTTP/1.%*d %d", &reply.status);
    std::string lower = headers;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (auto at = lower.find("content-length:"); at != std::string::npos) {
      const std::size_t length = std::stoul(lower.substr(at + 15));
      while (buffer_.size() < length) {
        if (!readMore()) return fail();
      }
      reply.body = buffer_.substr(0, length);
      buffer_.erase(0, length);
    } else if (lower.find("transfer-encoding: chunked") != std::string::npos) {
      for (;;) {
        std::size_t line_end;
        while ((line_end = buffer_.find("\r\n")) == std::string::npos) {
          if (!readMore()) return fail();
        }
        const std::size_t size = std::stoul(buffer_.substr(0, line_end), nullptr, 16);
        while (buffer_.size() < line_end + 2 + size + 2) {
          if (!readMore()) return fail();
        }
        reply.body += buffer_.substr(line_end + 2, size);
        buffer_.erase(0, line_end + 2 + size + 2);
        if (size == 0) break;
      }
    }
    if (lower.find("connection: close") != std::string::npos) fail();
    return reply;
  }
  bool connectSocket() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval timeout{600, 0};  // a server that hangs fails the request instead of the whole run
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return true;
    fail();
    return false;
  }
  bool readMore() {
    char chunk[65536];
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<std::size_t>(n));
    return true;
  }
  std::nullopt_t fail() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    buffer_.clear();
    return std::nullopt;
  }

  std::string name_;
  int port_;
  int fd_ = -1;
  std::string buffer_;
};

struct PartsSummary {
  std::size_t parts = 0;
  uint64_t bytes = 0;  // on disk
  uint64_t rows = 0;
};

// Three replicas of the table, 0-based index = replica r1..r3.
class System {
 public:
  virtual ~System() = default;
  virtual std::string name() const = 0;
  virtual TestStatus stop(int i) = 0;
  virtual TestStatus launch(int i) = 0;
  virtual KeepAliveClient client(int i) const = 0;
  virtual bool insert(KeepAliveClient& c, const std::string& body) = 0;
  // Rows in active parts, from metadata only (cheap enough to poll every 20 ms).
  virtual std::optional<uint64_t> rows(KeepAliveClient& c) = 0;
  // The query a user would run; for checking at the end.
  virtual std::optional<uint64_t> count(KeepAliveClient& c) = 0;
  virtual std::optional<PartsSummary> parts(KeepAliveClient& c,
                                            const std::string& partition_prefix) = 0;
  // Parts fetched and merges executed by replica i since its process started.
  virtual std::optional<std::pair<uint64_t, uint64_t>> fetchesAndMerges(int i,
                                                                        KeepAliveClient& c) = 0;
  virtual std::filesystem::path logFile(int i) const = 0;
  // What marks, in the log, a replica that starts by cloning another (it had been marked lost).
  virtual std::string cloneMessage() const = 0;
};

uint64_t fileSize(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

// Whether `text` was written to the file after it had `offset` bytes (from the start if it was
// rotated since).
bool loggedSince(const std::filesystem::path& path, uint64_t offset, const std::string& text) {
  std::ifstream in(path);
  if (fileSize(path) >= offset) in.seekg(static_cast<std::streamoff>(offset));
  std::stringstream tail;
  tail << in.rdbuf();
  return tail.str().find(text) != std::string::npos;
}

class RtableSystem : public System {
 public:
  static std::expected<std::unique_ptr<RtableSystem>, std::string> start(const LocalZooKeeper& zk) {
    std::unique_ptr<RtableSystem> system(new RtableSystem());
    for (int i = 0; i < 3; ++i) {
      LocalReplicaOptions options;
      options.binary = RTABLE_CORE_BINARY;
      options.replica = fmt::format("r{}", i + 1);
      options.work_dir = zk.workDir() / ("rtable-" + options.replica);
      options.table_yaml = kTableYaml;
      options.zookeeper = zk.connectString();
      options.session_timeout_ms = 10000;
      system->dirs_.push_back(options.work_dir);
      auto replica = LocalReplica::start(options);
      if (!replica) return std::unexpected(replica.error());
      system->replicas_.push_back(std::move(*replica));
    }
    return system;
  }
  ~RtableSystem() override {
    replicas_.clear();
    for (const auto& dir : dirs_) {
      std::error_code ec;
      if (!std::getenv("RTABLE_KEEP_TEST_DIRS")) std::filesystem::remove_all(dir, ec);
    }
  }
  std::string name() const override { return "rtable-core"; }
  TestStatus stop(int i) override {
    const int code = replicas_[i]->terminate();
    if (code != 0)
      return std::unexpected(fmt::format("rtable-core r{} exited with {}", i + 1, code));
    return {};
  }
  TestStatus launch(int i) override { return replicas_[i]->launch(std::chrono::minutes(10)); }
  KeepAliveClient client(int i) const override {
    return KeepAliveClient(fmt::format("rtable-core r{}", i + 1), replicas_[i]->httpPort());
  }
  bool insert(KeepAliveClient& c, const std::string& body) override {
    return c.ok("POST", "/insert?format=JSONEachRow", body).has_value();
  }
  std::optional<uint64_t> rows(KeepAliveClient& c) override {
    auto reply = c.request("GET", "/count");
    if (!reply || reply->status != 200) return std::nullopt;
    return nlohmann::json::parse(reply->body, nullptr, false).value("rows", uint64_t{0});
  }
  std::optional<uint64_t> count(KeepAliveClient& c) override { return rows(c); }
  std::optional<PartsSummary> parts(KeepAliveClient& c, const std::string& prefix) override {
    auto body = c.ok("GET", "/parts");
    if (!body) return std::nullopt;
    PartsSummary summary;
    for (const auto& part : nlohmann::json::parse(*body)) {
      if (!part["partition"].get<std::string>().starts_with(prefix)) continue;
      ++summary.parts;
      summary.bytes += part["bytes"].get<uint64_t>();
      summary.rows += part["rows"].get<uint64_t>();
    }
    return summary;
  }
  std::optional<std::pair<uint64_t, uint64_t>> fetchesAndMerges(int i, KeepAliveClient&) override {
    auto reply = replicas_[i]->metrics();
    if (!reply || reply->status != 200) return std::nullopt;
    auto value = [&](const std::string& name) -> uint64_t {
      std::istringstream lines(reply->body);
      for (std::string line; std::getline(lines, line);) {
        if (line.starts_with(name + "{") || line.starts_with(name + " ")) {
          return static_cast<uint64_t>(std::stod(line.substr(line.rfind(' ') + 1)));
        }
      }
      return 0;
    };
    return std::make_pair(value("rtable_fetches_total"), value("rtable_merges_total"));
  }
  std::filesystem::path logFile(int i) const override { return replicas_[i]->logFile(); }
  std::string cloneMessage() const override { return " cloned "; }

 private:
  RtableSystem() = default;
  std::vector<std::filesystem::path> dirs_;
  std::vector<std::unique_ptr<LocalReplica>> replicas_;
};

class ClickHouseSystem : public System {
 public:
  static std::expected<std::unique_ptr<ClickHouseSystem>, std::string> start(
      const LocalZooKeeper& zk) {
    std::unique_ptr<ClickHouseSystem> system(new ClickHouseSystem());
    for (int i = 0; i < 3; ++i) {
      LocalClickHouseOptions options;
      options.zookeeper_host = "127.0.0.1";
      options.zookeeper_port = zk.port();
      options.replica = fmt::format("r{}", i + 1);
      options.assign_merges = true;
      auto server = LocalClickHouse::start(options);
      if (!server) return std::unexpected(server.error());
      if (auto created = (*server)->query(kClickHouseTable); !created)
        return std::unexpected(created.error());
      system->servers_.push_back(std::move(*server));
    }
    // 18.16's system.parts: bytes_on_disk (newer) or bytes.
    auto columns = system->servers_[0]->query(
        "SELECT name FROM system.columns WHERE database = 'system' AND table = 'parts' AND name = "
        "'bytes_on_disk'");
    system->bytes_column_ =
        columns && columns->find("bytes_on_disk") != std::string::npos ? "bytes_on_disk" : "bytes";
    return system;
  }
  std::string name() const override { return "ClickHouse 18.16"; }
  TestStatus stop(int i) override {
    const int code = servers_[i]->terminate();
    if (code != 0)
      return std::unexpected(fmt::format("clickhouse-server r{} exited with {}", i + 1, code));
    return {};
  }
  TestStatus launch(int i) override { return servers_[i]->launch(std::chrono::minutes(10)); }
  KeepAliveClient client(int i) const override {
    return KeepAliveClient(fmt::format("ClickHouse r{}", i + 1), servers_[i]->httpPort());
  }
  bool insert(KeepAliveClient& c, const std::string& body) override {
    return c.ok("POST", "/?query=INSERT%20INTO%20default.bench%20FORMAT%20JSONEachRow", body)
        .has_value();
  }
  // 18.16 has no trivial-count optimisation: SELECT count() reads a column of every part, which
  // polled every 20 ms would load the server it measures; system.parts is metadata.
  std::optional<uint64_t> rows(KeepAliveClient& c) override {
    return number(c,
                  "SELECT sum(rows) FROM system.parts WHERE database = 'default' AND table = "
                  "'bench' AND active");
  }
  std::optional<uint64_t> count(KeepAliveClient& c) override {
    return number(c, "SELECT count() FROM default.bench");
  }
  std::optional<PartsSummary> parts(KeepAliveClient& c, const std::string& prefix) override {
    auto reply = c.request("POST", "/",
                           fmt::format("SELECT count(), sum({}), sum(rows) FROM system.parts WHERE "
                                       "database = 'default' AND table = 'bench' AND active AND "
                                       "startsWith(partition_id, '{}') FORMAT TSV",
                                       bytes_column_, prefix));
    if (!reply || reply->status != 200) {
      if (reply) fmt::print(stderr, "ClickHouse parts: {}\n", reply->body);
      return std::nullopt;
    }
    PartsSummary summary;
    std::istringstream in(reply->body);
    in >> summary.parts >> summary.bytes >> summary.rows;
    return summary;
  }
  std::optional<std::pair<uint64_t, uint64_t>> fetchesAndMerges(int, KeepAliveClient& c) override {
    auto fetches =
        number(c, "SELECT sum(value) FROM system.events WHERE event = 'ReplicatedPartFetches'");
    auto merges =
        number(c, "SELECT sum(value) FROM system.events WHERE event = 'ReplicatedPartMerges'");
    if (!fetches || !merges) return std::nullopt;
    return std::make_pair(*fetches, *merges);
  }
  std::filesystem::path logFile(int i) const override { return servers_[i]->logFile(); }
  std::string cloneMessage() const override { return "Will mimic "; }

 private:
  ClickHouseSystem() = default;
  static std::optional<uint64_t> number(KeepAliveClient& c, const std::string& sql) {
    auto reply = c.request("POST", "/", sql);
    if (!reply || reply->status != 200 || reply->body.empty()) return std::nullopt;
    return std::stoull(reply->body);
  }
  std::string bytes_column_ = "bytes_on_disk";
  std::vector<std::unique_ptr<LocalClickHouse>> servers_;
};

struct Results {
  bool ran = false;
  bool ok = false;
  // catch-up
  int inserts = 0;
  double inserts_s = 0;
  double catchup_ready_s = 0;
  double catchup_s = 0;
  bool catchup_cloned = false;
  PartsSummary catchup_source;  // r1's parts in the catch-up partitions when r3 starts
  std::pair<uint64_t, uint64_t> catchup_work;  // r3's fetches and merges until it had every row
  // fetch
  uint64_t fetch_input_bytes = 0;
  uint64_t fetch_rows = 0;
  int fetch_inserts = 0;
  double fetch_insert_s = 0;
  PartsSummary source;   // replica 1's fetch-phase parts before replica 2 starts
  PartsSummary fetched;  // replica 2's once it has every row
  double fetch_ready_s = 0;
  double fetch_s = 0;
  bool fetch_cloned = false;
  std::string error;
};

// Launches replica i and measures, from the moment of the launch, when it has `expected` rows. A
// thread polls the count every 20 ms from the start, so the servers' readiness checks (rtable's
// /readyz every 50 ms, ClickHouse's SELECT 1 through clickhouse-client) do not delay the figure.
struct CatchUp {
  bool ok = false;
  double ready_s = 0;
  double all_rows_s = 0;
  bool cloned = false;  // it had been marked lost and started by cloning another replica
  std::string error;
};

CatchUp launchAndWait(System& system, int i, uint64_t expected, std::chrono::seconds timeout) {
  CatchUp result;
  const uint64_t log_offset = fileSize(system.logFile(i));
  std::atomic<bool> give_up{false};
  std::optional<double> done_s;
  std::optional<uint64_t> last;
  const auto start = Clock::now();
  std::thread poller([&] {
    KeepAliveClient c = system.client(i);
    while (!give_up && Clock::now() - start < timeout) {
      if (auto n = system.rows(c)) {
        last = n;
        if (*n >= expected) {
          done_s = secondsSince(start);
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto launched = system.launch(i);
  result.ready_s = secondsSince(start);
  if (!launched) {
    give_up = true;
    poller.join();
    result.error = launched.error();
    return result;
  }
  poller.join();
  if (!done_s) {
    result.error = fmt::format("replica r{} had {} of {} rows after {} s", i + 1, last.value_or(0),
                               expected, timeout.count());
    return result;
  }
  if (*last != expected)
    fmt::print(stderr, "{} r{}: {} rows, expected {}\n", system.name(), i + 1, *last, expected);
  result.ok = true;
  result.all_rows_s = *done_s;
  result.cloned = loggedSince(system.logFile(i), log_offset, system.cloneMessage());
  return result;
}

// The replicas' ports come from the kernel's ephemeral range (findFreeLoopbackPort), so while a
// replica is down another process's outgoing connection on this shared machine can hold its port
// (seen once: "bind: Address already in use"). Then the launch is tried again, up to three times,
// and the figure is the successful launch's.
CatchUp relaunchAndWait(System& system, int i, uint64_t expected, std::chrono::seconds timeout) {
  for (int attempt = 1;; ++attempt) {
    CatchUp result = launchAndWait(system, i, expected, timeout);
    if (result.ok || attempt == 4 ||
        result.error.find("ddress already in use") == std::string::npos)
      return result;
    fmt::print(stderr, "{} r{}: its port is taken, launching again in 2 s\n", system.name(), i + 1);
    if (auto stopped = system.stop(i); !stopped) fmt::print(stderr, "{}\n", stopped.error());
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
}

// Waits until replica i has `expected` rows (r3 following r1 before the fetch phase).
bool waitForRows(System& system, int i, uint64_t expected, std::chrono::seconds timeout) {
  KeepAliveClient c = system.client(i);
  const auto start = Clock::now();
  while (Clock::now() - start < timeout) {
    if (auto n = system.rows(c); n && *n >= expected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

Results run(System& system, int inserts, uint64_t fetch_bytes) {
  Results r;
  r.ran = true;
  auto fail = [&](std::string error) {
    fmt::print(stderr, "{}: {}\n", system.name(), error);
    r.error = std::move(error);
    return r;
  };
  std::vector<KeepAliveClient> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(system.client(i));

  // 1. Catch-up.
  fmt::print("{}: stopping r3, {} single-row inserts on r1\n", system.name(), inserts);
  std::fflush(stdout);
  if (auto stopped = system.stop(2); !stopped) return fail(stopped.error());
  const auto insert_start = Clock::now();
  for (int i = 0; i < inserts; ++i) {
    if (!system.insert(clients[0], row(static_cast<uint64_t>(i))))
      return fail(fmt::format("insert {} failed", i));
  }
  r.inserts = inserts;
  r.inserts_s = secondsSince(insert_start);
  auto total = system.rows(clients[0]);
  if (!total) return fail("no count from r1");
  r.catchup_source = system.parts(clients[0], "2026").value_or(PartsSummary{});
  fmt::print("{}: inserts took {:.2f} s; r1 has {} rows in {} parts; starting r3\n", system.name(),
             r.inserts_s, *total, r.catchup_source.parts);
  std::fflush(stdout);
  const CatchUp catchup = relaunchAndWait(system, 2, *total, std::chrono::seconds(900));
  if (!catchup.ok) return fail("catch-up: " + catchup.error);
  r.catchup_ready_s = catchup.ready_s;
  r.catchup_s = catchup.all_rows_s;
  r.catchup_cloned = catchup.cloned;
  r.catchup_work =
      system.fetchesAndMerges(2, clients[2]).value_or(std::make_pair(uint64_t{0}, uint64_t{0}));
  fmt::print("{}: r3 ready after {:.2f} s, all {} rows after {:.2f} s ({} fetches, {} merges){}\n",
             system.name(), r.catchup_ready_s, *total, r.catchup_s, r.catchup_work.first,
             r.catchup_work.second,
             r.catchup_cloned ? " (it had been marked lost and cloned another replica)" : "");
  std::fflush(stdout);

  // 2. Fetch throughput.
  if (auto stopped = system.stop(1); !stopped) return fail(stopped.error());
  r.fetch_inserts = std::max<int>(
      3, static_cast<int>((fetch_bytes + 192 * 1024 * 1024 - 1) / (192 * 1024 * 1024)));
  const std::size_t chunk_bytes = fetch_bytes / static_cast<uint64_t>(r.fetch_inserts);
  fmt::print("{}: r2 stopped; {} inserts of {:.0f} MiB on r1\n", system.name(), r.fetch_inserts,
             chunk_bytes / kMiB);
  std::fflush(stdout);
  for (int chunk = 0; chunk < r.fetch_inserts; ++chunk) {
    uint64_t rows = 0;
    const std::string body = fetchChunk(chunk, chunk_bytes, &rows);
    const auto start = Clock::now();
    if (!system.insert(clients[0], body)) return fail(fmt::format("large insert {} failed", chunk));
    r.fetch_insert_s += secondsSince(start);
    r.fetch_input_bytes += body.size();
    r.fetch_rows += rows;
  }
  total = system.rows(clients[0]);
  if (!total) return fail("no count from r1");
  // r3 is live and follows (a second source for r2, the same on both systems); wait for it so
  // that its fetches are not part of r2's time.
  if (!waitForRows(system, 2, *total, std::chrono::seconds(1800)))
    return fail("r3 did not follow r1");
  auto source = system.parts(clients[0], kFetchPartitionPrefix);
  if (!source) return fail("no parts from r1");
  r.source = *source;
  fmt::print(
      "{}: r1 has {} parts, {:.1f} MiB on disk, {} rows in the fetch partitions (inserts took "
      "{:.1f} s); "
      "starting r2\n",
      system.name(), r.source.parts, r.source.bytes / kMiB, r.source.rows, r.fetch_insert_s);
  std::fflush(stdout);
  const CatchUp fetch = relaunchAndWait(system, 1, *total, std::chrono::seconds(3600));
  if (!fetch.ok) return fail("fetch: " + fetch.error);
  r.fetch_ready_s = fetch.ready_s;
  r.fetch_s = fetch.all_rows_s;
  r.fetch_cloned = fetch.cloned;
  auto fetched = system.parts(clients[1], kFetchPartitionPrefix);
  if (!fetched) return fail("no parts from r2");
  r.fetched = *fetched;
  fmt::print(
      "{}: r2 ready after {:.2f} s, all rows after {:.2f} s: {} parts, {:.1f} MiB on disk{}\n",
      system.name(), r.fetch_ready_s, r.fetch_s, r.fetched.parts, r.fetched.bytes / kMiB,
      r.fetch_cloned ? " (it had been marked lost and cloned)" : "");
  // The count a user would see, on every replica.
  for (int i = 0; i < 3; ++i) {
    auto n = system.count(clients[i]);
    if (!n || *n != *total)
      return fail(fmt::format("r{} counts {} rows, r1 has {}", i + 1, n.value_or(0), *total));
  }
  r.ok = true;
  return r;
}

std::string cell(const Results& r, double value, const char* format) {
  if (!r.ran) return "-";
  if (!r.ok && value == 0) return "failed";
  return fmt::format(fmt::runtime(format), value);
}

std::string ratio(const Results& a, const Results& b, double x, double y) {
  if (!a.ok || !b.ok || y == 0) return "-";
  return fmt::format("{:.2f}x", x / y);
}

}  // namespace

int main(int argc, char** argv) {
  int inserts = 1000;
  uint64_t fetch_mb = 1024;
  std::string only;
  std::string command = "rtable-replication-bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  constexpr const char* kUsage =
      "usage: rtable-replication-bench [--inserts N] [--fetch-mb N] [--only rtable|clickhouse]\n";
  if (rtable::bench::wantsHelp(argc, argv)) return fmt::print("{}", kUsage), 0;
  std::string refused;
  if (auto paired = rtable::bench::pairedFlags(argc, argv); !paired) refused = paired.error();
  for (int i = 1; refused.empty() && i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    auto number = [&](int64_t min, int64_t max) {
      return rtable::bench::wholeNumber(flag, argv[i + 1], min, max);
    };
    std::expected<int64_t, std::string> value;
    if (flag == "--inserts") {
      if ((value = number(1, 10'000'000))) inserts = static_cast<int>(*value);
    } else if (flag == "--fetch-mb") {
      if ((value = number(1, 1'000'000))) fetch_mb = static_cast<uint64_t>(*value);
    } else if (flag == "--only") {
      only = argv[i + 1];
      if (only != "rtable" && only != "clickhouse")
        refused = fmt::format("--only: expected rtable or clickhouse, got '{}'", only);
    } else {
      refused = "unknown flag " + flag;
    }
    if (!value) refused = value.error();
  }
  if (!refused.empty()) {
    fmt::print(stderr, "rtable-replication-bench: {}\n{}", refused, kUsage);
    return 2;
  }
  fmt::print("{}\n", command);
  std::fflush(stdout);
  rtable::core::ZooKeeperClient::silenceLibraryLog();
  auto zk = LocalZooKeeper::start();
  if (!zk) return fmt::print(stderr, "{}\n", zk.error()), 1;

  Results rt, ch;
  const uint64_t fetch_bytes = fetch_mb * 1024 * 1024;
  if (only.empty() || only == "rtable") {
    auto system = RtableSystem::start(**zk);
    if (!system) return fmt::print(stderr, "{}\n", system.error()), 1;
    rt = run(**system, inserts, fetch_bytes);
  }
  if (only.empty() || only == "clickhouse") {
    auto system = ClickHouseSystem::start(**zk);
    if (!system) return fmt::print(stderr, "{}\n", system.error()), 1;
    ch = run(**system, inserts, fetch_bytes);
  }

  const Results& any = rt.fetch_inserts > 0 ? rt : ch;
  fmt::print("\n{}\n\n", command);
  fmt::print("| measure | rtable-core | ClickHouse 18.16 | ratio (>= 1.00x: rtable no slower) |\n");
  fmt::print("| --- | ---: | ---: | ---: |\n");
  fmt::print("| {} single-row inserts on r1 with r3 down, s | {} | {} | |\n", inserts,
             cell(rt, rt.inserts_s, "{:.2f}"), cell(ch, ch.inserts_s, "{:.2f}"));
  fmt::print("| catch-up: r3 launch to all {} rows, s | {} | {} | {} |\n", inserts,
             cell(rt, rt.catchup_s, "{:.2f}"), cell(ch, ch.catchup_s, "{:.2f}"),
             ratio(rt, ch, ch.catchup_s, rt.catchup_s));
  fmt::print("| (r3 launch to ready, s) | {} | {} | |\n", cell(rt, rt.catchup_ready_s, "{:.2f}"),
             cell(ch, ch.catchup_ready_s, "{:.2f}"));
  fmt::print("| (r1's parts when r3 starts) | {} | {} | |\n",
             cell(rt, static_cast<double>(rt.catchup_source.parts), "{:.0f}"),
             cell(ch, static_cast<double>(ch.catchup_source.parts), "{:.0f}"));
  fmt::print("| (r3's fetches, merges by then) | {} | {} | |\n",
             rt.ran ? fmt::format("{}, {}", rt.catchup_work.first, rt.catchup_work.second) : "-",
             ch.ran ? fmt::format("{}, {}", ch.catchup_work.first, ch.catchup_work.second) : "-");
  fmt::print("| (r3 marked lost and cloned) | {} | {} | |\n",
             rt.ran ? (rt.catchup_cloned ? "yes" : "no") : "-",
             ch.ran ? (ch.catchup_cloned ? "yes" : "no") : "-");
  fmt::print("| fetch set: {} inserts, {} rows, {:.0f} MiB of JSON; parts on r1 | {} | {} | |\n",
             any.fetch_inserts, any.fetch_rows, any.fetch_input_bytes / kMiB,
             cell(rt, static_cast<double>(rt.source.parts), "{:.0f}"),
             cell(ch, static_cast<double>(ch.source.parts), "{:.0f}"));
  fmt::print("| fetch set on disk on r1, MiB | {} | {} | |\n",
             cell(rt, rt.source.bytes / kMiB, "{:.1f}"),
             cell(ch, ch.source.bytes / kMiB, "{:.1f}"));
  fmt::print("| fetch: r2 launch to all rows, s | {} | {} | {} |\n", cell(rt, rt.fetch_s, "{:.2f}"),
             cell(ch, ch.fetch_s, "{:.2f}"), ratio(rt, ch, ch.fetch_s, rt.fetch_s));
  fmt::print("| (r2 launch to ready, s) | {} | {} | |\n", cell(rt, rt.fetch_ready_s, "{:.2f}"),
             cell(ch, ch.fetch_ready_s, "{:.2f}"));
  fmt::print("| fetch throughput, MiB/s (r1's on-disk MiB / time) | {} | {} | {} |\n",
             cell(rt, rt.fetch_s > 0 ? rt.source.bytes / kMiB / rt.fetch_s : 0, "{:.1f}"),
             cell(ch, ch.fetch_s > 0 ? ch.source.bytes / kMiB / ch.fetch_s : 0, "{:.1f}"),
             ratio(rt, ch, rt.fetch_s > 0 ? rt.source.bytes / rt.fetch_s : 0,
                   ch.fetch_s > 0 ? ch.source.bytes / ch.fetch_s : 0));
  fmt::print("| fetch throughput, JSON MiB/s (same input for both) | {} | {} | {} |\n",
             cell(rt, rt.fetch_s > 0 ? rt.fetch_input_bytes / kMiB / rt.fetch_s : 0, "{:.1f}"),
             cell(ch, ch.fetch_s > 0 ? ch.fetch_input_bytes / kMiB / ch.fetch_s : 0, "{:.1f}"),
             ratio(rt, ch, ch.fetch_s, rt.fetch_s));
  fmt::print("| r2 after: parts, MiB on disk in the fetch partitions | {} | {} | |\n",
             rt.ran ? fmt::format("{}, {:.1f}", rt.fetched.parts, rt.fetched.bytes / kMiB) : "-",
             ch.ran ? fmt::format("{}, {:.1f}", ch.fetched.parts, ch.fetched.bytes / kMiB) : "-");
  fmt::print("| (r2 marked lost and cloned) | {} | {} | |\n",
             rt.ran ? (rt.fetch_cloned ? "yes" : "no") : "-",
             ch.ran ? (ch.fetch_cloned ? "yes" : "no") : "-");
  const bool ok = (!rt.ran || rt.ok) && (!ch.ran || ch.ok);
  if (!ok) fmt::print("\nfailed: {} {}\n", rt.error, ch.error);
  return ok ? 0 : 1;
}
