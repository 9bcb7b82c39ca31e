// The table swap (issue 20) of a table of N parts on three replicas, for each N of --parts, on a
// fresh ZooKeeper 3.8 each time:
//   - rtable-core: three rtable-core processes, one part per partition (`partitionBy: d`, N
//     distinct dates, one insert each, so no merge can fold them), then core::SwapDriver (what the
//     operator runs) drives the swap (begin, then advance every 10 ms) while a writer inserts
//     without pause, retrying each insert with its insert_deduplication_token. Figures: the whole
//     swap (begin to ended), the write pause the plan records (switched_ms - paused_ms), the
//     longest gap the writer saw between two acknowledged inserts, and each step's time as the
//     driver saw it. Then every acknowledged row must be on every replica exactly once.
//   - ClickHouse 18.16: three servers (ReplicatedMergeTree, same schema and N parts), then seed
//     002's manual procedure timed step by step: CREATE the new table on each replica (a new
//     ZooKeeper path), ALTER TABLE new ATTACH PARTITION ID ... FROM old for every partition (on
//     one replica: the others fetch), SYSTEM SYNC REPLICA new on each, the count on each, RENAME
//     TABLE old TO old_gone, new TO old on each (18.16 has no EXCHANGE TABLES), DROP the old one
//     on each. Writes into the old table during the attach would be lost, so the user stops them:
//     the write pause is from the attach's start to the last rename's end. No writer runs.
// Usage: rtable-swap-bench [--parts 10,100,1000] [--only rtable|clickhouse]
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rtable/common/testing/http_client.h"
#include "rtable/replication_core/table_swap.h"
#include "rtable/replication_core/testing/local_clickhouse.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace {

using namespace rtable::core::testing;
using rtable::common::testing::httpRequest;
using rtable::core::SwapStep;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kTable = "swap_bench";
constexpr const char* kTableYaml = R"(table: swap_bench
columns:
  - {name: id, type: UInt64}
  - {name: d, type: Date}
  - {name: user, type: String}
partitionBy: d
orderBy: [id])";
// The writer's rows go to one date after the N parts' dates, apart from them.
constexpr const char* kWriterDate = "2099-12-31";
// Parallel inserts while the N parts are made (two cores: more would only queue).
constexpr int kLoaders = 4;
// How long the writer runs before the swap begins and after it ends, so that the gaps it sees
// around the pause are measured against its ordinary pace.
constexpr auto kWriterMargin = std::chrono::milliseconds(500);
// Between the writer's acknowledged inserts: each is a part, and the swap attaches those of the
// writer's partition too; at this pace they stay few beside N (the figures report how many).
constexpr auto kWriterPace = std::chrono::milliseconds(20);
// The driver's period between advance() calls (the operator's is longer; this measures the steps).
constexpr auto kAdvancePeriod = std::chrono::milliseconds(10);
constexpr auto kWriterRetryDelay = std::chrono::milliseconds(10);

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// 2000-01-01 + `day` days: one partition per part.
std::string date(int day) {
  using namespace std::chrono;
  const year_month_day ymd{sys_days{year{2000} / January / 1} + days{day}};
  return fmt::format("{:04d}-{:02d}-{:02d}", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()));
}

std::string row(uint64_t id, const std::string& d) {
  return fmt::format(R"({{"id":{},"d":"{}","user":"u{}"}})", id, d, id % 97) + "\n";
}

// Runs `make(i)` for i in [0, n) on kLoaders threads; false if any call returned false.
template <typename F>
bool parallelFor(int n, F make) {
  std::atomic<int> next{0};
  std::atomic<bool> ok{true};
  std::vector<std::thread> threads;
  for (int t = 0; t < kLoaders; ++t) {
    threads.emplace_back([&] {
      for (int i; ok && (i = next++) < n;) {
        if (!make(i)) ok = false;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return ok;
}

// --- rtable-core ---

struct RtableResult {
  bool ok = false;
  std::string error;
  std::vector<std::size_t> parts_before;  // per replica, in the N parts' partitions
  double swap_s = 0;                      // begin() to the advance() that reported ended
  double plan_pause_s = 0;                // switched_ms - paused_ms
  double plan_total_s = 0;                // ended - started_ms (driver's wall clock)
  double longest_gap_s = 0;               // between two acknowledged inserts, around the swap
  double writer_median_s = 0;             // the writer's ordinary time per insert, for scale
  std::vector<std::pair<SwapStep, double>> steps;  // each step's time as the driver saw it
  std::string attach_ack;                          // the attacher's acknowledgement
  std::vector<std::string> verify_acks;
  std::size_t acknowledged = 0;  // writer inserts acknowledged
  std::set<std::string> writer_errors;
};

std::multiset<uint64_t> idsOn(LocalReplica& replica, std::string* error) {
  std::multiset<uint64_t> ids;
  auto selected = replica.get("/select?format=TSV");
  if (!selected || selected->status != 200) {
    *error = selected ? selected->body : selected.error();
    return ids;
  }
  std::istringstream in(selected->body);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) ids.insert(std::stoull(line.substr(0, line.find('\t'))));
  }
  return ids;
}

RtableResult runRtable(int n) {
  RtableResult r;
  auto fail = [&](std::string error) {
    fmt::print(stderr, "rtable-core N={}: {}\n", n, error);
    r.error = std::move(error);
    return r;
  };
  auto zk = LocalZooKeeper::start();
  if (!zk) return fail(zk.error());
  std::vector<std::unique_ptr<LocalReplica>> replicas;
  for (int i = 0; i < 3; ++i) {
    LocalReplicaOptions options;
    options.binary = RTABLE_CORE_BINARY;
    options.replica = fmt::format("r{}", i + 1);
    options.work_dir = (*zk)->workDir() / ("rtable-" + options.replica);
    options.table_yaml = kTableYaml;
    options.zookeeper = (*zk)->connectString();
    options.session_timeout_ms = 10000;
    auto replica = LocalReplica::start(options);
    if (!replica) return fail(replica.error());
    replicas.push_back(std::move(*replica));
  }
  std::set<uint64_t> acknowledged;  // every row that was acknowledged, setup's too
  const bool loaded = parallelFor(n, [&](int i) {
    auto reply = replicas[i % 3]->post("/insert?format=JSONEachRow", row(i, date(i)));
    if (!reply || reply->status != 200) {
      fmt::print(stderr, "insert {}: {}\n", i, reply ? reply->body : reply.error());
      return false;
    }
    return true;
  });
  if (!loaded) return fail("loading the parts failed");
  for (int i = 0; i < n; ++i) acknowledged.insert(i);
  // Every replica has all N parts, one per partition.
  for (int i = 0; i < 3; ++i) {
    if (auto synced = replicas[i]->post("/sync", ""); !synced || synced->status != 200)
      return fail(fmt::format("r{}: /sync failed", i + 1));
    auto parts = replicas[i]->get("/parts");
    if (!parts || parts->status != 200) return fail(fmt::format("r{}: no /parts", i + 1));
    std::size_t count = 0;
    std::set<std::string> partitions;
    for (const auto& part : json::parse(parts->body)) {
      ++count;
      partitions.insert(part["partition"].get<std::string>());
    }
    r.parts_before.push_back(count);
    if (count != static_cast<std::size_t>(n) || partitions.size() != count)
      return fail(fmt::format("r{} has {} parts in {} partitions, expected {}", i + 1, count,
                              partitions.size(), n));
  }
  fmt::print("rtable-core N={}: {} parts on each replica; swapping with a writer running\n", n, n);
  std::fflush(stdout);

  // The writer: one insert at a time, each retried (same token) on the next replica until one
  // acknowledges it.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Clock::time_point> acks;  // guarded by mu
  std::vector<double> latencies;        // guarded by mu
  std::set<std::string> errors;         // guarded by mu
  std::vector<uint64_t> writer_ids;     // guarded by mu
  std::thread writer([&] {
    for (uint64_t id = 1'000'000'000ULL; !stop; ++id) {
      const auto started = Clock::now();
      for (std::size_t attempt = 0;; ++attempt) {
        auto reply = replicas[(id + attempt) % 3]->post(
            fmt::format("/insert?format=JSONEachRow&insert_deduplication_token=t{}", id),
            row(id, kWriterDate));
        if (reply && reply->status == 200) {
          std::lock_guard lock(mu);
          acks.push_back(Clock::now());
          latencies.push_back(secondsSince(started));
          writer_ids.push_back(id);
          break;
        }
        {
          std::lock_guard lock(mu);
          if (!reply) {
            errors.insert("no answer");
          } else {
            auto body = json::parse(reply->body, nullptr, false);
            errors.insert(body.is_discarded() ? fmt::format("HTTP {}", reply->status)
                                              : body.value("error", "?"));
          }
        }
        if (stop && attempt > 500) return;  // the run failed elsewhere; give up on this row
        std::this_thread::sleep_for(kWriterRetryDelay);
      }
      std::this_thread::sleep_for(kWriterPace);
    }
  });
  auto stopWriter = [&] {
    stop = true;
    writer.join();
  };
  std::this_thread::sleep_for(kWriterMargin);

  auto keeper = (*zk)->connect();
  if (!keeper) {
    stopWriter();
    return fail(keeper.error().toString());
  }
  rtable::core::SwapDriver driver(**keeper, std::string("/rtable/tables/") + kTable);
  const auto begun = Clock::now();
  auto plan = driver.begin();
  if (!plan) {
    stopWriter();
    return fail("begin: " + plan.error().toString());
  }
  SwapStep step = plan->step;
  auto step_started = begun;
  rtable::core::SwapProgress progress;
  Clock::time_point ended_at;
  for (;;) {
    if (Clock::now() - begun > std::chrono::minutes(10)) {
      stopWriter();
      return fail(fmt::format("the swap did not end in 10 minutes: at {}, {}",
                              rtable::core::swapStepName(step), progress.waiting_for));
    }
    auto advanced = driver.advance();
    if (!advanced) {
      std::this_thread::sleep_for(kAdvancePeriod);  // ZooKeeper busy: look again
      continue;
    }
    progress = *advanced;
    if (progress.ended || (progress.plan && progress.plan->step != step)) {
      // The acknowledgements of the step that just ended, for where the time went.
      for (const auto& ack : progress.acknowledgements) {
        if (step == SwapStep::kAttach && ack.find("attached") != std::string::npos)
          r.attach_ack = ack;
        if (step == SwapStep::kVerify) r.verify_acks.push_back(ack);
      }
      const auto now = Clock::now();
      r.steps.emplace_back(step, seconds(now - step_started));
      step_started = now;
      if (progress.ended) {
        ended_at = now;
        break;
      }
      step = progress.plan->step;
    }
    std::this_thread::sleep_for(kAdvancePeriod);
  }
  const int64_t ended_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  std::this_thread::sleep_for(kWriterMargin);
  stopWriter();
  r.swap_s = seconds(ended_at - begun);
  if (progress.aborted) return fail("the swap aborted: " + progress.waiting_for);
  if (!progress.ended_plan) return fail("the swap ended without its plan");
  r.plan_pause_s =
      static_cast<double>(progress.ended_plan->switched_ms - progress.ended_plan->paused_ms) / 1000;
  r.plan_total_s = static_cast<double>(ended_ms - progress.ended_plan->started_ms) / 1000;
  for (std::size_t i = 1; i < acks.size(); ++i) {
    // Only gaps that end after the swap began: before it the writer is at its ordinary pace.
    if (acks[i] > begun)
      r.longest_gap_s = std::max(r.longest_gap_s, seconds(acks[i] - acks[i - 1]));
  }
  if (!latencies.empty()) {
    std::vector<double> sorted = latencies;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    r.writer_median_s = sorted[sorted.size() / 2];
  }
  r.acknowledged = writer_ids.size();
  r.writer_errors = errors;
  acknowledged.insert(writer_ids.begin(), writer_ids.end());

  // Every acknowledged row exactly once on every replica, in generation 2.
  const std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
  for (int i = 0; i < 3; ++i) {
    if (auto synced = replicas[i]->post("/sync", ""); !synced || synced->status != 200)
      return fail(fmt::format("r{}: /sync failed after the swap", i + 1));
    auto state = replicas[i]->get("/replica");
    if (!state || state->status != 200) return fail(fmt::format("r{}: no /replica", i + 1));
    if (json::parse(state->body).value("generation", 0) != 2)
      return fail(fmt::format("r{} does not serve generation 2", i + 1));
    std::string error;
    const auto ids = idsOn(*replicas[i], &error);
    if (!error.empty()) return fail(fmt::format("r{}: select: {}", i + 1, error));
    if (ids != expected) {
      std::size_t missing = 0, doubled = 0;
      for (uint64_t id : acknowledged) {
        const auto c = ids.count(id);
        missing += c == 0;
        doubled += c > 1;
      }
      return fail(fmt::format("r{}: {} rows, {} acknowledged: {} missing, {} doubled", i + 1,
                              ids.size(), expected.size(), missing, doubled));
    }
  }
  r.ok = true;
  return r;
}

// --- ClickHouse 18.16 ---

struct ClickHouseResult {
  bool ok = false;
  std::string error;
  std::string attach_form;  // what the attach step ran
  std::vector<std::size_t> parts_before;
  double create_s = 0;  // CREATE TABLE new, on each replica in turn
  double attach_s = 0;  // ATTACH PARTITION ... FROM for every partition, on r1
  double sync_s = 0;    // SYSTEM SYNC REPLICA new, on each replica in turn
  double count_s = 0;   // SELECT count() FROM new, on each
  double rename_s = 0;  // RENAME TABLE old TO old_gone, new TO old, on each
  double drop_s = 0;    // DROP TABLE old_gone, on each
  double pause_s = 0;   // attach start to the last rename's end
  double total_s = 0;   // CREATE's start to DROP's end
};

std::string createTable(const std::string& name) {
  return fmt::format(
      "CREATE TABLE default.{0} (id UInt64, d Date, user String) ENGINE = "
      "ReplicatedMergeTree('/clickhouse/tables/01/{0}', '{{replica}}') PARTITION BY d ORDER BY id",
      name);
}

// ClickHouse answers HTTP/1.1 in chunks; httpRequest hands the body over as it came.
std::string dechunk(const std::string& chunked) {
  std::string body;
  for (std::size_t at = 0; at < chunked.size();) {
    const std::size_t line_end = chunked.find("\r\n", at);
    if (line_end == std::string::npos) break;
    const std::size_t size = std::stoul(chunked.substr(at, line_end - at), nullptr, 16);
    if (size == 0) break;
    body += chunked.substr(line_end + 2, size);
    at = line_end + 2 + size + 2;
  }
  return body;
}

class ClickHouseClient {
 public:
  explicit ClickHouseClient(int port) : port_(port) {}
  // The statement's TSV result, or the server's error.
  std::expected<std::string, std::string> query(const std::string& sql) const {
    auto reply = httpRequest("127.0.0.1", port_, "POST", "/", sql, std::chrono::minutes(10));
    if (!reply) return std::unexpected(reply.error());
    std::string body = reply->body;
    std::string headers = reply->headers;
    for (auto& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (headers.find("transfer-encoding: chunked") != std::string::npos) body = dechunk(body);
    if (reply->status != 200) return std::unexpected(body);
    return body;
  }

 private:
  int port_;
};

ClickHouseResult runClickHouse(int n) {
  ClickHouseResult r;
  auto fail = [&](std::string error) {
    fmt::print(stderr, "ClickHouse N={}: {}\n", n, error);
    r.error = std::move(error);
    return r;
  };
  auto zk = LocalZooKeeper::start();
  if (!zk) return fail(zk.error());
  std::vector<std::unique_ptr<LocalClickHouse>> servers;
  std::vector<ClickHouseClient> clients;
  for (int i = 0; i < 3; ++i) {
    LocalClickHouseOptions options;
    options.zookeeper_port = (*zk)->port();
    options.replica = fmt::format("r{}", i + 1);
    options.assign_merges = true;  // ClickHouse's default; one part per partition has no merge
    auto server = LocalClickHouse::start(options);
    if (!server) return fail(server.error());
    clients.emplace_back((*server)->httpPort());
    servers.push_back(std::move(*server));
    if (auto created = clients.back().query(createTable(kTable)); !created)
      return fail(created.error());
  }
  const bool loaded = parallelFor(n, [&](int i) {
    auto inserted = clients[i % 3].query(
        fmt::format("INSERT INTO default.{} FORMAT JSONEachRow\n{}", kTable, row(i, date(i))));
    if (!inserted) fmt::print(stderr, "insert {}: {}\n", i, inserted.error());
    return inserted.has_value();
  });
  if (!loaded) return fail("loading the parts failed");
  std::vector<std::string> partition_ids;
  for (int i = 0; i < 3; ++i) {
    if (auto synced = clients[i].query(fmt::format("SYSTEM SYNC REPLICA default.{}", kTable));
        !synced)
      return fail(synced.error());
    auto parts = clients[i].query(
        fmt::format("SELECT partition_id FROM system.parts WHERE database = 'default' AND table = "
                    "'{}' AND active ORDER BY partition_id",
                    kTable));
    if (!parts) return fail(parts.error());
    std::vector<std::string> ids;
    std::istringstream in(*parts);
    for (std::string line; std::getline(in, line);) ids.push_back(line);
    r.parts_before.push_back(ids.size());
    if (ids.size() != static_cast<std::size_t>(n) ||
        std::set<std::string>(ids.begin(), ids.end()).size() != ids.size())
      return fail(fmt::format("r{} has {} parts, expected {} in as many partitions: {}", i + 1,
                              ids.size(), n, *parts));
    if (i == 0) partition_ids = ids;
  }
  auto old_count = clients[0].query(fmt::format("SELECT count() FROM default.{}", kTable));
  if (!old_count) return fail(old_count.error());
  fmt::print("ClickHouse N={}: {} parts on each replica; seed 002's procedure\n", n, n);
  std::fflush(stdout);

  const std::string old_name = kTable;
  const std::string new_name = old_name + "_new";
  const std::string gone_name = old_name + "_gone";
  auto each = [&](const std::string& sql) -> std::expected<void, std::string> {
    for (auto& client : clients) {
      if (auto done = client.query(sql); !done) return std::unexpected(done.error());
    }
    return {};
  };
  const auto started = Clock::now();
  if (auto created = each(createTable(new_name)); !created) return fail(created.error());
  r.create_s = secondsSince(started);

  const auto attach_started = Clock::now();
  r.attach_form = "ALTER TABLE new ATTACH PARTITION ID '<id>' FROM old";
  for (const auto& id : partition_ids) {
    auto attached = clients[0].query(fmt::format(
        "ALTER TABLE default.{} ATTACH PARTITION ID '{}' FROM default.{}", new_name, id, old_name));
    if (!attached) return fail("attach: " + attached.error());
  }
  r.attach_s = secondsSince(attach_started);

  auto mark = Clock::now();
  if (auto synced = each(fmt::format("SYSTEM SYNC REPLICA default.{}", new_name)); !synced)
    return fail(synced.error());
  r.sync_s = secondsSince(mark);

  mark = Clock::now();
  for (int i = 0; i < 3; ++i) {
    auto count = clients[i].query(fmt::format("SELECT count() FROM default.{}", new_name));
    if (!count) return fail(count.error());
    if (*count != *old_count)
      return fail(
          fmt::format("r{}: the new table counts {} rows, the old {}", i + 1, *count, *old_count));
  }
  r.count_s = secondsSince(mark);

  mark = Clock::now();
  if (auto renamed = each(fmt::format("RENAME TABLE default.{0} TO default.{1}, default.{2} TO "
                                      "default.{0}",
                                      old_name, gone_name, new_name));
      !renamed)
    return fail(renamed.error());
  r.rename_s = secondsSince(mark);
  r.pause_s = secondsSince(attach_started);

  mark = Clock::now();
  if (auto dropped = each(fmt::format("DROP TABLE default.{}", gone_name)); !dropped)
    return fail(dropped.error());
  r.drop_s = secondsSince(mark);
  r.total_s = secondsSince(started);

  // After: the table under its old name has every part on every replica.
  for (int i = 0; i < 3; ++i) {
    auto count = clients[i].query(fmt::format("SELECT count() FROM default.{}", old_name));
    if (!count || *count != *old_count)
      return fail(fmt::format("r{}: {} rows after the swap, {} before", i + 1,
                              count ? *count : count.error(), *old_count));
  }
  r.ok = true;
  return r;
}

std::string figure(bool ran, bool ok, double value) {
  if (!ran) return "-";
  if (!ok) return "failed";
  return fmt::format("{:.2f}", value);
}

// A Markdown table's title and head: one column per table size.
void printTableHead(const std::string& title, const std::vector<int>& sizes) {
  fmt::print("\n{}\n\n| measure |", title);
  for (int n : sizes) fmt::print(" {} parts |", n);
  fmt::print("\n| --- |");
  for (std::size_t i = 0; i < sizes.size(); ++i) fmt::print(" ---: |");
  fmt::print("\n");
}

// One row: `value` of each size's result.
template <typename Results, typename Value>
void printLine(const std::string& label, const std::vector<int>& sizes, Results& results,
               const Value& value) {
  fmt::print("| {} |", label);
  for (int n : sizes) fmt::print(" {} |", figure(true, results[n].ok, value(results[n])));
  fmt::print("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {10, 100, 1000};
  std::string only;
  std::string command = "rtable-swap-bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  bool usage = argc % 2 == 0;
  for (int i = 1; !usage && i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--parts") {
      sizes.clear();
      std::istringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) {
        const int n = std::atoi(item.c_str());
        if (n < 1 || n > 20000) usage = true;
        sizes.push_back(n);
      }
    } else if (flag == "--only") {
      only = argv[i + 1];
      usage = usage || (only != "rtable" && only != "clickhouse");
    } else {
      usage = true;
    }
  }
  if (usage || sizes.empty()) {
    fmt::print(stderr,
               "usage: rtable-swap-bench [--parts 10,100,1000] [--only rtable|clickhouse]\n");
    return 2;
  }
  fmt::print("{}\n", command);
  std::fflush(stdout);
  rtable::core::ZooKeeperClient::silenceLibraryLog();

  std::map<int, RtableResult> rt;
  std::map<int, ClickHouseResult> ch;
  for (int n : sizes) {
    if (only.empty() || only == "rtable") {
      rt[n] = runRtable(n);
      const auto& r = rt[n];
      if (r.ok) {
        fmt::print("rtable-core N={}: swap {:.2f} s, write pause {:.2f} s, longest gap {:.2f} s\n",
                   n, r.swap_s, r.plan_pause_s, r.longest_gap_s);
        std::fflush(stdout);
      }
    }
    if (only.empty() || only == "clickhouse") {
      ch[n] = runClickHouse(n);
      const auto& c = ch[n];
      if (c.ok) {
        fmt::print("ClickHouse N={}: procedure {:.2f} s, write pause {:.2f} s\n", n, c.total_s,
                   c.pause_s);
        std::fflush(stdout);
      }
    }
  }

  bool ok = true;
  fmt::print("\n{}\n", command);
  if (!rt.empty()) {
    printTableHead("rtable-core, 3 replicas (seconds)", sizes);
    auto line = [&](const std::string& label, auto value) { printLine(label, sizes, rt, value); };
    line("whole swap (begin to ended)", [](const RtableResult& r) { return r.swap_s; });
    line("write pause (plan: switched - paused)",
         [](const RtableResult& r) { return r.plan_pause_s; });
    line("longest gap between two acknowledged inserts",
         [](const RtableResult& r) { return r.longest_gap_s; });
    line("(the writer's median insert)", [](const RtableResult& r) { return r.writer_median_s; });
    for (SwapStep step : {SwapStep::kOpen, SwapStep::kPause, SwapStep::kDrain, SwapStep::kAttach,
                          SwapStep::kVerify, SwapStep::kSwitch, SwapStep::kCleanup}) {
      line(fmt::format("step {}", rtable::core::swapStepName(step)), [&](const RtableResult& r) {
        double total = 0;
        for (const auto& [s, t] : r.steps) total += s == step ? t : 0;
        return total;
      });
    }
    for (int n : sizes) {
      const auto& r = rt[n];
      ok = ok && r.ok;
      if (!r.ok) {
        fmt::print("N={}: failed: {}\n", n, r.error);
        continue;
      }
      fmt::print(
          "N={}: {} writer inserts acknowledged, all on every replica once; answers met: {}\n", n,
          r.acknowledged, fmt::join(r.writer_errors, ", "));
      fmt::print("N={}: attach: {}; verify: {}\n", n, r.attach_ack, fmt::join(r.verify_acks, "; "));
    }
  }
  if (!ch.empty()) {
    printTableHead("ClickHouse 18.16, 3 replicas, seed 002's procedure (seconds)", sizes);
    auto line = [&](const std::string& label, auto value) { printLine(label, sizes, ch, value); };
    line("whole procedure (CREATE to DROP)", [](const ClickHouseResult& r) { return r.total_s; });
    line("write pause (attach to the last RENAME)",
         [](const ClickHouseResult& r) { return r.pause_s; });
    line("CREATE TABLE new, on each", [](const ClickHouseResult& r) { return r.create_s; });
    line("ATTACH PARTITION ID ... FROM old, every partition, on r1",
         [](const ClickHouseResult& r) { return r.attach_s; });
    line("SYSTEM SYNC REPLICA new, on each", [](const ClickHouseResult& r) { return r.sync_s; });
    line("SELECT count() FROM new, on each", [](const ClickHouseResult& r) { return r.count_s; });
    line("RENAME TABLE old TO old_gone, new TO old, on each",
         [](const ClickHouseResult& r) { return r.rename_s; });
    line("DROP TABLE old_gone, on each", [](const ClickHouseResult& r) { return r.drop_s; });
    for (int n : sizes) {
      ok = ok && ch[n].ok;
      if (!ch[n].ok) fmt::print("N={}: failed: {}\n", n, ch[n].error);
    }
  }
  return ok ? 0 : 1;
}
