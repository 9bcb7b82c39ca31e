// LocalKubelet: plays the scheduler, the kubelet and a volume provisioner of one node for a real
// control plane (LocalControlPlane with controller_manager = true, or any apiserver reachable by
// a kubeconfig), so that Pods made by StatefulSets really run, as local processes
// (docs/local-kubelet.md).
//
// - Registers a Node (Ready, capacity, addresses 127.0.0.1) and keeps it alive the way kubelet
//   does: a Lease in kube-node-lease renewed every lease_renew_interval and the Ready
//   condition's heartbeat, so the node lifecycle controller never marks it NotReady.
// - Binds every unscheduled Pod to its node (pods/binding, like the default scheduler; affinity,
//   taints and resources are not looked at).
// - Provisions a PersistentVolume (a directory under the work dir) for each pending PVC,
//   pre-bound to it; kube-controller-manager's PV controller completes the binding.
// - Runs each container of each Pod bound to its node as a local process in its own mount, PID
//   and UTS namespaces (rtable-pod-sandbox): image -> local executable through `images`; env,
//   command/args with $(VAR) expansion; configMap, secret, emptyDir, downwardAPI and
//   persistentVolumeClaim volumes bind-mounted at their mountPaths; an /etc/hosts holding the DNS
//   names of every running pod of a headless Service; pod IP 127.0.0.N.
// - Reports status through pods/status (phase, IPs, conditions, container states), probes
//   readiness, liveness and startup (httpGet, tcpSocket, exec), restarts containers with kubelet's
//   backoff, and on deletion stops them (SIGTERM, grace, SIGKILL) and deletes the Pod with
//   gracePeriodSeconds=0 and a UID precondition.
//
// Lifetime: start() returns a running kubelet; destruction stops every container (SIGTERM, then
// SIGKILL after `shutdown_grace`) and its threads, leaving the Pods and the Node in the API as a
// stopped kubelet would. Every container process also dies with the process that owns the
// LocalKubelet (PR_SET_PDEATHSIG), and its mounts with it.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <expected>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rtable/operator/testing/pod_runtime_spec.h"

namespace rtable::op::testing {

struct LocalKubeletOptions {
  // The identity the kubelet acts as (an admin kubeconfig is simplest).
  std::filesystem::path kubeconfig;
  std::string node_name = "rtable-local-node";
  // Pod dirs, volumes, PV dirs, logs. Empty: a new dir under the system temp dir, removed on
  // destruction unless RTABLE_KEEP_TEST_DIRS is set or keepWorkDir() was called.
  std::filesystem::path work_dir;
  // Image name (exactly as in the pod spec) -> what runs. An image not in the map leaves the
  // container waiting with reason ErrImagePull (then ImagePullBackOff).
  std::map<std::string, LocalImage> images;
  // The container launcher; empty: the rtable-pod-sandbox built with this library.
  std::filesystem::path sandbox_binary;
  // Also keep the pods' DNS names in a marked block of this file (e.g. /etc/hosts, or a file a
  // host-side test bind-mounts), so processes outside the pods resolve them too. Empty: none.
  std::filesystem::path host_hosts_file;
  std::string cluster_domain = "cluster.local";

  // kubelet's container restart backoff: 10 s doubling to 5 min, reset after 10 min of running.
  std::chrono::milliseconds restart_backoff_initial{10'000};
  std::chrono::milliseconds restart_backoff_max{300'000};
  std::chrono::milliseconds restart_backoff_reset{600'000};
  // Upper bound on a pod's termination grace period (its terminationGracePeriodSeconds or the
  // deletion's gracePeriodSeconds, whichever applies).
  std::chrono::milliseconds max_termination_grace{30'000};
  // Grace for containers still running when the LocalKubelet is destroyed.
  std::chrono::milliseconds shutdown_grace{2'000};
  // How often mounted ConfigMaps and Secrets are compared with the API objects (kubelet: its
  // sync period of about a minute plus the cache TTL).
  std::chrono::milliseconds volume_refresh_interval{2'000};
  // kubelet's node lease: 40 s duration, renewed every 10 s; the Ready condition's heartbeat is
  // posted every node_status_interval (kubelet: nodeStatusReportFrequency, 5 min).
  std::chrono::seconds lease_duration{40};
  std::chrono::milliseconds lease_renew_interval{10'000};
  std::chrono::milliseconds node_status_interval{60'000};
  // Node capacity as reported (nothing is enforced).
  std::string capacity_cpu = "8";
  std::string capacity_memory = "32Gi";
  int capacity_pods = 110;
};

// Where a container of a running pod is, for tests (kill -9, logs).
struct ContainerInfo {
  bool running = false;
  pid_t pid = -1;  // the container's main process (PID 1 inside its namespace); -1 if not running
  int restart_count = 0;
  std::filesystem::path log_file;  // stdout and stderr of every run, appended
};

class LocalKubelet {
 public:
  static std::expected<LocalKubelet, std::string> start(LocalKubeletOptions options);

  LocalKubelet(LocalKubelet&&) noexcept;
  LocalKubelet& operator=(LocalKubelet&&) noexcept;
  ~LocalKubelet();

  const std::string& nodeName() const;
  const std::filesystem::path& workDir() const;
  void keepWorkDir();

  // The container of pod ns/name as run now; nullopt when no such pod runs here.
  std::optional<ContainerInfo> container(const std::string& ns, const std::string& pod,
                                         const std::string& container) const;
  // Where a container's log goes (also for pods that are gone); the file may not exist yet.
  std::filesystem::path logFile(const std::string& ns, const std::string& pod,
                                const std::string& container) const;
  // The directory behind a PVC's PersistentVolume (exists once provisioned).
  std::filesystem::path volumeDir(const std::string& ns, const std::string& claim) const;
  // Pods whose sandbox is up (an IP assigned), and container processes running now.
  int runningPods() const;
  int runningContainers() const;
  // The shared hosts content last written (for debugging a name that does not resolve).
  std::vector<HostsEntry> hostsEntries() const;

 private:
  struct State;
  explicit LocalKubelet(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

// The rtable-pod-sandbox this library was built with.
std::filesystem::path defaultPodSandboxBinary();

}  // namespace rtable::op::testing
