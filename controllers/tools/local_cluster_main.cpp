// rtable-local-cluster: the whole stack on one machine, nothing to install by hand: a local
// kube-apiserver + kube-controller-manager (built from Go modules, cached), the CRDs, a local
// ZooKeeper, LocalKubelet running the replica pods as rtable-core processes on 127.0.0.N, and
// rtable-operator. It applies a 3-replica ReplicatedTable with kubectl, waits for 3/3, inserts a
// row through one replica, reads it back on all three, prints `kubectl get replicatedtables`, and
// (without --keep-running) deletes the table and stops everything.
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/operator/testing/local_control_plane.h"
#include "rtable/operator/testing/local_kubelet.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using rtable::common::testing::httpRequest;
using rtable::common::testing::Subprocess;
using rtable::core::testing::LocalZooKeeper;
using rtable::op::testing::LocalControlPlane;
using rtable::op::testing::LocalImage;
using rtable::op::testing::LocalKubelet;
using rtable::op::testing::LocalKubeletOptions;

constexpr const char* kUsage =
    "usage: rtable-local-cluster [--keep-running]\n"
    "Starts a local Kubernetes control plane, ZooKeeper, a test kubelet and rtable-operator, "
    "applies a\n"
    "3-replica ReplicatedTable, inserts a row on one replica and reads it on all three.\n"
    "--keep-running leaves it all up (Ctrl-C to stop) and prints how to point kubectl at it.\n";
constexpr const char* kImage = "rtable/rtable:local";

volatile sig_atomic_t interrupted = 0;
void onSignal(int) {
  interrupted = 1;
}

bool eventually(const std::function<bool()>& check, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline && !interrupted) {
    if (check()) return true;
    std::this_thread::sleep_for(500ms);
  }
  return check();
}

int fail(const std::string& message) {
  std::fprintf(stderr, "rtable-local-cluster: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool keep_running = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--keep-running") {
      keep_running = true;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "rtable-local-cluster: unknown argument %s\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  signal(SIGINT, onSignal);
  signal(SIGTERM, onSignal);
  rtable::core::ZooKeeperClient::silenceLibraryLog();
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };

  std::printf("== control plane (kube-apiserver, kube-controller-manager, etcd)\n");
  rtable::op::testing::LocalControlPlaneOptions plane_options;
  plane_options.controller_manager = true;
  auto plane = LocalControlPlane::start(plane_options);
  if (!plane) return fail("control plane: " + plane.error());
  auto run = [&](const std::vector<std::string>& args) -> std::string {
    auto result = plane->kubectl(args);
    if (!result) return "(kubectl: " + result.error() + ")";
    return result->out + result->err;
  };
  std::printf("%s", run({"apply", "-f", RTABLE_CRDS_DIR}).c_str());
  run({"wait", "--for=condition=Established", "crd/replicatedtables.rtable.io", "--timeout=60s"});

  std::printf("== ZooKeeper\n");
  auto zookeeper = LocalZooKeeper::start();
  if (!zookeeper) return fail("ZooKeeper: " + zookeeper.error());
  std::printf("ZooKeeper at %s\n", (*zookeeper)->connectString().c_str());

  std::printf("== test kubelet (pods run as local processes on 127.0.0.N)\n");
  LocalKubeletOptions kubelet_options;
  kubelet_options.kubeconfig = plane->kubeconfigPath();
  kubelet_options.images[kImage] = LocalImage{{RTABLE_CORE_BINARY}, {}, {}};
  kubelet_options.host_hosts_file = plane->workDir() / "host-hosts";
  {
    std::ofstream(kubelet_options.host_hosts_file) << "127.0.0.1\tlocalhost\n";
  }
  auto kubelet = LocalKubelet::start(kubelet_options);
  if (!kubelet) return fail("kubelet: " + kubelet.error());

  std::printf("== rtable-operator (log: %s)\n", (plane->workDir() / "rtable-operator.log").c_str());
  ::setenv("RTABLE_CORE_IMAGE", kImage, 1);
  auto operator_process = Subprocess::start(
      {RTABLE_OPERATOR_BINARY, "--kubeconfig", plane->kubeconfigPath().string(),
       "--leader-election-namespace=kube-system", "--health-probe-bind-address=127.0.0.1:0",
       "--metrics-bind-address=127.0.0.1:0"},
      plane->workDir() / "rtable-operator.log");
  if (!operator_process) return fail("rtable-operator: " + operator_process.error());

  const std::string manifest = fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ReplicatedTable
metadata: {{name: events, namespace: default}}
spec:
  table: events
  columns:
    - {{name: d, type: Date}}
    - {{name: user, type: String}}
    - {{name: clicks, type: UInt32}}
  partitionBy: toYYYYMM(d)
  orderBy: [user, d]
  replicas: 3
  zookeeper: {{connect: "{}"}}
  storage: {{size: 1Gi}}
)",
                                           (*zookeeper)->connectString());
  std::printf("== kubectl apply -f -\n%s", manifest.c_str());
  if (auto applied = plane->apply(manifest); !applied)
    return fail("kubectl apply: " + applied.error());

  auto status = [&](const std::string& pointer) {
    auto out = plane->kubectl({"get", "replicatedtable/events", "-o", "json"});
    if (!out || out->exit_code != 0) return json();
    const json table = json::parse(out->out, nullptr, false);
    return table.is_object() && table.contains(json::json_pointer(pointer))
               ? table.at(json::json_pointer(pointer))
               : json();
  };
  if (!eventually([&] { return status("/status/readyReplicas") == 3; }, 300s)) {
    std::printf("%s", run({"get", "replicatedtables,statefulsets,pods", "-o", "wide"}).c_str());
    return fail("the table did not become 3/3 Ready in 300 s; operator log: " +
                (plane->workDir() / "rtable-operator.log").string());
  }
  auto podIp = [&](const std::string& pod) {
    auto out = plane->kubectl({"get", "pod", pod, "-o", "jsonpath={.status.podIP}"});
    return out ? out->out : std::string();
  };
  const std::string row = R"({"d":"2026-12-03","user":"ada","clicks":3})";
  std::printf("== insert on events-0 (%s): %s\n", podIp("events-0").c_str(), row.c_str());
  auto inserted =
      httpRequest(podIp("events-0"), 8123, "POST", "/insert?format=JSONEachRow", row + "\n");
  if (!inserted || inserted->status != 200) {
    return fail("insert: " + (inserted ? inserted->body : inserted.error()));
  }
  std::printf("%s", inserted->body.c_str());
  for (const char* pod : {"events-0", "events-1", "events-2"}) {
    std::string body;
    eventually(
        [&] {
          auto selected =
              httpRequest(podIp(pod), 8123, "GET", "/select?format=JSONEachRow", "", 5s);
          body = selected && selected->status == 200 ? selected->body : "";
          return !body.empty();
        },
        60s);
    if (body.empty()) return fail(std::string("the row did not reach ") + pod);
    std::printf("select on %s (%s): %s", pod, podIp(pod).c_str(), body.c_str());
  }
  // The operator reads the log from ZooKeeper every 15 s: wait for the insert to show.
  eventually(
      [&] {
        return status("/status/logMaxIndex").is_number() &&
               status("/status/logMaxIndex").get<int64_t>() >= 0;
      },
      30s);
  std::printf("== kubectl get replicatedtables\n%s", run({"get", "replicatedtables"}).c_str());
  std::printf("== kubectl get pods -o wide\n%s", run({"get", "pods", "-o", "wide"}).c_str());
  std::printf("== up in %.0f s\n", elapsed());

  if (keep_running) {
    std::printf(
        "Running. Try:\n  export KUBECONFIG=%s\n  %s/kubectl get replicatedtables\n"
        "Ctrl-C stops everything.\n",
        plane->kubeconfigPath().c_str(), plane->binDir().c_str());
    std::fflush(stdout);
    while (!interrupted) std::this_thread::sleep_for(200ms);
  }
  std::printf(
      "== kubectl delete replicatedtable events (the operator removes its ZooKeeper tree)\n%s",
      run({"delete", "replicatedtable/events", "--timeout=120s"}).c_str());
  operator_process->stop(5s);
  return 0;
}
