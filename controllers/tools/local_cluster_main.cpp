// rtable-local-cluster: the whole stack on one machine, nothing to install by hand: a local
// kube-apiserver + kube-controller-manager (built from Go modules, cached), the CRDs, a local
// ZooKeeper, LocalKubelet running the replica pods as rtable-core processes on 127.0.0.N, and
// rtable-operator. It applies a 3-replica ReplicatedTable with kubectl, waits for 3/3, inserts a
// row through one replica, reads it back on all three, prints `kubectl get replicatedtables`.
// Then the table swap (issue 20): writers insert continuously, retrying each block with its
// insert_deduplication_token; generation 1's log counter is raised to just under the headroom
// threshold; the operator swaps the table to generation 2 while the rows keep arriving; every
// replica ends with exactly the acknowledged rows, each once; rtable-inspect shows the headroom
// before and after. Then backup and restore (issue 21): a ClusterBackup of the table into a
// directory every replica sees, and a new table restored from it (spec.restoreFrom) whose three
// replicas hold exactly the acknowledged rows. Without --keep-running it then deletes the tables
// and stops everything.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "rtable/common/base64.h"
#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/operator/testing/local_control_plane.h"
#include "rtable/operator/testing/local_kubelet.h"
#include "rtable/replication_core/sequential_counter.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/testing/retrying_writers.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using rtable::common::testing::httpRequest;
using rtable::common::testing::Subprocess;
using rtable::common::testing::TestStatus;
using rtable::core::SequentialCounter;
using rtable::core::testing::LocalZooKeeper;
using rtable::core::testing::ReplicaEndpoint;
using rtable::core::testing::RetryingWriters;
using rtable::core::testing::RetryingWritersOptions;
using rtable::op::testing::LocalControlPlane;
using rtable::op::testing::LocalImage;
using rtable::op::testing::LocalKubelet;
using rtable::op::testing::LocalKubeletOptions;

constexpr const char* kUsage =
    "usage: rtable-local-cluster [--keep-running]\n"
    "Starts a local Kubernetes control plane, ZooKeeper, a test kubelet and rtable-operator, "
    "applies a\n"
    "3-replica ReplicatedTable, inserts a row on one replica and reads it on all three, then\n"
    "swaps the table to ZooKeeper generation 2 while writers keep inserting (issue 20), backs it\n"
    "up with a ClusterBackup and restores the backup into a new table (issue 21).\n"
    "--keep-running leaves it all up (Ctrl-C to stop) and prints how to point kubectl at it.\n";
constexpr const char* kImage = "rtable/rtable:local";
constexpr const char* kPods[] = {"events-0", "events-1", "events-2"};
// The table's spec.headroom.thresholdPercent (the CRD's default, written out in the manifest), and
// the headroom generation 1's log is left with: under the threshold, far from stuck.
constexpr int kThresholdPercent = 5;
constexpr double kPushedHeadroom = 0.045;

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

std::string kubectlOutput(LocalControlPlane& plane, const std::vector<std::string>& args) {
  auto result = plane.kubectl(args);
  if (!result) return "(kubectl: " + result.error() + ")";
  return result->out + result->err;
}

// The table's status as the operator last wrote it (empty when unreadable).
json tableStatus(LocalControlPlane& plane) {
  auto out = plane.kubectl({"get", "replicatedtable/events", "-o", "json"});
  if (!out || out->exit_code != 0) return json::object();
  const json table = json::parse(out->out, nullptr, /*allow_exceptions=*/false);
  return table.is_object() && table.contains("status") ? table["status"] : json::object();
}

// `object`'s field at `pointer`; null when absent.
json field(const json& object, const std::string& pointer) {
  const json::json_pointer at(pointer);
  return object.contains(at) ? object.at(at) : json();
}

std::string podIp(LocalControlPlane& plane, const std::string& pod) {
  auto out = plane.kubectl({"get", "pod", pod, "-o", "jsonpath={.status.podIP}"});
  return out ? out->out : std::string();
}

// A key of a Secret in the default namespace, decoded; "" when it cannot be read.
std::string secretValue(LocalControlPlane& plane, const std::string& secret,
                        const std::string& key) {
  auto out = plane.kubectl({"get", "secret", secret, "-o", "jsonpath={.data." + key + "}"});
  if (!out) return "";
  auto decoded = rtable::common::base64Decode(out->out);
  return decoded ? *decoded : "";
}

// The header that authorizes writes to a table's replicas: the first token of the Secret the
// operator made for its API.
std::string apiHeaders(LocalControlPlane& plane, const std::string& table) {
  const std::string tokens = secretValue(plane, table + "-api-tokens", "tokens");
  return "Authorization: Bearer " + tokens.substr(0, tokens.find('\n')) + "\r\n";
}

ReplicaEndpoint endpoint(LocalControlPlane& plane, const std::string& pod,
                         const std::string& table) {
  return ReplicaEndpoint{podIp(plane, pod), 8123, apiHeaders(plane, table)};
}

// The table's ZooKeeper identity as rtable-inspect reads it: `username` and `password` files in
// a directory, from the Secret the operator made (as `kubectl get secret` would give them).
std::filesystem::path zookeeperCredentials(LocalControlPlane& plane, const std::string& table) {
  const std::filesystem::path dir = plane.workDir() / (table + "-zookeeper");
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
  for (const char* key : {"username", "password"}) {
    std::ofstream(dir / key) << secretValue(plane, table + "-zookeeper", key);
  }
  return dir;
}

// Prints `rtable-inspect` over the table's ZooKeeper tree; an error unless it ran (exit 0: every
// table above the threshold, 1: some below it).
TestStatus printInspect(LocalControlPlane& plane, const LocalZooKeeper& zookeeper,
                        const std::string& root, const std::string& why) {
  const std::filesystem::path credentials = zookeeperCredentials(plane, "events");
  std::printf("$ rtable-inspect --zookeeper %s --root %s --zookeeper-credentials %s    # %s\n",
              zookeeper.connectString().c_str(), root.c_str(), credentials.c_str(), why.c_str());
  auto inspected = rtable::common::testing::runCommand(
      {RTABLE_INSPECT_BINARY, "--zookeeper", zookeeper.connectString(), "--root", root,
       "--zookeeper-credentials", credentials.string()},
      30s);
  if (!inspected) return std::unexpected("rtable-inspect: " + inspected.error());
  std::printf("%s%s(exit %d)\n", inspected->out.c_str(), inspected->err.c_str(),
              inspected->exit_code);
  if (inspected->exit_code != 0 && inspected->exit_code != 1) {
    return std::unexpected(fmt::format("rtable-inspect exited {}", inspected->exit_code));
  }
  return {};
}

// What the status says of the headroom and the swap, in one line: printed whenever it changes.
std::string swapProgress(const json& status) {
  std::string headroom_low;
  for (const json& condition : status.value("conditions", json::array())) {
    if (condition.value("type", "") == "HeadroomLow") {
      headroom_low = condition.value("status", "") + " " + condition.value("reason", "");
    }
  }
  std::string line = fmt::format(
      "generation {}, headroom {} ({}), HeadroomLow {}", field(status, "/activeGeneration").dump(),
      status.value("headroom", "?"), status.value("headroomCounter", "?"), headroom_low);
  const json recovery = status.value("recovery", json::object());
  if (recovery.empty()) return line;
  line += fmt::format("; swap {} -> {}: {}", field(recovery, "/fromGeneration").dump(),
                      field(recovery, "/toGeneration").dump(),
                      recovery.value("result", "step " + recovery.value("step", "?")));
  if (!recovery.contains("result") && !recovery.value("message", "").empty()) {
    line += " (" + recovery.value("message", "") + ")";
  }
  return line;
}

// The table swap under load. The table already holds the rows `acknowledged`.
TestStatus demonstrateSwap(LocalControlPlane& plane, LocalZooKeeper& zookeeper,
                           std::set<uint64_t>& acknowledged) {
  const auto started = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  const std::string root = tableStatus(plane).value("zookeeperPath", "");
  if (root.empty()) return std::unexpected("the table's status has no zookeeperPath");

  std::printf(
      "== writers: 2 clients insert blocks of 1 and 10 rows continuously, each block with its "
      "insert_deduplication_token, retried on the next replica until acknowledged\n");
  RetryingWritersOptions writer_options;
  for (const char* pod : kPods) {
    writer_options.replicas.push_back(endpoint(plane, pod, "events"));
  }
  writer_options.row = rtable::core::testing::idRow;
  writer_options.first_id = *acknowledged.rbegin() + 1;
  writer_options.block_sizes = {1, 10};
  writer_options.writers = 2;
  writer_options.pause_between_blocks = 100ms;
  RetryingWriters writers(writer_options);
  writers.start();
  // A failure stops the writers at once, not after their default 120 s of retries.
  auto giveUp = [&](const std::string& message) {
    writers.stop(1s);
    return std::unexpected(message);
  };
  if (!eventually([&] { return writers.acknowledgedBlocks() >= 10; }, 60s)) {
    return giveUp(fmt::format("the writers' inserts do not succeed; errors met: {}",
                              fmt::join(writers.errorCodes(), ", ")));
  }
  if (auto printed = printInspect(plane, zookeeper, root, "headroom before"); !printed)
    return giveUp(printed.error());

  const auto counter = static_cast<int32_t>(SequentialCounter::kNameSpace -
                                            kPushedHeadroom * SequentialCounter::kNameSpace);
  std::printf(
      "== generation 1's log counter raised to %d (%.1f%% headroom, under the table's %d%% "
      "threshold): ZooKeeper stopped, the counter set in its snapshot, ZooKeeper started\n",
      counter, kPushedHeadroom * 100, kThresholdPercent);
  if (auto raised = zookeeper.setSequentialCounter(root + "/1/log", counter); !raised) {
    return giveUp("raising the log counter: " + raised.error());
  }
  if (auto printed = printInspect(plane, zookeeper, root, "pushed near the limit"); !printed) {
    return giveUp(printed.error());
  }

  std::printf(
      "== the operator swaps the table to generation 2 (autoRecover; it reads the counters every "
      "15 s) while the writers go on\n");
  const auto pushed = std::chrono::steady_clock::now();
  std::string last;
  json status;
  const bool swapped = eventually(
      [&] {
        status = tableStatus(plane);
        if (const std::string line = swapProgress(status); line != last) {
          std::printf(
              "  %5.1f s  %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - pushed).count(),
              line.c_str());
          std::fflush(stdout);
          last = line;
        }
        const std::string result = field(status, "/recovery/result").is_string()
                                       ? field(status, "/recovery/result").get<std::string>()
                                       : "";
        return result == "Aborted" ||
               (result == "Succeeded" && status.value("activeGeneration", 0) == 2);
      },
      180s);
  if (!swapped || field(status, "/recovery/result") != "Succeeded") {
    return giveUp(fmt::format("the swap did not succeed within 180 s: {}", last));
  }
  auto seconds = [&](const std::string& pointer) {
    const json value = field(status, pointer);
    return value.is_number() ? fmt::format("{:.1f} s", value.get<double>()) : "(not reported)";
  };
  std::printf("swap took %s, inserts paused for %s (status.recovery)\n",
              seconds("/recovery/durationSeconds").c_str(),
              seconds("/recovery/writePauseSeconds").c_str());

  const std::size_t blocks_at_switch = writers.acknowledgedBlocks();
  if (!eventually([&] { return writers.acknowledgedBlocks() >= blocks_at_switch + 10; }, 60s)) {
    return giveUp(fmt::format("inserts do not succeed in generation 2; errors met: {}",
                              fmt::join(writers.errorCodes(), ", ")));
  }
  if (!writers.stop(60s)) return std::unexpected("a block was never acknowledged");
  for (uint64_t id : writers.acknowledged()) acknowledged.insert(id);
  std::printf(
      "== writers stopped: %zu blocks acknowledged after %zu retries (errors met: %s); every "
      "replica holds exactly the %zu acknowledged rows, each once:\n",
      writers.acknowledgedBlocks(), writers.retries(),
      fmt::format("{}", fmt::join(writers.errorCodes(), ", ")).c_str(), acknowledged.size());
  const std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
  for (const char* pod : kPods) {
    if (auto holds =
            rtable::core::testing::checkReplicaHolds(endpoint(plane, pod, "events"), 2, expected);
        !holds) {
      return std::unexpected(std::string(pod) + ": " + holds.error());
    }
    std::printf("%s: generation 2, %zu rows, ids as acknowledged\n", pod, expected.size());
  }
  std::printf("== kubectl get replicatedtables\n%s",
              kubectlOutput(plane, {"get", "replicatedtables"}).c_str());
  if (auto printed = printInspect(plane, zookeeper, root, "headroom after"); !printed)
    return printed;
  std::printf("== the swap demo took %.0f s\n", since());
  return {};
}

// A 3-replica table of core::testing::idRow (the demo writers' rows) named `name`; `extra` is
// more of its spec (indented lines).
// Where the replicas see the backup directory: a shared file system at the same path on every
// replica (a hostPath volume of backupsDir() here, an NFS share in a cluster).
constexpr const char* kBackupsMount = "/mnt/rtable-backups";

// The backup directory on this machine, writable by the replicas' user (10001).
std::filesystem::path backupsDir(LocalControlPlane& plane) {
  const std::filesystem::path dir = plane.workDir() / "backups";
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::all);
  return dir;
}

std::string tableManifest(const std::string& name, const std::string& zookeeper,
                          const std::string& extra, const std::filesystem::path& backups) {
  return fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ReplicatedTable
metadata: {{name: {}, namespace: default}}
spec:
  table: events
  columns:
    - {{name: id, type: UInt64}}
    - {{name: d, type: Date}}
    - {{name: user, type: String}}
  partitionBy: toYYYYMM(d)
  orderBy: [id]
  replicas: 3
  zookeeper: {{connect: "{}"}}
  storage: {{size: 1Gi}}
  podTemplate:
    volumes:
      - {{name: backups, hostPath: {{path: "{}", type: Directory}}}}
    volumeMounts:
      - {{name: backups, mountPath: "{}"}}
{})",
                     name, zookeeper, backups.string(), kBackupsMount, extra);
}

// The Restored condition of table `name`, or null.
json restoredCondition(LocalControlPlane& plane, const std::string& name) {
  auto object = plane.kubectl({"get", "replicatedtable", name, "-o", "json"});
  if (!object) return json();
  const json table = json::parse(object->out, nullptr, /*allow_exceptions=*/false);
  for (const auto& condition : field(table, "/status/conditions")) {
    if (condition.value("type", "") == "Restored") return condition;
  }
  return json();
}

// A ClusterBackup of the table (which holds exactly `acknowledged`), then a new table restored
// from it.
TestStatus demonstrateBackupAndRestore(LocalControlPlane& plane, LocalZooKeeper& zookeeper,
                                       const std::set<uint64_t>& acknowledged) {
  const auto started = std::chrono::steady_clock::now();
  const std::filesystem::path directory = backupsDir(plane);  // the mount every replica has
  const std::string backup = fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ClusterBackup
metadata: {{name: events-backup, namespace: default}}
spec:
  table: events
  destination:
    filesystem: {{path: "{}"}}
)",
                                         kBackupsMount);
  std::printf("== backup: kubectl apply -f -\n%s", backup.c_str());
  if (auto applied = plane.apply(backup); !applied) return std::unexpected(applied.error());
  std::string phase;
  if (!eventually(
          [&] {
            auto got = plane.kubectl(
                {"get", "clusterbackup", "events-backup", "-o", "jsonpath={.status.phase}"});
            phase = got ? got->out : "";
            return phase == "Completed" || phase == "Failed";
          },
          180s) ||
      phase != "Completed") {
    return std::unexpected("the backup did not complete in 180 s: phase '" + phase + "'");
  }
  std::printf("== kubectl get clusterbackups -o wide\n%s",
              kubectlOutput(plane, {"get", "clusterbackups", "-o", "wide"}).c_str());

  const std::string restored = tableManifest("events-restored", zookeeper.connectString(),
                                             "  restoreFrom: {backup: events-backup}\n", directory);
  std::printf("== restore into a new table: kubectl apply -f -\n%s", restored.c_str());
  if (auto applied = plane.apply(restored); !applied) return std::unexpected(applied.error());
  std::string last;
  json condition;
  const bool ended = eventually(
      [&] {
        condition = restoredCondition(plane, "events-restored");
        const std::string line = condition.is_object() ? condition.value("reason", "") + ": " +
                                                             condition.value("message", "")
                                                       : "(no Restored condition yet)";
        if (line != last) {
          std::printf("  %s\n", line.c_str());
          std::fflush(stdout);
          last = line;
        }
        return condition.is_object() && (condition.value("status", "") == "True" ||
                                         condition.value("reason", "") == "RestoreFailed");
      },
      300s);
  if (!ended || condition.value("status", "") != "True") {
    return std::unexpected("the restore did not succeed in 300 s: " + last);
  }
  const std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
  for (const char* pod : {"events-restored-0", "events-restored-1", "events-restored-2"}) {
    std::string answer;
    if (!eventually(
            [&] {
              auto synced = httpRequest(podIp(plane, pod), 8123, "POST", "/sync?timeout_seconds=30",
                                        "", 40s, apiHeaders(plane, "events-restored"));
              answer = synced ? synced->body : synced.error();
              return synced && synced->status == 200;
            },
            120s)) {
      return std::unexpected(std::string(pod) + " did not catch up: " + answer);
    }
    if (auto holds = rtable::core::testing::checkReplicaHolds(
            endpoint(plane, pod, "events-restored"), 1, expected);
        !holds) {
      return std::unexpected(std::string(pod) + ": " + holds.error());
    }
    std::printf("%s: %zu rows, ids as acknowledged in the backed-up table\n", pod, expected.size());
  }
  std::printf("== kubectl get replicatedtables\n%s",
              kubectlOutput(plane, {"get", "replicatedtables"}).c_str());
  std::printf("== the backup and restore demo took %.0f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return {};
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
  auto run = [&](const std::vector<std::string>& args) { return kubectlOutput(*plane, args); };
  std::printf("%s", run({"apply", "-f", RTABLE_CRDS_DIR}).c_str());
  run({"wait", "--for=condition=Established", "crd/replicatedtables.rtable.io",
       "crd/clusterbackups.rtable.io", "--timeout=60s"});

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
  // On a failure: the logs stay for a look.
  auto keepLogs = [&] {
    plane->keepWorkDir();
    kubelet->keepWorkDir();
    return fmt::format("operator log: {}, pod logs under {}",
                       (plane->workDir() / "rtable-operator.log").string(),
                       kubelet->workDir().string());
  };

  // The table of core::testing::idRow, which the swap demo's writers insert.
  const std::string manifest = tableManifest(
      "events", (*zookeeper)->connectString(),
      fmt::format("  headroom: {{thresholdPercent: {}, autoRecover: true}}\n", kThresholdPercent),
      backupsDir(*plane));
  std::printf("== kubectl apply -f -\n%s", manifest.c_str());
  if (auto applied = plane->apply(manifest); !applied)
    return fail("kubectl apply: " + applied.error());

  if (!eventually([&] { return tableStatus(*plane).value("readyReplicas", 0) == 3; }, 300s)) {
    std::printf("%s", run({"get", "replicatedtables,statefulsets,pods", "-o", "wide"}).c_str());
    return fail("the table did not become 3/3 Ready in 300 s; " + keepLogs());
  }
  const std::string row = R"({"id":0,"d":"2026-12-03","user":"ada"})";
  std::printf("== insert on events-0 (%s): %s\n", podIp(*plane, "events-0").c_str(), row.c_str());
  // Writes need the table's bearer token, from the Secret the operator made for it.
  std::printf(
      "== its API token: kubectl get secret events-api-tokens -o jsonpath={.data.tokens} "
      "| base64 -d\n");
  auto inserted = httpRequest(podIp(*plane, "events-0"), 8123, "POST", "/insert?format=JSONEachRow",
                              row + "\n", 30s, apiHeaders(*plane, "events"));
  if (!inserted || inserted->status != 200) {
    return fail("insert: " + (inserted ? inserted->body : inserted.error()));
  }
  std::printf("%s", inserted->body.c_str());
  for (const char* pod : kPods) {
    std::string body;
    eventually(
        [&] {
          auto selected =
              httpRequest(podIp(*plane, pod), 8123, "GET", "/select?format=JSONEachRow", "", 5s);
          body = selected && selected->status == 200 ? selected->body : "";
          return !body.empty();
        },
        60s);
    if (body.empty()) return fail(std::string("the row did not reach ") + pod);
    std::printf("select on %s (%s): %s", pod, podIp(*plane, pod).c_str(), body.c_str());
  }
  // The operator reads the log from ZooKeeper every 15 s: wait for the insert to show.
  eventually(
      [&] {
        const json index = tableStatus(*plane).value("logMaxIndex", json());
        return index.is_number() && index.get<int64_t>() >= 0;
      },
      30s);
  std::printf("== kubectl get replicatedtables\n%s", run({"get", "replicatedtables"}).c_str());
  std::printf("== kubectl get pods -o wide\n%s", run({"get", "pods", "-o", "wide"}).c_str());
  std::printf("== up in %.0f s\n", elapsed());

  std::set<uint64_t> acknowledged = {0};
  if (auto demonstrated = demonstrateSwap(*plane, **zookeeper, acknowledged); !demonstrated) {
    std::printf("%s", run({"get", "replicatedtables", "-o", "yaml"}).c_str());
    return fail("table swap: " + demonstrated.error() + "; " + keepLogs());
  }
  if (auto demonstrated = demonstrateBackupAndRestore(*plane, **zookeeper, acknowledged);
      !demonstrated) {
    std::printf("%s", run({"get", "replicatedtables,clusterbackups", "-o", "yaml"}).c_str());
    return fail("backup and restore: " + demonstrated.error() + "; " + keepLogs());
  }

  if (keep_running) {
    std::printf(
        "Running. Try:\n  export KUBECONFIG=%s\n  %s/kubectl get replicatedtables\n"
        "Ctrl-C stops everything.\n",
        plane->kubeconfigPath().c_str(), plane->binDir().c_str());
    std::fflush(stdout);
    while (!interrupted) std::this_thread::sleep_for(200ms);
  }
  std::printf(
      "== kubectl delete replicatedtables events events-restored (the operator removes their "
      "ZooKeeper trees)\n%s",
      run({"delete", "replicatedtable/events", "replicatedtable/events-restored", "--timeout=120s"})
          .c_str());
  operator_process->stop(5s);
  return 0;
}
