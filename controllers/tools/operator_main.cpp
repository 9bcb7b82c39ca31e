// rtable-operator: the operator process (operator_main.h: flags, health/metrics servers, leader
// election, graceful shutdown) running the ReplicatedTable controller.
//
// Environment (as operators deployed by Helm commonly take them):
//   RTABLE_CORE_IMAGE  the image of the replica pods (default rtable/rtable:dev)
//   WATCH_NAMESPACE    only tables in this namespace (default: every namespace)
#include "rtable/operator/operator_main.h"

#include <cstdlib>

#include "rtable/controllers/replicated_table_controller.h"

namespace {

std::string env(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  return rtable::op::runOperatorMain(argc, argv, [](rtable::op::OperatorProcess& process) {
    rtable::controllers::ReplicatedTableControllerOptions options;
    options.reconciler.image = env("RTABLE_CORE_IMAGE", "rtable/rtable:dev");
    options.watch_namespace = env("WATCH_NAMESPACE", "");
    return rtable::controllers::addReplicatedTableController(process, std::move(options));
  });
}
