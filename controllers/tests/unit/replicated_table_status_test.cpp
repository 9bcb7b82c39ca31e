#include "rtable/controllers/replicated_table_status.h"

#include <gtest/gtest.h>

namespace rtable::controllers {
namespace {

using nlohmann::json;

Condition condition(std::string type, ConditionStatus status, std::string reason,
                    std::string message = "") {
  Condition c;
  c.type = std::move(type);
  c.status = status;
  c.reason = std::move(reason);
  c.message = std::move(message);
  return c;
}

// Every field set, as a reconcile with ZooKeeper and a table swap would write them.
ReplicatedTableStatus fullStatus() {
  ReplicatedTableStatus status;
  status.observed_generation = 7;
  Condition ready =
      condition("Ready", ConditionStatus::kTrue, "AllReplicasReady", "3/3 replicas ready");
  ready.observed_generation = 7;
  ready.last_transition_time = "2025-01-02T03:04:05Z";
  Condition headroom = condition("HeadroomLow", ConditionStatus::kUnknown, "NotMeasured");
  headroom.observed_generation = 6;
  headroom.last_transition_time = "2025-01-01T00:00:00Z";
  status.conditions = {ready, headroom};
  status.replicas = 3;
  status.ready_replicas = 3;
  status.ready = "3/3";
  status.selector = "app.kubernetes.io/instance=events";
  status.zookeeper_path = "/rtable/tables/analytics.events";
  status.active_generation = 2;
  status.log_max_index = 1'204'330;
  status.log_counter = 1'204'331;
  status.headroom_ratio = 0.9994;
  status.headroom = "99.94%";
  status.headroom_counter = "block_numbers/202612";
  status.exhaustion_seconds = 86400.5;
  status.recovery = RecoveryStatus{1,
                                   2,
                                   "attach",
                                   "2025-01-02T03:00:00Z",
                                   "2025-01-02T03:00:04Z",
                                   "Succeeded",
                                   "manual: now",
                                   "now",
                                   "abort-1",
                                   "replica events-1 has not acknowledged attach",
                                   4.25,
                                   0.5};
  return status;
}

TEST(ReplicatedTableStatus, RoundTripsEveryField) {
  const ReplicatedTableStatus status = fullStatus();
  const json object = status.toJson();
  auto parsed = ReplicatedTableStatus::parse(object);
  ASSERT_TRUE(parsed) << parsed.error().toString();
  EXPECT_EQ(*parsed, status);
  EXPECT_EQ(parsed->toJson(), object);
}

TEST(ReplicatedTableStatus, WritesTheCrdFieldNames) {
  EXPECT_EQ(fullStatus().toJson(), json::parse(R"({
    "observedGeneration": 7,
    "conditions": [
      {"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "3/3 replicas ready",
       "observedGeneration": 7, "lastTransitionTime": "2025-01-02T03:04:05Z"},
      {"type": "HeadroomLow", "status": "Unknown", "reason": "NotMeasured", "message": "",
       "observedGeneration": 6, "lastTransitionTime": "2025-01-01T00:00:00Z"}],
    "replicas": 3, "readyReplicas": 3, "ready": "3/3", "selector": "app.kubernetes.io/instance=events",
    "zookeeperPath": "/rtable/tables/analytics.events", "activeGeneration": 2,
    "logMaxIndex": 1204330, "logCounter": 1204331, "headroomRatio": 0.9994, "headroom": "99.94%",
    "headroomCounter": "block_numbers/202612", "exhaustionSeconds": 86400.5,
    "recovery": {"fromGeneration": 1, "toGeneration": 2, "step": "attach",
                 "startedAt": "2025-01-02T03:00:00Z", "finishedAt": "2025-01-02T03:00:04Z",
                 "result": "Succeeded", "trigger": "manual: now", "lastManualTrigger": "now",
                 "lastAbortRequest": "abort-1",
                 "message": "replica events-1 has not acknowledged attach",
                 "durationSeconds": 4.25, "writePauseSeconds": 0.5}})"));
}

// A new swap's recovery replaces the last one's whole: its unset fields go as null.
TEST(ReplicatedTableStatus, AMergePatchReplacesTheRecoveryWhole) {
  ReplicatedTableStatus status;
  status.recovery = RecoveryStatus{};
  status.recovery->step = "open";
  const json patch = status.toMergePatch();
  EXPECT_EQ(patch["recovery"]["step"], "open");
  EXPECT_TRUE(patch["recovery"]["finishedAt"].is_null());
  EXPECT_TRUE(patch["recovery"]["result"].is_null());
  EXPECT_EQ(patch["recovery"].size(), 12u);
  EXPECT_FALSE(ReplicatedTableStatus{}.toMergePatch().contains("recovery"));
}

// A merge patch: what is not set is not written, so the server keeps it.
TEST(ReplicatedTableStatus, WritesOnlyTheFieldsThatAreSet) {
  EXPECT_EQ(ReplicatedTableStatus{}.toJson(), json::object());
  ReplicatedTableStatus status;
  status.observed_generation = 3;
  status.conditions = {
      condition("Ready", ConditionStatus::kFalse, "InvalidSpec", "spec.table: required")};
  const json object = status.toJson();
  EXPECT_EQ(object.size(), 2u) << object.dump();
  EXPECT_TRUE(object.contains("observedGeneration") && object.contains("conditions"))
      << object.dump();
  EXPECT_EQ(*ReplicatedTableStatus::parse(object), status);
}

TEST(ReplicatedTableStatus, ReadsAnAbsentStatusAndIgnoresUnknownFields) {
  EXPECT_EQ(*ReplicatedTableStatus::parse(json()), ReplicatedTableStatus{});
  EXPECT_EQ(*ReplicatedTableStatus::parse(json::object()), ReplicatedTableStatus{});
  auto newer =
      ReplicatedTableStatus::parse({{"ready", "1/1"}, {"fieldOfANewerOperator", {{"x", 1}}}});
  ASSERT_TRUE(newer) << newer.error().toString();
  EXPECT_EQ(newer->ready, "1/1");
}

TEST(ReplicatedTableStatus, ErrorsNameTheField) {
  const json ready = fullStatus().conditions[0].toJson();
  const std::vector<std::pair<json, std::string>> cases = {
      {json::array(), "status: expected an object, got array"},
      {{{"observedGeneration", "7"}}, "status.observedGeneration: expected an integer, got string"},
      {{{"replicas", -1}}, "status.replicas: must be from 0 to 2147483647, got -1"},
      {{{"headroomRatio", "0.5"}}, "status.headroomRatio: expected a number, got string"},
      {{{"conditions", json::object()}}, "status.conditions: expected a list, got object"},
      {{{"recovery", {{"step", 3}}}}, "status.recovery.step: expected a string, got integer"},
  };
  for (const auto& [object, message] : cases) {
    auto parsed = ReplicatedTableStatus::parse(object);
    ASSERT_FALSE(parsed) << object.dump();
    EXPECT_EQ(parsed.error().toString(), message) << object.dump();
  }
  json missing_type = ready;
  missing_type.erase("type");
  auto parsed = ReplicatedTableStatus::parse({{"conditions", json::array({ready, missing_type})}});
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().toString(), "status.conditions[1].type: required");
  json bad_status = ready;
  bad_status["status"] = "Yes";
  parsed = ReplicatedTableStatus::parse({{"conditions", json::array({bad_status})}});
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().toString(),
            "status.conditions[0].status: expected True, False or Unknown, got 'Yes'");
}

TEST(Condition, RoundTripsAlone) {
  const Condition c = fullStatus().conditions[1];
  auto parsed = Condition::parse(c.toJson());
  ASSERT_TRUE(parsed) << parsed.error().toString();
  EXPECT_EQ(*parsed, c);
  EXPECT_EQ(Condition::parse(json::object(), "x").error().toString(), "x.type: required");
}

TEST(Conditions, SetReplacesByTypeAndKeepsTheOrder) {
  std::vector<Condition> conditions;
  setCondition(conditions, condition("Ready", ConditionStatus::kFalse, "ReplicasNotReady"));
  setCondition(conditions, condition("Degraded", ConditionStatus::kFalse, "AsExpected"));
  setCondition(conditions, condition("Ready", ConditionStatus::kTrue, "AllReplicasReady"));
  ASSERT_EQ(conditions.size(), 2u);
  EXPECT_EQ(conditions[0].type, "Ready");
  EXPECT_EQ(conditions[0].reason, "AllReplicasReady");
  EXPECT_EQ(conditions[1].type, "Degraded");
}

TEST(Conditions, LastTransitionTimeChangesOnlyWithTheStatus) {
  std::vector<Condition> previous = {
      condition("Ready", ConditionStatus::kFalse, "ReplicasNotReady"),
      condition("Degraded", ConditionStatus::kTrue, "ReplicasUnavailable")};
  previous[0].last_transition_time = "2025-01-01T00:00:00Z";
  previous[1].last_transition_time = "2025-01-01T00:00:01Z";
  std::vector<Condition> now = {condition("Ready", ConditionStatus::kFalse, "ApplyFailed"),
                                condition("Degraded", ConditionStatus::kFalse, "AsExpected"),
                                condition("Replicating", ConditionStatus::kTrue, "AsExpected")};
  stampConditions(now, previous, 4, "2025-01-02T00:00:00Z");
  EXPECT_EQ(now[0].last_transition_time, "2025-01-01T00:00:00Z");  // still False: since then
  EXPECT_EQ(now[1].last_transition_time, "2025-01-02T00:00:00Z");  // True -> False: now
  EXPECT_EQ(now[2].last_transition_time, "2025-01-02T00:00:00Z");  // new: now
  for (const auto& c : now) EXPECT_EQ(c.observed_generation, 4) << c.type;
}

}  // namespace
}  // namespace rtable::controllers
