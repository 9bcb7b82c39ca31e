#include "rtable/controllers/replicated_table_status.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "json_fields.h"

namespace rtable::controllers {
namespace {

using detail::fail;
using detail::indexPath;
using detail::JsonFields;
using nlohmann::json;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::optional<double> optionalNumber(JsonFields& fields, const std::string& key) {
  const json* value = fields.find(key);
  if (!value) return std::nullopt;
  if (!value->is_number()) {
    fail(fields.at(key), fmt::format("expected a number, got {}", detail::jsonTypeName(*value)));
  }
  return value->get<double>();
}

std::optional<int32_t> optionalInt32(JsonFields& fields, const std::string& key) {
  auto value = fields.optionalInteger(key, 0, kInt32Max);
  if (!value) return std::nullopt;
  return static_cast<int32_t>(*value);
}

ConditionStatus parseConditionStatus(JsonFields& fields) {
  const std::string text = fields.string("status");
  for (ConditionStatus status :
       {ConditionStatus::kTrue, ConditionStatus::kFalse, ConditionStatus::kUnknown}) {
    if (text == conditionStatusName(status)) return status;
  }
  fail(fields.at("status"), fmt::format("expected True, False or Unknown, got '{}'", text));
}

Condition parseCondition(const json& object, const std::string& path) {
  JsonFields fields(object, path);
  Condition condition;
  condition.type = fields.string("type");
  condition.status = parseConditionStatus(fields);
  condition.reason = fields.string("reason");
  condition.message = fields.string("message");
  condition.observed_generation = fields.integer("observedGeneration", 0, 0, kInt64Max);
  condition.last_transition_time = fields.string("lastTransitionTime");
  return condition;
}

RecoveryStatus parseRecovery(const json& object, const std::string& path) {
  JsonFields fields(object, path);
  RecoveryStatus recovery;
  recovery.from_generation = fields.optionalInteger("fromGeneration", 0, kInt64Max);
  recovery.to_generation = fields.optionalInteger("toGeneration", 0, kInt64Max);
  recovery.step = fields.optionalString("step");
  recovery.started_at = fields.optionalString("startedAt");
  recovery.finished_at = fields.optionalString("finishedAt");
  recovery.result = fields.optionalString("result");
  recovery.trigger = fields.optionalString("trigger");
  recovery.last_manual_trigger = fields.optionalString("lastManualTrigger");
  recovery.last_abort_request = fields.optionalString("lastAbortRequest");
  recovery.message = fields.optionalString("message");
  recovery.duration_seconds = optionalNumber(fields, "durationSeconds");
  recovery.write_pause_seconds = optionalNumber(fields, "writePauseSeconds");
  return recovery;
}

ReplicaQueueStatus parseReplicaQueue(const json& object, const std::string& path) {
  JsonFields fields(object, path);
  ReplicaQueueStatus queue;
  queue.replica = fields.string("replica");
  queue.active = fields.boolean("active", false);
  queue.queue_size = fields.integer("queueSize", 0, 0, kInt64Max);
  queue.oldest_entry = fields.optionalString("oldestEntry");
  queue.oldest_waiting_seconds = fields.optionalInteger("oldestWaitingSeconds", 0, kInt64Max);
  return queue;
}

ReplicatedTableStatus parseStatus(const json& object) {
  ReplicatedTableStatus status;
  if (object.is_null()) return status;
  JsonFields fields(object, "status");
  status.observed_generation = fields.optionalInteger("observedGeneration", 0, kInt64Max);
  const json& conditions = fields.array("conditions", std::numeric_limits<std::size_t>::max());
  for (std::size_t i = 0; i < conditions.size(); ++i) {
    status.conditions.push_back(
        parseCondition(conditions[i], indexPath(fields.at("conditions"), i)));
  }
  status.replicas = optionalInt32(fields, "replicas");
  status.ready_replicas = optionalInt32(fields, "readyReplicas");
  status.ready = fields.optionalString("ready");
  status.selector = fields.optionalString("selector");
  status.zookeeper_path = fields.optionalString("zookeeperPath");
  status.active_generation = fields.optionalInteger("activeGeneration", 0, kInt64Max);
  status.log_max_index = fields.optionalInteger("logMaxIndex", -1, kInt64Max);
  status.log_counter = fields.optionalInteger("logCounter", 0, kInt64Max);
  status.headroom_ratio = optionalNumber(fields, "headroomRatio");
  status.headroom = fields.optionalString("headroom");
  status.headroom_counter = fields.optionalString("headroomCounter");
  status.exhaustion_seconds = optionalNumber(fields, "exhaustionSeconds");
  if (const json* recovery = fields.find("recovery")) {
    status.recovery = parseRecovery(*recovery, fields.at("recovery"));
  }
  if (fields.find("replicaQueues")) {
    const json& queues = fields.array("replicaQueues", std::numeric_limits<std::size_t>::max());
    status.replica_queues.emplace();
    for (std::size_t i = 0; i < queues.size(); ++i) {
      status.replica_queues->push_back(
          parseReplicaQueue(queues[i], indexPath(fields.at("replicaQueues"), i)));
    }
  }
  // Fields of a newer operator are not an error (see the header).
  return status;
}

template <class T>
void putIfSet(json& object, const char* key, const std::optional<T>& value) {
  if (value) object[key] = *value;
}

template <class T>
std::expected<T, SpecError> catchFailures(auto parse) {
  try {
    return parse();
  } catch (const detail::SpecFailure& failure) {
    return std::unexpected(failure.error);
  } catch (const json::exception& e) {
    return std::unexpected(SpecError{"status", e.what()});
  }
}

}  // namespace

std::string_view conditionStatusName(ConditionStatus status) {
  switch (status) {
    case ConditionStatus::kTrue:
      return "True";
    case ConditionStatus::kFalse:
      return "False";
    case ConditionStatus::kUnknown:
      return "Unknown";
  }
  return "Unknown";
}

json Condition::toJson() const {
  return {{"type", type},
          {"status", std::string(conditionStatusName(status))},
          {"reason", reason},
          {"message", message},
          {"observedGeneration", observed_generation},
          {"lastTransitionTime", last_transition_time}};
}

std::expected<Condition, SpecError> Condition::parse(const json& condition,
                                                     const std::string& path) {
  return catchFailures<Condition>([&] { return parseCondition(condition, path); });
}

json ReplicatedTableStatus::toMergePatch() const {
  json patch = toJson();
  if (recovery) {
    for (const char* field : {"fromGeneration", "toGeneration", "step", "startedAt", "finishedAt",
                              "result", "trigger", "lastManualTrigger", "lastAbortRequest",
                              "message", "durationSeconds", "writePauseSeconds"}) {
      if (!patch["recovery"].contains(field)) patch["recovery"][field] = nullptr;
    }
  }
  return patch;
}

json ReplicatedTableStatus::toJson() const {
  json status = json::object();
  putIfSet(status, "observedGeneration", observed_generation);
  if (!conditions.empty()) {
    json list = json::array();
    for (const auto& condition : conditions) list.push_back(condition.toJson());
    status["conditions"] = std::move(list);
  }
  putIfSet(status, "replicas", replicas);
  putIfSet(status, "readyReplicas", ready_replicas);
  putIfSet(status, "ready", ready);
  putIfSet(status, "selector", selector);
  putIfSet(status, "zookeeperPath", zookeeper_path);
  putIfSet(status, "activeGeneration", active_generation);
  putIfSet(status, "logMaxIndex", log_max_index);
  putIfSet(status, "logCounter", log_counter);
  putIfSet(status, "headroomRatio", headroom_ratio);
  putIfSet(status, "headroom", headroom);
  putIfSet(status, "headroomCounter", headroom_counter);
  putIfSet(status, "exhaustionSeconds", exhaustion_seconds);
  if (recovery) {
    json object = json::object();
    putIfSet(object, "fromGeneration", recovery->from_generation);
    putIfSet(object, "toGeneration", recovery->to_generation);
    putIfSet(object, "step", recovery->step);
    putIfSet(object, "startedAt", recovery->started_at);
    putIfSet(object, "finishedAt", recovery->finished_at);
    putIfSet(object, "result", recovery->result);
    putIfSet(object, "trigger", recovery->trigger);
    putIfSet(object, "lastManualTrigger", recovery->last_manual_trigger);
    putIfSet(object, "lastAbortRequest", recovery->last_abort_request);
    putIfSet(object, "message", recovery->message);
    putIfSet(object, "durationSeconds", recovery->duration_seconds);
    putIfSet(object, "writePauseSeconds", recovery->write_pause_seconds);
    status["recovery"] = std::move(object);
  }
  if (replica_queues) {
    json list = json::array();
    for (const auto& queue : *replica_queues) {
      json object = {
          {"replica", queue.replica}, {"active", queue.active}, {"queueSize", queue.queue_size}};
      putIfSet(object, "oldestEntry", queue.oldest_entry);
      putIfSet(object, "oldestWaitingSeconds", queue.oldest_waiting_seconds);
      list.push_back(std::move(object));
    }
    status["replicaQueues"] = std::move(list);
  }
  return status;
}

std::expected<ReplicatedTableStatus, SpecError> ReplicatedTableStatus::parse(const json& status) {
  return catchFailures<ReplicatedTableStatus>([&] { return parseStatus(status); });
}

void setCondition(std::vector<Condition>& conditions, Condition condition) {
  for (auto& existing : conditions) {
    if (existing.type == condition.type) {
      existing = std::move(condition);
      return;
    }
  }
  conditions.push_back(std::move(condition));
}

void stampConditions(std::vector<Condition>& conditions, const std::vector<Condition>& previous,
                     int64_t generation, const std::string& now) {
  for (auto& condition : conditions) {
    condition.observed_generation = generation;
    condition.last_transition_time = now;
    for (const auto& old : previous) {
      if (old.type == condition.type && old.status == condition.status &&
          !old.last_transition_time.empty()) {
        condition.last_transition_time = old.last_transition_time;
      }
    }
  }
}

}  // namespace rtable::controllers
