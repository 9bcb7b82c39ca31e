#include "rtable/replication_core/part_exchange.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <thread>

#include "rtable/common/testing/files.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/replication_core/http_api.h"
#include "rtable/replication_core/table_replica.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Kind = FetchError::Kind;
using common::testing::readFile;

constexpr std::string_view kSecret = "shared-by-the-replicas-7f3a";

void flipByte(const fs::path& path, std::size_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  file.get(c);
  file.seekp(static_cast<std::streamoff>(offset));
  file.put(static_cast<char>(c ^ 0x5a));
}

// A blocking loopback socket with a receive timeout, so that a broken server fails the test
// instead of hanging it.
int connectLoopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct RawAnswer {
  int status = 0;
  std::string head;
  std::string body;
  std::size_t content_length = 0;
};

// GET `target` with extra header lines; reads the head and at most `max_body` bytes of the body
// (all of it by default, as Content-Length says), then closes the connection.
std::expected<RawAnswer, std::string> rawGet(uint16_t port, const std::string& target,
                                             const std::string& headers,
                                             std::size_t max_body = SIZE_MAX) {
  const int fd = connectLoopback(port);
  if (fd < 0) return std::unexpected("cannot connect");
  const std::string request = fmt::format(
      "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\n{}Connection: close\r\n\r\n", target, headers);
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return std::unexpected("cannot send");
  }
  std::string raw;
  RawAnswer answer;
  std::size_t head_end = std::string::npos;
  char buffer[65536];
  for (;;) {
    if (head_end != std::string::npos &&
        raw.size() - head_end - 4 >= std::min(answer.content_length, max_body)) {
      break;
    }
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    raw.append(buffer, static_cast<std::size_t>(n));
    if (head_end == std::string::npos && (head_end = raw.find("\r\n\r\n")) != std::string::npos) {
      answer.head = raw.substr(0, head_end);
      std::string lower = answer.head;
      for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const auto at = lower.find("content-length:");
      if (at != std::string::npos) answer.content_length = std::stoul(lower.substr(at + 15));
    }
  }
  ::close(fd);
  if (head_end == std::string::npos) return std::unexpected("no answer");
  std::sscanf(answer.head.c_str(), "HTTP/1.%*d %d", &answer.status);
  answer.body = raw.substr(head_end + 4);
  return answer;
}

// A fake source for what a real one does not do: answers the first connection's request with
// `answer` verbatim, then closes it, or holds it open (saying nothing more) until destroyed.
class ScriptedHttpServer {
 public:
  explicit ScriptedHttpServer(std::string answer, bool hold_open = false)
      : answer_(std::move(answer)), hold_open_(hold_open) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedHttpServer() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }
  // The request the client sent (its head), once it arrived.
  std::string request() const {
    std::lock_guard lock(mu_);
    return request_;
  }

 private:
  bool waitReadable(int fd) {
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }
  void serve() {
    if (!waitReadable(listen_fd_)) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    std::string received;
    char buffer[4096];
    while (received.find("\r\n\r\n") == std::string::npos && waitReadable(fd)) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      received.append(buffer, static_cast<std::size_t>(n));
    }
    {
      std::lock_guard lock(mu_);
      request_ = received;
    }
    ::send(fd, answer_.data(), answer_.size(), MSG_NOSIGNAL);
    if (hold_open_) {
      while (!stop_) std::this_thread::sleep_for(10ms);
    }
    ::close(fd);
  }

  std::string answer_;
  bool hold_open_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::string request_;
  std::thread thread_;
};

std::string okAnswer(std::string_view body, std::size_t content_length) {
  return fmt::format(
      "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n{}",
      content_length, body);
}

// One source replica: a TableReplica on the fake ZooKeeper, its HTTP server on loopback.
class PartExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-exchange-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    fs::create_directories(root_ / "fetched");
    dest_ = root_ / "fetched" / "tmp_fetch_1";
    std::ofstream(root_ / "secret") << kSecret << "\n";
  }
  void TearDown() override {
    server_.reset();
    table_.reset();
    fs::remove_all(root_);
  }

  TableSpec makeSpec(bool with_secret) {
    fs::create_directories(root_ / "source");
    auto spec = TableSpec::parseYaml(fmt::format(
        R"(
table: events
columns: [{{name: d, type: Date}}, {{name: x, type: UInt64}}, {{name: s, type: String}}]
orderBy: [x]
zookeeper: {{connect: fake}}
replica: {{name: source}}
dataDir: {}
{}
)",
        (root_ / "source").string(),
        with_secret ? fmt::format("replication: {{secretFile: {}}}", (root_ / "secret").string())
                    : ""));
    EXPECT_TRUE(spec) << spec.error();
    return *spec;
  }

  void startSource(bool with_secret = true, std::size_t workers = 2) {
    spec_ = makeSpec(with_secret);
    TableReplicaOptions options;
    options.background = false;
    options.parts.checkpoint_interval = 0ms;  // a background round writes held parts out
    if (!hold_parts_in_memory_) options.parts.journal_part_bytes = 0;
    auto server = keeper_;
    auto opened = TableReplica::open(
        spec_, [server]() -> KeeperResult<std::unique_ptr<Keeper>> { return server->connect(); },
        registry_, options);
    ASSERT_TRUE(opened) << opened.error();
    table_ = std::move(*opened);
    // findFreeLoopbackPort may race with another process taking the port: a few tries.
    for (int attempt = 0; attempt < 5 && !server_; ++attempt) {
      auto port = common::testing::findFreeLoopbackPort();
      ASSERT_TRUE(port) << port.error();
      auto started =
          ReplicaHttpServer::start(*table_, "127.0.0.1", static_cast<uint16_t>(*port), workers);
      if (started) {
        server_ = std::move(*started);
        port_ = static_cast<uint16_t>(*port);
      }
    }
    ASSERT_TRUE(server_);
  }

  // Inserts `rows` rows in one part; with `random_bytes`, strings of that many random bytes,
  // which zstd cannot shrink, so that the part has megabytes on the wire.
  DataPartPtr insertPart(std::size_t rows, std::size_t random_bytes = 0) {
    Block block = spec_.schema.emptyBlock();
    std::mt19937_64 random(rows);
    for (std::size_t i = 0; i < rows; ++i) {
      std::get<std::vector<uint16_t>>(block.columns[0].values).push_back(*parseDate("2026-12-01"));
      std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(random());
      std::string s = fmt::format("v{}", i);
      if (random_bytes > 0) {
        s.resize(random_bytes);
        for (auto& c : s) c = static_cast<char>(random());
      }
      std::get<std::vector<std::string>>(block.columns[2].values).push_back(std::move(s));
    }
    auto pending = table_->beginInsert({});
    EXPECT_TRUE(pending->add(std::move(block)));
    auto committed = table_->commit(*pending);
    EXPECT_TRUE(committed) << committed.error().message;
    if (!committed || committed->parts.size() != 1) return nullptr;
    for (const auto& part : table_->activeParts()) {
      if (part->name.format() == committed->parts[0]) return part;
    }
    return nullptr;
  }

  FetchSource source() const { return FetchSource{"source", "127.0.0.1", port_}; }

  std::expected<PartChecksums, FetchError> fetch(const std::string& part,
                                                 std::string_view secret = kSecret,
                                                 std::chrono::milliseconds timeout = 20s) {
    return fetchPart(source(), std::string(secret), part, dest_, spec_.schema,
                     FetchTimeouts{timeout, timeout});
  }

  // The proof of the secret a fetch of `target` from the source sends (X-Rtable-Fetch-Auth).
  std::string proofHeader(const std::string& target) const {
    const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    return fmt::format("{}: {}\r\n", kFetchAuthHeader,
                       signFetch(kSecret, fmt::format("127.0.0.1:{}", port_), target, now));
  }

  // Small inserted parts stay in memory until a checkpoint (the default), or go to disk at once.
  bool hold_parts_in_memory_ = true;
  fs::path root_;
  fs::path dest_;
  std::shared_ptr<testing::FakeKeeperServer> keeper_ = testing::FakeKeeperServer::create();
  prometheus::Registry registry_;
  TableSpec spec_;
  std::unique_ptr<TableReplica> table_;
  std::unique_ptr<ReplicaHttpServer> server_;
  uint16_t port_ = 0;
};

TEST_F(PartExchangeTest, AFetchedPartHasTheSameChecksumsAndRows) {
  startSource();
  auto part = insertPart(300000, /*random_bytes=*/16);
  ASSERT_TRUE(part);
  uint64_t bytes = 0;
  for (const auto& file : part->checksums.files) bytes += file.size;
  ASSERT_GT(bytes, 6u << 20) << "the part should be larger than the sender's buffer";

  auto fetched = fetch(part->name.format());
  ASSERT_TRUE(fetched) << fetched.error().toString();
  EXPECT_EQ(*fetched, part->checksums);
  auto copy = readPart(dest_, spec_.schema);
  ASSERT_TRUE(copy) << copy.error();
  auto original = readPart(part->dir, spec_.schema);
  ASSERT_TRUE(original) << original.error();
  EXPECT_EQ(copy->rows(), 300000u);
  EXPECT_TRUE(*copy == *original);
  for (const auto& file : part->checksums.files) {
    EXPECT_EQ(fs::file_size(dest_ / file.name), file.size) << file.name;
  }
}

TEST_F(PartExchangeTest, TheBodyIsTheDocumentedWireFormat) {
  hold_parts_in_memory_ = false;  // the test reads or changes the part's files
  startSource();
  auto part = insertPart(10);
  ASSERT_TRUE(part);
  auto answer = rawGet(port_, "/replication/part?name=" + part->name.format(),
                       proofHeader("/replication/part?name=" + part->name.format()));
  ASSERT_TRUE(answer) << answer.error();
  ASSERT_EQ(answer->status, 200) << answer->body;
  EXPECT_EQ(answer->body.size(), answer->content_length);

  std::string expected =
      fmt::format("rtable part transfer v1\n{}\n", part->checksums.files.size() + 1);
  const std::string checksums = readFile(part->dir / "checksums.txt");
  expected += fmt::format("checksums.txt\t{}\n{}", checksums.size(), checksums);
  for (const auto& file : part->checksums.files) {
    expected += fmt::format("{}\t{}\n{}", file.name, file.size, readFile(part->dir / file.name));
  }
  EXPECT_TRUE(answer->body == expected)
      << "body of " << answer->body.size() << " bytes, expected " << expected.size();
  EXPECT_NE(answer->head.find("Content-Type: application/octet-stream"), std::string::npos)
      << answer->head;
}

TEST_F(PartExchangeTest, APartHeldInMemoryIsSentAsTheBytesItLaterHasOnDisk) {
  startSource();
  auto held = insertPart(10);
  ASSERT_TRUE(held);
  ASSERT_TRUE(held->image) << "a 10-row part is held in memory until a checkpoint";
  EXPECT_FALSE(fs::exists(held->dir));
  const std::string path = "/replication/part?name=" + held->name.format();
  auto from_memory = rawGet(port_, path, proofHeader(path));
  ASSERT_TRUE(from_memory) << from_memory.error();
  ASSERT_EQ(from_memory->status, 200) << from_memory->body;
  EXPECT_EQ(from_memory->body.size(), from_memory->content_length);
  auto fetched = fetch(held->name.format());
  ASSERT_TRUE(fetched) << fetched.error().toString();
  EXPECT_EQ(fetched->total, held->checksums.total);

  table_->runBackgroundRoundForTest();  // the checkpoint writes it out
  auto active = table_->activeParts();
  ASSERT_EQ(active.size(), 1u);
  EXPECT_FALSE(active[0]->image);
  ASSERT_TRUE(fs::exists(active[0]->dir / "checksums.txt"));
  auto from_disk = rawGet(port_, path, proofHeader(path));
  ASSERT_TRUE(from_disk) << from_disk.error();
  EXPECT_TRUE(from_disk->body == from_memory->body)
      << from_disk->body.size() << " bytes from disk, " << from_memory->body.size()
      << " from memory";
}

TEST_F(PartExchangeTest, AWrongOrMissingSecretIsUnauthorizedAndLeavesNothing) {
  startSource();
  auto part = insertPart(10);
  ASSERT_TRUE(part);
  auto fetched = fetch(part->name.format(), "not-the-secret");
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kUnauthorized) << fetched.error().toString();
  EXPECT_EQ(fetched.error().http_status, 401);
  EXPECT_NE(fetched.error().message.find("does not prove the interserver secret"),
            std::string::npos)
      << fetched.error().message;
  EXPECT_FALSE(fs::exists(dest_));

  // A prefix of the secret is no secret.
  fetched = fetch(part->name.format(), kSecret.substr(0, kSecret.size() - 1));
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kUnauthorized);

  auto answer = rawGet(port_, "/replication/part?name=" + part->name.format(), "");
  ASSERT_TRUE(answer) << answer.error();
  EXPECT_EQ(answer->status, 401);
  EXPECT_NE(answer->body.find(R"("error":"UNAUTHORIZED")"), std::string::npos) << answer->body;
  EXPECT_NE(answer->body.find("header is missing"), std::string::npos) << answer->body;
}

TEST_F(PartExchangeTest, AReplicaWithoutASecretServesNoParts) {
  startSource(/*with_secret=*/false);
  auto part = insertPart(10);
  ASSERT_TRUE(part);
  auto fetched = fetch(part->name.format());
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kUnauthorized) << fetched.error().toString();
  EXPECT_EQ(fetched.error().http_status, 401);
  EXPECT_NE(fetched.error().message.find(
                "this replica has no interserver secret (spec replication.secretFile)"),
            std::string::npos)
      << fetched.error().message;
  EXPECT_FALSE(fs::exists(dest_));
}

TEST_F(PartExchangeTest, AFetcherWithoutASecretAsksNobody) {
  ScriptedHttpServer never_asked(okAnswer("", 0));
  auto fetched = fetchPart(FetchSource{"source", "127.0.0.1", never_asked.port()}, "", "all_1_1_0",
                           dest_, makeSpec(true).schema, FetchTimeouts{2s, 2s});
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kUnauthorized);
  EXPECT_EQ(fetched.error().http_status, 0);
  EXPECT_NE(fetched.error().message.find("no interserver secret"), std::string::npos);
  EXPECT_FALSE(fs::exists(dest_));
  EXPECT_EQ(never_asked.request(), "");
}

TEST_F(PartExchangeTest, AnUnknownPartIsNotFoundAndABadNameIsRefused) {
  startSource();
  ASSERT_TRUE(insertPart(10));
  auto fetched = fetch("all_7_7_0");
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kNotFound) << fetched.error().toString();
  EXPECT_EQ(fetched.error().http_status, 404);
  EXPECT_NE(fetched.error().message.find("all_7_7_0 is not active on replica source"),
            std::string::npos)
      << fetched.error().message;
  EXPECT_FALSE(fs::exists(dest_));

  auto answer = rawGet(port_, "/replication/part?name=..%2Fsecret",
                       proofHeader("/replication/part?name=..%2Fsecret"));
  ASSERT_TRUE(answer) << answer.error();
  EXPECT_EQ(answer->status, 400);
  EXPECT_NE(answer->body.find("BAD_PART_NAME"), std::string::npos) << answer->body;

  fetched = fetch("../all_1_1_0");
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kLocal);
  EXPECT_FALSE(fs::exists(dest_));
}

TEST_F(PartExchangeTest, ACorruptSourceFileIsCaughtAndNamed) {
  hold_parts_in_memory_ = false;  // the test reads or changes the part's files
  startSource();
  auto part = insertPart(5000);
  ASSERT_TRUE(part);
  const auto* x = part->checksums.find("x.bin");
  ASSERT_NE(x, nullptr);
  flipByte(part->dir / "x.bin", x->size / 2);

  auto fetched = fetch(part->name.format());
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kCorrupt) << fetched.error().toString();
  EXPECT_NE(fetched.error().message.find("x.bin: hash"), std::string::npos)
      << fetched.error().message;
  EXPECT_FALSE(fs::exists(dest_));
}

TEST_F(PartExchangeTest, ASourceWhoseChecksumsFileChangedSendsNothing) {
  hold_parts_in_memory_ = false;  // the test reads or changes the part's files
  startSource();
  auto part = insertPart(10);
  ASSERT_TRUE(part);
  fs::resize_file(part->dir / "checksums.txt", 20);
  auto fetched = fetch(part->name.format());
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kTransfer) << fetched.error().toString();
  EXPECT_EQ(fetched.error().http_status, 500);
  EXPECT_NE(fetched.error().message.find("BROKEN_PART"), std::string::npos)
      << fetched.error().message;
  EXPECT_FALSE(fs::exists(dest_));
}

// The real body of a small part, for the scripted source.
class ScriptedTransferTest : public PartExchangeTest {
 protected:
  void SetUp() override {
    PartExchangeTest::SetUp();
    startSource();
    part_ = insertPart(2000);
    ASSERT_TRUE(part_);
    auto answer = rawGet(port_, "/replication/part?name=" + part_->name.format(),
                         proofHeader("/replication/part?name=" + part_->name.format()));
    ASSERT_TRUE(answer) << answer.error();
    ASSERT_EQ(answer->status, 200);
    body_ = answer->body;
  }

  std::expected<PartChecksums, FetchError> fetchFrom(const ScriptedHttpServer& scripted,
                                                     std::chrono::milliseconds timeout = 10s) {
    return fetchPart(FetchSource{"scripted", "127.0.0.1", scripted.port()}, std::string(kSecret),
                     part_->name.format(), dest_, spec_.schema, FetchTimeouts{timeout, timeout});
  }

  DataPartPtr part_;
  std::string body_;
};

TEST_F(ScriptedTransferTest, TheWholeBodyGivesThePartAndTheRequestCarriesTheSecret) {
  ScriptedHttpServer scripted(okAnswer(body_, body_.size()));
  auto fetched = fetchFrom(scripted);
  ASSERT_TRUE(fetched) << fetched.error().toString();
  EXPECT_EQ(*fetched, part_->checksums);
  const std::string request = scripted.request();
  EXPECT_TRUE(request.starts_with(
      fmt::format("GET /replication/part?name={} HTTP/1.1\r\n", part_->name.format())))
      << request;
  // The secret itself never goes on the wire; the proof holds for this source and request.
  EXPECT_EQ(request.find(std::string(kSecret)), std::string::npos) << request;
  const std::string header = std::string(kFetchAuthHeader) + ": ";
  const auto at = request.find(header);
  ASSERT_NE(at, std::string::npos) << request;
  const std::string proof =
      request.substr(at + header.size(), request.find("\r\n", at) - at - header.size());
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  EXPECT_EQ(checkFetchAuth(kSecret, fmt::format("127.0.0.1:{}", scripted.port()),
                           "/replication/part?name=" + part_->name.format(), proof, now),
            "");
}

TEST_F(ScriptedTransferTest, ACutTransferIsATransferErrorAndLeavesNothing) {
  // Cut in the middle of a column file, then at the very end.
  for (std::size_t cut : {body_.size() / 2, body_.size() - 1}) {
    ScriptedHttpServer scripted(okAnswer(body_.substr(0, cut), body_.size()));
    auto fetched = fetchFrom(scripted);
    ASSERT_FALSE(fetched);
    EXPECT_EQ(fetched.error().kind, Kind::kTransfer) << fetched.error().toString();
    EXPECT_NE(fetched.error().message.find(
                  fmt::format("closed after {} of the body's {} bytes", cut, body_.size())),
              std::string::npos)
        << fetched.error().message;
    EXPECT_FALSE(fs::exists(dest_));
  }
}

TEST_F(ScriptedTransferTest, ASilentSourceTimesOut) {
  ScriptedHttpServer silent(okAnswer(body_.substr(0, 100), body_.size()), /*hold_open=*/true);
  const auto start = std::chrono::steady_clock::now();
  auto fetched = fetchFrom(silent, 300ms);
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kTransfer) << fetched.error().toString();
  EXPECT_NE(fetched.error().message.find("nothing received for 300 ms"), std::string::npos)
      << fetched.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_FALSE(fs::exists(dest_));
}

TEST_F(ScriptedTransferTest, SizesAndNamesFromTheWireAreNotTrusted) {
  const std::string header =
      fmt::format("rtable part transfer v1\n{}\n", part_->checksums.files.size() + 1);
  const std::string rest = body_.substr(header.size());
  struct Case {
    std::string body;
    std::string error;
  };
  const std::vector<Case> cases = {
      {header + "../checksums.txt\t10\n0123456789", "'../checksums.txt' is not a file name"},
      {header + "checksums.txt\t999999999\n", "999999999 bytes announced, the body has"},
      {"HTTP/1.1 200 OK\n", "the body starts with 'HTTP/1.1 200 OK'"},
      {fmt::format("rtable part transfer v1\n{}\n", part_->checksums.files.size() + 5) + rest,
       "the body announces"},
      {body_ + "extra", "5 bytes follow the last file"},
  };
  for (const Case& c : cases) {
    ScriptedHttpServer scripted(okAnswer(c.body, c.body.size()));
    auto fetched = fetchFrom(scripted);
    ASSERT_FALSE(fetched) << c.error;
    EXPECT_EQ(fetched.error().kind, Kind::kCorrupt) << fetched.error().toString();
    EXPECT_NE(fetched.error().message.find(c.error), std::string::npos) << fetched.error().message;
    EXPECT_FALSE(fs::exists(dest_));
    EXPECT_FALSE(fs::exists(root_ / "fetched" / "checksums.txt"));
  }
}

TEST_F(PartExchangeTest, ARefusedConnectionIsATransferError) {
  auto port = common::testing::findFreeLoopbackPort();
  ASSERT_TRUE(port);
  auto fetched = fetchPart(FetchSource{"gone", "127.0.0.1", static_cast<uint16_t>(*port)},
                           std::string(kSecret), "all_1_1_0", dest_, makeSpec(true).schema,
                           FetchTimeouts{2s, 2s});
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kTransfer) << fetched.error().toString();
  EXPECT_NE(fetched.error().message.find("cannot connect"), std::string::npos);
  EXPECT_NE(fetched.error().message.find("replica gone"), std::string::npos);
  EXPECT_FALSE(fs::exists(dest_));
}

TEST_F(PartExchangeTest, AnExistingDestinationIsLeftUntouched) {
  startSource();
  auto part = insertPart(10);
  ASSERT_TRUE(part);
  fs::create_directory(dest_);
  std::ofstream(dest_ / "mine.txt") << "keep me";
  auto fetched = fetch(part->name.format());
  ASSERT_FALSE(fetched);
  EXPECT_EQ(fetched.error().kind, Kind::kLocal) << fetched.error().toString();
  EXPECT_NE(fetched.error().message.find("it exists"), std::string::npos);
  EXPECT_EQ(readFile(dest_ / "mine.txt"), "keep me");
  EXPECT_EQ(std::distance(fs::directory_iterator(dest_), fs::directory_iterator()), 1);
}

TEST_F(PartExchangeTest, AFetcherThatGoesAwayFreesTheSender) {
  startSource(/*with_secret=*/true, /*workers=*/1);
  // 20 MB: more than the sender's buffer and the sockets' buffers together, so that the sender
  // is still feeding the body when the fetcher goes away.
  auto part = insertPart(300000, /*random_bytes=*/64);
  ASSERT_TRUE(part);
  // Reads 100 KB of the body and hangs up. With one worker, the next request is only served once
  // the sender noticed.
  auto abandoned = rawGet(port_, "/replication/part?name=" + part->name.format(),
                          proofHeader("/replication/part?name=" + part->name.format()), 100 << 10);
  ASSERT_TRUE(abandoned) << abandoned.error();
  ASSERT_EQ(abandoned->status, 200);
  ASSERT_LT(abandoned->body.size(), abandoned->content_length);

  auto fetched = fetch(part->name.format(), kSecret, 10s);
  ASSERT_TRUE(fetched) << fetched.error().toString();
  EXPECT_EQ(*fetched, part->checksums);
}

TEST_F(PartExchangeTest, AnOpenReaderOutlivesItsPartDirectory) {
  hold_parts_in_memory_ = false;  // the test reads or changes the part's files
  startSource();
  auto part = insertPart(1000);
  ASSERT_TRUE(part);
  auto expected = rawGet(port_, "/replication/part?name=" + part->name.format(),
                         proofHeader("/replication/part?name=" + part->name.format()));
  ASSERT_TRUE(expected);

  auto reader = PartTransferReader::open(part->dir, part->checksums);
  ASSERT_TRUE(reader) << reader.error();
  EXPECT_EQ(reader->contentLength(), expected->body.size());
  const fs::path moved = root_ / "moved-away";
  fs::rename(part->dir, moved);  // as a merge's cleanup would remove it
  fs::remove_all(moved);
  std::string body;
  std::vector<uint8_t> chunk(777);
  for (;;) {
    auto n = reader->read(chunk.data(), chunk.size());
    ASSERT_TRUE(n) << n.error();
    if (*n == 0) break;
    body.append(reinterpret_cast<const char*>(chunk.data()), *n);
  }
  EXPECT_TRUE(body == expected->body);
}

TEST_F(PartExchangeTest, AReaderRefusesAPartThatDiffersFromWhatWasLoaded) {
  hold_parts_in_memory_ = false;  // the test reads or changes the part's files
  startSource();
  auto part = insertPart(10);
  ASSERT_TRUE(part);
  PartChecksums other = part->checksums;
  other.files[0].size += 1;
  other = PartChecksums::fromFiles(other.files);
  auto reader = PartTransferReader::open(part->dir, other);
  ASSERT_FALSE(reader);
  EXPECT_NE(reader.error().find("checksums.txt: says total"), std::string::npos) << reader.error();

  fs::resize_file(part->dir / "count.txt", 0);
  reader = PartTransferReader::open(part->dir, part->checksums);
  ASSERT_FALSE(reader);
  EXPECT_NE(reader.error().find("count.txt: size 0 bytes"), std::string::npos) << reader.error();
}

TEST(InterserverSecret, MatchesOnlyTheWholeSecret) {
  EXPECT_TRUE(interserverSecretMatches("abc", "abc"));
  EXPECT_FALSE(interserverSecretMatches("abc", "abd"));
  EXPECT_FALSE(interserverSecretMatches("abc", "ab"));
  EXPECT_FALSE(interserverSecretMatches("abc", "abcd"));
  EXPECT_FALSE(interserverSecretMatches("", ""));  // no secret matches nothing
}

// A fetch proves the interserver secret without sending it (issue 23): the proof holds for one
// source, one request and five minutes, so a host that receives it can use it nowhere else.
TEST(FetchAuth, AProofHoldsForItsSourceAndRequestOnly) {
  const std::string target = "/replication/part?name=202612_1_1_0&generation=2";
  const int64_t now = 1'796'000'000;
  const std::string proof = signFetch("s3cret", "events-0.events:8123", target, now);
  EXPECT_TRUE(proof.starts_with("v1 1796000000 ")) << proof;
  EXPECT_EQ(proof.find("s3cret"), std::string::npos);
  EXPECT_EQ(checkFetchAuth("s3cret", "events-0.events:8123", target, proof, now), "");
  EXPECT_EQ(checkFetchAuth("s3cret", "events-0.events:8123", target, proof, now + 299), "");

  // Replayed to another replica, for another part, later, or checked with another secret.
  EXPECT_NE(checkFetchAuth("s3cret", "events-1.events:8123", target, proof, now)
                .find("made for another replica or request"),
            std::string::npos);
  EXPECT_NE(checkFetchAuth("s3cret", "events-0.events:8123",
                           "/replication/part?name=202612_2_2_0&generation=2", proof, now),
            "");
  EXPECT_NE(
      checkFetchAuth("s3cret", "events-0.events:8123", target, proof, now + 301).find("expired"),
      std::string::npos);
  EXPECT_NE(checkFetchAuth("s3cret", "events-0.events:8123", target, proof, now - 301), "");
  EXPECT_NE(checkFetchAuth("other", "events-0.events:8123", target, proof, now), "");
  // Malformed headers are refused, never read past.
  for (const std::string& bad :
       std::vector<std::string>{"", "v1", "v1 ", "v1 x y", "v2 1796000000 00", "s3cret",
                                "v1 1796000000", proof.substr(0, proof.size() - 1)}) {
    EXPECT_NE(checkFetchAuth("s3cret", "events-0.events:8123", target, bad, now), "") << bad;
  }
}

}  // namespace
}  // namespace rtable::core
