#include "rtable/replication_core/table_swap.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <utility>

#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_registration.h"

namespace rtable::core {
namespace {

constexpr std::array<std::pair<SwapStep, std::string_view>, 8> kSteps = {{
    {SwapStep::kOpen, "open"},
    {SwapStep::kPause, "pause"},
    {SwapStep::kDrain, "drain"},
    {SwapStep::kAttach, "attach"},
    {SwapStep::kVerify, "verify"},
    {SwapStep::kSwitch, "switch"},
    {SwapStep::kCleanup, "cleanup"},
    {SwapStep::kAbort, "abort"},
}};

}  // namespace

std::string_view swapStepName(SwapStep step) {
  for (const auto& [value, name] : kSteps) {
    if (value == step) return name;
  }
  return "unknown";
}

std::optional<SwapStep> parseSwapStep(std::string_view name) {
  for (const auto& [value, known] : kSteps) {
    if (known == name) return value;
  }
  return std::nullopt;
}

std::string SwapPlan::format() const {
  return fmt::format(
      "from: {}\nto: {}\nstep: {}\nattacher: {}\nstarted_ms: {}\npaused_ms: {}\nswitched_ms: {}\n"
      "trigger: {}\n",
      from, to, swapStepName(step), attacher, started_ms, paused_ms, switched_ms, trigger);
}

std::expected<SwapPlan, std::string> SwapPlan::parse(std::string_view text) {
  SwapPlan plan;
  bool has_from = false, has_to = false, has_step = false;
  std::size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty()) continue;
    const std::size_t colon = line.find(": ");
    const std::string_view key = line.substr(0, colon);
    const std::string_view value =
        colon == std::string_view::npos ? std::string_view() : line.substr(colon + 2);
    auto fail = [&](std::string why) {
      return std::unexpected(fmt::format("swap plan line {} '{}': {}", line_number, line, why));
    };
    int64_t number = 0;
    auto [ptr, error] = std::from_chars(value.data(), value.data() + value.size(), number);
    const bool is_number = error == std::errc() && ptr == value.data() + value.size();
    if (key == "from" || key == "to") {
      if (!is_number || number < 1) return fail("not a generation number");
      (key == "from" ? plan.from : plan.to) = number;
      (key == "from" ? has_from : has_to) = true;
    } else if (key == "started_ms" || key == "paused_ms" || key == "switched_ms") {
      if (!is_number || number < 0) return fail("not a time in ms");
      (key == "started_ms"  ? plan.started_ms
       : key == "paused_ms" ? plan.paused_ms
                            : plan.switched_ms) = number;
    } else if (key == "step") {
      auto step = parseSwapStep(value);
      if (!step) return fail("unknown step");
      plan.step = *step;
      has_step = true;
    } else if (key == "attacher") {
      plan.attacher = std::string(value);
    } else if (key == "trigger") {
      plan.trigger = std::string(value);
    } else {
      return fail("unknown field");
    }
  }
  if (!has_from || !has_to || !has_step) {
    return std::unexpected(fmt::format("swap plan: missing {}", !has_from ? "from"
                                                                : !has_to ? "to"
                                                                          : "step"));
  }
  if (plan.to <= plan.from) {
    return std::unexpected(
        fmt::format("swap plan: to ({}) must come after from ({})", plan.to, plan.from));
  }
  return plan;
}

SwapDriver::SwapDriver(Keeper& keeper, std::string table_root, std::function<int64_t()> now_ms,
                       std::function<void(const SwapPlan&)> recorded)
    : keeper_(keeper),
      root_(std::move(table_root)),
      now_ms_(std::move(now_ms)),
      recorded_(std::move(recorded)) {
  if (!now_ms_) {
    now_ms_ = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  }
}

KeeperResult<SwapPlan> SwapDriver::begin(std::string trigger) {
  auto running = keeper_.get(swapPath(root_));
  if (running) {
    auto plan = SwapPlan::parse(running->data);
    if (!plan)
      return std::unexpected(
          KeeperError{KeeperCode::kBadArguments, swapPath(root_), plan.error(), {}});
    return *plan;
  }
  if (running.error().code != KeeperCode::kNoNode) return std::unexpected(running.error());
  auto active = readActiveGeneration(keeper_, root_);
  if (!active) return std::unexpected(active.error());
  if (!*active) {
    return std::unexpected(
        KeeperError{KeeperCode::kNoNode, root_ + "/active", "the table does not exist", {}});
  }
  const TablePaths from{root_, **active, ""};
  const TablePaths to{root_, **active + 1, ""};
  auto metadata = keeper_.get(from.metadata());
  if (!metadata) return std::unexpected(metadata.error());
  // A next generation without a plan is what a begin cut short (or an abort's removal) left; no
  // replica opens a generation without a plan, so it holds nothing: made afresh.
  if (auto stale = removeRecursive(keeper_, to.generationRoot()); !stale) {
    return std::unexpected(stale.error());
  }
  if (auto created = createTableIfNotExists(keeper_, to, metadata->data); !created) {
    return std::unexpected(created.error());
  }
  SwapPlan plan{from.generation, to.generation, SwapStep::kOpen, ""};
  plan.started_ms = now_ms_();
  plan.trigger = trigger;
  // In one multi with the check that no backup copies the table (a backup checks the reverse).
  auto made = keeper_.multi({op::CheckNotExists{backupLockPath(root_)},
                             op::Create{swapPath(root_), plan.format(), CreateMode::kPersistent}});
  if (!made && made.error().code == KeeperCode::kNodeExists && made.error().failed_op_index == 0) {
    auto backup = keeper_.get(backupLockPath(root_));
    return std::unexpected(KeeperError{
        KeeperCode::kNodeExists, backupLockPath(root_),
        fmt::format("a cluster backup ({}) copies the table: the swap begins when it ends",
                    backup ? backup->data : "?"),
        0});
  }
  if (!made && made.error().code == KeeperCode::kNodeExists) return begin();  // another driver
  if (!made) return std::unexpected(made.error());
  if (recorded_) recorded_(plan);
  return plan;
}

KeeperStatus SwapDriver::setStep(SwapPlan plan, int32_t version) {
  auto set = keeper_.set(swapPath(root_), plan.format(), version);
  if (!set) return std::unexpected(set.error());
  if (recorded_) recorded_(plan);
  return {};
}

KeeperResult<SwapProgress> SwapDriver::advance() {
  SwapProgress progress;
  auto node = keeper_.get(swapPath(root_));
  if (!node) {
    if (node.error().code != KeeperCode::kNoNode) return std::unexpected(node.error());
    progress.ended = true;
    return progress;
  }
  auto parsed = SwapPlan::parse(node->data);
  if (!parsed) {
    return std::unexpected(
        KeeperError{KeeperCode::kBadArguments, swapPath(root_), parsed.error(), {}});
  }
  SwapPlan plan = *parsed;
  progress.plan = plan;
  const TablePaths from{root_, plan.from, ""};
  const TablePaths to{root_, plan.to, ""};
  auto replicas = keeper_.children(from.replicas());
  // A driver that died while removing `from` at cleanup (which starts only once every replica
  // acknowledged it) left part of its tree: nothing is left to wait for but the removal.
  const bool removing_from =
      !replicas && replicas.error().code == KeeperCode::kNoNode && plan.step == SwapStep::kCleanup;
  if (!replicas && !removing_from) return std::unexpected(replicas.error());
  std::vector<std::string> required = replicas ? replicas->names : std::vector<std::string>{};
  std::sort(required.begin(), required.end());
  if (plan.step == SwapStep::kAttach) required = {plan.attacher};
  std::string error;
  for (const auto& replica : required) {
    auto ack = keeper_.get(swapAckPath(root_, plan.step, replica));
    if (!ack && ack.error().code != KeeperCode::kNoNode) return std::unexpected(ack.error());
    if (!ack) {
      if (progress.waiting_for.empty()) {
        auto live = keeper_.exists(from.replicaRoot(replica) + "/is_active");
        progress.waiting_for = fmt::format(
            "replica {} has not acknowledged {}{}", replica, swapStepName(plan.step),
            live && !*live ? " (it is not live: the swap waits for it or an abort)" : "");
      }
      continue;
    }
    progress.acknowledgements.push_back(fmt::format("{}: {}", replica, ack->data));
    if (ack->data.starts_with("error") && error.empty()) {
      error = fmt::format("replica {} at {}: {}", replica, swapStepName(plan.step), ack->data);
    }
  }
  if (!error.empty()) {
    progress.waiting_for = error;
    // Parts that differ between the generations: nothing switched, so generation g serves on.
    if (plan.step == SwapStep::kVerify) {
      SwapPlan aborting = plan;
      aborting.step = SwapStep::kAbort;
      if (auto set = setStep(aborting, node->stat.version); !set)
        return std::unexpected(set.error());
      progress.plan = aborting;
    }
    return progress;
  }
  if (!progress.waiting_for.empty()) return progress;
  SwapPlan next = plan;
  switch (plan.step) {
    case SwapStep::kOpen:
      next.step = SwapStep::kPause;
      next.paused_ms = now_ms_();
      break;
    case SwapStep::kPause:
      next.step = SwapStep::kDrain;
      break;
    case SwapStep::kDrain:
      next.step = SwapStep::kAttach;
      for (const auto& replica : required) {
        auto live = keeper_.exists(to.replicaRoot(replica) + "/is_active");
        if (live && *live) {
          next.attacher = replica;
          break;
        }
      }
      if (next.attacher.empty()) {
        progress.waiting_for =
            fmt::format("no replica is live in generation {} to attach", plan.to);
        return progress;
      }
      break;
    case SwapStep::kAttach:
      next.step = SwapStep::kVerify;
      break;
    case SwapStep::kVerify: {
      // The switch itself: one versioned set of <root>/active.
      auto active = keeper_.get(root_ + "/active");
      if (!active) return std::unexpected(active.error());
      if (active->data != std::to_string(plan.to)) {
        if (active->data != std::to_string(plan.from)) {
          return std::unexpected(KeeperError{KeeperCode::kBadArguments,
                                             root_ + "/active",
                                             fmt::format("active generation is {}, not {} or {}",
                                                         active->data, plan.from, plan.to),
                                             {}});
        }
        auto set = keeper_.set(root_ + "/active", std::to_string(plan.to), active->stat.version);
        if (!set) return std::unexpected(set.error());
      }
      next.step = SwapStep::kSwitch;
      next.switched_ms = now_ms_();
      break;
    }
    case SwapStep::kSwitch:
      next.step = SwapStep::kCleanup;
      break;
    case SwapStep::kCleanup:
    case SwapStep::kAbort: {
      const bool aborted = plan.step == SwapStep::kAbort;
      // The generation given up goes before the plan: without a plan no replica opens it again.
      if (auto removed = removeRecursive(keeper_, (aborted ? to : from).generationRoot());
          !removed) {
        return std::unexpected(removed.error());
      }
      if (auto removed = removeRecursive(keeper_, swapPath(root_)); !removed) {
        return std::unexpected(removed.error());
      }
      progress.plan.reset();
      progress.ended_plan = plan;
      progress.ended = true;
      progress.aborted = aborted;
      return progress;
    }
  }
  if (auto set = setStep(next, node->stat.version); !set) return std::unexpected(set.error());
  progress.plan = next;
  progress.waiting_for =
      next.step == SwapStep::kAttach
          ? fmt::format("waiting for replica {} to attach", next.attacher)
          : fmt::format("waiting for every replica to acknowledge {}", swapStepName(next.step));
  return progress;
}

KeeperResult<bool> SwapDriver::abort() {
  auto node = keeper_.get(swapPath(root_));
  if (!node) {
    if (node.error().code == KeeperCode::kNoNode) return false;
    return std::unexpected(node.error());
  }
  auto plan = SwapPlan::parse(node->data);
  if (!plan) {
    return std::unexpected(
        KeeperError{KeeperCode::kBadArguments, swapPath(root_), plan.error(), {}});
  }
  if (plan->step == SwapStep::kAbort) return true;
  if (plan->step >= SwapStep::kSwitch) return false;
  plan->step = SwapStep::kAbort;
  if (auto set = setStep(*plan, node->stat.version); !set) return std::unexpected(set.error());
  return true;
}

}  // namespace rtable::core
