// Backup and restore of a table of three rtable-core replicas (issue 21), on a fresh ZooKeeper 3.8
// and a filesystem destination on the same disk, all in one run:
//   - load: about --gib / --mib of parts (rows with a 1000-character random string, one partition
//     per insert so that no merge rewrites them), every replica synced and holding the same parts;
//   - plain copy: `cp -r` of r1's active part directories into a new directory, then an fsync of
//     every copied file and directory (the backup fsyncs each file it writes), timed twice: before
//     and after the first backup, so that both see the same page cache; each after an untimed
//     copy of the same (the first copy of new files is much slower here: the faster is the bar);
//   - first backup: BackupInitiator (what the operator runs: woken by its hosts' moves, polled
//     every --poll-ms, 1000 as the operator, at least) with the three replicas' BackupAgents as
//     hosts, into an empty destination; its time from start() to completed, and the data bytes
//     per second;
//   - second backup, nothing changed, into the same destination: the bytes it writes (data files
//     by the hosts' stats, and the destination's growth: the manifest);
//   - one host: a backup naming only r1 into another empty destination, against the three-host
//     backup's bytes (each data file is written once, by whichever host wins it, so both write
//     the same bytes);
//   - restore: a RestoreRequest written at a new table's root before its three replicas start
//     (as the operator does); the time from their launch until the request is done and until
//     every replica counts the backup's rows.
// Usage: rtable-backup-bench [--gib N | --mib N] [--poll-ms N] [--keep]
#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "rtable/backup/backup_initiator.h"
#include "rtable/backup/restore.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/local_replica.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace {

namespace fs = std::filesystem;
using namespace rtable::core::testing;
using rtable::backup::BackupInitiator;
using rtable::backup::BackupOperation;
using rtable::backup::BackupPaths;
using rtable::backup::BackupProgress;
using rtable::backup::RestoreRequest;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kTable = "backup_bench";
constexpr const char* kRestoredTable = "backup_bench_restored";
constexpr const char* kZooKeeperRoot = "/rtable/tables";  // the spec's default
constexpr const char* kColumns = R"(columns:
  - {name: id, type: UInt64}
  - {name: d, type: Date}
  - {name: payload, type: String}
partitionBy: toYYYYMM(d)
orderBy: [id])";
constexpr std::size_t kPayloadLength = 1000;
// Parts of about this size, one per insert and partition: large inserts, and enough parts that
// the three hosts share the data files between them.
constexpr uint64_t kPartTarget = 64ULL << 20;
// Parallel inserts (two cores: one generates its rows while the other's insert runs).
constexpr int kLoaders = 2;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr auto kDeadline = std::chrono::minutes(30);

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t wallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One insert: rows of a random 64-letter payload (6 bits per byte: zstd keeps about 3/4 of it),
// all in partition 2027-01 + chunk months, so each insert is one part alone in its partition.
std::string chunkRows(int chunk, std::size_t target_bytes, uint64_t* rows) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string body;
  body.reserve(target_bytes + 2 * kPayloadLength);
  uint64_t state = 0xbac0b000ULL + static_cast<uint64_t>(chunk);
  const int year = 2027 + chunk / 12;
  const int month = 1 + chunk % 12;
  std::string payload(kPayloadLength, ' ');
  *rows = 0;
  for (uint64_t id = static_cast<uint64_t>(chunk) * 100'000'000ULL; body.size() < target_bytes;
       ++id) {
    for (std::size_t i = 0; i < payload.size();) {
      uint64_t bits = splitmix64(state);
      for (int k = 0; k < 10 && i < payload.size(); ++k, bits >>= 6) {
        payload[i++] = kAlphabet[bits & 63];
      }
    }
    body += fmt::format(R"({{"id":{},"d":"{:04d}-{:02d}-{:02d}","payload":"{}"}})", id, year, month,
                        1 + id % 28, payload);
    body += '\n';
    ++*rows;
  }
  return body;
}

// Bytes of the regular files under `dir` (0 if it does not exist).
uint64_t treeBytes(const fs::path& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) bytes += it->file_size(ec);
  }
  return bytes;
}

// fsync of every file and directory under `dir`, and of `dir`: what the backup does per file.
bool fsyncTree(const fs::path& dir) {
  std::vector<fs::path> paths{dir};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    paths.push_back(it->path());
  }
  if (ec) return false;
  for (const auto& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (!synced) return false;
  }
  return true;
}

std::string shellQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The stages a host records in order (backup_host.h), "gathering metadata (<attempt>)" first.
const std::vector<std::string> kStageNames{"gathering metadata", "extracting data",
                                           "building file infos", "writing backup", "completed"};

// How many of kStageNames `stage` has passed: 0 before any, 1 after gathering metadata, ...
std::size_t stageIndex(const std::string& stage) {
  for (std::size_t i = kStageNames.size(); i > 0; --i) {
    if (stage.starts_with(kStageNames[i - 1])) return i;
  }
  return 0;
}

struct Failure {
  std::string message;
};

struct CopyTiming {
  double copy_s = 0;   // cp -r alone
  double total_s = 0;  // cp -r, then the fsyncs
};

// `cp -r` of the part directories into `target` (new), then an fsync of all it wrote.
std::expected<CopyTiming, Failure> plainCopy(const std::vector<fs::path>& parts,
                                             const fs::path& target) {
  std::error_code ec;
  fs::create_directories(target, ec);
  if (ec) return std::unexpected(Failure{"cannot create " + target.string()});
  std::string command = "cp -r";
  for (const auto& part : parts) command += " " + shellQuoted(part.string());
  command += " " + shellQuoted(target.string() + "/");
  // A first copy, not timed: here the first `cp -r` of freshly written parts takes several times
  // as long as the next one (3.2 against 0.37 s for 1 GiB, nearly all of it in copy_file_range,
  // the files all in the page cache), which would flatter the backup.
  if (std::system(command.c_str()) != 0) return std::unexpected(Failure{command + " failed"});
  fs::remove_all(target, ec);
  fs::create_directories(target, ec);
  if (ec) return std::unexpected(Failure{"cannot create " + target.string()});
  ::sync();  // earlier writes flushed first, so that the copy does not pay for them
  CopyTiming timing;
  const auto start = Clock::now();
  if (std::system(command.c_str()) != 0) return std::unexpected(Failure{command + " failed"});
  timing.copy_s = secondsSince(start);
  if (!fsyncTree(target)) return std::unexpected(Failure{"fsync of the copy failed"});
  timing.total_s = secondsSince(start);
  return timing;
}

class Bench {
 public:
  Bench(fs::path work, uint64_t target_bytes, std::chrono::milliseconds poll)
      : work_(std::move(work)), target_bytes_(target_bytes), poll_(poll) {}
  std::expected<void, Failure> run();

 private:
  std::expected<std::unique_ptr<LocalReplica>, Failure> startReplica(const std::string& table,
                                                                     const std::string& name);
  std::expected<void, Failure> load();
  std::expected<void, Failure> syncAll(std::vector<std::unique_ptr<LocalReplica>>& replicas);
  std::expected<uint64_t, Failure> count(LocalReplica& replica);
  std::expected<void, Failure> measureTable();

  struct BackupRun {
    double seconds = 0;
    // From start(): when every host had recorded kStageNames[i], as the polls saw it.
    std::vector<double> stage_ends;
    BackupProgress progress;
    uint64_t destination_growth = 0;  // bytes the destination grew by (data files and manifest)
  };
  std::expected<BackupRun, Failure> backUp(const std::string& uid, const std::string& name,
                                           const std::vector<std::string>& hosts,
                                           const fs::path& destination);

  struct RestoreRun {
    double done_s = 0;      // launch to the request's state done
    double all_rows_s = 0;  // launch to every replica counting every row
    double launch_s = 0;    // launch to the three replicas ready
    RestoreRequest request;
    uint64_t restored_bytes = 0;  // r1's parts on disk afterwards
  };
  std::expected<RestoreRun, Failure> restore(const fs::path& destination);

  const fs::path work_;
  const uint64_t target_bytes_;
  const std::chrono::milliseconds poll_;
  std::unique_ptr<LocalZooKeeper> zk_;
  std::vector<std::unique_ptr<LocalReplica>> replicas_;
  uint64_t rows_ = 0;
  uint64_t json_bytes_ = 0;
  double load_s_ = 0;
  std::vector<fs::path> part_dirs_;  // r1's active parts
  uint64_t table_bytes_ = 0;         // their files' bytes on disk
  uint64_t table_files_ = 0;
};

std::expected<std::unique_ptr<LocalReplica>, Failure> Bench::startReplica(const std::string& table,
                                                                          const std::string& name) {
  LocalReplicaOptions options;
  options.binary = RTABLE_CORE_BINARY;
  options.replica = name;
  options.work_dir = work_ / table / name;
  options.table_yaml = fmt::format("table: {}\n{}", table, kColumns);
  options.zookeeper = zk_->connectString();
  options.session_timeout_ms = 10000;
  auto replica = LocalReplica::start(options);
  if (!replica) return std::unexpected(Failure{table + " " + name + ": " + replica.error()});
  return std::move(*replica);
}

std::expected<uint64_t, Failure> Bench::count(LocalReplica& replica) {
  auto reply = replica.get("/count");
  if (!reply || reply->status != 200) {
    return std::unexpected(Failure{"/count: " + (reply ? reply->body : reply.error())});
  }
  return json::parse(reply->body, nullptr, false).value("rows", uint64_t{0});
}

std::expected<void, Failure> Bench::syncAll(std::vector<std::unique_ptr<LocalReplica>>& replicas) {
  const auto start = Clock::now();
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    for (;;) {
      // /sync answers within its HTTP timeout or not at all: ask again until the deadline.
      auto synced = replicas[i]->post("/sync", "");
      if (synced && synced->status == 200) break;
      if (Clock::now() - start > kDeadline) {
        return std::unexpected(
            Failure{fmt::format("r{}: /sync: {}", i + 1, synced ? synced->body : synced.error())});
      }
    }
  }
  return {};
}

std::expected<void, Failure> Bench::load() {
  // The first insert alone gives the parts' bytes per JSON byte; the rest are sized from it.
  const int chunks =
      static_cast<int>(std::max<uint64_t>(1, (target_bytes_ + kPartTarget / 2) / kPartTarget));
  const uint64_t part_bytes = target_bytes_ / static_cast<uint64_t>(chunks);
  std::atomic<uint64_t> rows{0}, json_bytes{0};
  std::atomic<bool> ok{true};
  std::string error;
  std::mutex mu;
  auto insert = [&](int chunk, std::size_t size) {
    uint64_t n = 0;
    const std::string body = chunkRows(chunk, size, &n);
    auto reply = replicas_[chunk % 3]->post("/insert?format=JSONEachRow", body);
    if (!reply || reply->status != 200) {
      std::lock_guard lock(mu);
      error = fmt::format("insert {}: {}", chunk, reply ? reply->body : reply.error());
      ok = false;
      return;
    }
    rows += n;
    json_bytes += body.size();
  };
  const auto start = Clock::now();
  insert(0, static_cast<std::size_t>(static_cast<double>(part_bytes) / 0.75));
  if (!ok) return std::unexpected(Failure{error});
  auto parts = replicas_[0]->get("/parts");
  if (!parts || parts->status != 200) return std::unexpected(Failure{"r1: no /parts"});
  uint64_t first_part_bytes = 0;
  for (const auto& part : json::parse(parts->body))
    first_part_bytes += part["bytes"].get<uint64_t>();
  if (first_part_bytes == 0) return std::unexpected(Failure{"the first insert made no bytes"});
  const double ratio = static_cast<double>(first_part_bytes) / static_cast<double>(json_bytes);
  const auto size = static_cast<std::size_t>(static_cast<double>(part_bytes) / ratio);
  fmt::print("load: {} inserts of {:.0f} MiB of JSONEachRow ({:.2f} part bytes per JSON byte)\n",
             chunks, size / kMiB, ratio);
  std::fflush(stdout);
  std::atomic<int> next{1};
  std::vector<std::thread> threads;
  for (int t = 0; t < kLoaders; ++t) {
    threads.emplace_back([&] {
      for (int chunk; ok && (chunk = next++) < chunks;) insert(chunk, size);
    });
  }
  for (auto& thread : threads) thread.join();
  if (!ok) return std::unexpected(Failure{error});
  rows_ = rows;
  json_bytes_ = json_bytes;
  if (auto synced = syncAll(replicas_); !synced) return synced;
  load_s_ = secondsSince(start);
  return {};
}

std::expected<void, Failure> Bench::measureTable() {
  // Every replica holds the same parts, all on disk (none held in memory only), and every row.
  std::optional<std::set<std::string>> first;
  for (std::size_t i = 0; i < replicas_.size(); ++i) {
    auto parts = replicas_[i]->get("/parts");
    if (!parts || parts->status != 200) return std::unexpected(Failure{"no /parts"});
    std::set<std::string> names;
    for (const auto& part : json::parse(parts->body)) {
      if (part.value("in_memory", false))
        return std::unexpected(Failure{"a part is held in memory"});
      names.insert(part["name"].get<std::string>());
    }
    if (first && names != *first) {
      return std::unexpected(Failure{fmt::format("r{} holds other parts than r1", i + 1)});
    }
    first = std::move(names);
    auto rows = count(*replicas_[i]);
    if (!rows) return std::unexpected(rows.error());
    if (*rows != rows_) {
      return std::unexpected(
          Failure{fmt::format("r{} counts {} rows, {} inserted", i + 1, *rows, rows_)});
    }
  }
  for (const auto& name : *first) {
    // Generation 1's parts are directly in the data directory (core::generationDataDir).
    const fs::path dir = replicas_[0]->dataDir() / name;
    if (!fs::is_directory(dir)) return std::unexpected(Failure{"no directory " + dir.string()});
    part_dirs_.push_back(dir);
    table_bytes_ += treeBytes(dir);
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      table_files_ += entry.is_regular_file();
    }
  }
  return {};
}

std::expected<Bench::BackupRun, Failure> Bench::backUp(const std::string& uid,
                                                       const std::string& name,
                                                       const std::vector<std::string>& hosts,
                                                       const fs::path& destination) {
  auto keeper = zk_->connect();
  if (!keeper) return std::unexpected(Failure{keeper.error().toString()});
  const std::string root = fmt::format("{}/{}", kZooKeeperRoot, kTable);
  // As the operator fills it (ClusterBackupReconciler): the active generation, the live hosts.
  auto generation = rtable::core::readActiveGeneration(**keeper, root);
  if (!generation || !*generation) return std::unexpected(Failure{"no active generation"});
  const rtable::core::TablePaths paths{root, **generation, ""};
  for (const auto& host : hosts) {
    auto active = (*keeper)->exists(paths.replicaRoot(host) + "/is_active");
    if (!active || !*active) return std::unexpected(Failure{host + " is not active"});
  }
  std::error_code ec;
  fs::create_directories(destination, ec);  // a mounted volume: rtable never creates it
  BackupOperation operation;
  operation.uid = uid;
  operation.name = name;
  operation.started_ms = wallMs();
  operation.tables.push_back({kTable, root, **generation, hosts});
  operation.destination.kind = rtable::backup::DestinationRef::Kind::kFilesystem;
  operation.destination.path = destination.string();
  const rtable::core::KeeperFactory factory =
      [this]() -> rtable::core::KeeperResult<std::unique_ptr<rtable::core::Keeper>> {
    auto client = zk_->connect();
    if (!client) return std::unexpected(client.error());
    return std::unique_ptr<rtable::core::Keeper>(std::move(*client));
  };
  const uint64_t before = treeBytes(destination);
  ::sync();  // earlier writes flushed first, so that the backup does not pay for them
  BackupInitiator initiator(factory, BackupPaths{BackupPaths::rootFor(kZooKeeperRoot), uid},
                            operation);
  // As the operator does: a host's move wakes the initiator at once, the poll covers a lost watch.
  std::mutex wake_mu;
  std::condition_variable wake_cv;
  bool woken = false;
  initiator.onChange([&] {
    {
      std::lock_guard lock(wake_mu);
      woken = true;
    }
    wake_cv.notify_all();
  });
  BackupRun run;
  const auto start = Clock::now();
  if (auto started = initiator.start(); !started) {
    return std::unexpected(Failure{"start: " + started.error().message});
  }
  for (;;) {
    auto progress = initiator.poll();
    if (progress) {
      run.progress = *progress;
      // The stage every host has reached (a host records a stage once its work is done).
      std::size_t reached = kStageNames.size();
      for (const auto& [host, state] : progress->hosts) {
        reached = std::min(reached, stageIndex(state.stage));
      }
      while (run.stage_ends.size() < reached) run.stage_ends.push_back(secondsSince(start));
      if (progress->phase != BackupProgress::Phase::kRunning) break;
    }
    if (Clock::now() - start > kDeadline) {
      initiator.fail("the benchmark gave up");
      return std::unexpected(Failure{name + ": not completed in time"});
    }
    std::unique_lock lock(wake_mu);
    wake_cv.wait_for(lock, poll_, [&] { return woken; });
    woken = false;
  }
  run.seconds = secondsSince(start);
  (void)initiator.cleanUp();
  if (run.progress.phase != BackupProgress::Phase::kCompleted || !run.progress.summary) {
    return std::unexpected(Failure{
        name + ": " + (run.progress.error ? run.progress.error->toString() : "no summary")});
  }
  run.destination_growth = treeBytes(destination) - before;
  return run;
}

std::expected<Bench::RestoreRun, Failure> Bench::restore(const fs::path& destination) {
  auto keeper = zk_->connect();
  if (!keeper) return std::unexpected(Failure{keeper.error().toString()});
  const std::string root = fmt::format("{}/{}", kZooKeeperRoot, kRestoredTable);
  // As the operator writes it (ReplicatedTableReconciler::writeRestoreRequest), before the
  // table's replicas start.
  RestoreRequest request;
  request.backup = "full";
  request.table = kTable;
  request.destination.kind = rtable::backup::DestinationRef::Kind::kFilesystem;
  request.destination.path = destination.string();
  request.requested_ms = wallMs();
  if (auto made = rtable::core::createAncestorsAndSelf(**keeper, root); !made) {
    return std::unexpected(Failure{made.error().toString()});
  }
  auto created = (*keeper)->create(rtable::backup::restoreRequestPath(root), request.format(),
                                   rtable::core::CreateMode::kPersistent);
  if (!created) return std::unexpected(Failure{created.error().toString()});

  ::sync();
  RestoreRun run;
  // One after the other from this thread (a child dies with the thread that forked it:
  // Subprocess's PR_SET_PDEATHSIG); each start waits for its /readyz, about 0.1 s. The first may
  // be restoring while the others start.
  std::vector<std::unique_ptr<LocalReplica>> restored;
  const auto start = Clock::now();
  for (const char* name : {"r1", "r2", "r3"}) {
    auto replica = startReplica(kRestoredTable, name);
    if (!replica) return std::unexpected(replica.error());
    restored.push_back(std::move(*replica));
  }
  run.launch_s = secondsSince(start);
  std::vector<bool> complete(restored.size(), false);
  for (;;) {
    if (run.done_s == 0) {
      auto stored = rtable::backup::readRestoreRequest(**keeper, root);
      if (stored && *stored) {
        run.request = (*stored)->request;
        if (run.request.state == RestoreRequest::State::kFailed) {
          return std::unexpected(Failure{"restore failed: " + run.request.message});
        }
        if (run.request.state == RestoreRequest::State::kDone) run.done_s = secondsSince(start);
      }
    }
    bool all = true;
    for (std::size_t i = 0; i < restored.size(); ++i) {
      if (!complete[i]) {
        auto rows = count(*restored[i]);
        complete[i] = rows && *rows == rows_;
      }
      all = all && complete[i];
    }
    if (all && run.done_s > 0) break;
    if (Clock::now() - start > kDeadline) {
      return std::unexpected(Failure{"the restore did not end in time"});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  run.all_rows_s = secondsSince(start);
  for (const auto& part : json::parse(restored[0]->get("/parts")->body)) {
    run.restored_bytes += treeBytes(restored[0]->dataDir() / part["name"].get<std::string>());
  }
  return run;
}

std::expected<void, Failure> Bench::run() {
  LocalZooKeeperOptions zk_options;
  zk_options.work_dir = work_ / "zookeeper";
  zk_options.production_jvm = true;
  auto zk = LocalZooKeeper::start(zk_options);
  if (!zk) return std::unexpected(Failure{zk.error()});
  zk_ = std::move(*zk);
  for (const char* name : {"r1", "r2", "r3"}) {
    auto replica = startReplica(kTable, name);
    if (!replica) return std::unexpected(replica.error());
    replicas_.push_back(std::move(*replica));
  }
  if (auto loaded = load(); !loaded) return loaded;
  if (auto measured = measureTable(); !measured) return measured;
  fmt::print(
      "table: {} rows, {} parts, {} files, {:.1f} MiB on disk per replica ({:.1f} MiB of JSON "
      "loaded and synced in {:.1f} s)\n",
      rows_, part_dirs_.size(), table_files_, table_bytes_ / kMiB, json_bytes_ / kMiB, load_s_);
  std::fflush(stdout);

  // The plain copy, before and after the first backup.
  auto copy_before = plainCopy(part_dirs_, work_ / "copy-1");
  if (!copy_before) return std::unexpected(copy_before.error());
  fs::remove_all(work_ / "copy-1");
  fmt::print("cp -r (before): {:.2f} s, with fsync {:.2f} s\n", copy_before->copy_s,
             copy_before->total_s);
  std::fflush(stdout);

  const std::vector<std::string> all_hosts{"r1", "r2", "r3"};
  auto first = backUp("bench-1", "full", all_hosts, work_ / "destination");
  if (!first) return std::unexpected(first.error());
  fmt::print("first backup: {:.2f} s\n", first->seconds);
  std::fflush(stdout);

  auto copy_after = plainCopy(part_dirs_, work_ / "copy-2");
  if (!copy_after) return std::unexpected(copy_after.error());
  fs::remove_all(work_ / "copy-2");
  fmt::print("cp -r (after): {:.2f} s, with fsync {:.2f} s\n", copy_after->copy_s,
             copy_after->total_s);
  std::fflush(stdout);

  auto second = backUp("bench-2", "second", all_hosts, work_ / "destination");
  if (!second) return std::unexpected(second.error());
  auto one_host = backUp("bench-3", "one-host", {"r1"}, work_ / "destination-one-host");
  if (!one_host) return std::unexpected(one_host.error());
  fs::remove_all(work_ / "destination-one-host");
  fmt::print("second backup: {:.2f} s; one-host backup: {:.2f} s; restoring\n", second->seconds,
             one_host->seconds);
  std::fflush(stdout);

  auto restored = restore(work_ / "destination");
  if (!restored) return std::unexpected(restored.error());

  // The figures.
  const double mib = table_bytes_ / kMiB;
  const auto& summary = *first->progress.summary;
  const double copy_s = (copy_before->copy_s + copy_after->copy_s) / 2;
  const double copy_sync_s = (copy_before->total_s + copy_after->total_s) / 2;
  auto hostStats = [](const BackupProgress& progress) {
    std::string text;
    for (const auto& [host, state] : progress.hosts) {
      text += fmt::format("{}{} {:.1f} MiB in {} files", text.empty() ? "" : "; ", host,
                          state.stats.bytes_written / kMiB, state.stats.files_written);
    }
    return text;
  };
  fmt::print("\n| measure | value |\n| --- | ---: |\n");
  fmt::print("| table: rows, parts, files | {}, {}, {} |\n", rows_, part_dirs_.size(),
             table_files_);
  fmt::print("| table: one replica's parts on disk, MiB | {:.1f} |\n", mib);
  fmt::print("| cp -r of those parts, s (before / after the first backup) | {:.2f} / {:.2f} |\n",
             copy_before->copy_s, copy_after->copy_s);
  fmt::print("| cp -r, MiB/s (mean time) | {:.1f} |\n", mib / copy_s);
  fmt::print("| cp -r + fsync of each file, s (before / after) | {:.2f} / {:.2f} |\n",
             copy_before->total_s, copy_after->total_s);
  fmt::print("| cp -r + fsync, MiB/s (mean time) | {:.1f} |\n", mib / copy_sync_s);
  fmt::print("| first backup (3 hosts), s | {:.2f} |\n", first->seconds);
  fmt::print("| first backup: data written, MiB (files); logical MiB | {:.1f} ({}); {:.1f} |\n",
             first->progress.totals.bytes_written / kMiB, first->progress.totals.files_written,
             summary.logical_bytes / kMiB);
  fmt::print("| first backup: per host | {} |\n", hostStats(first->progress));
  for (std::size_t i = 0; i < first->stage_ends.size(); ++i) {
    fmt::print("| first backup: every host past {}, s from start | {:.2f} |\n", kStageNames[i],
               first->stage_ends[i]);
  }
  fmt::print("| first backup, MiB/s (data bytes / s) | {:.1f} |\n",
             first->progress.totals.bytes_written / kMiB / first->seconds);
  fmt::print("| **backup time / cp -r time** (goal <= 1.5x) | **{:.2f}x** |\n",
             first->seconds / copy_s);
  fmt::print("| backup time / (cp -r + fsync) time | {:.2f}x |\n", first->seconds / copy_sync_s);
  fmt::print("| second backup (unchanged), s | {:.2f} |\n", second->seconds);
  for (std::size_t i = 0; i < second->stage_ends.size(); ++i) {
    fmt::print("| second backup: every host past {}, s from start | {:.2f} |\n", kStageNames[i],
               second->stage_ends[i]);
  }
  fmt::print(
      "| second backup: data written, bytes (files); reused MiB (files) | {} ({}); {:.1f} ({}) "
      "|\n",
      second->progress.totals.bytes_written, second->progress.totals.files_written,
      second->progress.totals.bytes_reused / kMiB, second->progress.totals.files_reused);
  fmt::print("| second backup: destination grew by, bytes (the manifest) | {} |\n",
             second->destination_growth);
  fmt::print("| **second / first, destination growth** (goal < 1%) | **{:.4f}%** |\n",
             100.0 * static_cast<double>(second->destination_growth) /
                 static_cast<double>(first->destination_growth));
  fmt::print("| one-host backup (r1 only), s | {:.2f} |\n", one_host->seconds);
  fmt::print("| one-host backup: data written, bytes (files) | {} ({}) |\n",
             one_host->progress.totals.bytes_written, one_host->progress.totals.files_written);
  fmt::print("| three-host backup: data written, bytes (files) | {} ({}) |\n",
             first->progress.totals.bytes_written, first->progress.totals.files_written);
  fmt::print("| destination growth, one host / three hosts, bytes | {} / {} |\n",
             one_host->destination_growth, first->destination_growth);
  fmt::print("| **one host and three hosts write equal data bytes** | **{}** |\n",
             one_host->progress.totals.bytes_written == first->progress.totals.bytes_written
                 ? "yes"
                 : "no");
  fmt::print("| restore: 3 replicas launched and ready, s | {:.2f} |\n", restored->launch_s);
  fmt::print("| restore: launch to request done (restorer {}), s | {:.2f} |\n",
             restored->request.restorer, restored->done_s);
  fmt::print("| restore: launch to every replica counting all rows, s | {:.2f} |\n",
             restored->all_rows_s);
  fmt::print("| restore, MiB/s (one replica's MiB / s to all rows on 3) | {:.1f} |\n",
             mib / restored->all_rows_s);
  fmt::print("| restored r1's parts on disk, MiB | {:.1f} |\n", restored->restored_bytes / kMiB);
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t target_bytes = 1ULL << 30;
  std::chrono::milliseconds poll{1000};  // the operator's poll_period
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    std::expected<int64_t, std::string> value;
    if (arg == "--gib" && has_value) {
      if ((value = rtable::bench::wholeNumber(arg, argv[++i], 1, 1024)))
        target_bytes = static_cast<uint64_t>(*value) << 30;
    } else if (arg == "--mib" && has_value) {
      if ((value = rtable::bench::wholeNumber(arg, argv[++i], 1, 1 << 20)))
        target_bytes = static_cast<uint64_t>(*value) << 20;
    } else if (arg == "--poll-ms" && has_value) {
      if ((value = rtable::bench::wholeNumber(arg, argv[++i], 1, 600'000)))
        poll = std::chrono::milliseconds(*value);
    } else if (arg == "--keep") {
      keep = true;
    } else {
      fmt::print(stderr, "usage: rtable-backup-bench [--gib N | --mib N] [--poll-ms N] [--keep]\n");
      return 2;
    }
    if (!value) {
      fmt::print(stderr,
                 "rtable-backup-bench: {}\nusage: rtable-backup-bench [--gib N | --mib N] "
                 "[--poll-ms N] [--keep]\n",
                 value.error());
      return 2;
    }
  }
  char pattern[] = "/tmp/rtable-backup-bench-XXXXXX";
  if (!mkdtemp(pattern)) {
    fmt::print(stderr, "mkdtemp failed\n");
    return 1;
  }
  const fs::path work = pattern;
  fmt::print("rtable-backup-bench: {:.0f} MiB of parts, initiator polled every {} ms, in {}\n",
             target_bytes / kMiB, poll.count(), work.string());
  std::fflush(stdout);
  const auto start = Clock::now();
  std::expected<void, Failure> result;
  {
    Bench bench(work, target_bytes, poll);
    result = bench.run();
  }  // the processes stop before their folders go
  fmt::print("whole run: {:.0f} s\n", secondsSince(start));
  if (!keep) fs::remove_all(work);
  if (!result) {
    fmt::print(stderr, "rtable-backup-bench: {}\n", result.error().message);
    return 1;
  }
  return 0;
}
