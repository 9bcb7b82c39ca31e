// The Kubernetes objects a ReplicatedTable owns (DESIGN.md 3, issue 6), rendered from its spec as
// complete desired states for server-side apply: the reconciler applies them with field manager
// rtable-operator and force, so a second apply changes nothing and a hand edit of a field the
// operator owns is reverted.
//
// Objects, all in the table's namespace, labelled app.kubernetes.io/{name,instance,component,
// managed-by,part-of} and owned by the ReplicatedTable (controller reference, so the garbage
// collector removes them with it):
//   <name>-headless  Service, clusterIP None, publishNotReadyAddresses (stable DNS for replicas
//                    that are still starting: a new replica fetches from the others by name)
//   <name>           Service, port 8123 for clients (ready replicas only)
//   <name>-config    ConfigMap, core.yaml: the rtable-core spec (renderCoreConfig)
//   <name>-interserver Secret, `secret`: the part-fetch credential (its value is the caller's: it
//                    is generated once and then kept)
//   <name>-zookeeper Secret (kubernetes.io/basic-auth), the table's ZooKeeper identity, unless
//                    spec.zookeeper.credentialsSecret names the user's own (renderZooKeeperSecret:
//                    made once, then kept; not owned by the table while the operator manages
//                    ZooKeeper, so that it outlives the pods until the tree is removed with it)
//   <name>-api-tokens Secret, `tokens`: the replica API's bearer token, with spec.api Token and no
//                    tokensSecret (renderApiTokensSecret: made once, then kept)
//   <name>           StatefulSet of rtable-core replicas, one PVC `data` each
//   <name>           PodDisruptionBudget, maxUnavailable 1
//   <name>           NetworkPolicy, with spec.networkPolicy.enabled: the replicas admit each other
//                    on 8123 (fetches), apiFrom on 8123, metricsFrom on 9363, nothing else
//
// Pure functions of their inputs: thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "rtable/controllers/replicated_table_spec.h"

namespace rtable::controllers {

// Where the pieces go inside a replica pod.
inline constexpr const char* kDataMountPath = "/var/lib/rtable";
inline constexpr const char* kConfigMountPath = "/etc/rtable/config";
inline constexpr const char* kConfigKey = "core.yaml";
inline constexpr const char* kSecretMountPath = "/etc/rtable/interserver";
inline constexpr const char* kSecretKey = "secret";
inline constexpr const char* kZooKeeperCredentialsMountPath = "/etc/rtable/zookeeper";
inline constexpr const char* kApiTokensMountPath = "/etc/rtable/api";
inline constexpr const char* kApiTokensKey = "tokens";
// The ZooKeeper identity Secret's key for the password being rotated out (docs/security.md).
inline constexpr const char* kZooKeeperPreviousPasswordKey = "previousPassword";
// spec.tls's Secret, in cert-manager's layout (tls.crt, tls.key, ca.crt).
inline constexpr const char* kTlsMountPath = "/etc/rtable/tls";
inline constexpr uint16_t kHttpPort = 8123;
inline constexpr uint16_t kMetricsPort = 9363;
// Pod template annotation holding a hash of core.yaml: a changed config rolls the pods.
inline constexpr const char* kConfigHashAnnotation = "rtable.io/config-hash";
// ... and the API tokens Secret's resourceVersion (spec.api Token): rotating them rolls the pods.
inline constexpr const char* kApiTokensVersionAnnotation = "rtable.io/api-tokens-version";
// ... and the interserver Secret's resourceVersion: a rotation's edit rolls the pods, which read
// the secret at start (docs/security.md).
inline constexpr const char* kInterserverVersionAnnotation = "rtable.io/interserver-version";
// ... and the ZooKeeper identity Secret's (a password rotation, docs/security.md).
inline constexpr const char* kZooKeeperIdentityVersionAnnotation =
    "rtable.io/zookeeper-identity-version";

struct TableObjectsContext {
  std::string name;  // the ReplicatedTable's metadata.name, namespace and uid
  std::string ns;
  std::string owner_uid;
  std::string image = "rtable/rtable:dev";
  std::string image_pull_policy = "IfNotPresent";
  std::string interserver_secret;  // the value to put in <name>-interserver
  // The resourceVersion of the API's tokens Secret: in the pod template, it rolls the replicas
  // when the tokens change (rtable-core reads them at start), as a changed config does.
  std::string api_tokens_version;
  // The ZooKeeper identity Secret's resourceVersion: a rotation of its password rolls the
  // replicas, which read it at start (empty: no annotation).
  std::string zookeeper_identity_version;
};

struct TableObjects {
  nlohmann::json headless_service;
  nlohmann::json client_service;
  nlohmann::json config_map;
  nlohmann::json secret;
  nlohmann::json stateful_set;
  nlohmann::json pod_disruption_budget;
  nlohmann::json network_policy;  // null unless spec.networkPolicy.enabled
};

// The labels every owned object carries, and (a subset) the pods' selector.
nlohmann::json tableLabels(const std::string& name);
nlohmann::json tableSelector(const std::string& name);

std::string headlessServiceName(const std::string& name);
// "<pod>.<name>-headless.<ns>.svc": where the other replicas reach a replica.
std::string replicaHost(const std::string& pod, const std::string& name, const std::string& ns);

TableObjects renderTableObjects(const ReplicatedTableSpec& spec,
                                const TableObjectsContext& context);

// The table's ZooKeeper identity as the operator makes it (username and password as given).
// Owned by the table (the garbage collector removes it) only when `owned`: an operator that
// removes the table's ZooKeeper tree needs the identity until then, and deletes the Secret itself.
// The replica API's tokens as the operator makes them: one token, owned by the table.
nlohmann::json renderApiTokensSecret(const TableObjectsContext& context, const std::string& token);

nlohmann::json renderZooKeeperSecret(const TableObjectsContext& context,
                                     const std::string& username, const std::string& password,
                                     bool owned);

}  // namespace rtable::controllers
