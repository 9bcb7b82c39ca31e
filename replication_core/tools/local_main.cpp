// rtable-local: runs rtable on an embedded default: a local ZooKeeper 3.8; a demo tree of
// replicated tables in rtable's and ClickHouse's layouts, one pushed to the seed-002 failure (the
// log counter at 2147483647, inserts fail with "node exists") and one close to it; three
// rtable-core replicas of a table `events`: a demo insert on one, its retry on another
// (deduplicated), the rows read on the third, the metrics; and rtable-inspect over all of it.
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/log_entry.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace {

using rtable::core::createAncestorsAndSelf;
using rtable::core::CreateMode;
using rtable::core::Keeper;
namespace testing = rtable::core::testing;

constexpr const char* kUsage =
    "usage: rtable-local [--work-dir DIR] [--keep-running]\n"
    "Starts a local ZooKeeper and three rtable-core replicas, inserts demo rows, builds a demo "
    "tree of\n"
    "replicated tables and runs rtable-inspect.\n"
    "--keep-running leaves ZooKeeper and the replicas up (Ctrl-C to stop) to try them yourself.\n";

constexpr const char* kEventsTable = R"(table: events
columns:
  - {name: d, type: Date}
  - {name: user, type: String}
  - {name: clicks, type: UInt32}
  - {name: score, type: Nullable(Float64)}
partitionBy: toYYYYMM(d)
orderBy: [user, d])";

constexpr const char* kDemoRows =
    "{\"d\":\"2026-12-01\",\"user\":\"ada\",\"clicks\":3,\"score\":0.5}\n"
    "{\"d\":\"2026-12-02\",\"user\":\"bob\",\"clicks\":1,\"score\":null}\n"
    "{\"d\":\"2026-11-30\",\"user\":\"cy\",\"clicks\":7,\"score\":2.25}\n";

std::string show(
    const std::expected<rtable::common::testing::HttpResponse, std::string>& response) {
  if (!response) return "(no answer: " + response.error() + ")";
  std::string body = response->body;
  while (!body.empty() && body.back() == '\n') body.pop_back();
  for (std::size_t at = body.find('\n'); at != std::string::npos; at = body.find('\n', at + 3)) {
    body.replace(at, 1, "\n  ");
  }
  return fmt::format("HTTP {} {}", response->status, body);
}

struct Failure {
  std::string message;
};
using Step = std::expected<void, Failure>;

Step check(const rtable::core::KeeperStatus& status, const std::string& what) {
  if (!status) return std::unexpected(Failure{what + ": " + status.error().toString()});
  return {};
}

// A table's nodes as ClickHouse's createTableIfNotExists lays them out (reference notes 1.1).
Step createTableTree(Keeper& keeper, const std::string& path, int replicas) {
  for (const char* child : {"metadata", "columns", "log", "block_numbers", "blocks", "quorum",
                            "leader_election", "temp", "replicas"}) {
    if (auto s = check(createAncestorsAndSelf(keeper, path + "/" + child), path); !s) return s;
  }
  for (int r = 1; r <= replicas; ++r) {
    const std::string replica = fmt::format("{}/replicas/r{}", path, r);
    for (const char* child : {"queue", "parts", "log_pointer", "is_lost"}) {
      if (auto s = check(createAncestorsAndSelf(keeper, replica + "/" + child), replica); !s)
        return s;
    }
  }
  return {};
}

// What an insert of one block into partition 202612 writes to the log.
std::string getEntry(int block) {
  rtable::core::LogEntry entry;
  entry.type = rtable::core::LogEntry::Type::kGetPart;
  entry.create_time = 1764558000;
  entry.source_replica = "r1";
  entry.block_id = fmt::format("202612_{}_{}", block * 7919, block * 104729);
  entry.new_part_name = fmt::format("202612_{}_{}_0", block, block);
  return entry.format();
}

Step appendLogEntries(Keeper& keeper, const std::string& table, int count, int first_block,
                      int* created) {
  for (int i = 0; i < count; ++i) {
    auto made = keeper.create(table + "/log/log-", getEntry(first_block + i),
                              CreateMode::kPersistentSequential);
    if (!made)
      return std::unexpected(Failure{"create " + table + "/log/log-: " + made.error().toString()});
    if (created) ++*created;
  }
  return {};
}

volatile sig_atomic_t g_stop = 0;
void onSignal(int) {
  g_stop = 1;
}

Step run(const testing::LocalZooKeeperOptions& zk_options, bool keep_running) {
  fmt::print("Starting ZooKeeper 3.8 ...\n");
  auto zk = testing::LocalZooKeeper::start(zk_options);
  if (!zk) return std::unexpected(Failure{"ZooKeeper did not start: " + zk.error()});
  fmt::print("ZooKeeper is serving at {} (data in {})\n\n", (*zk)->connectString(),
             (*zk)->workDir().string());

  const std::string healthy = "/rtable/tables/3f2a9c1e-events/1";
  const std::string near_limit = "/rtable/tables/8b41d07a-metrics/1";
  const std::string stuck = "/clickhouse/tables/01/seq_flow";
  {
    auto keeper = (*zk)->connect();
    if (!keeper) return std::unexpected(Failure{"connect: " + keeper.error().toString()});
    auto& k = **keeper;
    if (auto s =
            check(createAncestorsAndSelf(k, "/rtable/tables/3f2a9c1e-events/active"), "active");
        !s)
      return s;
    if (auto set = k.set("/rtable/tables/3f2a9c1e-events/active", "1"); !set) {
      return std::unexpected(Failure{"set active: " + set.error().toString()});
    }
    for (const auto& table : {healthy, near_limit, stuck}) {
      if (auto s = createTableTree(k, table, 3); !s) return s;
    }
    if (auto s = appendLogEntries(k, healthy, 120, 1, nullptr); !s) return s;
    if (auto s = appendLogEntries(k, near_limit, 10, 1, nullptr); !s) return s;
    if (auto s = appendLogEntries(k, stuck, 10, 1, nullptr); !s) return s;
  }

  // Jump two counters forward in the stopped server's snapshot, as if billions of inserts ran.
  fmt::print("Raising log counters in the snapshot (ZooKeeper restarts twice) ...\n");
  if (auto s = (*zk)->setSequentialCounter(near_limit + "/log", 2100000000); !s)
    return std::unexpected(Failure{s.error()});
  if (auto s = (*zk)->setSequentialCounter(stuck + "/log", 2147483644); !s)
    return std::unexpected(Failure{s.error()});

  auto keeper = (*zk)->connect();
  if (!keeper) return std::unexpected(Failure{"connect: " + keeper.error().toString()});
  fmt::print("\nInserting into {}: each insert creates one log/log- entry\n", stuck);
  for (int insert = 1; insert <= 5; ++insert) {
    auto made = (*keeper)->create(stuck + "/log/log-", getEntry(100 + insert),
                                  CreateMode::kPersistentSequential);
    if (made) {
      fmt::print("  insert {}: created {}\n", insert, *made);
    } else {
      fmt::print("  insert {}: FAILED: {}  <- the int32 counter is exhausted (seed 002)\n", insert,
                 made.error().toString());
    }
  }

  fmt::print("\nStarting rtable-core: three replicas of table 'events' ...\n");
  std::fflush(stdout);
  std::vector<std::unique_ptr<testing::LocalReplica>> replicas;
  for (const char* name : {"r1", "r2", "r3"}) {
    testing::LocalReplicaOptions replica_options;
    replica_options.binary = RTABLE_CORE_BINARY;
    replica_options.work_dir = (*zk)->workDir() / fmt::format("events-{}", name);
    replica_options.table_yaml = kEventsTable;
    replica_options.zookeeper = (*zk)->connectString();
    replica_options.replica = name;
    auto started = testing::LocalReplica::start(replica_options);
    if (!started)
      return std::unexpected(
          Failure{fmt::format("rtable-core {} did not start: {}", name, started.error())});
    fmt::print("  {} serves http://127.0.0.1:{} (spec: {})\n", name, (*started)->httpPort(),
               (replica_options.work_dir / "spec.yaml").string());
    replicas.push_back(std::move(*started));
  }
  auto url = [&](std::size_t i) {
    return fmt::format("http://127.0.0.1:{}", replicas[i]->httpPort());
  };
  auto& replica = replicas[0];
  const std::string base = url(0);
  fmt::print(
      "\n$ curl -X POST '{}/insert?format=JSONEachRow' --data-binary @rows.jsonl   # r1: 3 rows, 2 "
      "months\n  {}\n",
      base, show(replica->post("/insert?format=JSONEachRow", kDemoRows)));
  fmt::print(
      "$ (the client did not see the answer and retries the same insert, on r2)\n"
      "$ curl -X POST '{}/insert?format=JSONEachRow' --data-binary @rows.jsonl\n  {}\n",
      url(1), show(replicas[1]->post("/insert?format=JSONEachRow", kDemoRows)));
  // Replicas fetch the part in the background: a read right after the answer may not see it yet
  // (as in ClickHouse). /sync waits until a replica has executed everything in the log.
  for (std::size_t i = 1; i < replicas.size(); ++i) {
    fmt::print(
        "$ curl -X POST '{}/sync'   # r{}: wait until its replication queue has drained\n  {}\n",
        url(i), i + 1, show(replicas[i]->post("/sync", "")));
  }
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    fmt::print("$ curl '{}/count'   # r{}\n  {}\n", url(i), i + 1,
               show(replicas[i]->get("/count")));
  }
  fmt::print("$ curl '{}/select?where=clicks%20%3E%202'   # r3\n  {}\n", url(2),
             show(replicas[2]->get("/select?where=clicks%20%3E%202")));
  // Background work publishes the log counter within a second.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  fmt::print("$ curl 'http://127.0.0.1:{}/metrics' | grep ...   # r1\n", replica->metricsPort());
  if (auto metrics = replica->metrics()) {
    std::size_t start = 0;
    while (start < metrics->body.size()) {
      std::size_t end = metrics->body.find('\n', start);
      if (end == std::string::npos) end = metrics->body.size();
      const std::string line = metrics->body.substr(start, end - start);
      for (const char* name : {"rtable_inserts_total", "rtable_inserted_rows_total",
                               "rtable_insert_deduplicated_blocks_total", "rtable_log_counter{",
                               "rtable_log_counter_headroom_ratio", "rtable_parts{",
                               "rtable_replication_queue_size{", "rtable_fetches_total{"}) {
        if (line.starts_with(name)) fmt::print("  {}\n", line);
      }
      start = end + 1;
    }
  }

  fmt::print("\n$ rtable-inspect --zookeeper {} --root /\n", (*zk)->connectString());
  std::fflush(stdout);
  auto inspected = rtable::common::testing::runCommand(
      {RTABLE_INSPECT_BINARY, "--zookeeper", (*zk)->connectString(), "--root", "/"},
      std::chrono::seconds(60));
  if (!inspected) return std::unexpected(Failure{"rtable-inspect: " + inspected.error()});
  fmt::print("{}{}", inspected->out, inspected->err);
  fmt::print("(rtable-inspect exited {}: {})\n", inspected->exit_code,
             inspected->exit_code == 1   ? "a table is under the 5% headroom threshold, as intended"
             : inspected->exit_code == 0 ? "every table has headroom"
                                         : "error");
  if (inspected->exit_code != 0 && inspected->exit_code != 1) {
    return std::unexpected(Failure{"rtable-inspect failed"});
  }

  if (keep_running) {
    fmt::print(
        "\nZooKeeper keeps running at {} and rtable-core r1 at {} (r2 at {}, r3 at {}). Try:\n"
        "  {} --zookeeper {} --format json\n"
        "  curl -X POST '{}/insert?format=TSV' --data-binary $'2026-12-03\\tdee\\t2\\t\\\\N\\n'\n"
        "  curl '{}/replica'\n"
        "Ctrl-C stops both.\n",
        (*zk)->connectString(), base, url(1), url(2), RTABLE_INSPECT_BINARY, (*zk)->connectString(),
        base, url(2));
    std::fflush(stdout);
    signal(SIGINT, onSignal);
    signal(SIGTERM, onSignal);
    while (!g_stop && (*zk)->running() && replica->running()) pause();
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  // Restarts make the C client log refused connections; the steps below report what matters.
  rtable::core::ZooKeeperClient::silenceLibraryLog();
  testing::LocalZooKeeperOptions zk_options;
  bool keep_running = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--keep-running") {
      keep_running = true;
    } else if (arg == "--work-dir" && i + 1 < argc) {
      zk_options.work_dir = argv[++i];
    } else if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    } else {
      fmt::print(stderr, "rtable-local: unknown argument '{}' (see --help)\n", arg);
      return 2;
    }
  }
  if (auto done = run(zk_options, keep_running); !done) {
    fmt::print(stderr, "rtable-local: {}\n", done.error().message);
    return 1;
  }
  return 0;
}
