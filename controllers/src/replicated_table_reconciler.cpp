#include "rtable/controllers/replicated_table_reconciler.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <fstream>
#include <random>

#include "rtable/controllers/replicated_table_objects.h"
#include "rtable/controllers/replicated_table_spec.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;

std::string randomSecret() {
  // 32 bytes from the kernel's CSPRNG, hex: a shared secret between the table's replicas.
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[32] = {};
  urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

std::string rfc3339(std::chrono::system_clock::time_point time) {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", std::chrono::floor<std::chrono::seconds>(time));
}

// Sets one metav1.Condition in `conditions`, keeping lastTransitionTime when the status is the
// same as before (kubectl and alerting read it as "since when").
void setCondition(json& conditions, const json& previous, const std::string& type, bool status,
                  const std::string& reason, const std::string& message, int64_t generation,
                  const std::string& now) {
  std::string since = now;
  const std::string status_text = status ? "True" : "False";
  if (previous.is_array()) {
    for (const auto& old : previous) {
      if (old.value("type", "") == type && old.value("status", "") == status_text) {
        since = old.value("lastTransitionTime", now);
      }
    }
  }
  conditions.push_back({{"type", type},
                        {"status", status_text},
                        {"reason", reason},
                        {"message", message},
                        {"observedGeneration", generation},
                        {"lastTransitionTime", since}});
}

}  // namespace

op::ResourceType replicatedTables() {
  return {"rtable.io", "v1alpha1", "replicatedtables", "ReplicatedTable", true, true};
}

ReplicatedTableReconciler::ReplicatedTableReconciler(op::KubeClient& client,
                                                     ReplicatedTableReconcilerOptions options)
    : client_(client), options_(std::move(options)) {
  if (!options_.generate_secret) options_.generate_secret = randomSecret;
  if (!options_.wall_clock) options_.wall_clock = [] { return std::chrono::system_clock::now(); };
}

op::ReconcileOutcome ReplicatedTableReconciler::reconcile(const op::ObjectKey& key) {
  auto table = client_.get(replicatedTables(), key);
  if (!table) {
    if (table.error().kind == op::KubeErrorKind::kNotFound) return op::ReconcileResult::done();
    return std::unexpected(op::ReconcileError::retryable("reading the table: " + table.error().toString()));
  }
  if (table->contains(json::json_pointer("/metadata/deletionTimestamp"))) {
    // The garbage collector removes the owned objects.
    return op::ReconcileResult::done();
  }
  const int64_t generation = table->value(json::json_pointer("/metadata/generation"), int64_t{0});
  const json previous = table->value(json::json_pointer("/status/conditions"), json::array());
  const std::string now = rfc3339(options_.wall_clock());

  std::optional<SpecError> invalid = checkReplicatedTableName(key.name);
  auto spec = ReplicatedTableSpec::parse(table->value("spec", json::object()));
  if (!invalid && !spec) invalid = spec.error();
  if (invalid) {
    json conditions = json::array();
    setCondition(conditions, previous, "Ready", false, "InvalidSpec", invalid->toString(), generation, now);
    json status = {{"observedGeneration", generation}, {"conditions", conditions}};
    if (auto patched = patchStatus(*table, status); !patched) return patched;
    // Nothing to retry until the spec changes (which enqueues the key again).
    return std::unexpected(op::ReconcileError::terminalError("invalid spec: " + invalid->toString()));
  }

  TableObjectsContext context;
  context.name = key.name;
  context.ns = key.ns;
  context.owner_uid = table->value(json::json_pointer("/metadata/uid"), "");
  context.image = options_.image;
  auto existing_secret = client_.get(op::resources::secrets(), {key.ns, key.name + "-interserver"});
  if (!existing_secret && existing_secret.error().kind != op::KubeErrorKind::kNotFound) {
    return std::unexpected(op::ReconcileError::retryable("reading the interserver secret: " +
                                                         existing_secret.error().toString()));
  }
  const std::string kept =
      existing_secret ? existing_secret->value(json::json_pointer(std::string("/data/") + kSecretKey), "") : "";
  if (kept.empty()) context.interserver_secret = options_.generate_secret();
  TableObjects objects = renderTableObjects(*spec, context);
  if (!kept.empty()) {
    // The same value, as the server stores it: applying it again changes nothing.
    objects.secret["data"] = {{kSecretKey, kept}};
  }

  const std::pair<op::ResourceType, const json*> owned[] = {
      {op::resources::configMaps(), &objects.config_map},
      {op::resources::secrets(), &objects.secret},
      {op::resources::services(), &objects.headless_service},
      {op::resources::services(), &objects.client_service},
      {op::resources::statefulSets(), &objects.stateful_set},
      {op::resources::podDisruptionBudgets(), &objects.pod_disruption_budget}};
  op::PatchOptions apply;
  apply.field_manager = options_.field_manager;
  apply.force = true;  // the operator owns these fields: a hand edit is reverted
  json stateful_set;
  for (const auto& [type, object] : owned) {
    const std::string name = (*object)["metadata"]["name"];
    auto applied = client_.patch(type, {key.ns, name}, op::PatchType::kApply, *object, apply);
    if (!applied) {
      const std::string message = fmt::format("applying {} {}: {}", type.kind, name, applied.error().toString());
      json conditions = json::array();
      setCondition(conditions, previous, "Ready", false, "ApplyFailed", message, generation, now);
      (void)patchStatus(*table, {{"observedGeneration", generation}, {"conditions", conditions}});
      return std::unexpected(op::ReconcileError::retryable(message));
    }
    if (type == op::resources::statefulSets()) stateful_set = std::move(*applied);
  }

  const int64_t desired = spec->replicas;
  const int64_t ready = stateful_set.value(json::json_pointer("/status/readyReplicas"), int64_t{0});
  const bool all_ready = ready >= desired;
  json conditions = json::array();
  setCondition(conditions, previous, "Ready", all_ready, all_ready ? "AllReplicasReady" : "ReplicasNotReady",
               fmt::format("{}/{} replicas ready", ready, desired), generation, now);
  // Degraded: some replicas are up but not all (a table with none up is simply not Ready).
  const bool degraded = ready > 0 && ready < desired;
  setCondition(conditions, previous, "Degraded", degraded, degraded ? "ReplicasUnavailable" : "AsExpected",
               degraded ? fmt::format("{} of {} replicas are not ready", desired - ready, desired) : "",
               generation, now);
  std::string selector;
  const json selector_labels = tableSelector(key.name);
  for (const auto& [label, value] : selector_labels.items()) {
    selector += (selector.empty() ? "" : ",") + label + "=" + value.get<std::string>();
  }
  json status = {{"observedGeneration", generation},
                 {"replicas", stateful_set.value(json::json_pointer("/status/replicas"), int64_t{0})},
                 {"readyReplicas", ready},
                 {"ready", fmt::format("{}/{}", ready, desired)},
                 {"selector", selector},
                 {"conditions", conditions}};
  if (auto patched = patchStatus(*table, status); !patched) return patched;
  // Readiness changes on the StatefulSet enqueue the table again (it owns the StatefulSet).
  return op::ReconcileResult::done();
}

op::ReconcileOutcome ReplicatedTableReconciler::patchStatus(const json& table, json status) {
  if (table.contains("status") && table["status"].is_object()) {
    // Fields the reconciler does not manage here (filled in by later parts) stay as they are.
    json merged = table["status"];
    merged.update(status);
    if (merged == table["status"]) return op::ReconcileResult::done();
  }
  op::PatchOptions options;
  options.subresource = "status";
  auto patched = client_.patch(replicatedTables(),
                               {table.value(json::json_pointer("/metadata/namespace"), ""),
                                table.value(json::json_pointer("/metadata/name"), "")},
                               op::PatchType::kMerge, json{{"status", status}}, options);
  if (!patched) {
    return std::unexpected(op::ReconcileError::retryable("patching the status: " + patched.error().toString()));
  }
  return op::ReconcileResult::done();
}

}  // namespace rtable::controllers
