#include "rtable/replication_core/table_replica.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <set>
#include <thread>

#include "rtable/replication_core/quorum.h"
#include "rtable/replication_core/replication_log.h"
#include "rtable/replication_core/table_registration.h"

namespace rtable::core {
namespace fs = std::filesystem;
namespace {

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string replicaAddress(const TableSpec& spec) {
  // ClickHouse's ReplicatedMergeTreeAddress text, so tools that read `host` find their way.
  return fmt::format("host: {}\nport: {}\ntcp_port: 0\ndatabase: default\ntable: {}\nscheme: {}\n",
                     spec.replica_host, spec.http_port, spec.table,
                     spec.tls_dir.empty() ? "http" : "https");
}

InsertError unavailable(const std::string& message) {
  return InsertError{InsertError::Kind::kUnavailable, message};
}

// Part images in ZooKeeper (replicas/<me>/part_images/<part>, docs/formats.md): rtable up to
// 2026-12-04 put small parts there until a checkpoint wrote them out. Nothing writes them any
// more; a replica that stopped with some left reads the committed ones back once, here, and
// removes them all after they are on disk. `found`: whether the node exists.
KeeperResult<std::vector<JournaledPart>> readLegacyPartImages(
    Keeper& keeper, const TablePaths& paths, const std::set<std::string>& committed, bool& found) {
  std::vector<JournaledPart> parts;
  auto listed = keeper.children(paths.partImages());
  found = listed.has_value();
  if (!listed) {
    if (listed.error().code == KeeperCode::kNoNode) return parts;
    return std::unexpected(listed.error());
  }
  std::vector<std::string> wanted;
  for (const auto& name : listed->names) {
    if (committed.contains(name)) wanted.push_back(paths.partImage(name));
  }
  auto read = keeper.getMany(wanted);
  for (std::size_t i = 0; i < read.size(); ++i) {
    if (!read[i]) return std::unexpected(read[i].error());
    DecodedJournal decoded = decodeJournal(read[i]->data);
    const std::string name = wanted[i].substr(paths.partImages().size() + 1);
    if (decoded.parts.size() != 1 || decoded.parts[0].name != name || !decoded.damage.empty()) {
      // Its part is then lost here, and fetched again like any other lost part.
      spdlog::error("the image of part {} in ZooKeeper is damaged ({}); not restored from it", name,
                    decoded.damage.empty() ? "not one record of that part" : decoded.damage);
      continue;
    }
    parts.push_back(std::move(decoded.parts[0]));
  }
  return parts;
}

}  // namespace

TableReplica::TableReplica(TableSpec spec, KeeperFactory factory, prometheus::Registry& registry,
                           TableReplicaOptions options)
    : spec_(std::move(spec)),
      options_(options),
      paths_{spec_.tableRoot(), options_.generation, spec_.replica},
      metrics_(registry, metrics::ReplicaLabels{spec_.table, spec_.replica, options_.generation}),
      clock_(options_.clock ? *options_.clock : common::SteadyClock::instance()),
      session_(std::move(factory), metrics_),
      allocator_(paths_, clock_) {}

std::expected<std::unique_ptr<TableReplica>, std::string> TableReplica::open(
    const TableSpec& spec, KeeperFactory keeper_factory, prometheus::Registry& registry,
    TableReplicaOptions options) {
  if (options.generation == 0) {
    // The active generation, asked for once over a connection of its own: the session proper
    // belongs to the generation, which this decides.
    auto keeper = keeper_factory();
    if (!keeper) return std::unexpected("ZooKeeper: " + keeper.error().toString());
    auto active = readActiveGeneration(**keeper, spec.tableRoot());
    if (!active) {
      return std::unexpected("reading the table's active generation: " + active.error().toString());
    }
    options.generation = active->value_or(1);
  }
  std::unique_ptr<TableReplica> table(
      new TableReplica(spec, std::move(keeper_factory), registry, options));
  if (auto started = table->start(); !started) return std::unexpected(started.error());
  return table;
}

TableReplica::~TableReplica() {
  shutdown();
}

KeeperStatus TableReplica::activate(Keeper& keeper) {
  if (auto activated = activateReplica(keeper, paths_, replicaAddress(spec_)); !activated) {
    return activated;
  }
  // Without a session we were inactive: the leader may have marked us lost meanwhile.
  return worker_->readLost(keeper);
}

std::expected<void, std::string> TableReplica::start() {
  auto store = PartStore::open(generationDataDir(spec_.data_dir, paths_.generation), spec_.schema,
                               options_.parts, metrics_, clock_);
  if (!store) return std::unexpected(store.error());
  store_ = std::move(*store);
  worker_ = std::make_unique<ReplicationWorker>(spec_, paths_, options_.replication, session_,
                                                *store_, allocator_, metrics_, clock_);
  worker_->freezeMerges(options_.merges_frozen);
  if (const TableReplica* previous = options_.attach_from) {
    worker_->setAttachSource([previous](const std::string& partition, const std::string& checksum) {
      return previous->activePartWithChecksum(partition, checksum);
    });
  }
  inserts_ = std::make_unique<InsertCommit>(spec_, paths_, options_.max_part_rows, session_,
                                            *store_, allocator_, *worker_, metrics_);
  async_inserts_ = std::make_unique<AsyncInsertQueue>(
      spec_.async_inserts,
      [this](std::vector<InsertPiece> pieces, const InsertOptions& options) {
        auto outcomes = inserts_->commitPieces(std::move(pieces), options);
        for (const auto& outcome : outcomes) {
          if (outcome.error && outcome.error->kind == InsertError::Kind::kStorageFull) {
            worker_->noteOutOfSpace(outcome.error->message);
            break;
          }
        }
        return outcomes;
      },
      metrics_);

  auto connected = session_.connect();
  if (!connected) return std::unexpected("ZooKeeper: " + connected.error().toString());
  std::shared_ptr<Keeper> keeper = std::move(*connected);
  if (auto table = createTableIfNotExists(*keeper, paths_, spec_.metadataText()); !table) {
    return std::unexpected("creating the table in ZooKeeper: " + table.error().toString());
  }
  if (auto replica = createReplicaIfNotExists(*keeper, paths_); !replica) {
    return std::unexpected("creating the replica in ZooKeeper: " + replica.error().toString());
  }
  // The previous process of this replica (killed, say) may have a commit on its way to
  // ZooKeeper: a request of a session is applied before that session's end or never. So its
  // session must have ended (its ephemeral is_active gone) before ZooKeeper is asked which parts
  // this replica has; a commit landing after that list would leave a part that is nowhere here,
  // while a client's retry of it is deduplicated against it.
  const auto deadline =
      std::chrono::steady_clock::now() + spec_.zookeeper_session_timeout + std::chrono::seconds(10);
  for (;;) {
    auto activated = activate(*keeper);
    if (activated) break;
    if (activated.error().code != KeeperCode::kNodeExists ||
        std::chrono::steady_clock::now() > deadline) {
      return std::unexpected("activating the replica: " + activated.error().toString());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  auto listed = keeper->children(paths_.parts());
  if (!listed) return std::unexpected("listing this replica's parts: " + listed.error().toString());
  const std::set<std::string> committed(listed->names.begin(), listed->names.end());
  bool legacy_images = false;
  auto images = readLegacyPartImages(*keeper, paths_, committed, legacy_images);
  if (!images)
    return std::unexpected("reading part images in ZooKeeper: " + images.error().toString());
  auto lost = store_->load(committed, *images);
  if (!lost) return std::unexpected(lost.error());
  if (legacy_images) {
    if (auto removed = removeRecursive(*keeper, paths_.partImages()); !removed) {
      return std::unexpected("removing part images in ZooKeeper: " + removed.error().toString());
    }
  }
  for (const auto& name : *lost) {
    // Lost here (broken and detached, or its files gone): unlist it and fetch it again from a
    // replica that has it, in one multi (ClickHouse's removePartAndEnqueueFetch).
    LogEntry get;
    get.type = LogEntry::Type::kGetPart;
    get.create_time = unixNow();
    get.new_part_name = name;
    auto requeued = keeper->multi(
        {op::Remove{paths_.part(name), -1},
         op::Create{paths_.queue() + "/queue-", get.format(), CreateMode::kPersistentSequential}});
    if (requeued) {
      spdlog::warn("part {} is listed for this replica but not on disk: fetching it again", name);
    } else {
      spdlog::error("part {} is lost here and could not be queued for a fetch: {}", name,
                    requeued.error().toString());
    }
  }
  // The queue as this replica left it; the log after it is pulled by the background work.
  auto queued = loadQueue(*keeper, paths_);
  if (!queued)
    return std::unexpected("loading the replication queue: " + queued.error().toString());
  worker_->load(std::move(*queued));
  session_.install(keeper, [this](Keeper& renewed) { return activate(renewed); });
  worker_->updateLogMetrics(*keeper);
  if (options_.background) worker_->start();
  return {};
}

DataPartPtr TableReplica::activePartWithChecksum(const std::string& partition,
                                                 const std::string& checksum_hex) const {
  for (auto& part : store_->activeParts()) {
    if (part->name.partition_id == partition && part->checksums.total.hex() == checksum_hex) {
      return part;
    }
  }
  return nullptr;
}

ReplicaState TableReplica::state() {
  ReplicaState state;
  state.table = spec_.table;
  state.replica = spec_.replica;
  state.generation = paths_.generation;
  for (const auto& part : store_->activeParts()) {
    ++state.active_parts;
    state.rows += part->rows;
  }
  PartStore::Report report = store_->report();
  state.broken_parts = std::move(report.broken);
  state.unexpected_parts = std::move(report.unexpected);
  state.lost_parts = std::move(report.lost);
  state.uncertain_parts = store_->uncertainNames();
  QueueState queue = worker_->queueState();
  state.queue = std::move(queue.entries);
  state.postponed = std::move(queue.postponed);
  state.executing = std::move(queue.executing);
  state.lost = worker_->lost();
  std::shared_ptr<Keeper> keeper = session_.current();
  state.readonly = keeper == nullptr;
  if (keeper) {
    if (auto counter = SequentialCounter::read(*keeper, paths_.log(), "log-")) state.log = *counter;
  }
  return state;
}

std::expected<void, InsertError> TableReplica::dropReplica(const std::string& replica) {
  if (replica == spec_.replica) {
    return std::unexpected(
        InsertError{InsertError::Kind::kBadRequest,
                    fmt::format("replica '{}' is this one: ask another replica, or "
                                "stop this one first",
                                replica)});
  }
  if (replica.empty() || replica.find('/') != std::string::npos) {
    return std::unexpected(InsertError{InsertError::Kind::kBadRequest,
                                       fmt::format("replica '{}' is not a replica name", replica)});
  }
  std::shared_ptr<Keeper> keeper = session_.current();
  if (!keeper) return std::unexpected(unavailable("ZooKeeper is unreachable; nothing was removed"));
  auto removed = core::dropReplica(*keeper, paths_, replica);
  if (!removed) {
    if (removed.error().code == KeeperCode::kBadArguments) {
      return std::unexpected(InsertError{InsertError::Kind::kBadRequest, removed.error().detail});
    }
    return std::unexpected(unavailable("ZooKeeper: " + removed.error().toString()));
  }
  if (*removed == ReplicaRemoval::kNotThere) {
    return std::unexpected(
        InsertError{InsertError::Kind::kNotFound,
                    fmt::format("replica '{}' is not a replica of this table", replica)});
  }
  return {};
}

std::vector<std::string> TableReplica::handOff(std::chrono::milliseconds timeout) {
  // Buffered async inserts are committed first: their parts are handed off with the rest.
  if (async_inserts_) async_inserts_->stop();
  // No new merge (this replica may lead) makes a part that only it has.
  worker_->stop();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> only_here;
  bool announced = false;
  for (;;) {
    std::shared_ptr<Keeper> keeper = session_.current();
    if (!keeper) return only_here;  // no session: nothing can be learned or handed on
    auto count = countReplicas(*keeper, paths_);
    if (!count) return only_here;
    std::vector<std::string> live = std::move(count->live);
    std::erase(live, spec_.replica);
    if (live.empty()) return {};  // no one to hand parts to; they stay on this volume
    auto only = partsOnlyOn(*keeper, paths_, spec_.replica, live);
    if (only) {
      only_here = std::move(*only);
      if (only_here.empty()) {
        if (announced)
          spdlog::info("hand-off done: every part of this replica is on another live replica");
        return {};
      }
      if (!announced) {
        spdlog::info(
            "handing off {} part(s) only this replica has before stopping (up to {} ms): {}",
            only_here.size(), timeout.count(), fmt::join(only_here, ", "));
        announced = true;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  spdlog::warn("stopping with {} part(s) no other live replica has yet: {}", only_here.size(),
               fmt::join(only_here, ", "));
  return only_here;
}

std::expected<void, std::string> TableReplica::closeAndRemoveFiles() {
  shutdown();
  const fs::path dir = generationDataDir(spec_.data_dir, paths_.generation);
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->path().filename().string().starts_with(kGenerationDirPrefix)) {
      doomed.push_back(it->path());
    }
  }
  if (ec) return std::unexpected(fmt::format("listing {}: {}", dir.string(), ec.message()));
  for (const auto& path : doomed) {
    fs::remove_all(path, ec);
    if (ec) return std::unexpected(fmt::format("removing {}: {}", path.string(), ec.message()));
  }
  if (paths_.generation != 1) fs::remove(dir, ec);
  return {};
}

void TableReplica::shutdown() {
  if (stopped_.exchange(true)) return;
  // Rows buffered by async inserts are committed while the session and the worker still run.
  if (async_inserts_) async_inserts_->stop();
  if (worker_) worker_->stop();
  // A clean stop leaves nothing for the next start to read back. Inserts have finished (the API
  // stops before the table).
  if (store_) {
    if (auto done = store_->checkpoint(); !done) spdlog::warn("{}", done.error());
  }
  session_.close();
}

}  // namespace rtable::core
