// rtable-operator: the operator process (operator_main.h: flags, health/metrics servers, leader
// election, graceful shutdown) running the ReplicatedTable, ClusterBackup and BackupSchedule
// controllers.
//
// Environment (as operators deployed by Helm commonly take them):
//   RTABLE_CORE_IMAGE  the image of the replica pods (default rtable/rtable:dev)
//   WATCH_NAMESPACE    only tables, backups and schedules in this namespace (default: every
//                      namespace)
//   RTABLE_OPERATOR_FAILPOINT  tests only, unset in production: `swap-after-step:<step>` makes
//                      the process SIGKILL itself right after it recorded that table swap step
//                      (open, pause, ..., cleanup, abort) in ZooKeeper, as a crash there would
//                      (controllers/tests/integration/operator_swap_crash_e2e_test.cpp).
#include "rtable/operator/operator_main.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdlib>
#include <expected>
#include <functional>
#include <string>

#include "rtable/controllers/backup_schedule_controller.h"
#include "rtable/controllers/cluster_backup_reconciler.h"
#include "rtable/controllers/replicated_table_controller.h"

namespace {

std::string env(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

// The fail point of RTABLE_OPERATOR_FAILPOINT, or why it is not one.
std::expected<std::function<void(const rtable::core::SwapPlan&)>, std::string> swapFailPoint(
    const std::string& spec) {
  constexpr std::string_view kPrefix = "swap-after-step:";
  if (spec.empty()) return nullptr;
  auto step = spec.starts_with(kPrefix) ? rtable::core::parseSwapStep(spec.substr(kPrefix.size()))
                                        : std::nullopt;
  if (!step) {
    return std::unexpected(
        fmt::format("RTABLE_OPERATOR_FAILPOINT '{}': expected swap-after-step:<step>", spec));
  }
  spdlog::warn("fail point armed: {} (SIGKILL once that table swap step is recorded)", spec);
  return [step = *step](const rtable::core::SwapPlan& plan) {
    if (plan.step != step) return;
    spdlog::warn("fail point: table swap {} -> {} recorded step {}: SIGKILL", plan.from, plan.to,
                 rtable::core::swapStepName(plan.step));
    spdlog::default_logger()->flush();
    std::raise(SIGKILL);
  };
}

}  // namespace

int main(int argc, char** argv) {
  return rtable::op::runOperatorMain(
      argc, argv, [](rtable::op::OperatorProcess& process) -> std::expected<void, std::string> {
        rtable::controllers::ReplicatedTableControllerOptions options;
        options.reconciler.image = env("RTABLE_CORE_IMAGE", "rtable/rtable:dev");
        options.watch_namespace = env("WATCH_NAMESPACE", "");
        auto fail_point = swapFailPoint(env("RTABLE_OPERATOR_FAILPOINT", ""));
        if (!fail_point) return std::unexpected(fail_point.error());
        options.reconciler.swap_step_recorded_for_test = std::move(*fail_point);
        if (auto added = rtable::controllers::addReplicatedTableController(process, options);
            !added) {
          return added;
        }
        rtable::controllers::ClusterBackupControllerOptions backups;
        backups.watch_namespace = options.watch_namespace;
        if (auto added = rtable::controllers::addClusterBackupController(process, backups);
            !added) {
          return added;
        }
        rtable::controllers::BackupScheduleControllerOptions schedules;
        schedules.watch_namespace = options.watch_namespace;
        return rtable::controllers::addBackupScheduleController(process, std::move(schedules));
      });
}
