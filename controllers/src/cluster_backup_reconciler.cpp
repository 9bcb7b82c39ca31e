#include "rtable/controllers/cluster_backup_reconciler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "finalizers.h"
#include "rtable/backup/backup_deletion.h"
#include "rtable/common/rfc3339.h"
#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/core_config.h"
#include "rtable/controllers/replicated_table_reconciler.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/operator/controller.h"
#include "rtable/operator/event_handlers.h"
#include "rtable/operator/informer.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::controllers {
namespace {

using backup::BackupProgress;
using nlohmann::json;

std::string textAt(const json& object, const char* pointer) {
  const json value = object.value(json::json_pointer(pointer), json());
  return value.is_string() ? value.get<std::string>() : "";
}

// The CRD's names of the stages (status.hosts[].stage).
std::string stageName(std::string_view stage) {
  if (stage.starts_with(backup::stage::kGatheringMetadata)) return "GatheringMetadata";
  if (stage == backup::stage::kExtractingData) return "ExtractingData";
  if (stage == backup::stage::kBuildingFileInfos) return "BuildingFileInfos";
  if (stage == backup::stage::kWritingBackup) return "WritingBackup";
  if (stage == backup::stage::kCompleted) return "Completed";
  return "";
}

// A condition list of one: the phase's condition, its lastTransitionTime kept while its type and
// status stay (as metav1.Condition wants).
json conditionsFor(const json& object, const std::string& type, const std::string& reason,
                   const std::string& message, const std::string& now) {
  std::string since = now;
  const json current = object.value(json::json_pointer("/status/conditions"), json::array());
  if (current.is_array()) {
    for (const auto& condition : current) {
      if (condition.value("type", "") == type && condition.value("status", "") == "True") {
        since = condition.value("lastTransitionTime", now);
      }
    }
  }
  return json::array({{{"type", type},
                       {"status", "True"},
                       {"reason", reason},
                       {"message", message.substr(0, 32000)},
                       {"lastTransitionTime", since},
                       {"observedGeneration",
                        object.value(json::json_pointer("/metadata/generation"), int64_t{1})}}});
}

struct ResolvedTables {
  std::string connect;
  std::string zookeeper_root;
  std::vector<backup::BackupTableRef> tables;     // hosts and generation not yet filled in
  std::vector<core::ZooKeeperDigest> identities;  // of the tables that have one
};

// A session of the operator for a backup: timeouts as the replicas', the tables' identities.
core::ZooKeeperConfig sessionConfig(const std::string& connect,
                                    std::vector<core::ZooKeeperDigest> identities) {
  return core::ZooKeeperConfig{connect, std::chrono::seconds(30), std::chrono::seconds(5),
                               std::move(identities)};
}

}  // namespace

op::ResourceType clusterBackups() {
  return {"rtable.io", "v1alpha1", "clusterbackups", "ClusterBackup", true, true};
}

std::string backupNameFor(const op::ObjectKey& key) {
  return key.ns + "." + key.name;
}

backup::DestinationRef s3DestinationRef(const BackupDestination::S3& s3) {
  backup::DestinationRef destination;
  destination.kind = backup::DestinationRef::Kind::kS3;
  destination.endpoint = s3.endpoint;
  destination.bucket = s3.bucket;
  destination.prefix = s3.prefix;
  destination.region = s3.region;
  destination.credentials_secret = s3.credentials_secret;
  destination.access_key_id_key = s3.access_key_id_key;
  destination.secret_access_key_key = s3.secret_access_key_key;
  return destination;
}

backup::DestinationRef volumeDestinationRef(const BackupDestination::PersistentVolumeClaim& claim) {
  backup::DestinationRef destination;
  destination.kind = backup::DestinationRef::Kind::kVolume;
  destination.claim_name = claim.claim_name;
  destination.path = claim.sub_path;
  return destination;
}

namespace {

using Problem = std::pair<std::string, std::string>;

std::optional<Problem> claimProblem(op::KubeClient& client, const std::string& ns,
                                    const std::string& table, const ReplicatedTableSpec& spec,
                                    const backup::DestinationRef& destination) {
  const std::string& claim = destination.claim_name;
  auto object = client.get(op::resources::persistentVolumeClaims(), {ns, claim});
  if (!object && object.error().kind == op::KubeErrorKind::kNotFound) {
    return Problem{"ClaimNotFound",
                   fmt::format("the PersistentVolumeClaim {} of {} does not exist in namespace {}",
                               claim, destination.location(), ns)};
  }
  if (!object) {
    return Problem{"ClaimNotFound", fmt::format("reading the PersistentVolumeClaim {}: {}", claim,
                                                object.error().toString())};
  }
  const json modes = object->value(json::json_pointer("/spec/accessModes"), json::array());
  const bool shared = std::find(modes.begin(), modes.end(), "ReadWriteMany") != modes.end();
  if (!shared && spec.replicas > 1) {
    return Problem{"ClaimNotShared",
                   fmt::format("the PersistentVolumeClaim {} is not ReadWriteMany (access modes "
                               "{}): the {} replicas of table {} may run on several nodes and "
                               "must all write to it",
                               claim, modes.dump(), spec.replicas, table)};
  }
  const std::vector<std::string> mounted = spec.mountedVolumes();
  if (std::find(mounted.begin(), mounted.end(), claim) == mounted.end()) {
    return Problem{"ClaimNotMounted",
                   fmt::format("the replicas of table {} do not mount the PersistentVolumeClaim {} "
                               "of {}: add it to the table's spec.backupVolumes (its pods restart, "
                               "one at a time, to mount it)",
                               table, claim, destination.location())};
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::pair<std::string, std::string>> mountProblem(
    op::KubeClient& client, const std::string& ns, const std::string& table,
    const ReplicatedTableSpec& spec, const backup::DestinationRef& destination) {
  if (destination.kind == backup::DestinationRef::Kind::kVolume) {
    return claimProblem(client, ns, table, spec, destination);
  }
  if (destination.kind != backup::DestinationRef::Kind::kS3) return std::nullopt;
  const std::string& secret = destination.credentials_secret;
  auto object = client.get(op::resources::secrets(), {ns, secret});
  if (!object && object.error().kind == op::KubeErrorKind::kNotFound) {
    return Problem{"CredentialsNotFound",
                   fmt::format("the credentials Secret {} of {} does not exist in namespace {}",
                               secret, destination.location(), ns)};
  }
  if (!object) {
    return Problem{"CredentialsNotFound", fmt::format("reading the credentials Secret {}: {}",
                                                      secret, object.error().toString())};
  }
  for (const std::string& key :
       {destination.access_key_id_key, destination.secret_access_key_key}) {
    if (!object->contains(json::json_pointer("/data/" + key))) {
      return Problem{"CredentialsNotFound",
                     fmt::format("the credentials Secret {} has no key '{}'", secret, key)};
    }
  }
  const std::vector<std::string> mounted = spec.mountedCredentials();
  if (std::find(mounted.begin(), mounted.end(), secret) == mounted.end()) {
    return Problem{"CredentialsNotMounted",
                   fmt::format("the replicas of table {} do not mount the credentials Secret {} "
                               "of {}: add it to the table's spec.backupCredentials (its pods "
                               "restart, one at a time, to mount it)",
                               table, secret, destination.location())};
  }
  return std::nullopt;
}

backup::DestinationRef destinationOf(const ClusterBackupSpec& spec) {
  if (spec.destination.s3) return s3DestinationRef(*spec.destination.s3);
  if (spec.destination.persistent_volume_claim) {
    return volumeDestinationRef(*spec.destination.persistent_volume_claim);
  }
  backup::DestinationRef destination;
  destination.kind = backup::DestinationRef::Kind::kFilesystem;
  destination.path = spec.destination.filesystem->path;
  return destination;
}

ClusterBackupReconciler::ClusterBackupReconciler(op::KubeClient& client,
                                                 ClusterBackupReconcilerOptions options)
    : client_(client), options_(std::move(options)) {
  if (!options_.wall_clock) options_.wall_clock = [] { return std::chrono::system_clock::now(); };
  if (options_.registry) metrics_ = std::make_unique<BackupMetrics>(*options_.registry);
  if (!options_.new_session) {
    options_.new_session = [](const core::ZooKeeperConfig& config)
        -> core::KeeperResult<std::unique_ptr<core::Keeper>> {
      auto client = core::ZooKeeperClient::connect(config);
      if (!client) return std::unexpected(client.error());
      return std::unique_ptr<core::Keeper>(std::move(*client));
    };
  }
}

namespace {

// The schedule that made a backup ("" when made by hand), its tables (status.tables, else
// spec.table), and times in seconds since the epoch.
std::string scheduleOf(const json& object) {
  return textAt(object, "/metadata/labels/rtable.io~1backup-schedule");
}
std::vector<std::string> tablesOf(const json& object) {
  std::vector<std::string> tables;
  const json listed = object.value(json::json_pointer("/status/tables"), json::array());
  if (listed.is_array()) {
    for (const auto& table : listed) {
      if (table.is_string()) tables.push_back(table.get<std::string>());
    }
  }
  if (tables.empty()) {
    std::string table = textAt(object, "/spec/table");
    tables.push_back(table.empty() ? "(selector)" : table);
  }
  return tables;
}
double secondsOf(const std::string& rfc3339) {
  auto time = common::parseRfc3339(rfc3339);
  return time ? std::chrono::duration<double>(time->time_since_epoch()).count() : 0;
}

}  // namespace

void ClusterBackupReconciler::recordFailure(const json& object, const std::string& reason) {
  if (metrics_)
    metrics_->failed(textAt(object, "/metadata/namespace"), tablesOf(object), scheduleOf(object),
                     reason);
}

core::KeeperFactory ClusterBackupReconciler::factoryFor(core::ZooKeeperConfig config) const {
  auto new_session = options_.new_session;
  return [new_session, config = std::move(config)] { return new_session(config); };
}

void ClusterBackupReconciler::event(const json& object, op::EventType type, std::string_view reason,
                                    const std::string& message) {
  if (options_.events)
    options_.events->record(op::ObjectReference::of(object), type, reason, message);
}

op::ReconcileOutcome ClusterBackupReconciler::patchStatus(const op::ObjectKey& key,
                                                          const json& object, json status) {
  status["observedGeneration"] =
      object.value(json::json_pointer("/metadata/generation"), int64_t{1});
  json merged = object.value("status", json::object());
  if (!merged.is_object()) merged = json::object();
  merged.update(status);
  if (merged == object.value("status", json::object())) return op::ReconcileResult::done();
  op::PatchOptions options;
  options.subresource = "status";
  options.field_manager = options_.field_manager;
  auto patched = client_.patch(clusterBackups(), key, op::PatchType::kMerge,
                               json{{"status", status}}, options);
  if (!patched) {
    return std::unexpected(
        op::ReconcileError::retryable("patching the status: " + patched.error().toString()));
  }
  return op::ReconcileResult::done();
}

op::ReconcileOutcome ClusterBackupReconciler::reconcile(const op::ObjectKey& key) {
  auto object = client_.get(clusterBackups(), key);
  if (!object) {
    if (object.error().kind != op::KubeErrorKind::kNotFound) {
      return std::unexpected(op::ReconcileError::retryable(object.error().toString()));
    }
    // Deleted: a run of it stops (failed), and its nodes and locks go.
    stopRunning(key, "the ClusterBackup was deleted");
    return op::ReconcileResult::done();
  }
  if (object->contains(json::json_pointer("/metadata/deletionTimestamp"))) {
    return finalize(key, *object);
  }
  // A backup whose data goes with it carries the finalizer before it writes anything.
  if (auto parsed = ClusterBackupSpec::parse(object->value("spec", json::object()));
      parsed && parsed->deletion_policy == DeletionPolicy::kDelete &&
      !detail::hasFinalizer(*object, kBackupDataFinalizer)) {
    auto patched = client_.patch(clusterBackups(), key, op::PatchType::kJson,
                                 detail::addFinalizerPatch(*object, kBackupDataFinalizer));
    if (!patched) {
      return std::unexpected(
          op::ReconcileError::retryable("adding the finalizer: " + patched.error().toString()));
    }
    *object = std::move(*patched);
  }
  const std::string uid = textAt(*object, "/metadata/uid");
  const std::string phase = textAt(*object, "/status/phase");
  std::shared_ptr<Running> running;
  {
    std::lock_guard lock(mu_);
    auto it = running_.find(uid);
    if (it != running_.end()) running = it->second;
  }
  if (phase == "Completed" && metrics_) {
    const json status = object->value("status", json::object());
    BackupMetrics::Completed completed;
    completed.started_seconds = secondsOf(status.value("startedAt", ""));
    completed.completed_seconds = secondsOf(status.value("completedAt", ""));
    completed.bytes_written = status.value("bytesWritten", 0.0);
    completed.bytes_reused = status.value("bytesReused", 0.0);
    metrics_->observeCompleted(key.ns, tablesOf(*object), scheduleOf(*object), completed);
  }
  if (phase == "Completed" || phase == "Failed") {
    if (running) {
      // The status was patched, the clean-up not yet done (or it failed): again.
      if (auto cleaned = running->initiator->cleanUp(); !cleaned) {
        return std::unexpected(op::ReconcileError::retryable(cleaned.error().toString()));
      }
      std::lock_guard lock(mu_);
      running_.erase(uid);
    }
    return op::ReconcileResult::done();
  }
  if (running) return follow(key, *object, *running);
  return start(key, *object);
}

void ClusterBackupReconciler::stopRunning(const op::ObjectKey& key, const std::string& why) {
  std::shared_ptr<Running> gone;
  {
    std::lock_guard lock(mu_);
    for (auto it = running_.begin(); it != running_.end(); ++it) {
      if (it->second->key == key) {
        gone = it->second;
        running_.erase(it);
        break;
      }
    }
  }
  if (gone) {
    gone->initiator->fail(why);
    (void)gone->initiator->cleanUp();
  }
}

op::ReconcileOutcome ClusterBackupReconciler::removeFinalizer(const op::ObjectKey& key,
                                                              const json& object) {
  auto patched = client_.patch(clusterBackups(), key, op::PatchType::kJson,
                               detail::removeFinalizerPatch(object, kBackupDataFinalizer));
  if (!patched && patched.error().kind != op::KubeErrorKind::kNotFound) {
    return std::unexpected(
        op::ReconcileError::retryable("removing the finalizer: " + patched.error().toString()));
  }
  return op::ReconcileResult::done();
}

op::ReconcileOutcome ClusterBackupReconciler::finalize(const op::ObjectKey& key,
                                                       const json& object) {
  stopRunning(key, "the ClusterBackup was deleted");
  if (!detail::hasFinalizer(object, kBackupDataFinalizer)) return op::ReconcileResult::done();
  auto spec = ClusterBackupSpec::parse(object.value("spec", json::object()));
  const std::string phase = textAt(object, "/status/phase");
  if (!spec || spec->deletion_policy == DeletionPolicy::kRetain) {
    return removeFinalizer(key, object);
  }
  // Never started: nothing was written.
  if (textAt(object, "/status/operation").empty()) return removeFinalizer(key, object);
  const backup::DestinationRef destination = destinationOf(*spec);
  const std::string location = destination.location();
  auto retained = [&](const std::string& why) {
    event(object, op::EventType::kWarning, "DataRetained",
          fmt::format("the data of backup {} stays in {}: {}", backupNameFor(key), location, why));
    return removeFinalizer(key, object);
  };

  // A replica of its first table that is not being deleted (its replicas are going) deletes: it
  // can open the destination. The request goes into that table's tree, under its identity.
  std::string connect;
  std::string zookeeper_root;
  std::vector<std::string> table_roots;
  std::vector<std::string> names;
  std::optional<core::ZooKeeperDigest> identity;  // the first table's: the request is in its tree
  for (const auto& item : object.value(json::json_pointer("/status/tables"), json::array())) {
    if (!item.is_string()) continue;
    const std::string name = item.get<std::string>();
    auto table = client_.get(replicatedTables(), {key.ns, name});
    if (!table && table.error().kind != op::KubeErrorKind::kNotFound) {
      return std::unexpected(op::ReconcileError::retryable(table.error().toString()));
    }
    if (!table || table->contains(json::json_pointer("/metadata/deletionTimestamp"))) continue;
    auto table_spec = ReplicatedTableSpec::parse(table->value("spec", json::object()));
    if (!table_spec) continue;
    if (connect.empty()) {
      connect = table_spec->zookeeper.connect;
      zookeeper_root = table_spec->zookeeper.root;
    } else if (table_spec->zookeeper.connect != connect ||
               table_spec->zookeeper.root != zookeeper_root) {
      continue;
    }
    if (table_roots.empty()) {
      auto read = readTableIdentity(client_, key.ns, name, *table_spec);
      if (!read) return std::unexpected(op::ReconcileError::retryable(read.error()));
      identity = *read;
    }
    table_roots.push_back(table_spec->zookeeper.root + "/" + tableUid(key.ns, name));
    names.push_back(name);
  }
  if (table_roots.empty()) {
    return retained(fmt::format(
        "no table of it is left to delete it (only their replicas can open the destination); "
        "remove backups/{}/ there by hand (the next deletion there then removes its data files)",
        backupNameFor(key)));
  }
  std::vector<core::ZooKeeperDigest> identities;
  if (identity) identities.push_back(*identity);
  auto session = options_.new_session(sessionConfig(connect, std::move(identities)));
  if (!session) {
    return std::unexpected(op::ReconcileError::retryable(
        "ZooKeeper " + connect + " cannot be reached: " + session.error().toString()));
  }
  core::Keeper& keeper = **session;
  const std::string backups_root = backup::BackupPaths::rootFor(zookeeper_root);
  const std::string uid = textAt(object, "/metadata/uid");
  const std::string path = backup::deletionRequestPath(table_roots.front(), uid);
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             options_.wall_clock().time_since_epoch())
                             .count();
  auto node = keeper.get(path);
  if (!node && node.error().code == core::KeeperCode::kNoNode) {
    backup::DeletionRequest request;
    request.backup = backupNameFor(key);
    request.destination = destination;
    request.table_roots = table_roots;
    request.requested_ms = now_ms;
    core::KeeperStatus made =
        core::createAncestorsAndSelf(keeper, backup::deletionsPath(table_roots.front()));
    if (made) {
      auto created = keeper.create(path, request.format(), core::CreateMode::kPersistent);
      if (!created && created.error().code != core::KeeperCode::kNodeExists) {
        made = std::unexpected(created.error());
      }
    }
    if (!made) return std::unexpected(op::ReconcileError::retryable(made.error().toString()));
    event(object, op::EventType::kNormal, "DeletingData",
          fmt::format("removing backup {} from {} (a replica of {} does it)", request.backup,
                      location, names.front()));
    return op::ReconcileResult::after(options_.busy_retry);
  }
  if (!node) return std::unexpected(op::ReconcileError::retryable(node.error().toString()));
  auto request = backup::DeletionRequest::parse(node->data);
  if (request && request->state == backup::DeletionRequest::State::kPending &&
      now_ms - request->requested_ms < options_.deletion_give_up.count()) {
    return op::ReconcileResult::after(options_.busy_retry);
  }
  if (!request) {
    event(object, op::EventType::kWarning, "DataRetained",
          fmt::format("the deletion request {} is unreadable ({}); the data stays in {}", path,
                      request.error(), location));
  } else if (request->state == backup::DeletionRequest::State::kDone) {
    event(object, op::EventType::kNormal, "DataDeleted",
          fmt::format("{} (by {})", request->message, request->deleter));
  } else if (request->state == backup::DeletionRequest::State::kFailed) {
    event(object, op::EventType::kWarning, "DataRetained",
          fmt::format("removing backup {} from {} failed: {}; the data stays", request->backup,
                      location, request->message));
  } else {
    event(object, op::EventType::kWarning, "DataRetained",
          fmt::format("no replica of {} removed backup {} from {} within {} s; the data stays",
                      names.front(), request->backup, location,
                      options_.deletion_give_up.count() / 1000));
  }
  // With the request, one an earlier version left where requests lay before (open to all).
  for (const auto& done : {path, backup::legacyDeletionRequestPath(backups_root, uid)}) {
    if (auto removed = keeper.remove(done);
        !removed && removed.error().code != core::KeeperCode::kNoNode) {
      return std::unexpected(op::ReconcileError::retryable(removed.error().toString()));
    }
  }
  return removeFinalizer(key, object);
}

op::ReconcileOutcome ClusterBackupReconciler::start(const op::ObjectKey& key, const json& object) {
  const std::string now = common::formatRfc3339(options_.wall_clock());
  const std::string phase = textAt(object, "/status/phase");
  auto fail = [&](const std::string& reason, const std::string& message) -> op::ReconcileOutcome {
    event(object, op::EventType::kWarning, "Failed", message);
    recordFailure(object, reason);
    json status = {{"phase", "Failed"},
                   {"error", message},
                   {"completedAt", now},
                   {"conditions", conditionsFor(object, "Failed", reason, message, now)}};
    return patchStatus(key, object, std::move(status));
  };
  auto wait = [&](const std::string& reason, const std::string& message) -> op::ReconcileOutcome {
    if (textAt(object, "/status/conditions/0/message") != message) {
      event(object, op::EventType::kNormal, "Waiting", message);
    }
    json status = {{"phase", "Pending"},
                   {"conditions", conditionsFor(object, "Waiting", reason, message, now)}};
    auto patched = patchStatus(key, object, std::move(status));
    if (!patched) return patched;
    return op::ReconcileResult::after(options_.busy_retry);
  };

  auto spec = ClusterBackupSpec::parse(object.value("spec", json::object()));
  if (!spec) {
    auto failed = fail("InvalidSpec", spec.error().toString());
    if (!failed) return failed;
    return std::unexpected(op::ReconcileError::terminalError(spec.error().toString()));
  }
  const backup::DestinationRef destination = destinationOf(*spec);

  // The tables, by name or by selector, in this namespace.
  std::vector<json> tables;
  if (spec->table) {
    auto table = client_.get(replicatedTables(), {key.ns, *spec->table});
    if (!table && table.error().kind == op::KubeErrorKind::kNotFound) {
      return wait("TableNotFound",
                  fmt::format("ReplicatedTable {} does not exist (yet)", *spec->table));
    }
    if (!table) return std::unexpected(op::ReconcileError::retryable(table.error().toString()));
    tables.push_back(std::move(*table));
  } else {
    op::ListOptions list_options;
    list_options.label_selector = spec->selector->toSelectorString();
    auto listed = client_.listAll(replicatedTables(), key.ns, list_options);
    if (!listed) return std::unexpected(op::ReconcileError::retryable(listed.error().toString()));
    tables = std::move(listed->items);
    if (tables.empty()) {
      return wait("TableNotFound", fmt::format("no ReplicatedTable matches the selector '{}'",
                                               list_options.label_selector));
    }
  }
  std::sort(tables.begin(), tables.end(), [](const json& a, const json& b) {
    return textAt(a, "/metadata/name") < textAt(b, "/metadata/name");
  });

  ResolvedTables resolved;
  for (const auto& table : tables) {
    const std::string name = textAt(table, "/metadata/name");
    auto table_spec = ReplicatedTableSpec::parse(table.value("spec", json::object()));
    if (!table_spec) {
      return fail("InvalidTable",
                  fmt::format("ReplicatedTable {}: {}", name, table_spec.error().toString()));
    }
    if (resolved.connect.empty()) {
      resolved.connect = table_spec->zookeeper.connect;
      resolved.zookeeper_root = table_spec->zookeeper.root;
    } else if (resolved.connect != table_spec->zookeeper.connect ||
               resolved.zookeeper_root != table_spec->zookeeper.root) {
      return fail("InvalidTable",
                  fmt::format("the tables use different ZooKeepers ({} and {}): one ClusterBackup "
                              "per ZooKeeper",
                              resolved.connect, table_spec->zookeeper.connect));
    }
    if (auto problem = mountProblem(client_, key.ns, name, *table_spec, destination)) {
      return wait(problem->first, problem->second);
    }
    backup::BackupTableRef ref;
    ref.table = name;
    ref.table_root = table_spec->zookeeper.root + "/" + tableUid(key.ns, name);
    resolved.tables.push_back(std::move(ref));
    // The table's nodes refuse every session without its identity.
    auto identity = readTableIdentity(client_, key.ns, name, *table_spec);
    if (!identity) return wait("ZooKeeperCredentialsUnavailable", identity.error());
    if (*identity) resolved.identities.push_back(**identity);
  }

  auto session = options_.new_session(sessionConfig(resolved.connect, resolved.identities));
  if (!session) {
    return wait("ZooKeeperUnreachable", "ZooKeeper " + resolved.connect +
                                            " cannot be reached: " + session.error().toString());
  }
  core::Keeper& keeper = **session;
  for (auto& table : resolved.tables) {
    auto active = core::readActiveGeneration(keeper, table.table_root);
    if (!active) return wait("ZooKeeperUnreachable", active.error().toString());
    if (!*active) {
      return wait("TableNotReady",
                  fmt::format("table {} has no tree in ZooKeeper yet", table.table));
    }
    table.generation = **active;
    core::TablePaths paths{table.table_root, table.generation, ""};
    auto replicas = keeper.children(paths.replicas());
    if (!replicas) return wait("ZooKeeperUnreachable", replicas.error().toString());
    std::vector<std::string> names = replicas->names;
    std::sort(names.begin(), names.end());
    for (const auto& replica : names) {
      core::TablePaths replica_paths{table.table_root, table.generation, replica};
      auto active_node = keeper.exists(replica_paths.isActive());
      if (!active_node) return wait("ZooKeeperUnreachable", active_node.error().toString());
      if (*active_node) table.hosts.push_back(replica);
    }
    if (table.hosts.empty()) {
      return wait("TableNotReady", fmt::format("table {} has no live replica", table.table));
    }
  }

  backup::BackupOperation operation;
  operation.uid = textAt(object, "/metadata/uid");
  operation.name = backupNameFor(key);
  operation.started_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             options_.wall_clock().time_since_epoch())
                             .count();
  operation.tables = resolved.tables;
  operation.destination = destination;
  backup::BackupPaths paths{backup::BackupPaths::rootFor(resolved.zookeeper_root), operation.uid};
  // The operation's nodes are changed by its tables' identities only (docs/security.md); a
  // table not given one yet (made before ACLs, its Secret not written yet) reads and writes them
  // as before: open.
  core::ZooKeeperConfig initiator_session = sessionConfig(resolved.connect, resolved.identities);
  if (resolved.identities.size() == resolved.tables.size()) {
    core::SharedSubtree shared{paths.operation(), {}};
    for (const auto& identity : resolved.identities) {
      for (auto& id : core::digestAclIds(identity)) shared.ids.push_back(std::move(id));
    }
    initiator_session.shared_subtrees.push_back(std::move(shared));
  }

  auto running = std::make_shared<Running>();
  running->key = key;
  // The hosts' moves requeue this object: the initiator's part in each barrier follows within
  // milliseconds instead of the next poll (five barriers per backup).
  auto follow_moves = [&](backup::BackupInitiator& initiator) {
    if (options_.wake) initiator.onChange([wake = options_.wake, key] { wake(key); });
  };
  if (phase == "Running") {
    // Started by an earlier operator process: rejoin it as it was written.
    auto node = keeper.get(paths.operation());
    if (!node && node.error().code == core::KeeperCode::kNoNode) {
      return fail("Lost",
                  "the operation's state in ZooKeeper is gone (the operator restarted after it "
                  "ended, or someone removed it); start a new ClusterBackup");
    }
    if (!node) return std::unexpected(op::ReconcileError::retryable(node.error().toString()));
    auto written = backup::BackupOperation::parse(node->data);
    if (!written)
      return fail("Lost", "the operation in ZooKeeper is unreadable: " + written.error());
    running->initiator = std::make_unique<backup::BackupInitiator>(factoryFor(initiator_session),
                                                                   paths, *written, options_.sync);
    follow_moves(*running->initiator);
    if (auto resumed = running->initiator->resume(); !resumed) {
      return std::unexpected(op::ReconcileError::retryable(resumed.error().toString()));
    }
  } else {
    running->initiator = std::make_unique<backup::BackupInitiator>(factoryFor(initiator_session),
                                                                   paths, operation, options_.sync);
    follow_moves(*running->initiator);
    auto started = running->initiator->start();
    if (!started && started.error().kind == backup::StartRefusal::Kind::kBusy) {
      return wait("Busy", started.error().message);
    }
    if (!started) return std::unexpected(op::ReconcileError::retryable(started.error().message));
    std::vector<std::string> names;
    for (const auto& table : operation.tables) names.push_back(table.table);
    event(object, op::EventType::kNormal, "Started",
          fmt::format("backing up {} to {} ({} replicas)", fmt::join(names, ", "),
                      destination.location(), operation.hosts().size()));
    json status = {{"phase", "Running"},         {"tables", names},
                   {"operation", operation.uid}, {"location", destination.location()},
                   {"startedAt", now},           {"conditions", json::array()}};
    if (auto patched = patchStatus(key, object, std::move(status)); !patched) {
      // The status will say Running at the next pass; the initiator runs meanwhile.
      std::lock_guard lock(mu_);
      running_[operation.uid] = running;
      return patched;
    }
  }
  {
    std::lock_guard lock(mu_);
    running_[running->initiator->operation().uid] = running;
  }
  return op::ReconcileResult::after(options_.poll_period);
}

op::ReconcileOutcome ClusterBackupReconciler::follow(const op::ObjectKey& key, const json& object,
                                                     Running& running) {
  const std::string now = common::formatRfc3339(options_.wall_clock());
  auto progress = running.initiator->poll();
  if (!progress) return std::unexpected(op::ReconcileError::retryable(progress.error().toString()));
  const auto& operation = running.initiator->operation();
  json hosts = json::array();
  for (const auto& [host, state] : progress->hosts) {
    const backup::BackupTableRef* table = operation.tableOf(host);
    json entry = {{"name", host},
                  {"table", table ? table->table : ""},
                  {"files", state.stats.files_written},
                  {"bytesWritten", state.stats.bytes_written}};
    std::string stage = stageName(state.stage);
    if (progress->phase == BackupProgress::Phase::kFailed && progress->error &&
        progress->error->host == host) {
      stage = "Failed";
      entry["message"] = progress->error->message;
    }
    if (!stage.empty()) entry["stage"] = stage;
    hosts.push_back(std::move(entry));
  }
  json status = {{"hosts", hosts},
                 {"bytesWritten", progress->totals.bytes_written},
                 {"bytesReused", progress->totals.bytes_reused}};
  if (progress->phase == BackupProgress::Phase::kRunning) {
    status["phase"] = "Running";
    auto patched = patchStatus(key, object, std::move(status));
    if (!patched) return patched;
    return op::ReconcileResult::after(options_.poll_period);
  }
  if (progress->phase == BackupProgress::Phase::kCompleted) {
    status["phase"] = "Completed";
    status["completedAt"] = now;
    json contents = json::array();
    std::string message = "the manifest was written";
    if (progress->summary) {
      for (const auto& table : progress->summary->tables) {
        contents.push_back({{"table", table.table},
                            {"generation", table.generation},
                            {"parts", table.parts},
                            {"rows", table.rows}});
      }
      status["files"] = progress->summary->data_files;
      status["bytesDeduplicated"] =
          progress->summary->logical_bytes -
          std::min(progress->summary->logical_bytes, progress->summary->data_bytes);
      status["manifest"] = progress->summary->manifest;
      message = fmt::format("{} data files, {} bytes written, {} bytes reused from earlier backups",
                            progress->summary->data_files, progress->totals.bytes_written,
                            progress->totals.bytes_reused);
    }
    status["contents"] = contents;
    status["conditions"] = conditionsFor(object, "Completed", "Completed", message, now);
    event(object, op::EventType::kNormal, "Completed", message);
  } else {
    const backup::BackupError error = progress->error.value_or(backup::BackupError{});
    status["phase"] = "Failed";
    status["completedAt"] = now;
    status["error"] = error.toString();
    status["conditions"] = conditionsFor(object, "Failed", error.reason, error.toString(), now);
    event(object, op::EventType::kWarning, "Failed", error.toString());
    recordFailure(object, error.reason);
  }
  auto patched = patchStatus(key, object, std::move(status));
  if (!patched) return patched;
  if (auto cleaned = running.initiator->cleanUp(); !cleaned) {
    return std::unexpected(op::ReconcileError::retryable(cleaned.error().toString()));
  }
  std::lock_guard lock(mu_);
  running_.erase(operation.uid);
  return op::ReconcileResult::done();
}

std::expected<void, std::string> addClusterBackupController(
    op::OperatorProcess& process, ClusterBackupControllerOptions options) {
  if (options.workers < 1) {
    return std::unexpected("the ClusterBackup controller needs at least one worker");
  }
  if (!options.reconciler.events) options.reconciler.events = &process.eventRecorder();
  if (!options.reconciler.registry) options.reconciler.registry = &process.registry();
  // The controller is made after the reconciler: the wake-up finds its queue through this slot.
  auto controller_slot = std::make_shared<std::weak_ptr<op::Controller>>();
  if (!options.reconciler.wake) {
    options.reconciler.wake = [controller_slot](const op::ObjectKey& key) {
      if (auto controller = controller_slot->lock()) controller->queue().add(key.toString());
    };
  }
  auto reconciler = std::make_shared<ClusterBackupReconciler>(process.client(), options.reconciler);
  op::ControllerOptions controller_options;
  controller_options.name = "clusterbackup";
  controller_options.max_concurrent_reconciles = options.workers;
  controller_options.registry = &process.registry();
  auto controller = std::make_shared<op::Controller>(
      std::move(controller_options),
      [reconciler](const op::ObjectKey& key) { return reconciler->reconcile(key); });
  op::InformerOptions informer_options;
  informer_options.type = clusterBackups();
  informer_options.ns = options.watch_namespace;
  auto backups = std::make_shared<op::Informer>(process.client(), informer_options);
  *controller_slot = controller;
  backups->addHandlers(op::enqueueObject(controller->queue()));
  process.addInformer(*backups);
  process.addController(*controller);
  process.adopt(reconciler);
  process.adopt(backups);
  process.adopt(controller);
  return {};
}

}  // namespace rtable::controllers
