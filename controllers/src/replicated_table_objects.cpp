#include "rtable/controllers/replicated_table_objects.h"

#include <fmt/format.h>

#include "rtable/backup/open_destination.h"
#include "rtable/common/base64.h"
#include "rtable/controllers/core_config.h"
#include "rtable/replication_core/hash128.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;

json objectMeta(const std::string& name, const TableObjectsContext& context) {
  json meta = {{"name", name}, {"namespace", context.ns}, {"labels", tableLabels(context.name)}};
  // The controller reference: the garbage collector removes the object with its table, and
  // foreground deletion of the table waits for it.
  meta["ownerReferences"] = json::array({{{"apiVersion", "rtable.io/v1alpha1"},
                                          {"kind", "ReplicatedTable"},
                                          {"name", context.name},
                                          {"uid", context.owner_uid},
                                          {"controller", true},
                                          {"blockOwnerDeletion", true}}});
  return meta;
}

json servicePorts() {
  return json::array(
      {{{"name", "http"}, {"port", kHttpPort}, {"targetPort", "http"}, {"protocol", "TCP"}},
       {{"name", "metrics"},
        {"port", kMetricsPort},
        {"targetPort", "metrics"},
        {"protocol", "TCP"}}});
}

json envFromField(const std::string& name, const std::string& path) {
  return {{"name", name},
          {"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", path}}}}}};
}

// The volume of the i-th mounted credentials Secret (a Secret's name may be too long for a
// volume's).
std::string credentialsVolume(std::size_t i) {
  return fmt::format("backup-credentials-{}", i);
}

// The volume of the i-th mounted backup claim.
std::string backupClaimVolume(std::size_t i) {
  return fmt::format("backup-volume-{}", i);
}

// With TLS the API answers nothing but HTTPS: so do the probes (the kubelet does not check the
// certificate).
json httpProbe(const std::string& path, int period, int failures, int initial_delay, bool tls) {
  return {{"httpGet", {{"path", path}, {"port", "http"}, {"scheme", tls ? "HTTPS" : "HTTP"}}},
          {"periodSeconds", period},
          {"failureThreshold", failures},
          {"initialDelaySeconds", initial_delay},
          {"timeoutSeconds", 2}};
}

json coreContainer(const ReplicatedTableSpec& spec, const TableObjectsContext& context) {
  json env = json::array({envFromField("POD_NAME", "metadata.name"),
                          envFromField("POD_NAMESPACE", "metadata.namespace"),
                          envFromField("POD_IP", "status.podIP")});
  for (const auto& extra : spec.pod_template.env) env.push_back(extra);
  json container = {
      {"name", "rtable-core"},
      {"image", context.image},
      {"imagePullPolicy", context.image_pull_policy},
      // Each pod names itself: one ConfigMap serves them all. Listening on the pod's own address
      // (not 0.0.0.0) keeps replicas that share a network namespace apart (the test kubelet).
      {"args", json::array({fmt::format("--config={}/{}", kConfigMountPath, kConfigKey),
                            "--replica-name=$(POD_NAME)",
                            fmt::format("--replica-host=$(POD_NAME).{}.$(POD_NAMESPACE).svc",
                                        headlessServiceName(context.name)),
                            "--listen=$(POD_IP)"})},
      {"env", env},
      {"ports",
       json::array({{{"name", "http"}, {"containerPort", kHttpPort}, {"protocol", "TCP"}},
                    {{"name", "metrics"}, {"containerPort", kMetricsPort}, {"protocol", "TCP"}}})},
      // Ready: a ZooKeeper session and not shutting down. Alive: the process answers; generous,
      // since a replica loading many parts is slow to start and a restart would not help it.
      {"readinessProbe", httpProbe("/readyz", 5, 3, 2, spec.tls.enabled())},
      {"livenessProbe", httpProbe("/healthz", 10, 6, 10, spec.tls.enabled())},
      {"volumeMounts",
       json::array({{{"name", "data"}, {"mountPath", kDataMountPath}},
                    {{"name", "config"}, {"mountPath", kConfigMountPath}, {"readOnly", true}},
                    {{"name", "interserver"}, {"mountPath", kSecretMountPath}, {"readOnly", true}},
                    {{"name", "zookeeper"},
                     {"mountPath", kZooKeeperCredentialsMountPath},
                     {"readOnly", true}}})},
      {"securityContext",
       {{"allowPrivilegeEscalation", false},
        {"readOnlyRootFilesystem", true},
        {"capabilities", {{"drop", {"ALL"}}}}}},
  };
  if (spec.api.token_required) {
    container["volumeMounts"].push_back(
        {{"name", "api-tokens"}, {"mountPath", kApiTokensMountPath}, {"readOnly", true}});
  }
  if (spec.tls.enabled()) {
    container["volumeMounts"].push_back(
        {{"name", "tls"}, {"mountPath", kTlsMountPath}, {"readOnly", true}});
  }
  // Each S3 credentials Secret where rtable-core's openDestination looks for it.
  const std::vector<std::string> credentials = spec.mountedCredentials();
  for (std::size_t i = 0; i < credentials.size(); ++i) {
    container["volumeMounts"].push_back(
        {{"name", credentialsVolume(i)},
         {"mountPath", fmt::format("{}/{}", backup::kDefaultCredentialsDir, credentials[i])},
         {"readOnly", true}});
  }
  // Each backup claim where openDestination looks for it, writable: the replicas write the backup.
  const std::vector<std::string> claims = spec.mountedVolumes();
  for (std::size_t i = 0; i < claims.size(); ++i) {
    container["volumeMounts"].push_back(
        {{"name", backupClaimVolume(i)},
         {"mountPath", fmt::format("{}/{}", backup::kDefaultVolumesDir, claims[i])}});
  }
  for (const auto& mount : spec.pod_template.volume_mounts)
    container["volumeMounts"].push_back(mount);
  if (!spec.resources.empty()) container["resources"] = spec.resources;
  return container;
}

std::string configHash(const std::string& config) {
  core::Hasher128 hasher;
  hasher.update(config);
  return hasher.digest().hex().substr(0, 16);
}

}  // namespace

json tableLabels(const std::string& name) {
  json labels = tableSelector(name);
  labels["app.kubernetes.io/managed-by"] = "rtable-operator";
  labels["app.kubernetes.io/part-of"] = "rtable";
  return labels;
}

json tableSelector(const std::string& name) {
  return {{"app.kubernetes.io/name", "rtable"},
          {"app.kubernetes.io/instance", name},
          {"app.kubernetes.io/component", "replica"}};
}

std::string headlessServiceName(const std::string& name) {
  return name + "-headless";
}

std::string replicaHost(const std::string& pod, const std::string& name, const std::string& ns) {
  return fmt::format("{}.{}.{}.svc", pod, headlessServiceName(name), ns);
}

json renderApiTokensSecret(const TableObjectsContext& context, const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", objectMeta(context.name + "-api-tokens", context)},
          {"type", "Opaque"},
          {"data", {{kApiTokensKey, common::base64Encode(token + "\n")}}}};
}

json renderZooKeeperSecret(const TableObjectsContext& context, const std::string& username,
                           const std::string& password, bool owned) {
  json meta = objectMeta(context.name + "-zookeeper", context);
  if (!owned) meta.erase("ownerReferences");
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", std::move(meta)},
          {"type", "kubernetes.io/basic-auth"},
          {"data",
           {{"username", common::base64Encode(username)},
            {"password", common::base64Encode(password)}}}};
}

TableObjects renderTableObjects(const ReplicatedTableSpec& spec,
                                const TableObjectsContext& context) {
  TableObjects objects;
  const std::string& name = context.name;

  objects.headless_service = {{"apiVersion", "v1"},
                              {"kind", "Service"},
                              {"metadata", objectMeta(headlessServiceName(name), context)},
                              {"spec",
                               {{"clusterIP", "None"},
                                {"publishNotReadyAddresses", true},
                                {"selector", tableSelector(name)},
                                {"ports", servicePorts()}}}};
  objects.client_service = {{"apiVersion", "v1"},
                            {"kind", "Service"},
                            {"metadata", objectMeta(name, context)},
                            {"spec",
                             {{"type", "ClusterIP"},
                              {"selector", tableSelector(name)},
                              {"ports", json::array({{{"name", "http"},
                                                      {"port", kHttpPort},
                                                      {"targetPort", "http"},
                                                      {"protocol", "TCP"}}})}}}};

  CoreConfigContext core;
  core.name = name;
  core.ns = context.ns;
  core.data_dir = kDataMountPath;
  core.secret_file = fmt::format("{}/{}", kSecretMountPath, kSecretKey);
  core.zookeeper_credentials_dir = kZooKeeperCredentialsMountPath;
  core.api_tokens_file = fmt::format("{}/{}", kApiTokensMountPath, kApiTokensKey);
  core.tls_dir = kTlsMountPath;
  core.http_port = kHttpPort;
  core.metrics_port = kMetricsPort;
  const std::string config = renderCoreConfig(spec, core);
  objects.config_map = {{"apiVersion", "v1"},
                        {"kind", "ConfigMap"},
                        {"metadata", objectMeta(name + "-config", context)},
                        {"data", {{kConfigKey, config}}}};
  // `data`, not `stringData`: what the operator applies is byte for byte what the server stores
  // and reads back.
  objects.secret = {{"apiVersion", "v1"},
                    {"kind", "Secret"},
                    {"metadata", objectMeta(name + "-interserver", context)},
                    {"type", "Opaque"},
                    {"data", {{kSecretKey, common::base64Encode(context.interserver_secret)}}}};

  json pod_labels = tableLabels(name);
  for (const auto& [key, value] : spec.pod_template.labels) pod_labels[key] = value;
  json annotations = {{"prometheus.io/scrape", "true"},
                      {"prometheus.io/port", std::to_string(kMetricsPort)},
                      {"prometheus.io/path", "/metrics"},
                      {kConfigHashAnnotation, configHash(config)}};
  // The Secret's version, not a hash of the tokens: the pod template is readable by more people
  // than the Secret, and a weak token could be tested against its hash.
  if (spec.api.token_required)
    annotations[kApiTokensVersionAnnotation] = context.api_tokens_version;
  if (!context.zookeeper_identity_version.empty())
    annotations[kZooKeeperIdentityVersionAnnotation] = context.zookeeper_identity_version;
  for (const auto& [key, value] : spec.pod_template.annotations) annotations[key] = value;

  json containers = json::array({coreContainer(spec, context)});
  for (const auto& extra : spec.pod_template.containers) containers.push_back(extra);
  json volumes = json::array(
      {{{"name", "config"}, {"configMap", {{"name", name + "-config"}}}},
       {{"name", "interserver"},
        {"secret", {{"secretName", name + "-interserver"}, {"defaultMode", 0400}}}},
       {{"name", "zookeeper"},
        {"secret",
         {{"secretName", spec.zookeeperCredentialsSecret(name)}, {"defaultMode", 0400}}}}});
  if (spec.api.token_required) {
    volumes.push_back(
        {{"name", "api-tokens"},
         {"secret", {{"secretName", spec.apiTokensSecret(name)}, {"defaultMode", 0400}}}});
  }
  // Not in the pod template's annotations: cert-manager's renewals are read in place
  // (rtable-core reloads changed files), so they roll nothing.
  if (spec.tls.enabled()) {
    volumes.push_back({{"name", "tls"},
                       {"secret", {{"secretName", *spec.tls.secret_name}, {"defaultMode", 0400}}}});
  }
  const std::vector<std::string> credentials = spec.mountedCredentials();
  for (std::size_t i = 0; i < credentials.size(); ++i) {
    volumes.push_back({{"name", credentialsVolume(i)},
                       {"secret", {{"secretName", credentials[i]}, {"defaultMode", 0400}}}});
  }
  const std::vector<std::string> claims = spec.mountedVolumes();
  for (std::size_t i = 0; i < claims.size(); ++i) {
    volumes.push_back(
        {{"name", backupClaimVolume(i)}, {"persistentVolumeClaim", {{"claimName", claims[i]}}}});
  }
  for (const auto& extra : spec.pod_template.volumes) volumes.push_back(extra);

  json pod_spec = {
      {"containers", containers},
      {"volumes", volumes},
      // rtable-core finishes inserts in flight for up to 30 s after SIGTERM.
      {"terminationGracePeriodSeconds", 45},
      {"securityContext",
       {{"runAsNonRoot", true}, {"runAsUser", 10001}, {"runAsGroup", 10001}, {"fsGroup", 10001}}},
      // Replicas on different nodes where possible: a node failure takes one replica, not all.
      {"affinity",
       {{"podAntiAffinity",
         {{"preferredDuringSchedulingIgnoredDuringExecution",
           json::array({{{"weight", 100},
                         {"podAffinityTerm",
                          {{"topologyKey", "kubernetes.io/hostname"},
                           {"labelSelector", {{"matchLabels", tableSelector(name)}}}}}}})}}}}},
  };
  if (!spec.pod_template.tolerations.empty())
    pod_spec["tolerations"] = spec.pod_template.tolerations;
  if (!spec.pod_template.node_selector.empty())
    pod_spec["nodeSelector"] = spec.pod_template.node_selector;
  if (spec.pod_template.priority_class_name)
    pod_spec["priorityClassName"] = *spec.pod_template.priority_class_name;

  json claim_spec = {{"accessModes", json::array({"ReadWriteOnce"})},
                     {"resources", {{"requests", {{"storage", spec.storage.size}}}}}};
  if (spec.storage.storage_class_name)
    claim_spec["storageClassName"] = *spec.storage.storage_class_name;

  objects.stateful_set = {
      {"apiVersion", "apps/v1"},
      {"kind", "StatefulSet"},
      {"metadata", objectMeta(name, context)},
      {"spec",
       {{"replicas", spec.replicas},
        {"serviceName", headlessServiceName(name)},
        // Replicas do not depend on each other's order: start and stop them together.
        {"podManagementPolicy", "Parallel"},
        {"updateStrategy", {{"type", "RollingUpdate"}}},
        {"selector", {{"matchLabels", tableSelector(name)}}},
        // Scale-down keeps the PVCs (a replica's data), deletion of the table removes them.
        {"persistentVolumeClaimRetentionPolicy",
         {{"whenDeleted", "Delete"}, {"whenScaled", "Retain"}}},
        {"template",
         {{"metadata", {{"labels", pod_labels}, {"annotations", annotations}}},
          {"spec", pod_spec}}},
        {"volumeClaimTemplates",
         json::array({{{"apiVersion", "v1"},
                       {"kind", "PersistentVolumeClaim"},
                       {"metadata", {{"name", "data"}, {"labels", tableLabels(name)}}},
                       {"spec", claim_spec}}})}}}};

  objects.pod_disruption_budget = {
      {"apiVersion", "policy/v1"},
      {"kind", "PodDisruptionBudget"},
      {"metadata", objectMeta(name, context)},
      // One replica at a time: drains never take a table's quorum or its last copy of a part.
      {"spec", {{"maxUnavailable", 1}, {"selector", {{"matchLabels", tableSelector(name)}}}}}};

  if (spec.network_policy.enabled) {
    auto port = [](uint16_t number) {
      return json::array({{{"protocol", "TCP"}, {"port", number}}});
    };
    const NetworkPolicySettings& policy = spec.network_policy;
    // A podSelector alone selects in the policy's own namespace: the table's.
    const json api_from = policy.api_from.empty() ? json::array({{{"podSelector", json::object()}}})
                                                  : json(policy.api_from);
    json metrics = {{"ports", port(kMetricsPort)}};
    if (!policy.metrics_from.empty()) metrics["from"] = policy.metrics_from;
    objects.network_policy = {
        {"apiVersion", "networking.k8s.io/v1"},
        {"kind", "NetworkPolicy"},
        {"metadata", objectMeta(name, context)},
        {"spec",
         {{"podSelector", {{"matchLabels", tableSelector(name)}}},
          {"policyTypes", json::array({"Ingress"})},
          {"ingress",
           json::array(
               {// The replicas fetch parts from each other on the API's port.
                {{"from", json::array({{{"podSelector", {{"matchLabels", tableSelector(name)}}}}})},
                 {"ports", port(kHttpPort)}},
                {{"from", api_from}, {"ports", port(kHttpPort)}},
                metrics})}}}};
  }
  return objects;
}

}  // namespace rtable::controllers
