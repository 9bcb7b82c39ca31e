// rtable-core as users run it: a real process, a real ZooKeeper 3.8, HTTP on loopback.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "rtable/common/percent_encoding.h"
#include "rtable/common/testing/files.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::core {
namespace {

using common::testing::waitFor;
using nlohmann::json;
using testing::LocalReplica;
using testing::LocalZooKeeper;

LocalZooKeeper& zookeeper() {
  static std::unique_ptr<LocalZooKeeper> zk = [] {
    auto started = LocalZooKeeper::start();
    if (!started) throw std::runtime_error(started.error());
    return std::move(*started);
  }();
  return *zk;
}

class CoreProcess : public ::testing::Test {
 protected:
  void startReplica(const std::string& dedup = "{window: 1000, windowSeconds: 3600}",
                    const std::string& zookeeper_user = "", const std::string& api_token = "",
                    bool reads_need_token = false) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    table_ = info->name();
    char pattern[] = "/tmp/rtable-core-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    work_dir_ = pattern;
    testing::LocalReplicaOptions options;
    options.binary = RTABLE_CORE_BINARY;
    options.work_dir = work_dir_;
    options.zookeeper = zookeeper().connectString();
    // The leader trims the dedup window once per cleanup period (default 30 s).
    options.replication_settings = "cleanupPeriodSeconds: 1";
    options.zookeeper_user = zookeeper_user;
    options.api_token = api_token;
    options.api_reads_need_token = reads_need_token;
    options.zookeeper_password = zookeeper_user.empty() ? "" : zookeeper_user + "-password";
    options.table_yaml = fmt::format(R"(table: {}
columns:
  - {{name: id, type: UInt64}}
  - {{name: d, type: Date}}
  - {{name: user, type: String}}
  - {{name: score, type: Nullable(Float64)}}
partitionBy: toYYYYMM(d)
orderBy: [id]
deduplication: {})",
                                     table_, dedup);
    auto replica = LocalReplica::start(options);
    ASSERT_TRUE(replica) << replica.error();
    replica_ = std::move(*replica);
    auto keeper = zookeeper().connect();
    ASSERT_TRUE(keeper);
    keeper_ = std::move(*keeper);
  }
  void TearDown() override {
    replica_.reset();
    if (!work_dir_.empty() && !::testing::Test::HasFailure())
      std::filesystem::remove_all(work_dir_);
  }

  static std::string row(uint64_t id, int month = 12) {
    return fmt::format(R"({{"id":{},"d":"2026-{:02d}-0{}","user":"u{}","score":{}}})", id, month,
                       1 + id % 9, id % 7, id % 3 == 0 ? "null" : std::to_string(id * 0.5)) +
           "\n";
  }

  json insert(const std::string& body, const std::string& params = "format=JSONEachRow",
              int expect_status = 200) {
    auto response = replica_->post("/insert?" + params, body);
    EXPECT_TRUE(response) << response.error();
    if (!response) return {};
    EXPECT_EQ(response->status, expect_status) << response->body;
    return json::parse(response->body);
  }

  uint64_t count() {
    auto response = replica_->get("/count");
    EXPECT_TRUE(response && response->status == 200);
    return response ? json::parse(response->body)["rows"].get<uint64_t>() : 0;
  }

  std::map<uint64_t, int> idCounts() {
    auto response = replica_->get("/select?format=TSV");
    EXPECT_TRUE(response && response->status == 200);
    std::map<uint64_t, int> ids;
    std::size_t start = 0;
    while (response && start < response->body.size()) {
      const std::size_t end = response->body.find('\n', start);
      ids[std::stoull(response->body.substr(start, response->body.find('\t', start) - start))]++;
      start = end + 1;
    }
    return ids;
  }

  std::size_t dedupIds() {
    TablePaths paths{"/rtable/tables/" + table_, 1, "r1"};
    auto listed = keeper_->children(paths.dedupHashes());
    return listed ? listed->names.size() : 0;
  }

  std::string table_;
  std::filesystem::path work_dir_;
  std::unique_ptr<LocalReplica> replica_;
  std::unique_ptr<Keeper> keeper_;
};

TEST_F(CoreProcess, InsertCountSelectAndDeduplication) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  auto first = insert(row(1) + row(2) + row(3, 11));
  EXPECT_EQ(first["rows"], 3);
  EXPECT_EQ(first["blocks"], 2);
  EXPECT_EQ(first["deduplicated_blocks"], 0);
  EXPECT_EQ(count(), 3u);

  auto again = insert(row(1) + row(2) + row(3, 11));
  EXPECT_EQ(again["rows"], 0);
  EXPECT_EQ(again["deduplicated_blocks"], 2);
  EXPECT_EQ(again["parts"], first["parts"]);
  EXPECT_EQ(count(), 3u);

  // The same rows as TSV: the id comes from the values, not the bytes on the wire.
  auto tsv = insert("3\t2026-11-04\tu3\t\\N\n", "format=TSV");
  EXPECT_EQ(tsv["deduplicated_blocks"], 1);

  auto selected =
      replica_->get("/select?where=" + common::percentEncode("id >= 2 AND score IS NOT NULL"));
  ASSERT_TRUE(selected);
  EXPECT_EQ(selected->body, R"({"id":2,"d":"2026-12-03","user":"u2","score":1})"
                            "\n");
  auto by_partition = replica_->get("/count?partition=202611");
  EXPECT_EQ(json::parse(by_partition->body)["rows"], 1);
}

// With a ZooKeeper credential (issue 23) the table's nodes are its own: inserts, merges and the
// leader's cleanup work as before, and a client without the credential can read or change none
// of them, while the shared parent stays open.
TEST_F(CoreProcess, ATableWithAZooKeeperCredentialRefusesEveryOtherClient) {
  ASSERT_NO_FATAL_FAILURE(startReplica("{window: 1000, windowSeconds: 3600}", "table-user"));
  for (uint64_t id = 1; id <= 6; ++id) EXPECT_EQ(insert(row(id))["rows"], 1);
  EXPECT_EQ(insert(row(1))["deduplicated_blocks"], 1);
  EXPECT_EQ(count(), 6u);

  const std::string root = "/rtable/tables/" + table_;
  TablePaths paths{root, 1, "r1"};
  for (const std::string& path :
       {root, paths.log(), paths.replicas(), paths.dedupHashes(), paths.blockNumbers()}) {
    auto refused = keeper_->children(path);
    ASSERT_FALSE(refused) << path;
    EXPECT_EQ(refused.error().code, KeeperCode::kNoAuth) << path;
    EXPECT_EQ(keeper_->set(path, "rewritten").error().code, KeeperCode::kNoAuth) << path;
  }
  EXPECT_TRUE(keeper_->children("/rtable/tables"));  // the shared parent stays readable

  ZooKeeperConfig config{zookeeper().connectString(),
                         std::chrono::seconds(10),
                         std::chrono::seconds(10),
                         {{"table-user", "table-user-password", root}}};
  auto owner = ZooKeeperClient::connect(config);
  ASSERT_TRUE(owner);
  auto log = (*owner)->children(paths.log());
  ASSERT_TRUE(log) << log.error().toString();
  EXPECT_GE(log->names.size(), 6u);

  // A new process (a new session) authenticates again.
  replica_->kill9();
  ASSERT_TRUE(replica_->launch());
  EXPECT_EQ(insert(row(7))["rows"], 1);
  EXPECT_EQ(count(), 7u);
}

// With api.tokensFile (issue 23) writes and admin calls need a bearer token: none or a wrong
// one is 401 with a JSON error, and nothing changes; reads stay open unless readsNeedToken.
TEST_F(CoreProcess, WritesNeedABearerTokenAndAreRefusedWithoutOne) {
  ASSERT_NO_FATAL_FAILURE(
      startReplica("{window: 1000, windowSeconds: 3600}", "", "token-of-the-writers"));
  auto call = [&](const std::string& method, const std::string& target,
                  const std::string& headers) {
    auto response = common::testing::httpRequest("127.0.0.1", replica_->httpPort(), method, target,
                                                 method == "POST" ? row(1) : "",
                                                 std::chrono::seconds(30), headers);
    EXPECT_TRUE(response) << response.error();
    return response ? *response : common::testing::HttpResponse{};
  };
  for (const std::string target : {"/insert?format=JSONEachRow", "/drop_partition?partition=202612",
                                   "/drop_replica?name=r2", "/sync"}) {
    for (const char* headers :
         {"", "Authorization: Bearer wrong-token\r\n", "Authorization: Basic dXNlcjpwYXNz\r\n",
          "Authorization: Bearer token-of-the-writers-and-more\r\n"}) {
      SCOPED_TRACE(target + " with " + std::string(headers));
      const auto refused = call("POST", target, headers);
      EXPECT_EQ(refused.status, 401) << refused.body;
      EXPECT_EQ(json::parse(refused.body)["error"], "UNAUTHORIZED");
      EXPECT_NE(refused.headers.find("WWW-Authenticate: Bearer"), std::string::npos);
    }
  }
  EXPECT_EQ(count(), 0u);  // reads are open; nothing was inserted
  const auto accepted =
      call("POST", "/insert?format=JSONEachRow", "authorization: bearer token-of-the-writers\r\n");
  EXPECT_EQ(accepted.status, 200) << accepted.body;
  EXPECT_EQ(count(), 1u);
  EXPECT_EQ(call("GET", "/healthz", "").status, 200);
}

TEST_F(CoreProcess, ReadsNeedTheTokenTooWhenTheSpecSaysSo) {
  ASSERT_NO_FATAL_FAILURE(
      startReplica("{window: 1000, windowSeconds: 3600}", "", "reader-token", true));
  EXPECT_EQ(insert(row(1))["rows"], 1);  // the replica's helpers send the token
  EXPECT_EQ(count(), 1u);
  for (const std::string target : {"/select", "/count", "/parts", "/replica"}) {
    auto refused = common::testing::httpRequest("127.0.0.1", replica_->httpPort(), "GET", target);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 401) << target << ": " << refused->body;
  }
  auto ready = common::testing::httpRequest("127.0.0.1", replica_->httpPort(), "GET", "/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);  // probes carry no token
}

// A one-row part is held in memory, its image in ZooKeeper; the checkpoint (every 5 s)
// writes it out. Selects read it either way.
TEST_F(CoreProcess, ASmallPartIsHeldInMemoryUntilTheCheckpointWritesItOut) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  auto inserted = insert(row(1));
  ASSERT_EQ(inserted["parts"].size(), 1u);
  const std::string name = inserted["parts"][0].get<std::string>();
  auto inMemory = [&]() -> std::optional<bool> {
    auto parts = replica_->get("/parts");
    if (!parts || parts->status != 200) return std::nullopt;
    for (const auto& part : json::parse(parts->body)) {
      if (part["name"] == name) return part["in_memory"].get<bool>();
    }
    return std::nullopt;
  };
  EXPECT_EQ(inMemory(), std::optional<bool>(true));
  EXPECT_FALSE(std::filesystem::exists(replica_->dataDir() / name));
  EXPECT_EQ(idCounts(), (std::map<uint64_t, int>{{1, 1}}));
  ASSERT_TRUE(
      waitFor([&] { return inMemory() == std::optional<bool>(false); }, std::chrono::seconds(20)));
  EXPECT_TRUE(std::filesystem::exists(replica_->dataDir() / name / "checksums.txt"));
  EXPECT_EQ(idCounts(), (std::map<uint64_t, int>{{1, 1}}));
}

TEST_F(CoreProcess, ATokenDecidesInsteadOfTheData) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  EXPECT_EQ(insert(row(1), "insert_deduplication_token=t-1")["rows"], 1);
  EXPECT_EQ(insert(row(2), "insert_deduplication_token=t-1")["deduplicated_blocks"], 1);
  EXPECT_EQ(insert(row(1), "insert_deduplication_token=t-2")["rows"], 1);
  EXPECT_EQ(count(), 2u);
  EXPECT_EQ(idCounts(), (std::map<uint64_t, int>{{1, 2}}));
}

TEST_F(CoreProcess, BadInputNamesRowAndColumnAndWritesNothing) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  auto bad = insert(row(1) + row(2) +
                        R"({"id":3,"d":"2026-12-01","user":"x","score":"high"})"
                        "\n",
                    "format=JSONEachRow", 400);
  EXPECT_EQ(bad["error"], "BAD_INPUT");
  EXPECT_EQ(bad["row"], 3);
  EXPECT_EQ(bad["column"], "score");
  auto unknown = insert(R"({"id":1,"d":"2026-12-01","user":"x","colour":1})"
                        "\n",
                        "format=JSONEachRow", 400);
  EXPECT_NE(unknown["message"].get<std::string>().find("colour"), std::string::npos);
  auto format = insert("", "format=Parquet", 400);
  EXPECT_EQ(format["error"], "BAD_FORMAT");
  EXPECT_EQ(count(), 0u);
  const auto staging = replica_->dataDir() / "staging";
  EXPECT_TRUE(!std::filesystem::exists(staging) || std::filesystem::is_empty(staging));
  auto wrong_table = replica_->post("/insert?table=other", row(1));
  EXPECT_EQ(wrong_table->status, 404);
  auto bad_query = replica_->post("/insert?format=%zz", row(1));
  ASSERT_TRUE(bad_query);
  EXPECT_EQ(bad_query->status, 400) << bad_query->body;
  EXPECT_EQ(json::parse(bad_query->body)["error"], "BAD_QUERY");
  EXPECT_EQ(count(), 0u);
}

// Every refusal of the API is an HTTP status with a JSON error code and a message saying what to
// change; none changes anything.
TEST_F(CoreProcess, RefusedRequestsAnswerAStatusAndAnErrorCodeAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  ASSERT_EQ(insert(row(1) + row(2))["rows"], 2);
  struct Case {
    std::string method, target;
    int status;
    std::string error, in_message, allow;
  };
  const std::vector<Case> cases = {
      {"GET", "/select?where=colour%3D1", 400, "BAD_WHERE", "colour", ""},
      {"GET", "/count?where=id%3D%3D", 400, "BAD_WHERE", "", ""},
      {"GET", "/select?limit=ten", 400, "BAD_LIMIT", "'ten' is not a whole number", ""},
      {"GET", "/select?limit=-1", 400, "BAD_LIMIT", "", ""},
      {"GET", "/select?format=Parquet", 400, "BAD_FORMAT", "Parquet", ""},
      {"GET", "/insert", 405, "METHOD_NOT_ALLOWED", "use POST", "POST"},
      {"GET", "/sync", 405, "METHOD_NOT_ALLOWED", "use POST", "POST"},
      {"GET", "/drop_partition?partition=202612", 405, "METHOD_NOT_ALLOWED", "", "POST"},
      {"POST", "/select", 405, "METHOD_NOT_ALLOWED", "use GET", "GET"},
      {"POST", "/count", 405, "METHOD_NOT_ALLOWED", "", "GET"},
      {"GET", "/tables", 404, "NOT_FOUND", "no endpoint /tables", ""},
      {"POST", "/insert/extra", 404, "NOT_FOUND", "no endpoint /insert/extra", ""},
      {"GET", "/select?table=other", 404, "UNKNOWN_TABLE", "not 'other'", ""},
      {"POST", "/sync?timeout_seconds=soon", 400, "BAD_TIMEOUT", "from 0 to 3600", ""},
      {"POST", "/sync?timeout_seconds=3601", 400, "BAD_TIMEOUT", "", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.method + " " + c.target);
    auto response = c.method == "GET" ? replica_->get(c.target) : replica_->post(c.target, "");
    ASSERT_TRUE(response) << response.error();
    EXPECT_EQ(response->status, c.status) << response->body;
    const json body = json::parse(response->body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << response->body;
    EXPECT_EQ(body.value("error", ""), c.error) << response->body;
    EXPECT_NE(body.value("message", "").find(c.in_message), std::string::npos) << response->body;
    if (!c.allow.empty()) {
      EXPECT_NE(response->headers.find("Allow: " + c.allow), std::string::npos)
          << response->headers;
    }
  }
  // /sync with a queue that drains answers once it has; the table is as it was.
  auto synced = replica_->post("/sync?timeout_seconds=30", "");
  ASSERT_TRUE(synced);
  EXPECT_EQ(synced->status, 200) << synced->body;
  EXPECT_EQ(json::parse(synced->body)["status"], "synced");
  EXPECT_EQ(count(), 2u);
  EXPECT_EQ(idCounts(), (std::map<uint64_t, int>{{1, 1}, {2, 1}}));
}

TEST_F(CoreProcess, TheWindowForgetsIdsByCount) {
  ASSERT_NO_FATAL_FAILURE(startReplica("{window: 3, windowSeconds: 3600}"));
  for (uint64_t id = 1; id <= 5; ++id) insert(row(id));
  ASSERT_TRUE(waitFor([&] { return dedupIds() == 3; })) << dedupIds();
  EXPECT_EQ(insert(row(1))["rows"], 1);                 // forgotten
  EXPECT_EQ(insert(row(5))["deduplicated_blocks"], 1);  // remembered
}

TEST_F(CoreProcess, TheWindowForgetsIdsByAgeOfTheNewest) {
  ASSERT_NO_FATAL_FAILURE(startReplica("{window: 1000, windowSeconds: 1}"));
  insert(row(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  insert(row(2));  // row 1's id is now more than 1 s older than the newest
  ASSERT_TRUE(waitFor([&] { return dedupIds() == 1; })) << dedupIds();
  EXPECT_EQ(insert(row(1))["rows"], 1);
  EXPECT_EQ(count(), 3u);
}

TEST_F(CoreProcess, MergesHappenAndKeepTheRows) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  for (uint64_t id = 20; id > 0; --id) insert(row(id));
  auto parts = [&] { return json::parse(replica_->get("/parts")->body).size(); };
  ASSERT_TRUE(waitFor([&] { return parts() < 10; })) << parts();
  EXPECT_EQ(count(), 20u);
  auto ids = idCounts();
  EXPECT_EQ(ids.size(), 20u);
  for (const auto& [id, n] : ids) EXPECT_EQ(n, 1) << id;
  auto listed = json::parse(replica_->get("/parts")->body);
  bool merged = false;
  for (const auto& part : listed) merged = merged || part["level"].get<int>() > 0;
  EXPECT_TRUE(merged) << listed.dump();
}

// What curl does with a body over 1 MiB (`curl --data-binary @rows.json`): headers with
// "Expect: 100-continue", then the body only once the server said 100 (or after a second's wait).
TEST_F(CoreProcess, ALargeInsertThatExpectsContinueGetsItAndAChunkedOneIsRead) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  std::string body;
  for (uint64_t id = 1; body.size() < (1u << 20) + 1; ++id) body += row(id);
  const uint64_t rows = static_cast<uint64_t>(std::count(body.begin(), body.end(), '\n'));

  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(replica_->httpPort()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  auto sendText = [&](const std::string& text) {
    for (std::size_t sent = 0; sent < text.size();) {
      const ssize_t n = send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
      ASSERT_GT(n, 0);
      sent += static_cast<std::size_t>(n);
    }
  };
  std::string received;
  auto receiveUntil = [&](const std::string& marker) {
    char chunk[4096];
    while (received.find(marker) == std::string::npos) {
      const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) return false;
      received.append(chunk, static_cast<std::size_t>(n));
    }
    return true;
  };
  sendText(
      fmt::format("POST /insert?format=JSONEachRow HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n"
                  "Expect: 100-continue\r\n\r\n",
                  body.size()));
  ASSERT_TRUE(receiveUntil("\r\n\r\n")) << "no interim answer within 10 s";
  EXPECT_EQ(received, "HTTP/1.1 100 Continue\r\n\r\n");
  received.clear();
  sendText(body);
  ASSERT_TRUE(receiveUntil("}\n")) << received;
  EXPECT_TRUE(received.starts_with("HTTP/1.1 200 OK")) << received;
  EXPECT_NE(received.find(fmt::format("\"rows\":{}", rows)), std::string::npos) << received;

  // The same connection, a chunked body (as clients send a stream of unknown length).
  received.clear();
  sendText(
      "POST /insert?format=JSONEachRow HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  for (uint64_t id = 900001; id <= 900003; ++id)
    sendText(fmt::format("{:x}\r\n{}\r\n", row(id).size(), row(id)));
  sendText("0\r\n\r\n");
  ASSERT_TRUE(receiveUntil("}\n")) << received;
  EXPECT_NE(received.find("\"rows\":3"), std::string::npos) << received;
  close(fd);
  EXPECT_EQ(count(), rows + 3);
}

TEST_F(CoreProcess, MetricsAndGracefulStop) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  insert(row(1));
  insert(row(1));
  ASSERT_TRUE(waitFor([&] {
    auto m = replica_->metrics();
    return m && m->body.find(
                    "rtable_log_counter{generation=\"1\",replica=\"r1\",table="
                    "\"MetricsAndGracefulStop\"} 1") != std::string::npos;
  }));
  const std::string text = replica_->metrics()->body;
  for (const char* name :
       {"rtable_log_max_index", "rtable_log_counter_headroom_ratio",
        "rtable_log_counter_exhaustion_seconds", "rtable_inserts_total",
        "rtable_inserted_rows_total", "rtable_insert_deduplicated_blocks_total", "rtable_parts",
        "rtable_merges_total", "rtable_zookeeper_request_duration_seconds"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name;
  }
  EXPECT_NE(text.find("rtable_insert_deduplicated_blocks_total{generation=\"1\",replica=\"r1\","
                      "table=\"MetricsAndGracefulStop\"} 1"),
            std::string::npos);
  EXPECT_EQ(replica_->terminate(), 0);
}

// The promise of the insert path: whatever moment the process dies at, a client that retries every
// insert it got no answer for ends with each row exactly once.
TEST_F(CoreProcess, KillNineDuringInsertsAndRetriesGiveEveryRowExactlyOnce) {
  ASSERT_NO_FATAL_FAILURE(startReplica());
  constexpr uint64_t kInserts = 240;
  std::atomic<uint64_t> done{0};
  std::atomic<bool> finished{false};
  std::thread client([&] {
    for (uint64_t id = 0; id < kInserts; ++id) {
      // Two rows in two partitions per insert: a kill may fall between their commits.
      const std::string body = row(id * 2, 12) + row(id * 2 + 1, 11);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
      for (;;) {
        auto response = replica_->post("/insert?format=JSONEachRow", body);
        if (response && response->status == 200) break;
        ASSERT_LT(std::chrono::steady_clock::now(), deadline)
            << "insert " << id << " never succeeded";
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      done = id + 1;
    }
    finished = true;
  });
  std::mt19937 random(20261202);
  int kills = 0;
  for (uint64_t at : {40u, 110u, 180u}) {
    while (done < at && !finished) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Somewhere inside the next few inserts.
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 40)(random)));
    replica_->kill9();
    ++kills;
    auto relaunched = replica_->launch();
    ASSERT_TRUE(relaunched) << relaunched.error();
  }
  client.join();
  EXPECT_EQ(kills, 3);
  EXPECT_EQ(count(), kInserts * 2);
  auto ids = idCounts();
  EXPECT_EQ(ids.size(), kInserts * 2);
  for (const auto& [id, n] : ids) EXPECT_EQ(n, 1) << "row " << id;
  // The kills fell between checkpoints: small parts committed since the last one existed only in
  // memory and in the part journal, and the restarts wrote them out from there.
  const std::string log = common::testing::readFile(replica_->logFile());
  std::size_t from_journal = 0;
  for (std::size_t at = 0;
       (at = log.find("written again from the part journal", at)) != std::string::npos; ++at)
    ++from_journal;
  EXPECT_GT(from_journal, 0u);
}

}  // namespace
}  // namespace rtable::core
