// A real Kubernetes control plane on loopback for the operator's tests (docs/control-plane.md):
// etcd, kube-apiserver and optionally kube-controller-manager, from the binaries that
// e2e/build-control-plane.sh builds. There is no kubelet: Pods are created, never run, unless a
// LocalKubelet (local_kubelet.h) runs them.
//
// One LocalControlPlane owns its processes and its work dir; both go with it (and the processes
// with the test process, see Subprocess). Not thread-safe: use it from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "rtable/common/testing/subprocess.h"

namespace rtable::op::testing {

using common::testing::CommandResult;
using common::testing::TestStatus;

struct LocalControlPlaneOptions {
  // Where certificates, kubeconfigs, etcd's data and the logs go. Empty: a new folder under the
  // system temp dir, removed on destruction unless RTABLE_KEEP_TEST_DIRS is set or keepWorkDir()
  // was called.
  std::filesystem::path work_dir;
  // Holds kube-apiserver, kube-controller-manager, kubectl and etcd. Empty: the environment
  // variable RTABLE_CONTROL_PLANE_BIN_DIR, else the cache dir the build was configured with.
  std::filesystem::path bin_dir;
  // Also run kube-controller-manager (StatefulSets become Pods, garbage collection, ...).
  bool controller_manager = false;
  // How long etcd and kube-apiserver may take to become ready, each.
  std::chrono::seconds start_timeout{120};
  // Appended to kube-apiserver's command line (a later flag wins), e.g. "--feature-gates=...".
  std::vector<std::string> extra_apiserver_flags;
};

class LocalControlPlane {
 public:
  static std::expected<LocalControlPlane, std::string> start(LocalControlPlaneOptions options = {});

  LocalControlPlane(LocalControlPlane&&) noexcept;
  LocalControlPlane& operator=(LocalControlPlane&&) noexcept;
  ~LocalControlPlane();

  // An admin identity (client certificate with O=system:masters), certificate data inline.
  const std::filesystem::path& kubeconfigPath() const;
  std::string serverUrl() const;  // https://127.0.0.1:<port>
  std::string etcdUrl() const;    // http://127.0.0.1:<port>
  const std::filesystem::path& workDir() const;
  const std::filesystem::path& binDir() const;
  // The directory stays after destruction (for a failed test's logs).
  void keepWorkDir();

  // Runs the cached kubectl with the admin kubeconfig, or with `kubeconfig`.
  std::expected<CommandResult, std::string> kubectl(
      const std::vector<std::string>& args,
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  std::expected<CommandResult, std::string> kubectlAs(
      const std::filesystem::path& kubeconfig, const std::vector<std::string>& args,
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  // kubectl as admin that must succeed: a command that exits non-zero is an error naming it and
  // quoting its output (kubectl() itself only fails when kubectl could not be run).
  TestStatus kubectlOk(const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  // `kubectl apply` of a YAML or JSON manifest as admin; an error includes kubectl's output.
  TestStatus apply(const std::string& manifest) const;

  // Stops kube-apiserver (SIGTERM, graceful) and starts it again on the same port, certificates
  // and etcd, for watch-resume tests. startApiServer() returns once /readyz answers ok.
  TestStatus stopApiServer();
  TestStatus startApiServer();
  bool apiServerRunning() const;

  // Compacts etcd at its current revision, the way kube-apiserver's own compactor does (it
  // records the revision in etcd's `compact_rev_key` first, which the apiserver watches to drop
  // watch-cache snapshots older than it). Returns the compacted revision: reads of an older
  // resourceVersion that reach etcd then fail with 410 Gone. The apiserver notices within ~16 s
  // (a 1 s watch retry plus its 15 s cache compaction poll).
  std::expected<int64_t, std::string> compactEtcd() const;

  // Creates namespace `ns`, ServiceAccount `ns/name` and a ClusterRoleBinding of it to the
  // existing ClusterRole `cluster_role` (none when empty: the rights come from elsewhere, a
  // chart's RoleBinding), and writes a kubeconfig that authenticates with a token from `kubectl
  // create token`: a restricted identity for RBAC tests. Idempotent.
  std::expected<std::filesystem::path, std::string> serviceAccountKubeconfig(
      const std::string& ns, const std::string& name, const std::string& cluster_role) const;

 private:
  struct State;
  explicit LocalControlPlane(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The Kubernetes version the build expects the binaries to be (e2e/build-control-plane.sh's
// KUBE_VERSION), e.g. "v1.34.4".
std::string controlPlaneVersion();

}  // namespace rtable::op::testing
