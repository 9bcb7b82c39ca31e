#include "rtable/replication_core/table_host.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "rtable/replication_core/table_registration.h"

namespace rtable::core {
namespace {

// Between looks at the plan when no watch fires (a watch lost with a session, say).
constexpr auto kFollowPeriod = std::chrono::seconds(2);
// How long one look waits for a queue to drain before it looks at the plan again.
constexpr auto kDrainWait = std::chrono::seconds(1);
constexpr std::size_t kDedupCopyBatch = 1000;

// What a generation holds, whatever its parts are named: (partition, checksum, rows) of each.
std::multiset<std::tuple<std::string, std::string, uint64_t>> contents(const TableReplica& table) {
  std::multiset<std::tuple<std::string, std::string, uint64_t>> parts;
  for (const auto& part : table.activeParts()) {
    parts.emplace(part->name.partition_id, part->checksums.total.hex(), part->rows);
  }
  return parts;
}

// The dedup window of `from` into `to`, so that a client retrying a block across the swap is
// still deduplicated. Ids there already (a copy cut short, or an insert into `to`) stay as they
// are. The values (part names of `from`) only tell a duplicate's answer which part had the rows.
std::expected<std::size_t, std::string> copyDedupWindow(Keeper& keeper, const TablePaths& from,
                                                        const TablePaths& to) {
  auto ids = keeper.children(from.dedupHashes());
  if (!ids) return std::unexpected("listing the dedup window: " + ids.error().toString());
  std::size_t copied = 0;
  for (std::size_t start = 0; start < ids->names.size(); start += kDedupCopyBatch) {
    const std::size_t end = std::min(ids->names.size(), start + kDedupCopyBatch);
    std::vector<std::string> paths;
    for (std::size_t i = start; i < end; ++i) paths.push_back(from.dedupHash(ids->names[i]));
    auto values = keeper.getMany(paths);
    std::vector<Op> ops;
    std::vector<std::pair<std::string, std::string>> nodes;
    for (std::size_t i = start; i < end; ++i) {
      const auto& value = values[i - start];
      if (!value) {
        if (value.error().code == KeeperCode::kNoNode) continue;  // trimmed meanwhile
        return std::unexpected("reading the dedup window: " + value.error().toString());
      }
      nodes.emplace_back(to.dedupHash(ids->names[i]), value->data);
      ops.push_back(op::Create{nodes.back().first, value->data, CreateMode::kPersistent});
    }
    if (ops.empty()) continue;
    auto created = keeper.multi(ops);
    if (created) {
      copied += ops.size();
      continue;
    }
    if (created.error().code != KeeperCode::kNodeExists) {
      return std::unexpected("copying the dedup window: " + created.error().toString());
    }
    // Some are there already: one by one for this batch.
    for (const auto& [path, data] : nodes) {
      auto one = keeper.create(path, data, CreateMode::kPersistent);
      if (one) {
        ++copied;
      } else if (one.error().code != KeeperCode::kNodeExists) {
        return std::unexpected("copying the dedup window: " + one.error().toString());
      }
    }
  }
  return copied;
}

}  // namespace

TableHost::InsertLease::~InsertLease() {
  if (!host_) return;
  {
    std::lock_guard lock(host_->mu_);
    --host_->inserts_in_flight_;
  }
  host_->inserts_done_.notify_all();
}

TableHost::TableHost(TableSpec spec, KeeperFactory factory, prometheus::Registry& registry,
                     TableReplicaOptions options)
    : spec_(std::move(spec)),
      factory_(std::move(factory)),
      registry_(registry),
      options_(options) {}

std::expected<std::unique_ptr<TableHost>, std::string> TableHost::open(
    const TableSpec& spec, KeeperFactory keeper_factory, prometheus::Registry& registry,
    TableReplicaOptions options) {
  options.generation = 0;
  options.attach_from = nullptr;
  // No merge is assigned before follow() knows whether a swap runs (a replica that restarts in
  // the middle of one must not change the parts being attached); follow() unfreezes them.
  options.merges_frozen = true;
  std::unique_ptr<TableHost> host(new TableHost(spec, keeper_factory, registry, options));
  auto table = TableReplica::open(spec, std::move(keeper_factory), registry, options);
  if (!table) return std::unexpected(table.error());
  const int64_t generation = (*table)->paths().generation;
  host->generations_[generation] = std::move(*table);
  host->serving_ = generation;
  // A swap in progress: caught up before anything is served (inserts stay paused if it paused
  // them, the next generation is open if it was).
  if (auto caught_up = host->follow(); !caught_up) {
    spdlog::warn("table swap: {} (retried in the background)", caught_up.error());
  }
  if (options.background) host->follower_ = std::thread([h = host.get()] { h->followLoop(); });
  return host;
}

TableHost::~TableHost() {
  shutdown();
}

std::shared_ptr<TableReplica> TableHost::serving() const {
  std::lock_guard lock(mu_);
  return generations_.at(serving_);
}

std::shared_ptr<TableReplica> TableHost::generation(int64_t generation) const {
  std::lock_guard lock(mu_);
  auto it = generations_.find(generation);
  return it == generations_.end() ? nullptr : it->second;
}

std::expected<TableHost::InsertLease, std::string> TableHost::admitInsert() {
  std::lock_guard lock(mu_);
  if (refused_) return std::unexpected(*refused_);
  if (paused_) return std::unexpected(*paused_);
  ++inserts_in_flight_;
  return InsertLease(this, generations_.at(serving_));
}

bool TableHost::insertsRefused() const {
  std::lock_guard lock(mu_);
  return refused_.has_value();
}

void TableHost::setInsertRefusal(std::optional<std::string> reason) {
  std::lock_guard lock(mu_);
  refused_ = std::move(reason);
}

std::string TableHost::swapState() const {
  std::lock_guard lock(mu_);
  return swap_state_;
}

std::expected<std::shared_ptr<Keeper>, std::string> TableHost::keeper() {
  if (keeper_ && !keeper_->expired()) return keeper_;
  auto made = factory_();
  if (!made) return std::unexpected("ZooKeeper: " + made.error().toString());
  keeper_ = std::shared_ptr<Keeper>(std::move(*made));
  return keeper_;
}

std::expected<void, std::string> TableHost::follow() {
  std::lock_guard follow_lock(follow_mu_);
  auto connected = keeper();
  if (!connected) return std::unexpected(connected.error());
  Keeper& keeper = **connected;
  const std::string root = spec_.tableRoot();
  auto wake = [this](const WatchEvent&) {
    {
      std::lock_guard lock(wake_mu_);
      wake_requested_ = true;
    }
    wake_.notify_all();
  };
  auto plan_node = keeper.exists(swapPath(root), wake);
  if (!plan_node) return std::unexpected("reading the swap plan: " + plan_node.error().toString());
  std::optional<SwapPlan> plan;
  if (*plan_node) {
    auto text = keeper.get(swapPath(root), wake);
    if (!text && text.error().code != KeeperCode::kNoNode) {
      return std::unexpected("reading the swap plan: " + text.error().toString());
    }
    if (text) {
      auto parsed = SwapPlan::parse(text->data);
      if (!parsed) return std::unexpected(parsed.error());
      plan = *parsed;
    }
  }
  auto active = readActiveGeneration(keeper, root, wake);
  if (!active || !*active) {
    return std::unexpected("reading the active generation: " +
                           (active ? std::string("no node") : active.error().toString()));
  }
  int64_t serving;
  {
    std::lock_guard lock(mu_);
    serving = serving_;
  }
  if (**active != serving) {
    // The swap switched (or this replica slept through a whole swap): serve the active one.
    if (auto opened = openNext(**active); !opened) return opened;
    std::shared_ptr<TableReplica> next = generation(**active);
    next->freezeMerges(false);
    {
      std::lock_guard lock(mu_);
      serving_ = **active;
      paused_.reset();
    }
    spdlog::info("table {} replica {}: serving generation {} (was {})", spec_.table, spec_.replica,
                 **active, serving);
  }
  if (!plan) {
    // No swap (or one that ended): nothing paused, nothing frozen.
    std::shared_ptr<TableReplica> current;
    {
      std::lock_guard lock(mu_);
      paused_.reset();
      swap_state_.clear();
      acked_.reset();
      current = generations_.at(serving_);
    }
    current->freezeMerges(false);
    return {};
  }
  return apply(keeper, *plan);
}

std::expected<void, std::string> TableHost::openNext(int64_t generation) {
  std::shared_ptr<TableReplica> from;
  {
    std::lock_guard lock(mu_);
    if (generations_.contains(generation)) return {};
    from = generations_.at(serving_);
  }
  TableReplicaOptions options = options_;
  options.generation = generation;
  options.attach_from = from.get();
  // Merges wait for the switch: the verify step compares parts one to one (frozen from the
  // start: a merge assigned before a later freeze would change them).
  options.merges_frozen = true;
  auto opened = TableReplica::open(spec_, factory_, registry_, options);
  if (!opened) {
    return std::unexpected(fmt::format("opening generation {}: {}", generation, opened.error()));
  }
  std::lock_guard lock(mu_);
  generations_[generation] = std::move(*opened);
  spdlog::info("table {} replica {}: opened generation {} beside {}", spec_.table, spec_.replica,
               generation, serving_);
  return {};
}

void TableHost::waitForInserts() {
  // Buffered async inserts hold their lease until committed: flushed now, not at their age.
  if (auto table = serving()) table->flushAsyncInserts();
  std::unique_lock lock(mu_);
  inserts_done_.wait(lock, [this] { return inserts_in_flight_ == 0; });
}

std::expected<void, std::string> TableHost::acknowledge(Keeper& keeper, const SwapPlan& plan,
                                                        const std::string& outcome) {
  const std::string path = swapAckPath(spec_.tableRoot(), plan.step, spec_.replica);
  auto created = keeper.create(path, outcome, CreateMode::kPersistent);
  if (!created && created.error().code == KeeperCode::kNodeExists) {
    auto set = keeper.set(path, outcome, -1);
    if (!set) return std::unexpected("acknowledging: " + set.error().toString());
  } else if (!created) {
    // kNoNode: the plan went (the swap ended or was aborted) meanwhile.
    if (created.error().code == KeeperCode::kNoNode) return {};
    return std::unexpected("acknowledging: " + created.error().toString());
  }
  std::lock_guard lock(mu_);
  swap_state_ =
      fmt::format("{} {} -> {}: {}", swapStepName(plan.step), plan.from, plan.to, outcome);
  if (outcome.starts_with("ok")) acked_ = plan;
  return {};
}

std::expected<void, std::string> TableHost::apply(Keeper& keeper, const SwapPlan& plan) {
  int64_t serving;
  {
    std::lock_guard lock(mu_);
    serving = serving_;
  }
  if (plan.from != serving && plan.to != serving) {
    return std::unexpected(
        fmt::format("the swap plan moves generation {} to {}; this replica "
                    "serves {}",
                    plan.from, plan.to, serving));
  }
  if (serving == plan.to && plan.step != SwapStep::kAbort) {
    // Switched (follow() saw <root>/active move, and took inserts again): the steps before the
    // switch are done here, whatever the plan still says until the driver moves it on.
    std::lock_guard lock(mu_);
    paused_.reset();
    if (plan.step < SwapStep::kSwitch) return {};
  }
  {
    std::lock_guard lock(mu_);
    // Done and acknowledged by this process: nothing to do again until the plan moves on.
    if (acked_ && *acked_ == plan) return {};
  }
  const bool before_switch = plan.step < SwapStep::kSwitch || plan.step == SwapStep::kAbort;
  if (plan.step == SwapStep::kAbort) {
    std::shared_ptr<TableReplica> next;
    std::shared_ptr<TableReplica> from = generation(plan.from);
    {
      std::lock_guard lock(mu_);
      paused_.reset();
      if (auto it = generations_.find(plan.to); it != generations_.end() && serving_ != plan.to) {
        next = it->second;
        generations_.erase(it);
      }
    }
    if (from) from->freezeMerges(false);
    if (next) {
      if (auto removed = next->closeAndRemoveFiles(); !removed) return removed;
    }
    return acknowledge(keeper, plan, "ok");
  }
  if (before_switch) {
    if (auto opened = openNext(plan.to); !opened) {
      (void)acknowledge(keeper, plan, "error: " + opened.error());
      return opened;
    }
  }
  std::shared_ptr<TableReplica> from = generation(plan.from);
  std::shared_ptr<TableReplica> to = generation(plan.to);
  if (before_switch && plan.step >= SwapStep::kPause) {
    bool newly = false;
    {
      std::lock_guard lock(mu_);
      if (!paused_) {
        paused_ = fmt::format(
            "the table is moving to a new generation ({} -> {}): inserts resume in a few seconds",
            plan.from, plan.to);
        newly = true;
      }
    }
    from->freezeMerges(true);
    waitForInserts();
    if (newly) spdlog::info("table swap {} -> {}: inserts paused", plan.from, plan.to);
  }
  switch (plan.step) {
    case SwapStep::kOpen:
      from->freezeMerges(false);  // opened frozen; merges go on until the pause
      return acknowledge(keeper, plan, "ok");
    case SwapStep::kPause:
      return acknowledge(keeper, plan, "ok");
    case SwapStep::kDrain:
      if (!from->syncQueue(kDrainWait)) {
        return std::unexpected(fmt::format("generation {}'s queue is not drained yet", plan.from));
      }
      return acknowledge(keeper, plan, "ok");
    case SwapStep::kAttach: {
      if (plan.attacher != spec_.replica) return {};
      auto attached = to->attachPartsOf(*from);
      if (!attached) {
        (void)acknowledge(keeper, plan, "error: " + attached.error());
        return std::unexpected(attached.error());
      }
      auto copied = copyDedupWindow(keeper, from->paths(), to->paths());
      if (!copied) {
        (void)acknowledge(keeper, plan, "error: " + copied.error());
        return std::unexpected(copied.error());
      }
      return acknowledge(keeper, plan,
                         fmt::format("ok: {} parts attached ({} before), {} dedup ids copied",
                                     attached->attached, attached->already, *copied));
    }
    case SwapStep::kVerify: {
      if (!to->syncQueue(kDrainWait)) {
        return std::unexpected(fmt::format("generation {}'s queue is not drained yet", plan.to));
      }
      const auto want = contents(*from);
      const auto have = contents(*to);
      if (want != have) {
        return acknowledge(
            keeper, plan,
            fmt::format("error: generation {} has {} parts, {} rows differ from "
                        "generation {}'s {} parts",
                        plan.to, have.size(), to->rowCount(), plan.from, want.size()));
      }
      return acknowledge(keeper, plan,
                         fmt::format("ok: {} parts, {} rows", have.size(), to->rowCount()));
    }
    case SwapStep::kSwitch:
      // follow() switched when it saw <root>/active move; it is set before this step.
      if (serving != plan.to) {
        return std::unexpected(fmt::format("waiting for the active generation to be {}", plan.to));
      }
      return acknowledge(keeper, plan, "ok");
    case SwapStep::kCleanup: {
      std::shared_ptr<TableReplica> old;
      {
        std::lock_guard lock(mu_);
        if (auto it = generations_.find(plan.from); it != generations_.end()) {
          old = it->second;
          generations_.erase(it);
        }
      }
      if (old) {
        if (auto removed = old->closeAndRemoveFiles(); !removed) return removed;
        spdlog::info("table swap {} -> {}: generation {} closed and its files removed", plan.from,
                     plan.to, plan.from);
      }
      return acknowledge(keeper, plan, "ok");
    }
    case SwapStep::kAbort:
      break;
  }
  return {};
}

void TableHost::followLoop() {
  for (;;) {
    {
      std::unique_lock lock(wake_mu_);
      wake_.wait_for(lock, kFollowPeriod, [this] { return wake_requested_ || stopping_; });
      if (stopping_) return;
      wake_requested_ = false;
    }
    if (auto followed = follow(); !followed) {
      spdlog::debug("table swap: {}", followed.error());
      // Waiting (a queue to drain, active to move): look again soon.
      std::unique_lock lock(wake_mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; });
      wake_requested_ = true;
    }
  }
}

std::vector<std::string> TableHost::handOff(std::chrono::milliseconds timeout) {
  return serving()->handOff(timeout);
}

void TableHost::shutdown() {
  {
    std::lock_guard lock(wake_mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (follower_.joinable()) follower_.join();
  std::map<int64_t, std::shared_ptr<TableReplica>> generations;
  {
    std::lock_guard lock(mu_);
    generations = generations_;
  }
  // The later generation first: it may hold hard links to the earlier one's parts.
  for (auto it = generations.rbegin(); it != generations.rend(); ++it) it->second->shutdown();
  std::lock_guard follow_lock(follow_mu_);
  keeper_.reset();
}

}  // namespace rtable::core
