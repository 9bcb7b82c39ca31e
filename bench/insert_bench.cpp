// rtable-core and ClickHouse 18.16 (ReplicatedMergeTree, same schema) side by side on one fresh
// ZooKeeper 3.8 (its JVM run as in production, not with the tests' fast-starting flags), one
// replica each, in one run:
//   - sequential single-row inserts per second over HTTP keep-alive,
//   - ZooKeeper write transactions per insert (the server's zxid delta over those inserts), and
//     the bytes those transactions took in ZooKeeper's transaction log (what every server of an
//     ensemble fsyncs and every follower receives),
//   - rows per second of one 1,000,000-row JSONEachRow insert of a 5-column table,
// after warming ZooKeeper up (below), in several rounds that alternate which system goes first
// (new rows each round); prints each
// round's ratios and the totals. Then, on the same ZooKeeper, the rate of rtable's own commit multi
// sent back to back with nothing else (no HTTP, no part): the ceiling of any insert path that
// makes one ZooKeeper write per insert, beside what 5x ClickHouse's rate would need.
// Usage: rtable-insert-bench [--single N] [--bulk-rows N] [--rounds N]
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "bench_flags.h"
#include "keep_alive_client.h"
#include "rtable/replication_core/insert_protocol.h"
#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/local_clickhouse.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace {

using namespace rtable::core::testing;
using rtable::bench::KeepAliveClient;

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

// Rows of round r fall in the months of year 2020 + r: ClickHouse refuses inserts into a partition
// with 300 active parts, and a round leaves about 170 unmerged ones in each of its three.
std::string row(uint64_t id, int round) {
  return fmt::format(R"({{"id":{},"d":"{}-{:02d}-{:02d}","user":"user-{}","value":{},"n":{}}})", id,
                     2020 + round, 10 + id % 3, 1 + id % 28, id % 1000,
                     static_cast<double>(id) * 0.25,
                     id % 5 == 0 ? std::string("null") : std::to_string(id % 100000)) +
         "\n";
}

// The last committed zxid, from ZooKeeper's `srvr` four-letter command.
int64_t lastZxid(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  (void)!write(fd, "srvr", 4);
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;)
    out.append(buffer, static_cast<std::size_t>(n));
  close(fd);
  const auto at = out.find("Zxid: ");
  return at == std::string::npos ? -1 : std::stoll(out.substr(at + 6), nullptr, 16);
}

// Bytes of the transactions with zxid in (after, upto] in ZooKeeper's transaction log files under
// `data_dir` (FileTxnLog: a 16-byte header, then per transaction a long checksum, an int length,
// the serialized TxnHeader and record, and an end-of-record byte, all big-endian; a file's
// preallocated rest is zeros). Each counted transaction is its whole record.
uint64_t txnLogBytes(const std::filesystem::path& data_dir, int64_t after, int64_t upto) {
  auto be = [](const unsigned char* p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
    return v;
  };
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(data_dir / "version-2", ec)) {
    if (!entry.path().filename().string().starts_with("log.")) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
    for (std::size_t at = 16; at + 12 <= bytes.size();) {
      const uint64_t length = be(data + at + 8, 4);
      if (length == 0 || at + 12 + length + 1 > bytes.size()) break;
      // TxnHeader: long clientId, int cxid, long zxid, ...
      const auto zxid = static_cast<int64_t>(be(data + at + 12 + 12, 8));
      if (zxid > after && zxid <= upto) total += 12 + length + 1;
      at += 12 + length + 1;
    }
  }
  return total;
}

// One system's totals over all rounds; rates are totals over totals, so a slow round weighs in
// by its time as it would for a client.
struct Figures {
  double single_seconds = 0;
  int singles = 0;
  double bulk_seconds = 0;
  uint64_t bulk_rows = 0;
  double zk_writes_per_insert = 0;  // first round only: later ones overlap the other's background
  double zk_log_bytes_per_insert = 0;  // the same transactions' bytes in ZooKeeper's log
  bool failed = false;
  double singlePerSecond() const { return singles / single_seconds; }
  double bulkRowsPerSecond() const { return static_cast<double>(bulk_rows) / bulk_seconds; }
};

struct Round {
  double single_per_second = 0;
  double bulk_rows_per_second = 0;
};

// Ids of round `index` start here, so that no round is deduplicated.
uint64_t firstId(int index) {
  return static_cast<uint64_t>(index) * 100'000'000;
}

// One round for one system: `single` sequential single-row inserts, then one bulk insert.
Round measureRound(KeepAliveClient& target, const LocalZooKeeper& zk, int index, int single,
                   const std::string& bulk, uint64_t bulk_rows, Figures& total, bool count_zk) {
  const int zk_port = zk.port();
  Round round;
  const uint64_t first_id = firstId(index);
  target.reconnect();
  for (int i = 0; i < 20; ++i) target.post(row(first_id + 5'000'000 + i, index));  // warm-up
  const int64_t zxid_before = lastZxid(zk_port);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < single; ++i) {
    if (!target.post(row(first_id + i, index))) return total.failed = true, round;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (count_zk) {
    const int64_t zxid_after = lastZxid(zk_port);
    total.zk_writes_per_insert = static_cast<double>(zxid_after - zxid_before) / single;
    total.zk_log_bytes_per_insert =
        static_cast<double>(txnLogBytes(zk.dataDir(), zxid_before, zxid_after)) / single;
  }
  const auto bulk_start = std::chrono::steady_clock::now();
  if (!target.post(bulk)) return total.failed = true, round;
  const double bulk_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - bulk_start).count();
  total.single_seconds += seconds;
  total.singles += single;
  total.bulk_seconds += bulk_seconds;
  total.bulk_rows += bulk_rows;
  return Round{single / seconds, static_cast<double>(bulk_rows) / bulk_seconds};
}

std::string bulkBody(int index, uint64_t rows) {
  std::string bulk;
  bulk.reserve(rows * 80);
  for (uint64_t id = 0; id < rows; ++id) bulk += row(firstId(index) + 10'000'000 + id, index);
  return bulk;
}

// `count` commits of one-row parts as rtable-core makes them (commitPart, each reserving the next
// block number) into a scratch table on `connect`, back to back: commits per second.
std::expected<double, std::string> commitFloor(
    const std::string& connect, int count,
    const std::string& table_path = "/rtable-bench/commit-floor") {
  rtable::core::ZooKeeperConfig config{connect, std::chrono::seconds(10), std::chrono::seconds(5)};
  auto keeper = rtable::core::ZooKeeperClient::connect(config);
  if (!keeper) return std::unexpected("ZooKeeper: " + keeper.error().toString());
  rtable::core::TablePaths paths{table_path, 1, "r1"};
  if (auto made = createTableIfNotExists(**keeper, paths, "bench"); !made)
    return std::unexpected(made.error().toString());
  if (auto made = createReplicaIfNotExists(**keeper, paths); !made)
    return std::unexpected(made.error().toString());
  rtable::core::BlockNumberAllocator allocator(paths);
  auto first = allocator.allocate(**keeper, "202612", "first");
  if (!first) return std::unexpected(first.error().toString());
  rtable::core::BlockNumberLock lock = std::get<rtable::core::BlockNumberLock>(*first);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    rtable::core::LogEntry entry;
    entry.type = rtable::core::LogEntry::Type::kGetPart;
    entry.source_replica = "r1";
    entry.block_id = fmt::format("202612_{}_0", i);
    entry.new_part_name = fmt::format("202612_{}_{}_0", lock.block_number, lock.block_number);
    const auto reserve = allocator.startReserving("202612");
    auto committed = commitPart(**keeper, paths, entry, lock, reserve);
    if (reserve) {
      allocator.finishReserving((*keeper)->sessionId(), "202612", *reserve,
                                committed ? committed->reserve_path : std::nullopt, false);
    }
    if (!committed) return std::unexpected("commit: " + committed.error().cause.toString());
    auto next = allocator.takeReserved((*keeper)->sessionId(), "202612");
    if (!next) return std::unexpected("the commit reserved no block number");
    lock = *next;
  }
  return count / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  int single = 500;
  uint64_t bulk_rows = 1'000'000;
  int rounds = 3;
  constexpr const char* kUsage =
      "usage: rtable-insert-bench [--single N] [--bulk-rows N] [--rounds N]\n";
  auto refuse = [&](const std::string& why) {
    fmt::print(stderr, "rtable-insert-bench: {}\n{}", why, kUsage);
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
    if (flag == "--single") {
      if ((value = number(0, 1'000'000))) single = static_cast<int>(*value);
    } else if (flag == "--bulk-rows") {
      if ((value = number(0, 1'000'000'000))) bulk_rows = static_cast<uint64_t>(*value);
    } else if (flag == "--rounds") {
      if ((value = number(1, 1000))) rounds = static_cast<int>(*value);
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
  options.table_yaml = kTableYaml;
  options.zookeeper = (*zk)->connectString();
  options.session_timeout_ms = 10000;
  auto replica = LocalReplica::start(options);
  if (!replica) return fmt::print(stderr, "{}\n", replica.error()), 1;
  auto clickhouse = LocalClickHouse::start("127.0.0.1", (*zk)->port(), "r1");
  if (!clickhouse) return fmt::print(stderr, "{}\n", clickhouse.error()), 1;
  if (auto created = (*clickhouse)->query(kClickHouseTable); !created)
    return fmt::print(stderr, "{}\n", created.error()), 1;

  KeepAliveClient rtable("rtable-core", (*replica)->httpPort(), "/insert?format=JSONEachRow");
  KeepAliveClient ch("ClickHouse 18.16", (*clickhouse)->httpPort(),
                     "/?query=INSERT%20INTO%20default.bench%20FORMAT%20JSONEachRow");

  // ZooKeeper's JVM compiles its hot paths during the first thousands of requests, and the
  // system that went first paid for it (round 1 was the slowest for rtable-core, the fastest for
  // ClickHouse, in every run before this). Commit multis on a path of their own warm it up for
  // both alike; neither table sees them.
  if (auto warm = commitFloor((*zk)->connectString(), 4 * single, "/rtable-bench/warm-up"); !warm) {
    return fmt::print(stderr, "warming ZooKeeper up: {}\n", warm.error()), 1;
  }

  // Rounds alternate which system goes first, so that a machine getting faster or slower during
  // the run (it is shared) weighs on both alike. The first round's rtable inserts run while
  // ClickHouse is still empty and idle, so their ZooKeeper transaction count is rtable's alone.
  Figures r, c;
  for (int round = 0; round < rounds; ++round) {
    const std::string bulk = bulkBody(round, bulk_rows);
    if (round == 0) {
      fmt::print("bulk body: {} rows, {:.1f} MB of JSONEachRow\n\n", bulk_rows, bulk.size() / 1e6);
      fmt::print("{:<8} {:>22} {:>22}   {}\n", "round", "single-row ratio", "bulk ratio",
                 "single-row inserts/s and bulk rows/s, rtable-core / ClickHouse");
    }
    Round rr, cr;
    if (round % 2 == 0) {
      rr = measureRound(rtable, **zk, round, single, bulk, bulk_rows, r, round == 0);
      cr = measureRound(ch, **zk, round, single, bulk, bulk_rows, c, round == 0);
    } else {
      cr = measureRound(ch, **zk, round, single, bulk, bulk_rows, c, false);
      rr = measureRound(rtable, **zk, round, single, bulk, bulk_rows, r, false);
    }
    if (r.failed || c.failed)
      return fmt::print(stderr, "an insert failed in round {}\n", round + 1), 1;
    fmt::print("{:<8} {:>21.2f}x {:>21.2f}x   {:.1f} / {:.1f}, {:.0f} / {:.0f}\n", round + 1,
               rr.single_per_second / cr.single_per_second,
               rr.bulk_rows_per_second / cr.bulk_rows_per_second, rr.single_per_second,
               cr.single_per_second, rr.bulk_rows_per_second, cr.bulk_rows_per_second);
  }

  fmt::print("\n{:<46} {:>14} {:>18} {:>10}\n", fmt::format("totals over {} rounds", rounds),
             "rtable-core", "ClickHouse 18.16", "ratio");
  fmt::print("{:<46} {:>14.1f} {:>18.1f} {:>9.2f}x\n",
             fmt::format("single-row inserts/s ({} sequential per round)", single),
             r.singlePerSecond(), c.singlePerSecond(), r.singlePerSecond() / c.singlePerSecond());
  fmt::print("{:<46} {:>14.2f} {:>18.2f} {:>9.2f}x\n", "ZooKeeper write transactions per insert",
             r.zk_writes_per_insert, c.zk_writes_per_insert,
             r.zk_writes_per_insert / c.zk_writes_per_insert);
  fmt::print("{:<46} {:>14.0f} {:>18.0f} {:>9.2f}x\n", "ZooKeeper log bytes per single-row insert",
             r.zk_log_bytes_per_insert, c.zk_log_bytes_per_insert,
             r.zk_log_bytes_per_insert / c.zk_log_bytes_per_insert);
  fmt::print("{:<46} {:>14.0f} {:>18.0f} {:>9.2f}x\n",
             fmt::format("bulk rows/s ({} rows, one insert per round)", bulk_rows),
             r.bulkRowsPerSecond(), c.bulkRowsPerSecond(),
             r.bulkRowsPerSecond() / c.bulkRowsPerSecond());

  auto floor = commitFloor((*zk)->connectString(), single);
  if (!floor) return fmt::print(stderr, "commit floor: {}\n", floor.error()), 1;
  fmt::print("\n{:<46} {:>14.1f}\n", fmt::format("bare commit multis/s ({} back to back)", single),
             *floor);
  fmt::print("{:<46} {:>14.1f}\n", "5x ClickHouse's single-row rate", 5 * c.singlePerSecond());
  return 0;
}
