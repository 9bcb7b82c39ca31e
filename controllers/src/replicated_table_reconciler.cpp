#include "rtable/controllers/replicated_table_reconciler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "finalizers.h"
#include "rtable/backup/restore.h"
#include "rtable/common/base64.h"
#include "rtable/common/rfc3339.h"
#include "rtable/common/tls.h"
#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/cluster_backup_reconciler.h"
#include "rtable/controllers/core_config.h"
#include "rtable/controllers/replicated_table_objects.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/controllers/replicated_table_status.h"
#include "rtable/replication_core/log_entry.h"
#include "rtable/replication_core/replication_log.h"
#include "rtable/replication_core/sequential_counter.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/table_spec.h"
#include "rtable/replication_core/table_swap.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;

std::expected<std::string, std::string> randomSecret() {
  // 32 bytes from the kernel's CSPRNG (getrandom: no file to open, blocks only until the pool is
  // first seeded), hex: a shared secret between the table's replicas. A short or failed read must
  // not become a secret of zeros.
  unsigned char bytes[32] = {};
  std::size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::unexpected(fmt::format("getrandom: {}", std::strerror(errno)));
    got += static_cast<std::size_t>(n);
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

// One of this reconcile's conditions; stampConditions() adds the generation and the time.
Condition condition(std::string type, bool status, std::string reason, std::string message) {
  Condition c;
  c.type = std::move(type);
  c.status = conditionStatusOf(status);
  c.reason = std::move(reason);
  c.message = std::move(message);
  return c;
}

// The conditions in the table's status; one that cannot be read (a hand edit) is left out, so its
// type starts a new lastTransitionTime.
std::vector<Condition> currentConditions(const json& table) {
  std::vector<Condition> conditions;
  const json list = table.value(json::json_pointer("/status/conditions"), json::array());
  if (!list.is_array()) return conditions;
  for (const auto& item : list) {
    if (auto condition = Condition::parse(item)) conditions.push_back(std::move(*condition));
  }
  return conditions;
}

// "k=v,k=v" of the table's pod labels.
std::string selectorText(const std::string& name) {
  std::string selector;
  const json labels = tableSelector(name);  // a range-for over a temporary's items() dangles
  for (const auto& [label, value] : labels.items()) {
    selector += (selector.empty() ? "" : ",") + label + "=" + value.get<std::string>();
  }
  return selector;
}

// <zookeeper.root>/<namespace>.<name>: every generation of the table lives under it.
std::string tableRoot(const ReplicatedTableSpec& spec, const op::ObjectKey& key) {
  return spec.zookeeper.root + "/" + tableUid(key.ns, key.name);
}

bool hasFinalizer(const json& table) {
  return detail::hasFinalizer(table, kZooKeeperFinalizer);
}

// The metadata text rtable-core writes for this spec, from the same TableSpec the replicas' config
// is written from, so operator and replicas cannot disagree (a mismatch would stop the replicas
// from joining).
std::string coreMetadataText(const ReplicatedTableSpec& spec, const op::ObjectKey& key) {
  CoreConfigContext context;
  context.name = key.name;
  context.ns = key.ns;
  return coreTableSpec(spec, context).metadataText();
}

// The rtable.io/swap annotation's value follows this in a manual swap's trigger.
constexpr std::string_view kManualTrigger = "manual: ";

// status.recovery of a swap just begun (or first seen in its plan): the annotation values spent so
// far kept, with the one this swap answers; nothing else of the last swap.
RecoveryStatus begunRecovery(const RecoveryStatus& last, const core::SwapPlan& plan,
                             const std::string& now) {
  RecoveryStatus recovery;
  recovery.last_abort_request = last.last_abort_request;
  recovery.last_manual_trigger = last.last_manual_trigger;
  recovery.from_generation = plan.from;
  recovery.to_generation = plan.to;
  recovery.started_at = now;
  if (!plan.trigger.empty()) recovery.trigger = plan.trigger;
  if (plan.trigger.starts_with(kManualTrigger)) {
    recovery.last_manual_trigger = plan.trigger.substr(kManualTrigger.size());
  }
  return recovery;
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
  growth_ = std::make_unique<CounterGrowth>(options_.growth_window, options_.growth_min_span);
  if (options_.registry) metrics_ = std::make_unique<TableMetrics>(*options_.registry);
}

void ReplicatedTableReconciler::forgetTable(const op::ObjectKey& key) {
  growth_->forget(key.ns + "/" + key.name + "/");
  if (metrics_) metrics_->forget(key.ns, key.name);
  std::lock_guard lock(identities_mu_);
  identities_.erase(key.ns + "/" + key.name);
  without_policy_.erase(key.ns + "/" + key.name);
}

std::expected<std::optional<core::ZooKeeperDigest>, std::string> readTableIdentity(
    op::KubeClient& client, const std::string& ns, const std::string& name,
    const ReplicatedTableSpec& spec, std::string* version) {
  const std::string secret_name = spec.zookeeperCredentialsSecret(name);
  auto secret = client.get(op::resources::secrets(), {ns, secret_name});
  if (!secret) {
    if (secret.error().kind == op::KubeErrorKind::kNotFound) return std::nullopt;
    return std::unexpected(
        fmt::format("reading the Secret {}: {}", secret_name, secret.error().toString()));
  }
  std::string fields[2];
  const char* keys[2] = {"username", "password"};
  for (int i = 0; i < 2; ++i) {
    auto decoded = common::base64Decode(
        secret->value(json::json_pointer(std::string("/data/") + keys[i]), ""));
    if (!decoded) {
      return std::unexpected(
          fmt::format("Secret {}: key {}: {}", secret_name, keys[i], decoded.error()));
    }
    fields[i] = std::move(*decoded);
  }
  if (fields[0].empty() || fields[1].empty() || fields[0].find(':') != std::string::npos) {
    return std::unexpected(fmt::format(
        "the Secret {} needs the keys username (without ':') and password, both non-empty",
        secret_name));
  }
  // During a rotation the Secret also holds the password the table's nodes carry until every
  // replica has the new one (docs/security.md).
  if (version) *version = secret->value(json::json_pointer("/metadata/resourceVersion"), "");
  auto previous = common::base64Decode(
      secret->value(json::json_pointer(std::string("/data/") + kZooKeeperPreviousPasswordKey), ""));
  if (!previous) {
    return std::unexpected(fmt::format("Secret {}: key {}: {}", secret_name,
                                       kZooKeeperPreviousPasswordKey, previous.error()));
  }
  return core::ZooKeeperDigest{fields[0], fields[1], tableRoot(spec, {ns, name}),
                               *previous == fields[1] ? std::string() : *previous};
}

std::expected<core::ZooKeeperDigest, ReplicatedTableReconciler::IdentityError>
ReplicatedTableReconciler::zookeeperIdentity(const op::ObjectKey& key,
                                             const ReplicatedTableSpec& spec, const json* table,
                                             std::string* version) {
  auto unavailable = [](std::string message) {
    return std::unexpected(IdentityError{"ZooKeeperCredentialsUnavailable", std::move(message)});
  };
  const std::string name = spec.zookeeperCredentialsSecret(key.name);
  auto read = readTableIdentity(client_, key.ns, key.name, spec, version);
  if (!read) return unavailable(read.error());
  if (!*read) {
    if (spec.zookeeper.credentials_secret) {
      return unavailable(fmt::format(
          "spec.zookeeper.credentialsSecret names the Secret {}, which does not exist", name));
    }
    if (!table) return unavailable(fmt::format("the Secret {} does not exist", name));
    auto generated = options_.generate_secret();
    if (!generated) {
      return std::unexpected(IdentityError{
          "SecretUnavailable", "making the table's ZooKeeper password: " + generated.error()});
    }
    TableObjectsContext context;
    context.name = key.name;
    context.ns = key.ns;
    context.owner_uid = table->value(json::json_pointer("/metadata/uid"), "");
    // Created, never applied: an existing identity is never overwritten (its ACLs are on the
    // table's nodes).
    auto created =
        client_.create(op::resources::secrets(),
                       renderZooKeeperSecret(context, tableUid(key.ns, key.name), *generated,
                                             /*owned=*/!options_.keeper_for));
    if (!created && created.error().kind != op::KubeErrorKind::kAlreadyExists) {
      return unavailable(
          fmt::format("creating the Secret {}: {}", name, created.error().toString()));
    }
    // As stored (another writer may have won).
    return zookeeperIdentity(key, spec, nullptr, version);
  }
  std::lock_guard lock(identities_mu_);
  identities_[key.ns + "/" + key.name] = **read;
  return **read;
}

std::expected<std::string, ReplicatedTableReconciler::IdentityError>
ReplicatedTableReconciler::ensureApiTokens(const op::ObjectKey& key,
                                           const ReplicatedTableSpec& spec, const json* table) {
  if (!spec.api.token_required) return std::string();
  const std::string name = spec.apiTokensSecret(key.name);
  auto unavailable = [](std::string message) {
    return std::unexpected(IdentityError{"ApiTokensUnavailable", std::move(message)});
  };
  auto secret = client_.get(op::resources::secrets(), {key.ns, name});
  if (!secret && secret.error().kind != op::KubeErrorKind::kNotFound)
    return unavailable(fmt::format("reading the Secret {}: {}", name, secret.error().toString()));
  if (!secret && !spec.api.tokens_secret && table) {
    auto generated = options_.generate_secret();
    if (!generated) {
      return std::unexpected(
          IdentityError{"SecretUnavailable", "making the table's API token: " + generated.error()});
    }
    TableObjectsContext context;
    context.name = key.name;
    context.ns = key.ns;
    context.owner_uid = table->value(json::json_pointer("/metadata/uid"), "");
    // Created, never applied: the clients hold the token; it is the user's to rotate.
    auto created =
        client_.create(op::resources::secrets(), renderApiTokensSecret(context, *generated));
    if (!created && created.error().kind != op::KubeErrorKind::kAlreadyExists) {
      return unavailable(
          fmt::format("creating the Secret {}: {}", name, created.error().toString()));
    }
    // As stored (another writer may have won); read once more, never made twice.
    return ensureApiTokens(key, spec, nullptr);
  }
  if (!secret && spec.api.tokens_secret) {
    return unavailable(
        fmt::format("spec.api.tokensSecret names the Secret {}, which does not exist", name));
  }
  if (!secret) return unavailable(fmt::format("the Secret {} does not exist", name));
  auto tokens = common::base64Decode(
      secret->value(json::json_pointer(std::string("/data/") + kApiTokensKey), ""));
  if (!tokens || tokens->find_first_not_of(" \t\r\n") == std::string::npos) {
    return unavailable(
        fmt::format("the Secret {} needs the key {}: one bearer token per line, at least one", name,
                    kApiTokensKey));
  }
  return secret->value(json::json_pointer("/metadata/resourceVersion"), "");
}

std::optional<ReplicatedTableReconciler::IdentityError> ReplicatedTableReconciler::checkTlsSecret(
    const op::ObjectKey& key, const ReplicatedTableSpec& spec) {
  if (!spec.tls.enabled()) return std::nullopt;
  const std::string& name = *spec.tls.secret_name;
  auto unavailable = [&name](const std::string& message) {
    return IdentityError{"TlsSecretUnavailable",
                         fmt::format("spec.tls.secretName: the Secret {} {}", name, message)};
  };
  auto secret = client_.get(op::resources::secrets(), {key.ns, name});
  if (!secret) {
    return unavailable(
        secret.error().kind == op::KubeErrorKind::kNotFound
            ? std::string("does not exist (cert-manager makes it from a Certificate; "
                          "docs/security.md)")
            : "cannot be read: " + secret.error().toString());
  }
  auto key_of = [&](const char* field) -> std::optional<std::string> {
    auto decoded =
        common::base64Decode(secret->value(json::json_pointer(std::string("/data/") + field), ""));
    if (!decoded || decoded->empty()) return std::nullopt;
    return std::move(*decoded);
  };
  const auto certificate = key_of("tls.crt");
  const auto private_key = key_of("tls.key");
  if (!certificate || !private_key) return unavailable("needs the keys tls.crt and tls.key");
  const std::string host = replicaHost(key.name + "-0", key.name, key.ns);
  if (auto usable = common::checkServerCertificate(*certificate, *private_key, host); !usable)
    return unavailable("cannot serve the replicas: " + usable.error());
  return std::nullopt;
}

std::expected<void, std::string> ReplicatedTableReconciler::removeNetworkPolicyIfDisabled(
    const op::ObjectKey& key, const ReplicatedTableSpec& spec) {
  const std::string table = key.ns + "/" + key.name;
  {
    std::lock_guard lock(identities_mu_);
    if (spec.network_policy.enabled) {
      without_policy_.erase(table);
      return {};
    }
    // Once per table and process: a table switched off meanwhile, or before a restart, still
    // has the policy; one that never had one costs one DELETE answered 404.
    if (without_policy_.contains(table)) return {};
  }
  // Outside the lock (one reconcile per table at a time): other tables' keeperFor never waits
  // for this call.
  auto removed = client_.remove(op::resources::networkPolicies(), key);
  if (!removed && removed.error().kind != op::KubeErrorKind::kNotFound)
    return std::unexpected("deleting the NetworkPolicy: " + removed.error().toString());
  std::lock_guard lock(identities_mu_);
  without_policy_.insert(table);
  return {};
}

core::KeeperResult<std::shared_ptr<core::Keeper>> ReplicatedTableReconciler::keeperFor(
    const op::ObjectKey& key, const ReplicatedTableSpec& spec) {
  std::optional<core::ZooKeeperDigest> identity;
  {
    std::lock_guard lock(identities_mu_);
    auto found = identities_.find(key.ns + "/" + key.name);
    if (found != identities_.end()) identity = found->second;
  }
  if (!identity) {
    return std::unexpected(core::KeeperError{core::KeeperCode::kNoAuth,
                                             tableRoot(spec, key),
                                             "the table's ZooKeeper identity is not known yet",
                                             {}});
  }
  return options_.keeper_for(spec.zookeeper.connect, *identity);
}

void ReplicatedTableReconciler::secureZooKeeperTree(const json& table, const op::ObjectKey& key,
                                                    const ReplicatedTableSpec& spec,
                                                    const json& stateful_set,
                                                    const std::string& identity_version,
                                                    ReplicatedTableStatus& status) {
  core::ZooKeeperDigest identity;
  {
    std::lock_guard lock(identities_mu_);
    auto found = identities_.find(key.ns + "/" + key.name);
    if (found == identities_.end()) return;
    identity = found->second;
  }
  // Names the Secret's version: an edit (a rotation's step) makes the walk run again.
  const std::string secured = fmt::format(
      "every node of {} carries the ACL of the table's ZooKeeper identity '{}' alone, {} (Secret "
      "version {})",
      identity.subtree, identity.user,
      identity.previous_password.empty() ? "its password"
                                         : "its password and its previous one (rotating)",
      identity_version);
  for (const Condition& current : currentConditions(table)) {
    if (current.type == "ZooKeeperSecured" && current.status == ConditionStatus::kTrue &&
        current.message == secured) {
      setCondition(status.conditions, condition("ZooKeeperSecured", true, current.reason, secured));
      return;
    }
  }
  // A replica still running the pod template from before the identity creates open nodes and
  // could not read locked ones: the migration waits for the StatefulSet to have rolled.
  const int64_t generation =
      stateful_set.value(json::json_pointer("/metadata/generation"), int64_t{0});
  const int64_t observed =
      stateful_set.value(json::json_pointer("/status/observedGeneration"), int64_t{-1});
  const std::string current_revision =
      stateful_set.value(json::json_pointer("/status/currentRevision"), "");
  const std::string update_revision =
      stateful_set.value(json::json_pointer("/status/updateRevision"), "");
  if (observed != generation || update_revision.empty() || current_revision != update_revision) {
    setCondition(status.conditions,
                 condition("ZooKeeperSecured", false, "WaitingForRollout",
                           "the table's nodes get the ACL of its ZooKeeper identity as it is now "
                           "once every replica runs with it"));
    return;
  }
  auto changed = options_.restrict_subtree(spec.zookeeper.connect, identity);
  if (!changed) {
    setCondition(status.conditions,
                 condition("ZooKeeperSecured", false, "ZooKeeperUnreachable",
                           "giving the table's nodes its ACL: " + changed.error().toString()));
    return;
  }
  if (*changed > 0) {
    event(table, op::EventType::kNormal, "ZooKeeperSecured",
          fmt::format("gave {} nodes of {} (made before the table had a ZooKeeper identity, or "
                      "before a step of a password rotation) the ACL of '{}'{}",
                      *changed, identity.subtree, identity.user,
                      identity.previous_password.empty() ? "" : " (both passwords)"));
  }
  setCondition(status.conditions, condition("ZooKeeperSecured", true, "DigestAcl", secured));
}

op::ReconcileOutcome ReplicatedTableReconciler::reconcile(const op::ObjectKey& key) {
  auto table = client_.get(replicatedTables(), key);
  if (!table) {
    if (table.error().kind == op::KubeErrorKind::kNotFound) {
      forgetTable(key);
      return op::ReconcileResult::done();
    }
    return std::unexpected(
        op::ReconcileError::retryable("reading the table: " + table.error().toString()));
  }
  if (table->contains(json::json_pointer("/metadata/deletionTimestamp")))
    return finalize(key, *table);
  const std::string now = common::formatRfc3339(options_.wall_clock());

  std::optional<SpecError> invalid = checkReplicatedTableName(key.name);
  auto spec = ReplicatedTableSpec::parse(table->value("spec", json::object()));
  if (!invalid && !spec) invalid = spec.error();
  if (invalid) {
    ReplicatedTableStatus status;
    setCondition(status.conditions, condition("Ready", false, "InvalidSpec", invalid->toString()));
    if (auto patched = patchStatus(*table, std::move(status), now); !patched) return patched;
    event(*table, op::EventType::kWarning, "InvalidSpec", invalid->toString());
    // Nothing to retry until the spec changes (which enqueues the key again).
    return std::unexpected(
        op::ReconcileError::terminalError("invalid spec: " + invalid->toString()));
  }

  // Before anything exists in ZooKeeper (or an unowned Secret): a deletion must always find the
  // finalizer.
  if (options_.keeper_for) {
    if (auto failed = ensureFinalizer(key, *table)) {
      return std::unexpected(op::ReconcileError::retryable("adding the finalizer: " + *failed));
    }
  }
  // The table's ZooKeeper identity, before the operator or a replica touches its tree.
  std::optional<IdentityError> unavailable;
  std::string api_tokens_version;
  std::string zookeeper_identity_version;
  if (auto identity = zookeeperIdentity(key, *spec, &*table, &zookeeper_identity_version);
      !identity) {
    unavailable = identity.error();
  } else if (auto tokens = ensureApiTokens(key, *spec, &*table); !tokens) {
    unavailable = tokens.error();
  } else {
    api_tokens_version = std::move(*tokens);
    unavailable = checkTlsSecret(key, *spec);
  }
  if (unavailable) {
    const auto& [reason, message] = *unavailable;
    ReplicatedTableStatus status;
    setCondition(status.conditions, condition("Ready", false, reason, message));
    (void)patchStatus(*table, std::move(status), now);
    event(*table, op::EventType::kWarning, reason, message);
    // Retried with back-off: a user's Secret appearing does not enqueue the table.
    return std::unexpected(op::ReconcileError::retryable(message));
  }

  // The table's active generation in ZooKeeper, or why it could not be had.
  std::expected<int64_t, std::string> tree = std::unexpected("");
  if (options_.keeper_for) {
    if (spec->restore_from) {
      // A table restored from a backup waits for it: nothing is created (no tree, no pods) until
      // the restore request is in ZooKeeper, so that its replicas refuse inserts from their
      // start (backup/restore.h).
      if (auto waiting = ensureRestoreRequest(key, *spec, *table)) {
        ReplicatedTableStatus status;
        setCondition(status.conditions,
                     condition("Restored", false, waiting->first, waiting->second));
        setCondition(status.conditions,
                     condition("Ready", false, "WaitingForBackup", waiting->second));
        if (restoreReason(*table) != waiting->first) {
          event(*table, op::EventType::kWarning, "RestoreWaiting", waiting->second);
        }
        if (auto patched = patchStatus(*table, std::move(status), now); !patched) return patched;
        return op::ReconcileResult::after(std::chrono::seconds(10));
      }
    }
    // Not fatal: rtable-core creates the tree too when it starts.
    tree = ensureZooKeeperTree(key, *spec, *table);
  }

  TableObjectsContext context;
  context.name = key.name;
  context.ns = key.ns;
  context.owner_uid = table->value(json::json_pointer("/metadata/uid"), "");
  context.image = options_.image;
  context.api_tokens_version = api_tokens_version;
  context.zookeeper_identity_version = zookeeper_identity_version;
  auto existing_secret = client_.get(op::resources::secrets(), {key.ns, key.name + "-interserver"});
  if (!existing_secret && existing_secret.error().kind != op::KubeErrorKind::kNotFound) {
    return std::unexpected(op::ReconcileError::retryable("reading the interserver secret: " +
                                                         existing_secret.error().toString()));
  }
  const std::string kept =
      existing_secret
          ? existing_secret->value(json::json_pointer(std::string("/data/") + kSecretKey), "")
          : "";
  if (kept.empty()) {
    auto generated = options_.generate_secret();
    if (!generated) {
      const std::string message = "making the interserver secret: " + generated.error();
      ReplicatedTableStatus status;
      setCondition(status.conditions, condition("Ready", false, "SecretUnavailable", message));
      (void)patchStatus(*table, std::move(status), now);
      event(*table, op::EventType::kWarning, "SecretUnavailable", message);
      return std::unexpected(op::ReconcileError::retryable(message));
    }
    context.interserver_secret = std::move(*generated);
  }
  TableObjects objects = renderTableObjects(*spec, context);
  if (!kept.empty()) {
    // The same value, as the server stores it: applying it again changes nothing.
    objects.secret["data"] = {{kSecretKey, kept}};
  }

  // The NetworkPolicy before the pods it guards (a new table's replicas are never open).
  std::vector<std::pair<op::ResourceType, const json*>> owned;
  if (!objects.network_policy.is_null())
    owned.emplace_back(op::resources::networkPolicies(), &objects.network_policy);
  owned.insert(owned.end(),
               {{op::resources::configMaps(), &objects.config_map},
                {op::resources::secrets(), &objects.secret},
                {op::resources::services(), &objects.headless_service},
                {op::resources::services(), &objects.client_service},
                {op::resources::statefulSets(), &objects.stateful_set},
                {op::resources::podDisruptionBudgets(), &objects.pod_disruption_budget}});
  if (auto removed = removeNetworkPolicyIfDisabled(key, *spec); !removed) {
    return std::unexpected(op::ReconcileError::retryable(removed.error()));
  }
  op::PatchOptions apply;
  apply.field_manager = options_.field_manager;
  apply.force = true;  // the operator owns these fields: a hand edit is reverted
  json stateful_set;
  for (const auto& [type, object] : owned) {
    const std::string name = (*object)["metadata"]["name"];
    auto applied = client_.patch(type, {key.ns, name}, op::PatchType::kApply, *object, apply);
    if (!applied) {
      const std::string message =
          fmt::format("applying {} {}: {}", type.kind, name, applied.error().toString());
      ReplicatedTableStatus status;
      setCondition(status.conditions, condition("Ready", false, "ApplyFailed", message));
      (void)patchStatus(*table, std::move(status), now);
      event(*table, op::EventType::kWarning, "ApplyFailed", message);
      return std::unexpected(op::ReconcileError::retryable(message));
    }
    if (type == op::resources::statefulSets()) stateful_set = std::move(*applied);
    // Applied before the StatefulSet: its version as stored goes into the pod template, so that
    // an edit of the secret (a rotation) rolls the replicas.
    if (object == &objects.secret) {
      objects.stateful_set["spec"]["template"]["metadata"]["annotations"]
                          [kInterserverVersionAnnotation] =
          applied->value(json::json_pointer("/metadata/resourceVersion"), "");
    }
  }

  const int32_t desired = spec->replicas;
  const int32_t ready = stateful_set.value(json::json_pointer("/status/readyReplicas"), int32_t{0});
  const bool all_ready = ready >= desired;
  ReplicatedTableStatus status;
  setCondition(status.conditions,
               condition("Ready", all_ready, all_ready ? "AllReplicasReady" : "ReplicasNotReady",
                         fmt::format("{}/{} replicas ready", ready, desired)));
  // Degraded: some replicas are up but not all (a table with none up is simply not Ready).
  const bool degraded = ready > 0 && ready < desired;
  setCondition(
      status.conditions,
      condition("Degraded", degraded, degraded ? "ReplicasUnavailable" : "AsExpected",
                degraded ? fmt::format("{} of {} replicas are not ready", desired - ready, desired)
                         : ""));
  bool restoring = false;
  if (spec->restore_from && !options_.keeper_for) {
    // A user who asked for a restore must not think it happened.
    setCondition(status.conditions,
                 condition("Restored", false, "RestoreUnavailable",
                           fmt::format("spec.restoreFrom names backup '{}', but this operator runs "
                                       "without ZooKeeper access and cannot restore: the table "
                                       "started empty",
                                       spec->restore_from->backup)));
  } else if (spec->restore_from) {
    restoring = reconcileRestoreStatus(*table, key, *spec, status);
  }
  status.replicas = stateful_set.value(json::json_pointer("/status/replicas"), int32_t{0});
  status.ready_replicas = ready;
  status.ready = fmt::format("{}/{}", ready, desired);
  status.selector = selectorText(key.name);
  std::optional<std::string> zookeeper_error;
  if (options_.keeper_for) {
    zookeeper_error = reconcileZooKeeper(*table, key, *spec, tree, status);
    if (!zookeeper_error && options_.restrict_subtree)
      secureZooKeeperTree(*table, key, *spec, stateful_set, zookeeper_identity_version, status);
  }
  if (auto patched = patchStatus(*table, std::move(status), now); !patched) return patched;
  // ZooKeeper is polled: nothing in Kubernetes tells of a log that grows or a replica to remove.
  if (zookeeper_error) return op::ReconcileResult::after(std::chrono::seconds(30));
  // A swap running: its steps move on as the replicas acknowledge them.
  if (status.recovery && status.recovery->step && !status.recovery->finished_at) {
    return op::ReconcileResult::after(std::chrono::seconds(1));
  }
  if (restoring) return op::ReconcileResult::after(std::chrono::seconds(5));
  if (options_.keeper_for) return op::ReconcileResult::after(std::chrono::seconds(15));
  // Readiness changes on the StatefulSet enqueue the table again (it owns the StatefulSet).
  return op::ReconcileResult::done();
}

std::optional<std::string> ReplicatedTableReconciler::reconcileSwap(
    const json& table, const op::ObjectKey& key, const ReplicatedTableSpec& spec,
    core::Keeper& keeper, const std::string& root, const HeadroomVerdict& headroom,
    ReplicatedTableStatus& status) {
  const auto wall = options_.wall_clock();
  const std::string now = common::formatRfc3339(wall);
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count();
  RecoveryStatus recovery;
  if (auto old = ReplicatedTableStatus::parse(table.value("status", json::object()));
      old && old->recovery) {
    recovery = *old->recovery;
  }
  // kubectl annotate replicatedtable <name> rtable.io/swap=<any new value>: one swap per value.
  const std::string requested =
      table.value(json::json_pointer("/metadata/annotations/rtable.io~1swap"), "");
  core::SwapDriver driver(
      keeper, root,
      [this] {
        return std::chrono::duration_cast<std::chrono::milliseconds>(
                   options_.wall_clock().time_since_epoch())
            .count();
      },
      options_.swap_step_recorded_for_test);
  auto progress = driver.advance();
  if (!progress) return "table swap: " + progress.error().toString();
  // kubectl annotate replicatedtable <name> rtable.io/swap-abort=<any new value>: aborts the swap
  // running then, if it has not switched yet (one abort per value; a value seen while no swap ran
  // aborts nothing later).
  const std::string abort_requested =
      table.value(json::json_pointer("/metadata/annotations/rtable.io~1swap-abort"), "");
  bool abort_seen = false;
  if (!abort_requested.empty() && recovery.last_abort_request != abort_requested) {
    recovery.last_abort_request = abort_requested;
    abort_seen = true;
    std::string message = "no table swap runs: nothing to abort";
    if (progress->plan && progress->plan->step != core::SwapStep::kAbort) {
      auto aborted = driver.abort();
      if (!aborted) return "aborting the table swap: " + aborted.error().toString();
      message = *aborted ? fmt::format(
                               "aborting the table swap {} -> {} (rtable.io/swap-abort={}): "
                               "generation {} serves on",
                               progress->plan->from, progress->plan->to, abort_requested,
                               progress->plan->from)
                         : fmt::format(
                               "too late to abort the table swap {} -> {}: it has switched "
                               "to generation {} and finishes",
                               progress->plan->from, progress->plan->to, progress->plan->to);
      if (*aborted) progress->plan->step = core::SwapStep::kAbort;
    }
    event(table, op::EventType::kNormal, "SwapAbortRequested", message);
  }
  const bool was_running = recovery.step && !recovery.finished_at;
  if (!progress->plan && was_running) {
    // Ended since the last look (by this call's last step, or before an operator restart).
    auto active = core::readActiveGeneration(keeper, root);
    const bool succeeded = !progress->aborted && active && *active && recovery.to_generation &&
                           **active == *recovery.to_generation;
    recovery.finished_at = now;
    recovery.result = succeeded ? "Succeeded" : "Aborted";
    // The last step (a merge patch keeps a field it does not write, so it is not cleared).
    recovery.step = std::string(
        core::swapStepName(succeeded ? core::SwapStep::kCleanup : core::SwapStep::kAbort));
    recovery.message = succeeded ? fmt::format("generation {} serves the table",
                                               recovery.to_generation.value_or(0))
                                 : "the table stays on its generation; see the Events for why";
    if (succeeded) status.active_generation = recovery.to_generation;
    // The figures, from the plan this call removed (an operator that restarted after another
    // call removed it has none).
    if (const auto& plan = progress->ended_plan) {
      if (plan->started_ms) recovery.duration_seconds = (now_ms - plan->started_ms) / 1000.0;
      if (plan->paused_ms) {
        recovery.write_pause_seconds =
            ((plan->switched_ms ? plan->switched_ms : now_ms) - plan->paused_ms) / 1000.0;
      }
    }
    if (metrics_) {
      metrics_->swapEnded(key.ns, key.name, *recovery.result, recovery.duration_seconds,
                          recovery.write_pause_seconds);
    }
    event(table, succeeded ? op::EventType::kNormal : op::EventType::kWarning,
          succeeded ? "SwapSucceeded" : "SwapAborted",
          fmt::format("table swap {} -> {}: {}{}", recovery.from_generation.value_or(0),
                      recovery.to_generation.value_or(0), *recovery.message,
                      recovery.duration_seconds
                          ? fmt::format(" (took {:.1f} s, inserts paused {:.1f} s)",
                                        *recovery.duration_seconds,
                                        recovery.write_pause_seconds.value_or(0))
                          : ""));
  }
  const bool manual = !requested.empty() && recovery.last_manual_trigger != requested;
  // After an aborted swap the automatic one waits `swap_retry_after`: a swap that fails its verify
  // again would pause inserts again and again. A stuck table retries at once (it takes no insert
  // anyway); a manual trigger always starts.
  bool retry_waits = false;
  if (recovery.result == "Aborted" && recovery.finished_at &&
      headroom.reason != HeadroomReason::kExhausted) {
    auto ended = common::parseRfc3339(*recovery.finished_at);
    retry_waits = ended && wall - *ended < options_.swap_retry_after;
  }
  const bool automatic = spec.headroom.auto_recover && headroom.low && !retry_waits;
  if (!progress->plan && (manual || automatic)) {
    auto plan = driver.begin(manual ? std::string(kManualTrigger) + requested : "headroom");
    if (!plan) return "starting a table swap: " + plan.error().toString();
    recovery = begunRecovery(recovery, *plan, now);
    recovery.step = std::string(core::swapStepName(plan->step));
    event(table, op::EventType::kNormal, "SwapStarted",
          fmt::format("moving the table from generation {} to {} ({})", plan->from, plan->to,
                      manual ? "requested by the rtable.io/swap annotation" : headroom.message));
    progress->plan = *plan;
  } else if (progress->plan) {
    // A swap the status does not show: the operator that began it died before it patched the
    // status. Taken from its plan, trigger included, so that its annotation value is spent.
    if (!was_running || recovery.to_generation != progress->plan->to) {
      recovery = begunRecovery(recovery, *progress->plan, now);
    }
    const std::string step(core::swapStepName(progress->plan->step));
    if (recovery.step != step) {
      event(table,
            progress->plan->step == core::SwapStep::kAbort ? op::EventType::kWarning
                                                           : op::EventType::kNormal,
            "SwapStep",
            fmt::format("table swap {} -> {}: {}{}", progress->plan->from, progress->plan->to, step,
                        progress->waiting_for.empty() ? "" : " (" + progress->waiting_for + ")"));
    }
    recovery.from_generation = progress->plan->from;
    recovery.to_generation = progress->plan->to;
    recovery.step = step;
    if (!recovery.started_at || recovery.finished_at) recovery.started_at = now;
    recovery.finished_at.reset();
    recovery.result.reset();
    recovery.message = progress->waiting_for;
    if (progress->plan->paused_ms && progress->plan->switched_ms) {
      recovery.write_pause_seconds =
          (progress->plan->switched_ms - progress->plan->paused_ms) / 1000.0;
    }
  }
  const bool running = progress->plan.has_value();
  if (metrics_) {
    metrics_->setSwapRunning(key.ns, key.name,
                             running && progress->plan->started_ms
                                 ? std::optional<double>(progress->plan->started_ms / 1000.0)
                                 : std::nullopt);
  }
  if (running || recovery.finished_at || abort_seen) status.recovery = recovery;
  setCondition(
      status.conditions,
      condition("Recovering", running,
                running           ? "SwapRunning"
                : recovery.result ? "Swap" + *recovery.result
                                  : "NoSwapNeeded",
                running
                    ? fmt::format("moving to generation {}: step {}{}", progress->plan->to,
                                  *recovery.step,
                                  progress->waiting_for.empty() ? "" : "; " + progress->waiting_for)
                    : ""));
  return std::nullopt;
}

std::optional<std::string> ReplicatedTableReconciler::reconcileZooKeeper(
    const json& table, const op::ObjectKey& key, const ReplicatedTableSpec& spec,
    const std::expected<int64_t, std::string>& tree, ReplicatedTableStatus& status) {
  auto fail = [&](const std::string& message) {
    setCondition(status.conditions,
                 condition("Replicating", false, "ZooKeeperUnreachable", message));
    return std::optional<std::string>(message);
  };
  if (!tree) return fail(tree.error());
  auto keeper = keeperFor(key, spec);  // the session ensureZooKeeperTree used
  if (!keeper)
    return fail("ZooKeeper " + spec.zookeeper.connect + ": " + keeper.error().toString());
  const std::string root = tableRoot(spec, key);
  status.zookeeper_path = root;
  const int64_t active_generation = *tree;
  core::TablePaths paths{root, active_generation, ""};
  auto watched = readWatchedCounters(**keeper, paths);
  if (!watched) return fail(watched.error().toString());
  const core::SequentialCounter& log = watched->front().counter;  // the log comes first
  std::vector<CounterHeadroom> counters;
  const std::string growth_key = fmt::format("{}/{}/{}/", key.ns, key.name, active_generation);
  growth_->forget(fmt::format("{}/{}/{}/", key.ns, key.name, active_generation - 1));
  for (const WatchedCounter& read : *watched) {
    CounterHeadroom headroom = counterHeadroom(read);
    headroom.exhaustion_seconds = growth_->observe(growth_key + read.name, read.counter.counter(),
                                                   headroom.creates_left, options_.wall_clock());
    counters.push_back(std::move(headroom));
  }
  const CounterHeadroom& lowest = *std::min_element(
      counters.begin(), counters.end(),
      [](const CounterHeadroom& a, const CounterHeadroom& b) { return a.ratio < b.ratio; });
  status.active_generation = active_generation;
  status.log_max_index = log.maxIndex();
  status.log_counter = log.counter();
  status.headroom_ratio = lowest.ratio;
  status.headroom = fmt::format("{:.2f}%", lowest.ratio * 100.0);
  status.headroom_counter = lowest.name;
  const HeadroomVerdict verdict = judgeHeadroom(counters, spec.headroom);
  status.exhaustion_seconds = verdict.exhaustion_seconds;
  if (metrics_) metrics_->setCounters(key.ns, key.name, active_generation, counters);
  setCondition(status.conditions,
               condition("HeadroomLow", verdict.low,
                         std::string(headroomReasonName(verdict.reason)), verdict.message));

  if (auto swapped = reconcileSwap(table, key, spec, **keeper, root, verdict, status)) {
    return fail(*swapped);
  }

  // Replicas a scale-down left behind: <name>-<ordinal> with ordinal >= replicas, pod gone.
  auto replicas = (*keeper)->children(paths.replicas());
  if (!replicas) return fail(replicas.error().toString());
  std::vector<std::pair<std::string, long>> leaving;  // name, ordinal
  std::vector<std::string> staying;
  for (const auto& replica : replicas->names) {
    const std::string prefix = key.name + "-";
    char* end = nullptr;
    const long ordinal =
        replica.starts_with(prefix) ? std::strtol(replica.c_str() + prefix.size(), &end, 10) : -1;
    const bool ours = end != nullptr && end != replica.c_str() + prefix.size() && *end == '\0';
    if (ours && ordinal >= spec.replicas) {
      leaving.emplace_back(replica, ordinal);
    } else {
      staying.push_back(replica);
    }
  }
  std::vector<std::string> waiting;
  std::vector<std::string> holding;  // stopped with parts no staying replica has
  for (const auto& [replica, ordinal] : leaving) {
    auto pod = client_.get(op::resources::pods(), {key.ns, replica});
    if (pod) {
      waiting.push_back(replica);  // still terminating: its process may still serve it
      continue;
    }
    if (pod.error().kind != op::KubeErrorKind::kNotFound)
      return fail("reading pod " + replica + ": " + pod.error().toString());
    // Removing its node would make its unreplicated parts unfetchable for good (their rows were
    // acknowledged): they stay on its volume until it runs again and the others fetch them.
    auto only = core::partsOnlyOn(**keeper, paths, replica, staying);
    if (!only)
      return fail("reading the parts of replica " + replica + ": " + only.error().toString());
    if (!only->empty()) {
      const std::size_t shown = std::min<std::size_t>(only->size(), 3);
      const std::string message = fmt::format(
          "scaled-down replica {} stopped holding {} part(s) no remaining replica has ({}{}); its "
          "ZooKeeper node is kept so that they are not lost: scale back to {} replicas or more "
          "until the others have fetched them",
          replica, only->size(),
          fmt::join(only->begin(), only->begin() + static_cast<std::ptrdiff_t>(shown), ", "),
          only->size() > shown ? ", ..." : "", ordinal + 1);
      holding.push_back(message);
      event(table, op::EventType::kWarning, "ReplicaHoldsUnreplicatedParts", message);
      continue;
    }
    auto dropped = core::dropReplica(**keeper, paths, replica);
    if (!dropped) {
      if (dropped.error().code == core::KeeperCode::kBadArguments) {
        waiting.push_back(replica);  // its session has not expired yet
        continue;
      }
      return fail("removing replica " + replica + ": " + dropped.error().toString());
    }
    if (*dropped == core::ReplicaRemoval::kRemoved) {
      event(table, op::EventType::kNormal, "ReplicaRemoved",
            fmt::format("removed scaled-down replica {} from ZooKeeper ({})", replica,
                        paths.replicas()));
    }
  }
  if (!holding.empty()) {
    setCondition(status.conditions, condition("Replicating", false, "ScaledDownReplicaHoldsParts",
                                              fmt::format("{}", fmt::join(holding, "; "))));
    return std::optional<std::string>("scaled-down replicas hold parts no other replica has");
  }
  // Each replica's queue: a replica that stays behind (its disk was full, a fetch hangs) shows
  // here and in the Replicating condition, not only in its own metrics.
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             options_.wall_clock().time_since_epoch())
                             .count();
  std::vector<ReplicaQueueStatus> queues;
  std::vector<std::string> stuck;
  std::vector<std::string> full;
  for (const auto& replica : staying) {
    auto summary = core::summarizeReplicaQueue(**keeper, paths, replica);
    if (!summary)
      return fail("reading the queue of replica " + replica + ": " + summary.error().toString());
    ReplicaQueueStatus queue{replica, summary->active, static_cast<int64_t>(summary->size), {}, {}};
    if (summary->disk_full) {
      full.push_back(
          fmt::format("replica {}'s data volume is full ({}): it refuses inserts (507) "
                      "and cannot fetch or merge until space is freed or the volume "
                      "grown",
                      replica, *summary->disk_full));
    }
    if (summary->oldest_node) {
      queue.oldest_entry =
          summary->oldest_entry
              ? fmt::format("{} {}", core::logEntryTypeName(summary->oldest_entry->type),
                            summary->oldest_entry->new_part_name)
              : *summary->oldest_node;
      queue.oldest_waiting_seconds =
          std::max<int64_t>(0, (now_ms - summary->oldest_queued_ms) / 1000);
      if (*queue.oldest_waiting_seconds >= options_.queue_stuck_after.count()) {
        stuck.push_back(fmt::format(
            "replica {}{}: the oldest of its {} queue entries ({}) has waited {} s; GET /replica "
            "on its pod shows the entry's last_exception",
            replica, summary->active ? "" : " (not running)", summary->size, *queue.oldest_entry,
            *queue.oldest_waiting_seconds));
      }
    }
    queues.push_back(std::move(queue));
  }
  status.replica_queues = std::move(queues);
  // A full volume first: it is the cause, a queue that stopped moving its effect.
  if (!full.empty()) {
    const std::string message = fmt::format("{}", fmt::join(full, "; "));
    setCondition(status.conditions, condition("Replicating", false, "ReplicaDiskFull", message));
    event(table, op::EventType::kWarning, "ReplicaDiskFull", message);
    return std::nullopt;
  }
  if (!stuck.empty()) {
    const std::string message = fmt::format("{}", fmt::join(stuck, "; "));
    setCondition(status.conditions,
                 condition("Replicating", false, "ReplicaQueueNotProgressing", message));
    event(table, op::EventType::kWarning, "ReplicaQueueNotProgressing", message);
    return std::nullopt;
  }
  setCondition(
      status.conditions,
      condition("Replicating", waiting.empty(), waiting.empty() ? "AsExpected" : "RemovingReplicas",
                waiting.empty()
                    ? ""
                    : fmt::format("waiting to remove scaled-down replicas from ZooKeeper: {}",
                                  fmt::join(waiting, ", "))));
  return waiting.empty() ? std::nullopt : std::optional<std::string>("replicas still to remove");
}

op::ReconcileOutcome ReplicatedTableReconciler::patchStatus(const json& table,
                                                            ReplicatedTableStatus update,
                                                            const std::string& now) {
  // The status describes the generation this reconcile read.
  const int64_t generation = table.value(json::json_pointer("/metadata/generation"), int64_t{0});
  update.observed_generation = generation;
  stampConditions(update.conditions, currentConditions(table), generation, now);
  const json status = update.toJson();
  if (table.contains("status") && table["status"].is_object()) {
    // Fields the reconciler does not manage here (filled in by later parts) stay as they are.
    json merged = table["status"];
    merged.update(status);
    if (merged == table["status"]) return op::ReconcileResult::done();
  }
  op::PatchOptions options;
  options.subresource = "status";
  auto patched =
      client_.patch(replicatedTables(),
                    {table.value(json::json_pointer("/metadata/namespace"), ""),
                     table.value(json::json_pointer("/metadata/name"), "")},
                    op::PatchType::kMerge, json{{"status", update.toMergePatch()}}, options);
  if (!patched) {
    return std::unexpected(
        op::ReconcileError::retryable("patching the status: " + patched.error().toString()));
  }
  return op::ReconcileResult::done();
}

}  // namespace rtable::controllers

namespace rtable::controllers {

void ReplicatedTableReconciler::event(const json& table, op::EventType type,
                                      std::string_view reason, const std::string& message) {
  if (options_.events && table.is_object()) {
    options_.events->record(op::ObjectReference::of(table), type, reason, message);
  }
}

std::optional<std::string> ReplicatedTableReconciler::ensureFinalizer(const op::ObjectKey& key,
                                                                      const json& table) {
  if (hasFinalizer(table)) return std::nullopt;
  auto patched = client_.patch(replicatedTables(), key, op::PatchType::kJson,
                               detail::addFinalizerPatch(table, kZooKeeperFinalizer));
  if (!patched) return patched.error().toString();
  return std::nullopt;
}

std::string ReplicatedTableReconciler::restoreReason(const json& table) {
  for (const Condition& c : currentConditions(table)) {
    if (c.type == "Restored") return c.reason;
  }
  return "";
}

std::optional<std::pair<std::string, std::string>> ReplicatedTableReconciler::ensureRestoreRequest(
    const op::ObjectKey& key, const ReplicatedTableSpec& spec, const json& table) {
  using Waiting = std::pair<std::string, std::string>;
  const std::string& name = spec.restore_from->backup;
  auto keeper = keeperFor(key, spec);
  if (!keeper) {
    return Waiting{"ZooKeeperUnreachable",
                   "ZooKeeper " + spec.zookeeper.connect + ": " + keeper.error().toString()};
  }
  const std::string root = tableRoot(spec, key);
  auto stored = backup::readRestoreRequest(**keeper, root);
  if (!stored) return Waiting{"ZooKeeperUnreachable", stored.error()};
  if (*stored) return std::nullopt;  // written before: the replicas take it from there

  backup::RestoreRequest request;
  request.requested_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             options_.wall_clock().time_since_epoch())
                             .count();
  if (spec.restore_from->backup.empty()) {
    // By location: what is there is for the restoring replica to find (the operator does not
    // mount the destination). An S3 location's Secret and a claim are mounted by the pods
    // (mountedCredentials, mountedVolumes).
    request.backup = spec.restore_from->name;
    request.table = spec.restore_from->table;
    if (spec.restore_from->s3) {
      request.destination = s3DestinationRef(*spec.restore_from->s3);
    } else if (spec.restore_from->persistent_volume_claim) {
      request.destination = volumeDestinationRef(*spec.restore_from->persistent_volume_claim);
    } else {
      request.destination.kind = backup::DestinationRef::Kind::kFilesystem;
      request.destination.path = spec.restore_from->filesystem_path;
    }
    if (auto problem = mountProblem(client_, key.ns, key.name, spec, request.destination))
      return problem;
    return writeRestoreRequest(table, **keeper, root, request, spec.restore_from->describe());
  }

  auto object = client_.get(clusterBackups(), {key.ns, name});
  if (!object) {
    if (object.error().kind == op::KubeErrorKind::kNotFound) {
      return Waiting{"BackupNotFound",
                     fmt::format("ClusterBackup {} does not exist in namespace {}: the table "
                                 "waits for it",
                                 name, key.ns)};
    }
    return Waiting{"BackupNotFound",
                   fmt::format("reading ClusterBackup {}: {}", name, object.error().toString())};
  }
  const std::string phase = object->value(json::json_pointer("/status/phase"), "");
  if (phase == "Failed") {
    return Waiting{"BackupFailed",
                   fmt::format("ClusterBackup {} failed: there is nothing to restore; delete this "
                               "table and create it from another backup",
                               name)};
  }
  if (phase != "Completed") {
    return Waiting{"BackupNotCompleted",
                   fmt::format("ClusterBackup {} is {}: the table waits for it to complete", name,
                               phase.empty() ? "not started" : phase)};
  }
  auto backup_spec = ClusterBackupSpec::parse(object->value("spec", json::object()));
  if (!backup_spec) {
    return Waiting{"BackupInvalid",
                   fmt::format("ClusterBackup {}: {}", name, backup_spec.error().toString())};
  }
  const backup::DestinationRef destination = destinationOf(*backup_spec);
  if (auto problem = mountProblem(client_, key.ns, key.name, spec, destination)) return problem;
  // The table of the backup: its only one, or the one with this table's name.
  std::vector<std::string> tables;
  for (const auto& item : object->value(json::json_pointer("/status/contents"), json::array())) {
    if (item.contains("table") && item["table"].is_string()) tables.push_back(item["table"]);
  }
  std::string source = spec.restore_from->table;
  if (!source.empty()) {
    if (std::find(tables.begin(), tables.end(), source) == tables.end()) {
      return Waiting{"TableNotInBackup", fmt::format("ClusterBackup {} holds tables [{}]: not {}",
                                                     name, fmt::join(tables, ", "), source)};
    }
  } else if (tables.size() == 1) {
    source = tables.front();
  } else if (std::find(tables.begin(), tables.end(), key.name) != tables.end()) {
    source = key.name;
  } else {
    return Waiting{"TableNotInBackup",
                   fmt::format("ClusterBackup {} holds tables [{}]: none is named {}", name,
                               fmt::join(tables, ", "), key.name)};
  }

  request.backup = backupNameFor({key.ns, name});
  request.table = source;
  request.destination = destination;
  return writeRestoreRequest(table, **keeper, root, request, spec.restore_from->describe());
}

std::optional<std::pair<std::string, std::string>> ReplicatedTableReconciler::writeRestoreRequest(
    const json& table, core::Keeper& keeper, const std::string& root,
    const backup::RestoreRequest& request, const std::string& source) {
  core::KeeperStatus made = core::createAncestorsAndSelf(keeper, root);
  if (made) {
    auto created = keeper.create(backup::restoreRequestPath(root), request.format(),
                                 core::CreateMode::kPersistent);
    if (!created && created.error().code != core::KeeperCode::kNodeExists) {
      made = std::unexpected(created.error());
    }
  }
  if (!made) {
    return std::pair<std::string, std::string>{"ZooKeeperUnreachable", made.error().toString()};
  }
  event(table, op::EventType::kNormal, "RestoreRequested",
        fmt::format("restoring {} from {} ({}) into this table",
                    request.table.empty() ? "its table" : "table " + request.table, source,
                    request.destination.location()));
  return std::nullopt;
}

bool ReplicatedTableReconciler::reconcileRestoreStatus(const json& table, const op::ObjectKey& key,
                                                       const ReplicatedTableSpec& spec,
                                                       ReplicatedTableStatus& status) {
  auto keeper = keeperFor(key, spec);
  if (!keeper) return true;  // ZooKeeper's own condition says so; look again soon
  auto stored = backup::readRestoreRequest(**keeper, tableRoot(spec, key));
  if (!stored || !*stored) return true;
  const backup::RestoreRequest& request = (*stored)->request;
  const std::string name = spec.restore_from->describe();
  Condition restored;
  switch (request.state) {
    case backup::RestoreRequest::State::kPending:
      restored = condition("Restored", false, "RestorePending",
                           fmt::format("waiting for a replica to restore {}", name));
      break;
    case backup::RestoreRequest::State::kRunning:
      restored = condition("Restored", false, "Restoring",
                           fmt::format("replica {} is restoring {}: {} of {} parts "
                                       "({} rows); inserts wait",
                                       request.restorer, name, request.parts_done,
                                       request.parts_total, request.rows_done));
      break;
    case backup::RestoreRequest::State::kDone:
      restored = condition("Restored", true, "Restored",
                           fmt::format("restored {} (table {}): {} parts, {} rows", name,
                                       request.table, request.parts_done, request.rows_done));
      break;
    case backup::RestoreRequest::State::kFailed:
      restored = condition("Restored", false, "RestoreFailed",
                           fmt::format("restoring {} failed: {}", name, request.message));
      break;
  }
  const std::string previous = restoreReason(table);
  if (previous != restored.reason) {
    if (request.state == backup::RestoreRequest::State::kDone) {
      event(table, op::EventType::kNormal, "Restored", restored.message);
    } else if (request.state == backup::RestoreRequest::State::kFailed) {
      event(table, op::EventType::kWarning, "RestoreFailed", restored.message);
    }
  }
  setCondition(status.conditions, std::move(restored));
  return request.state == backup::RestoreRequest::State::kPending ||
         request.state == backup::RestoreRequest::State::kRunning;
}

std::expected<int64_t, std::string> ReplicatedTableReconciler::ensureZooKeeperTree(
    const op::ObjectKey& key, const ReplicatedTableSpec& spec, const json& table) {
  auto keeper = keeperFor(key, spec);
  if (!keeper)
    return std::unexpected("ZooKeeper " + spec.zookeeper.connect + ": " +
                           keeper.error().toString());
  const std::string root = tableRoot(spec, key);
  const core::TablePaths first{root, 1, ""};
  auto active = (*keeper)->get(first.activeGeneration());
  if (active) return std::strtoll(active->data.c_str(), nullptr, 10);
  if (active.error().code != core::KeeperCode::kNoNode)
    return std::unexpected(active.error().toString());
  const std::string metadata = coreMetadataText(spec, key);
  core::KeeperStatus made = core::createAncestorsAndSelf(**keeper, spec.zookeeper.root);
  if (made) {
    if (auto created = core::createTableIfNotExists(**keeper, first, metadata); !created) {
      made = std::unexpected(created.error());
    }
  }
  if (!made) {
    const std::string message =
        fmt::format("creating the table's ZooKeeper tree {}: {}", root, made.error().toString());
    event(table, op::EventType::kWarning, "ZooKeeperUnreachable", message);
    return std::unexpected(message);
  }
  event(table, op::EventType::kNormal, "ZooKeeperTreeCreated",
        "created the table's ZooKeeper tree " + root);
  return first.generation;
}

op::ReconcileOutcome ReplicatedTableReconciler::finalize(const op::ObjectKey& key,
                                                         const json& table) {
  if (!hasFinalizer(table))
    return op::ReconcileResult::done();  // the garbage collector does the rest
  auto spec = ReplicatedTableSpec::parse(table.value("spec", json::object()));
  if (!spec) {
    // Never valid, so nothing was created in ZooKeeper for it.
    event(
        table, op::EventType::kWarning, "CleanupSkipped",
        "the spec is not valid, so no ZooKeeper tree was made for it: " + spec.error().toString());
  } else if (options_.keeper_for) {
    // Replicas still running would re-create what we remove: their pods go first.
    op::DeleteOptions background;
    background.propagation_policy = op::PropagationPolicy::kBackground;
    auto removed = client_.remove(op::resources::statefulSets(), key, background);
    if (!removed && removed.error().kind != op::KubeErrorKind::kNotFound) {
      return std::unexpected(
          op::ReconcileError::retryable("deleting the StatefulSet: " + removed.error().toString()));
    }
    op::ListOptions selector;
    selector.label_selector = selectorText(key.name);
    auto pods = client_.list(op::resources::pods(), key.ns, selector);
    if (!pods)
      return std::unexpected(
          op::ReconcileError::retryable("listing the pods: " + pods.error().toString()));
    if (!pods->items.empty()) {
      event(table, op::EventType::kNormal, "WaitingForPods",
            fmt::format(
                "{} replica pods still exist; the ZooKeeper tree is removed once they are gone",
                pods->items.size()));
      return op::ReconcileResult::after(std::chrono::seconds(2));
    }
    const std::string root = tableRoot(*spec, key);
    // The tree's nodes carry the table's ACL: only its identity can remove them.
    auto identity = zookeeperIdentity(key, *spec, nullptr);
    if (!identity) {
      const std::string message = fmt::format(
          "removing the table's ZooKeeper tree {} needs its identity: {} (restore the Secret, or "
          "remove the finalizer {} by hand to leave the tree behind)",
          root, identity.error().message, kZooKeeperFinalizer);
      event(table, op::EventType::kWarning, "CleanupFailed", message);
      return std::unexpected(op::ReconcileError::retryable(message));
    }
    auto keeper = keeperFor(key, *spec);
    core::KeeperStatus gone = keeper ? core::removeRecursive(**keeper, root)
                                     : core::KeeperStatus(std::unexpected(keeper.error()));
    if (!gone) {
      const std::string message =
          fmt::format("removing the table's ZooKeeper tree {} ({}): {}", root,
                      spec->zookeeper.connect, gone.error().toString());
      event(table, op::EventType::kWarning, "CleanupFailed", message);
      return std::unexpected(op::ReconcileError::retryable(message));
    }
    event(table, op::EventType::kNormal, "ZooKeeperTreeRemoved",
          "removed the table's ZooKeeper tree " + root);
    // The identity the operator made goes with the tree (a user's own Secret stays).
    if (!spec->zookeeper.credentials_secret) {
      auto deleted = client_.remove(op::resources::secrets(),
                                    {key.ns, spec->zookeeperCredentialsSecret(key.name)});
      if (!deleted && deleted.error().kind != op::KubeErrorKind::kNotFound) {
        return std::unexpected(op::ReconcileError::retryable(
            "deleting the ZooKeeper identity's Secret: " + deleted.error().toString()));
      }
    }
  }
  auto patched = client_.patch(replicatedTables(), key, op::PatchType::kJson,
                               detail::removeFinalizerPatch(table, kZooKeeperFinalizer));
  if (!patched && patched.error().kind != op::KubeErrorKind::kNotFound) {
    return std::unexpected(
        op::ReconcileError::retryable("removing the finalizer: " + patched.error().toString()));
  }
  forgetTable(key);
  return op::ReconcileResult::done();
}

}  // namespace rtable::controllers
