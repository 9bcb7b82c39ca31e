// A Keeper that times every request into rtable_zookeeper_request_duration_seconds{operation}
// and counts failures by code, around any other Keeper (the real client in production).
#pragma once

#include <memory>

#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/keeper.h"

namespace rtable::core {

// `metrics` must outlive this Keeper and the sessions it starts.
std::unique_ptr<Keeper> measureKeeper(std::unique_ptr<Keeper> inner,
                                      metrics::ReplicaMetrics& metrics);

}  // namespace rtable::core
