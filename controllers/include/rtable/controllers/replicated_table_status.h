// ReplicatedTableStatus: the status of a ReplicatedTable custom resource
// (crds/rtable.io_replicatedtables.yaml, docs/crds.md) as plain data, with its JSON beside it, as
// kubebuilder's *_types.go keep a status struct and its tags together.
//
// Every field is optional because the reconciler writes a status as a JSON merge patch: a field it
// leaves unset is one it does not manage in that call, and the server keeps it as it was.
// toJson() writes only the fields that are set; parse() reads what toJson() wrote (and what the
// apiserver returns), ignoring fields it does not know so that an older operator reads a newer
// one's status. parse(toJson()) gives the same status back.
//
// Plain copyable values; no shared state: thread-safe as values are.
#pragma once

#include <cstdint>
#include <expected>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/controllers/spec_error.h"

namespace rtable::controllers {

enum class ConditionStatus { kTrue, kFalse, kUnknown };

// "True", "False", "Unknown": metav1.ConditionStatus.
std::string_view conditionStatusName(ConditionStatus status);
inline ConditionStatus conditionStatusOf(bool value) {
  return value ? ConditionStatus::kTrue : ConditionStatus::kFalse;
}

// metav1.Condition: the CRD requires every field but observedGeneration.
struct Condition {
  std::string type;  // Ready, Degraded, Replicating, HeadroomLow, Recovering
  ConditionStatus status = ConditionStatus::kUnknown;
  std::string reason;               // CamelCase, for machines ("ReplicasNotReady")
  std::string message;              // for people; may be empty
  int64_t observed_generation = 0;  // the metadata.generation the condition was set for
  // RFC 3339, as the apiserver returns it: since when `status` has held.
  std::string last_transition_time;

  nlohmann::json toJson() const;
  // `path` names the condition in errors ("status.conditions[1]").
  static std::expected<Condition, SpecError> parse(const nlohmann::json& condition,
                                                   const std::string& path = "condition");
  friend bool operator==(const Condition&, const Condition&) = default;
};

// status.recovery: the progress of a table swap to a new generation (DESIGN.md 2.6).
struct RecoveryStatus {
  std::optional<int64_t> from_generation;
  std::optional<int64_t> to_generation;
  std::optional<std::string> step;
  std::optional<std::string> started_at;   // RFC 3339
  std::optional<std::string> finished_at;  // RFC 3339, once it ended
  std::optional<std::string> result;       // Succeeded or Aborted, once it ended
  // Why it started: "headroom" (under the threshold, or the log stuck) or "manual: <value>" (the
  // rtable.io/swap annotation's value, which starts one swap per distinct value).
  std::optional<std::string> trigger;
  // The last rtable.io/swap annotation value a swap was started for.
  std::optional<std::string> last_manual_trigger;
  // The last rtable.io/swap-abort annotation value seen (one abort per distinct value).
  std::optional<std::string> last_abort_request;
  std::optional<std::string> message;  // what the running step waits for
  // From the swap's plan: begin to end, and inserts paused to switched (or aborted).
  std::optional<double> duration_seconds;
  std::optional<double> write_pause_seconds;
  friend bool operator==(const RecoveryStatus&, const RecoveryStatus&) = default;
};

// status.replicaQueues[]: one replica's replication queue as ZooKeeper shows it.
struct ReplicaQueueStatus {
  std::string replica;
  bool active = false;                      // its process holds a ZooKeeper session (is_active)
  int64_t queue_size = 0;                   // entries waiting
  std::optional<std::string> oldest_entry;  // "GET_PART 202612_5_5_0"
  std::optional<int64_t> oldest_waiting_seconds;  // since it was pulled into the queue
  friend bool operator==(const ReplicaQueueStatus&, const ReplicaQueueStatus&) = default;
};

struct ReplicatedTableStatus {
  std::optional<int64_t> observed_generation;
  std::vector<Condition> conditions;  // empty: left out
  std::optional<int32_t> replicas;    // replica pods that exist (the scale subresource's)
  std::optional<int32_t> ready_replicas;
  std::optional<std::string> ready;           // "<readyReplicas>/<spec.replicas>", for kubectl get
  std::optional<std::string> selector;        // the pods' label selector, for the scale subresource
  std::optional<std::string> zookeeper_path;  // <zookeeper.root>/<uid>
  std::optional<int64_t> active_generation;
  std::optional<int64_t> log_max_index;
  std::optional<int64_t> log_counter;
  // Of the watched counter with the least headroom (log, a partition's block numbers, a
  // replica's queue; headroom_counter names it): creates left / 2^31, and as a percentage for
  // kubectl get ("99.94%").
  std::optional<double> headroom_ratio;
  std::optional<std::string> headroom;
  std::optional<std::string> headroom_counter;  // "log", "block_numbers/202612", "queue/events-1"
  // The soonest any watched counter runs out at its sampled growth rate (unset: none grows, or
  // not sampled long enough yet).
  std::optional<double> exhaustion_seconds;
  std::optional<RecoveryStatus> recovery;
  std::optional<std::vector<ReplicaQueueStatus>> replica_queues;

  nlohmann::json toJson() const;
  // toJson() as a JSON merge patch (RFC 7386): `recovery`, when set, replaces the stored one
  // whole (its unset fields as null), so that a new swap's status keeps nothing of the last one.
  nlohmann::json toMergePatch() const;
  // `status` is the object's .status; a null or absent one is an empty status.
  static std::expected<ReplicatedTableStatus, SpecError> parse(const nlohmann::json& status);
  friend bool operator==(const ReplicatedTableStatus&, const ReplicatedTableStatus&) = default;
};

// Sets `condition` in `conditions`: replaces the one of the same type, or appends it.
void setCondition(std::vector<Condition>& conditions, Condition condition);

// Finishes one reconcile's conditions as metav1 wants them: each gets `generation` as its
// observedGeneration, and keeps the lastTransitionTime of the condition of its type in `previous`
// while its status is the same there (kubectl and alerting read it as "since when"); a condition
// whose status changed, or that is new, changed `now`.
void stampConditions(std::vector<Condition>& conditions, const std::vector<Condition>& previous,
                     int64_t generation, const std::string& now);

}  // namespace rtable::controllers
