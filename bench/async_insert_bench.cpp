// Many clients, one row per insert (issue 22): rtable-core with async inserts
// (async_insert=1, wait_for_async_insert=1: each client is answered once its row is committed and
// durable) beside ClickHouse 18.16, which has no async inserts and takes the same clients
// synchronously, on one ZooKeeper 3.8 (its JVM as in production), one replica each, in one run.
// Per system: acknowledged rows per second, client latency (p50, p99, max), errors by status, and
// the table's log entries per 1000 acknowledged inserts (its log counter's growth, merges
// included). Then one bulk JSONEachRow insert of --bulk-rows rows into each (rows per second).
// Usage: rtable-async-insert-bench [--clients N] [--seconds S] [--bulk-rows N]
//                                  [--async 'staleTimeoutMs: 5, ...'] (the table's inserts.async)
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "keep_alive_client.h"
#include "rtable/common/testing/http_client.h"
#include "rtable/replication_core/sequential_counter.h"
#include "rtable/replication_core/testing/local_clickhouse.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace {

using namespace rtable::core::testing;
using rtable::bench::KeepAliveClient;
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
constexpr const char* kClickHouseLog = "/clickhouse/tables/01/bench/log";

// All rows in one month: a client's many single-row inserts land in one partition, as a stream
// of events does.
std::string row(uint64_t id) {
  return fmt::format(R"({{"id":{},"d":"2026-12-{:02d}","user":"user-{}","value":{},"n":{}}})", id,
                     1 + id % 28, id % 1000, static_cast<double>(id) * 0.25,
                     id % 5 == 0 ? std::string("null") : std::to_string(id % 100000)) +
         "\n";
}

struct Run {
  uint64_t acknowledged = 0;
  double seconds = 0;
  std::vector<double> latencies_ms;  // of acknowledged inserts
  std::vector<double> slow_sent_s;   // when the inserts over 250 ms were sent, from the start
  std::map<int, uint64_t> errors;    // by HTTP status (0: no answer)
  int64_t log_entries = 0;

  double perSecond() const { return static_cast<double>(acknowledged) / seconds; }
  double percentile(double p) {
    if (latencies_ms.empty()) return 0;
    std::sort(latencies_ms.begin(), latencies_ms.end());
    return latencies_ms[std::min(latencies_ms.size() - 1,
                                 static_cast<std::size_t>(p * latencies_ms.size()))];
  }
  // The slow inserts grouped by when they were sent (within half a second of each other):
  // "at 0.0 s: 64" is a stall every client met at once.
  std::string slowTimes() const {
    std::vector<double> at = slow_sent_s;
    std::sort(at.begin(), at.end());
    std::string text;
    for (std::size_t i = 0; i < at.size();) {
      std::size_t j = i;
      while (j < at.size() && at[j] - at[i] < 0.5) ++j;
      text += fmt::format("{}at {:.1f} s: {}", text.empty() ? "" : ", ", at[i], j - i);
      i = j;
    }
    return text.empty() ? "none" : text;
  }
  std::size_t slowerThan(double ms) const {
    return static_cast<std::size_t>(
        std::count_if(latencies_ms.begin(), latencies_ms.end(), [ms](double l) { return l > ms; }));
  }
  double entriesPerThousand() const {
    return acknowledged ? 1000.0 * static_cast<double>(log_entries) / acknowledged : 0;
  }
};

// `clients` threads, each with its own keep-alive connection, sending one row per insert for
// `seconds`; `log_counter` reads the table's log counter (before and after).
Run hammer(const std::string& name, int port, const std::string& path, int clients,
           std::chrono::seconds seconds, uint64_t first_id,
           const std::function<int64_t()>& log_counter) {
  Run run;
  std::mutex mu;
  std::atomic<uint64_t> next_id{first_id};
  const int64_t counter_before = log_counter();
  const auto start = Clock::now();
  const auto deadline = start + seconds;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      KeepAliveClient client(name, port, path);
      client.setQuiet(true);
      std::vector<double> latencies;
      std::vector<double> slow;
      std::map<int, uint64_t> errors;
      while (Clock::now() < deadline) {
        const auto sent = Clock::now();
        if (client.post(row(next_id++))) {
          latencies.push_back(
              std::chrono::duration<double, std::milli>(Clock::now() - sent).count());
          if (latencies.back() > 250)
            slow.push_back(std::chrono::duration<double>(sent - start).count());
        } else {
          ++errors[client.lastStatus()];
          if (client.lastStatus() == 0) client.reconnect();
          // As a client told to come back later would (503 Retry-After, ClickHouse's too many
          // parts): not at once.
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
      std::lock_guard lock(mu);
      run.acknowledged += latencies.size();
      run.latencies_ms.insert(run.latencies_ms.end(), latencies.begin(), latencies.end());
      run.slow_sent_s.insert(run.slow_sent_s.end(), slow.begin(), slow.end());
      for (auto [status, n] : errors) run.errors[status] += n;
    });
  }
  for (auto& thread : threads) thread.join();
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  run.log_entries = log_counter() - counter_before;
  return run;
}

std::string bulkBody(uint64_t first_id, uint64_t rows) {
  std::string body;
  for (uint64_t id = first_id; id < first_id + rows; ++id) body += row(id);
  return body;
}

double bulkRowsPerSecond(KeepAliveClient& client, const std::string& body, uint64_t rows) {
  client.reconnect();
  const auto start = Clock::now();
  if (!client.post(body)) return 0;
  return static_cast<double>(rows) / std::chrono::duration<double>(Clock::now() - start).count();
}

// rtable-core's flushes by reason and inserts per flush, from its /metrics.
std::string flushesText(const LocalReplica& replica) {
  auto metrics = replica.metrics();
  if (!metrics || metrics->status != 200) return "(no /metrics)";
  std::string reasons;
  double flushes = 0, inserts = 0;
  std::istringstream lines(metrics->body);
  for (std::string line; std::getline(lines, line);) {
    const double value = std::strtod(line.substr(line.rfind(' ') + 1).c_str(), nullptr);
    if (line.starts_with("rtable_async_insert_flushes_total{")) {
      const auto at = line.find("reason=\"") + 8;
      reasons += fmt::format("{}{} {:.0f}", reasons.empty() ? "" : ", ",
                             line.substr(at, line.find('"', at) - at), value);
    } else if (line.starts_with("rtable_async_insert_inserts_per_flush_sum")) {
      inserts = value;
    } else if (line.starts_with("rtable_async_insert_inserts_per_flush_count")) {
      flushes = value;
    }
  }
  return fmt::format("{} flushes ({}), {:.1f} inserts per flush", flushes, reasons,
                     flushes > 0 ? inserts / flushes : 0);
}

std::string errorsText(const std::map<int, uint64_t>& errors) {
  std::string text;
  for (auto [status, n] : errors)
    text += fmt::format("{}{}: {}", text.empty() ? "" : ", ",
                        status ? std::to_string(status) : "none", n);
  return text.empty() ? "none" : text;
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 64;
  int seconds = 20;
  uint64_t bulk_rows = 1'000'000;
  int bulk_rounds = 3;
  std::string async_settings = "enabled: true";  // the table's inserts.async (--async 'k: v, ...')
  constexpr const char* kUsage =
      "usage: rtable-async-insert-bench [--clients N] [--seconds S (0: bulk only)] "
      "[--bulk-rows N] [--bulk-rounds N] [--async 'busyTimeoutMs: 200, ...']\n";
  auto refuse = [&](const std::string& why) {
    fmt::print(stderr, "rtable-async-insert-bench: {}\n{}", why, kUsage);
    return 2;
  };
  if (rtable::bench::wantsHelp(argc, argv)) return fmt::print("{}", kUsage), 0;
  if (auto paired = rtable::bench::pairedFlags(argc, argv); !paired) return refuse(paired.error());
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    auto number = [&](int64_t min, int64_t max) {
      return rtable::bench::wholeNumber(flag, argv[i + 1], min, max);
    };
    std::expected<int64_t, std::string> value;
    if (flag == "--clients") {
      if ((value = number(1, 10'000))) clients = static_cast<int>(*value);
    } else if (flag == "--seconds") {
      if ((value = number(0, 86'400))) seconds = static_cast<int>(*value);
    } else if (flag == "--bulk-rows") {
      if ((value = number(0, 1'000'000'000))) bulk_rows = static_cast<uint64_t>(*value);
    } else if (flag == "--bulk-rounds") {
      if ((value = number(1, 1000))) bulk_rounds = static_cast<int>(*value);
    } else if (flag == "--async") {
      async_settings = argv[i + 1];
    } else {
      return refuse("unknown flag " + flag);
    }
    if (!value) return refuse(value.error());
  }
  rtable::core::ZooKeeperClient::silenceLibraryLog();
  LocalZooKeeperOptions zk_options;
  zk_options.production_jvm = true;
  auto zk = LocalZooKeeper::start(zk_options);
  if (!zk) return fmt::print(stderr, "{}\n", zk.error()), 1;
  LocalReplicaOptions options;
  options.binary = RTABLE_CORE_BINARY;
  options.work_dir = (*zk)->workDir() / "rtable";
  options.table_yaml = fmt::format("{}\ninserts: {{async: {{{}}}}}", kTableYaml, async_settings);
  options.zookeeper = (*zk)->connectString();
  options.session_timeout_ms = 10000;
  auto replica = LocalReplica::start(options);
  if (!replica) return fmt::print(stderr, "{}\n", replica.error()), 1;
  // Merges on, as in production: without them ClickHouse refuses inserts at 300 parts.
  LocalClickHouseOptions clickhouse_options;
  clickhouse_options.zookeeper_port = (*zk)->port();
  clickhouse_options.assign_merges = true;
  auto clickhouse = LocalClickHouse::start(clickhouse_options);
  if (!clickhouse) return fmt::print(stderr, "{}\n", clickhouse.error()), 1;
  if (auto created = (*clickhouse)->query(kClickHouseTable); !created)
    return fmt::print(stderr, "{}\n", created.error()), 1;
  rtable::core::ZooKeeperConfig zk_config;
  zk_config.connect_string = (*zk)->connectString();
  auto keeper = rtable::core::ZooKeeperClient::connect(zk_config);
  if (!keeper) return fmt::print(stderr, "{}\n", keeper.error().toString()), 1;

  const int http_port = (*replica)->httpPort();
  auto rtable_counter = [&]() -> int64_t {
    auto state = rtable::common::testing::httpRequest("127.0.0.1", http_port, "GET", "/replica", "",
                                                      std::chrono::seconds(30));
    if (!state || state->status != 200) return -1;
    return nlohmann::json::parse(state->body).value("log_counter", int64_t{-1});
  };
  auto clickhouse_counter = [&]() -> int64_t {
    auto counter = rtable::core::SequentialCounter::read(**keeper, kClickHouseLog, "log-");
    return counter ? counter->counter() : -1;
  };

  if (seconds > 0) {
    fmt::print(
        "{} clients, one row per insert, {} s each; rtable-core with async_insert=1 and "
        "wait_for_async_insert=1 (inserts.async: {{{}}}), ClickHouse 18.16 synchronous\n\n",
        clients, seconds, async_settings);
    // ClickHouse first: the ZooKeeper JVM warms up on its requests, not on rtable's.
    Run c = hammer("ClickHouse 18.16", (*clickhouse)->httpPort(),
                   "/?query=INSERT%20INTO%20default.bench%20FORMAT%20JSONEachRow", clients,
                   std::chrono::seconds(seconds), 1, clickhouse_counter);
    Run r = hammer("rtable-core", http_port, "/insert?format=JSONEachRow&async_insert=1", clients,
                   std::chrono::seconds(seconds), 1, rtable_counter);

    fmt::print("{:<44} {:>14} {:>18} {:>9}\n", "", "rtable-core", "ClickHouse 18.16", "ratio");
    fmt::print("{:<44} {:>14} {:>18}\n", "acknowledged inserts (= rows)", r.acknowledged,
               c.acknowledged);
    fmt::print("{:<44} {:>14.0f} {:>18.0f} {:>8.2f}x\n", "rows/s", r.perSecond(), c.perSecond(),
               r.perSecond() / c.perSecond());
    for (double p : {0.5, 0.99}) {
      fmt::print("{:<44} {:>14.1f} {:>18.1f}\n", fmt::format("client latency p{:.0f}, ms", p * 100),
                 r.percentile(p), c.percentile(p));
    }
    fmt::print("{:<44} {:>14.1f} {:>18.1f}\n", "client latency max, ms", r.percentile(1.0),
               c.percentile(1.0));
    fmt::print("{:<44} {:>14} {:>18}\n", "inserts slower than 250 ms (busy timeout + 50)",
               r.slowerThan(250), c.slowerThan(250));
    fmt::print("rtable-core's inserts over 250 ms, by when they were sent: {}\n", r.slowTimes());
    fmt::print("{:<44} {:>14} {:>18}\n", "log entries (merges included)", r.log_entries,
               c.log_entries);
    fmt::print("{:<44} {:>14.1f} {:>18.1f}\n", "log entries per 1000 acknowledged inserts",
               r.entriesPerThousand(), c.entriesPerThousand());
    fmt::print("{:<44} {:>14} {:>18}\n", "failed attempts by HTTP status", errorsText(r.errors),
               errorsText(c.errors));
    fmt::print("rtable-core's flushes: {}\n", flushesText(**replica));
  }
  if (bulk_rows > 0) {
    // Rounds alternate which server goes first; each round's rows are new (else a repeat would be
    // deduplicated), and the figure is each side's median round.
    KeepAliveClient rtable_bulk("rtable-core", http_port, "/insert?format=JSONEachRow");
    KeepAliveClient ch_bulk("ClickHouse 18.16", (*clickhouse)->httpPort(),
                            "/?query=INSERT%20INTO%20default.bench%20FORMAT%20JSONEachRow");
    std::vector<double> rtable_rates, clickhouse_rates;
    std::size_t body_bytes = 0;
    for (int round = 0; round < bulk_rounds; ++round) {
      const std::string bulk = bulkBody(1'000'000'000 + round * bulk_rows, bulk_rows);
      body_bytes = bulk.size();
      double rb = 0, cb = 0;
      if (round % 2 == 0) {
        rb = bulkRowsPerSecond(rtable_bulk, bulk, bulk_rows);
        cb = bulkRowsPerSecond(ch_bulk, bulk, bulk_rows);
      } else {
        cb = bulkRowsPerSecond(ch_bulk, bulk, bulk_rows);
        rb = bulkRowsPerSecond(rtable_bulk, bulk, bulk_rows);
      }
      fmt::print(
          "bulk round {}: rtable-core {:.0f} rows/s, ClickHouse 18.16 {:.0f} rows/s, {:.2f}x\n",
          round + 1, rb, cb, cb > 0 ? rb / cb : 0);
      rtable_rates.push_back(rb);
      clickhouse_rates.push_back(cb);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double rb = median(rtable_rates), cb = median(clickhouse_rates);
    fmt::print("{:<44} {:>14.0f} {:>18.0f} {:>8.2f}x\n",
               fmt::format("bulk rows/s, median of {} ({} rows, {:.0f} MB JSONEachRow)",
                           bulk_rounds, bulk_rows, body_bytes / 1e6),
               rb, cb, cb > 0 ? rb / cb : 0);
  }
  return 0;
}
