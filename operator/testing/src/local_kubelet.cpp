#include "rtable/operator/testing/local_kubelet.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "rtable/common/rfc3339.h"
#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/informer.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/testing/local_control_plane.h"
#include "rtable/operator/testing/sandbox_process.h"

namespace rtable::op::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using SteadyTime = std::chrono::steady_clock::time_point;
using std::chrono::steady_clock;

const ResourceType kPods = resources::pods();
const ResourceType kPvcs = resources::persistentVolumeClaims();
const ResourceType kConfigMaps = resources::configMaps();
const ResourceType kSecrets = resources::secrets();
const ResourceType kLeases = resources::leases();
const ResourceType kNodes{"",
                          "v1",
                          "nodes",
                          "Node",
                          /*namespaced=*/false,
                          /*status_subresource=*/true};
const ResourceType kPersistentVolumes{"",
                                      "v1",
                                      "persistentvolumes",
                                      "PersistentVolume",
                                      /*namespaced=*/false,
                                      /*status_subresource=*/true};
// The legacy POST /api/v1/namespaces/{ns}/bindings: the same as pods/{name}/binding.
const ResourceType kBindings{"",
                             "v1",
                             "bindings",
                             "Binding",
                             /*namespaced=*/true,
                             /*status_subresource=*/false};

constexpr std::string_view kNodeLeaseNamespace = "kube-node-lease";
constexpr std::string_view kProvisionerName = "rtable.io/local-kubelet";
constexpr std::string_view kProvisionedByAnnotation = "pv.kubernetes.io/provisioned-by";
constexpr std::string_view kDefaultPath =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";  // runc's default
// How often a worker looks at its processes when nothing else is due.
constexpr auto kProcessPoll = std::chrono::milliseconds(100);
// Retry delay for a pod that cannot start yet (volume source missing, config error).
constexpr auto kNotReadyRetry = std::chrono::milliseconds(500);
constexpr auto kBindRetry = std::chrono::seconds(5);
// Kubernetes' defaults (k8s.io/api/core/v1 types.go).
constexpr int64_t kDefaultTerminationGraceSeconds = 30;
constexpr int kDefaultProbePeriodSeconds = 10;
constexpr int kDefaultProbeTimeoutSeconds = 1;
constexpr int kDefaultProbeFailureThreshold = 3;

std::string stringOr(const json& object, const char* key, std::string fallback = {}) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

int intOr(const json& object, const char* key, int fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return fallback;
  return it->get<int>();
}

std::string uidOf(const json& object) {
  return stringOr(object["metadata"], "uid");
}

bool isDeleting(const json& object) {
  return object["metadata"].contains("deletionTimestamp");
}

// The wall clock now as metav1.Time (status times) and as MicroTime (Lease.spec.renewTime).
std::string rfc3339Now() {
  return common::formatRfc3339(std::chrono::system_clock::now());
}
std::string rfc3339MicroNow() {
  return common::formatRfc3339Micros(std::chrono::system_clock::now());
}

fs::path defaultSandbox() {
  if (const char* path = std::getenv("RTABLE_POD_SANDBOX"); path && *path) return path;
  return RTABLE_POD_SANDBOX_BINARY;
}

bool tcpConnects(const std::string& ip, int port, std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = false;
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) == 1) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof(error);
      ok = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
           getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
  }
  ::close(fd);
  return ok;
}

struct ProbeState {
  json spec;  // null: no such probe
  SteadyTime next{};
  int successes = 0;
  int failures = 0;
  bool ok = false;
  bool present() const { return spec.is_object(); }
  int period() const {
    return std::max(1, intOr(spec, "periodSeconds", kDefaultProbePeriodSeconds));
  }
};

// One container of a pod, as the worker runs it.
struct ContainerRun {
  json spec;
  std::string name;
  bool init = false;
  std::optional<SandboxProcess> process;
  pid_t main_pid = -1;  // the container's PID 1, from the sandbox's pid file
  int starts = 0;       // restartCount = starts - 1
  int crashes = 0;      // exits since the backoff was last reset
  int config_failures = 0;
  SteadyTime next_start{};
  SteadyTime started_steady{};
  std::string started_at;
  json state = {{"waiting", {{"reason", "ContainerCreating"}}}};
  json last_state = json::object();
  bool terminal = false;   // will not run again
  bool succeeded = false;  // exited 0 (what an init container must do)
  bool started = false;    // the startup probe passed, or there is none
  ProbeState startup, liveness, readiness;

  bool running() const { return process.has_value(); }
  bool ready() const { return running() && started && (!readiness.present() || readiness.ok); }
  int restartCount() const { return std::max(0, starts - 1); }
  bool everRan() const { return starts > 0; }
};

// What tests and the control loop read of a worker, published after each step.
struct WorkerSnapshot {
  bool sandbox_up = false;  // IP assigned, not terminal
  HostsEntry hosts_entry;
  json host_aliases;
  fs::path hosts_file;
  std::map<std::string, ContainerInfo> containers;
};

}  // namespace

struct LocalKubelet::State : std::enable_shared_from_this<LocalKubelet::State> {
  class PodWorker;

  LocalKubeletOptions options;
  fs::path work_dir;
  bool remove_work_dir = false;
  std::unique_ptr<HttpKubeClient> client;
  std::unique_ptr<Informer> pods;
  std::unique_ptr<Informer> pvcs;
  std::unique_ptr<Informer> pvs;
  std::unique_ptr<Informer> config_maps;
  std::unique_ptr<Informer> secrets;
  PodIpAllocator ips;
  std::string node_uid;
  std::string kernel_version;

  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool dirty = false;
  std::map<std::string, std::unique_ptr<PodWorker>> workers;  // by pod uid
  std::vector<HostsEntry> hosts_entries;
  // Pods whose worker finished (deleted, or gone): not started again while the cache lags.
  std::set<std::string> finished_uids;
  std::thread control;

  // Control-thread-only state.
  std::map<std::string, SteadyTime> bind_attempts;  // pod uid -> last try
  std::set<std::string> provisioned;                // PVC uids a PV was created for
  SteadyTime next_lease_renew{};
  SteadyTime next_node_status{};
  std::string lease_resource_version;
  std::string node_transition_time = rfc3339Now();

  ~State();

  ObjectSource objectSource() const {
    ObjectSource source;
    source.config_map = [this](const std::string& ns,
                               const std::string& name) -> std::optional<json> {
      auto object = config_maps->store().get({ns, name});
      if (!object) return std::nullopt;
      return *object;
    };
    source.secret = [this](const std::string& ns, const std::string& name) -> std::optional<json> {
      auto object = secrets->store().get({ns, name});
      if (!object) return std::nullopt;
      return *object;
    };
    return source;
  }

  fs::path logFile(const std::string& ns, const std::string& pod, const std::string& c) const {
    return work_dir / "logs" / fmt::format("{}_{}", ns, pod) / (c + ".log");
  }

  void wake() {
    std::lock_guard lock(mu);
    dirty = true;
    cv.notify_all();
  }
  void wakeWorkers();
  void wakeWorker(const std::string& uid);

  std::expected<void, std::string> registerNode();
  void heartbeat();
  json nodeStatus() const;
  void schedule();
  void provision();
  void syncWorkers();
  void updateHosts();
  void runControl();
  void stop();
};

// One pod bound to this node: its sandbox (IP, volumes, hosts file), its containers, its probes
// and its status, on a thread of its own (kubelet's pod worker).
class LocalKubelet::State::PodWorker {
 public:
  PodWorker(State& kubelet, std::string uid, ObjectKey key)
      : kubelet_(kubelet), uid_(std::move(uid)), key_(std::move(key)) {
    dir_ = kubelet_.work_dir / "pods" / uid_;
  }
  ~PodWorker() {
    requestShutdown();
    if (thread_.joinable()) thread_.join();
  }

  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void notify() {
    std::lock_guard lock(mu_);
    notified_ = true;
    cv_.notify_all();
  }
  void requestShutdown() {
    std::lock_guard lock(mu_);
    shutdown_ = true;
    cv_.notify_all();
  }
  bool finished() const { return finished_.load(); }
  const ObjectKey& key() const { return key_; }
  const std::string& uid() const { return uid_; }
  WorkerSnapshot snapshot() const {
    std::lock_guard lock(mu_);
    return snapshot_;
  }

 private:
  void run();
  bool shuttingDown() const {
    std::lock_guard lock(mu_);
    return shutdown_;
  }
  void waitUntil(SteadyTime deadline) {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, deadline, [this] { return notified_ || shutdown_; });
    notified_ = false;
  }
  void publish();

  void sync(const json& pod);
  bool prepareSandbox(const json& pod);
  std::expected<void, std::string> writeVolumes(const json& pod);
  // The pod's fsGroup (if any) on a volume's directory (applyFsGroup).
  std::expected<void, std::string> applyPodFsGroup(const json& pod, const fs::path& dir,
                                                   bool read_only);
  std::expected<fs::path, std::string> volumeSource(const json& pod, const json& volume);
  void manage(ContainerRun& c, const json& pod, const std::string& restart_policy);
  void tryStart(ContainerRun& c, const json& pod);
  void onExit(ContainerRun& c, int exit_code, const std::string& restart_policy,
              std::string reason = {});
  void runProbes(ContainerRun& c, const json& pod, const std::string& restart_policy);
  bool probeOnce(const json& probe, const ContainerRun& c);
  void stopContainer(ContainerRun& c, std::chrono::milliseconds grace, const std::string& policy);
  void stopAll(std::chrono::milliseconds grace);
  std::chrono::milliseconds graceFor(const json* pod) const;
  void terminate(const json* pod, bool gone);
  std::string phase() const;
  json buildStatus(const json& pod);
  json condition(const std::string& type, bool status, const std::string& reason,
                 const std::string& message);
  void patchStatus(const json& pod);
  json podWithOwnStatus(const json& pod) const;
  SteadyTime nextWake() const;
  void releaseSandbox();

  State& kubelet_;
  const std::string uid_;
  const ObjectKey key_;
  fs::path dir_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
  bool shutdown_ = false;
  WorkerSnapshot snapshot_;
  std::atomic<bool> finished_{false};
  std::thread thread_;

  // Worker-thread-only state.
  bool initialized_ = false;
  std::vector<ContainerRun> init_containers_;
  std::vector<ContainerRun> containers_;
  std::string restart_policy_ = "Always";
  bool sandbox_ready_ = false;
  std::string sandbox_problem_;
  std::string pod_ip_;
  bool ip_held_ = false;
  std::string start_time_;
  std::string terminal_phase_;  // "Succeeded" or "Failed" once reached
  SteadyTime next_volume_refresh_{};
  std::map<std::string, fs::path> volume_dirs_;  // volume name -> host dir
  std::set<std::string> read_only_volumes_;
  std::map<std::string, std::pair<std::string, std::string>> conditions_;  // type -> status, time
  json last_patch_;
  SteadyTime next_status_retry_{};
};

// ---------------------------------------------------------------------------------------------
// PodWorker

void LocalKubelet::State::PodWorker::run() {
  json last_pod;
  while (true) {
    if (shuttingDown()) {
      stopAll(kubelet_.options.shutdown_grace);
      break;
    }
    auto object = kubelet_.pods->store().get(key_);
    const bool gone = !object || uidOf(*object) != uid_;
    if (gone || isDeleting(*object)) {
      terminate(gone ? (last_pod.is_null() ? nullptr : &last_pod) : object.get(), gone);
      break;
    }
    last_pod = *object;
    sync(last_pod);
    publish();
    waitUntil(nextWake());
  }
  releaseSandbox();
  publish();
  finished_ = true;
  kubelet_.wake();
}

void LocalKubelet::State::PodWorker::publish() {
  WorkerSnapshot snap;
  snap.sandbox_up = sandbox_ready_ && terminal_phase_.empty() && !pod_ip_.empty();
  snap.hosts_file = dir_ / "etc-hosts";
  {
    std::lock_guard lock(mu_);
    snap.hosts_entry = snapshot_.hosts_entry;
    snap.host_aliases = snapshot_.host_aliases;
  }
  snap.hosts_entry.ip = pod_ip_;
  for (const auto* list : {&init_containers_, &containers_}) {
    for (const auto& c : *list) {
      ContainerInfo info;
      info.running = c.running();
      info.pid = c.running() ? c.main_pid : -1;
      info.restart_count = c.restartCount();
      info.log_file = kubelet_.logFile(key_.ns, key_.name, c.name);
      snap.containers[c.name] = info;
    }
  }
  std::lock_guard lock(mu_);
  snapshot_ = std::move(snap);
}

json LocalKubelet::State::PodWorker::podWithOwnStatus(const json& pod) const {
  json copy = pod;
  copy["status"]["podIP"] = pod_ip_;
  copy["status"]["podIPs"] = json::array({{{"ip", pod_ip_}}});
  copy["status"]["hostIP"] = "127.0.0.1";
  copy["status"]["hostIPs"] = json::array({{{"ip", "127.0.0.1"}}});
  copy["spec"]["nodeName"] = kubelet_.options.node_name;
  return copy;
}

void LocalKubelet::State::PodWorker::sync(const json& pod) {
  const json& spec = pod["spec"];
  if (!initialized_) {
    initialized_ = true;
    restart_policy_ = stringOr(spec, "restartPolicy", "Always");
    for (const char* field : {"initContainers", "containers"}) {
      if (!spec.contains(field)) continue;
      for (const auto& c : spec[field]) {
        ContainerRun run;
        run.spec = c;
        run.name = stringOr(c, "name");
        run.init = std::string_view(field) == "initContainers";
        if (run.init) run.state = {{"waiting", {{"reason", "PodInitializing"}}}};
        run.startup.spec = c.value("startupProbe", json());
        run.liveness.spec = c.value("livenessProbe", json());
        run.readiness.spec = c.value("readinessProbe", json());
        (run.init ? init_containers_ : containers_).push_back(std::move(run));
      }
    }
    // Keep the transition times of conditions already on the pod (PodScheduled, from binding).
    if (auto conds = pod["status"].find("conditions"); conds != pod["status"].end()) {
      for (const auto& c : *conds) {
        conditions_[stringOr(c, "type")] = {stringOr(c, "status"),
                                            stringOr(c, "lastTransitionTime", rfc3339Now())};
      }
    }
    // A pod that already ended (e.g. before this LocalKubelet started) is not run again.
    const std::string phase = stringOr(pod["status"], "phase");
    if (phase == "Succeeded" || phase == "Failed") terminal_phase_ = phase;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    fs::create_directories(kubelet_.logFile(key_.ns, key_.name, "x").parent_path(), ec);
    HostsEntry own;
    own.hostname = stringOr(spec, "hostname", key_.name);
    own.subdomain = stringOr(spec, "subdomain");
    own.ns = key_.ns;
    std::lock_guard lock(mu_);
    snapshot_.hosts_entry = own;
    snapshot_.host_aliases = spec.value("hostAliases", json::array());
  }
  if (!terminal_phase_.empty()) {
    patchStatus(pod);
    return;
  }
  if (!sandbox_ready_ && !prepareSandbox(pod)) {
    patchStatus(pod);
    return;
  }
  if (steady_clock::now() >= next_volume_refresh_) {
    if (auto written = writeVolumes(pod); !written) sandbox_problem_ = written.error();
    next_volume_refresh_ = steady_clock::now() + kubelet_.options.volume_refresh_interval;
  }
  // Init containers one after another, each to success; then the containers.
  const std::string init_policy = restart_policy_ == "Never" ? "Never" : "OnFailure";
  bool initialized = true;
  for (auto& c : init_containers_) {
    if (c.succeeded) continue;
    manage(c, pod, init_policy);
    if (!c.succeeded) {
      initialized = false;
      if (c.terminal) terminal_phase_ = "Failed";
      break;
    }
  }
  if (initialized && terminal_phase_.empty()) {
    for (auto& c : containers_) manage(c, pod, restart_policy_);
    for (auto& c : containers_) {
      if (c.running()) runProbes(c, pod, restart_policy_);
    }
    const std::string p = phase();
    if (p == "Succeeded" || p == "Failed") terminal_phase_ = p;
  }
  if (!terminal_phase_.empty()) {
    // kubelet tears the sandbox down; the pod keeps its IP in status.
    for (auto& c : containers_) {
      if (c.running()) stopContainer(c, graceFor(&pod), "Never");
    }
    releaseSandbox();
  }
  patchStatus(pod);
}

std::expected<fs::path, std::string> LocalKubelet::State::PodWorker::volumeSource(
    const json& pod, const json& volume) {
  const std::string name = stringOr(volume, "name");
  const fs::path own = dir_ / "volumes" / name;
  if (volume.contains("emptyDir") || volume.contains("configMap") || volume.contains("secret") ||
      volume.contains("downwardAPI")) {
    return own;
  }
  if (auto host = volume.find("hostPath"); host != volume.end()) {
    return fs::path(stringOr(*host, "path"));
  }
  if (auto claim = volume.find("persistentVolumeClaim"); claim != volume.end()) {
    const std::string claim_name = stringOr(*claim, "claimName");
    auto pvc = kubelet_.pvcs->store().get({key_.ns, claim_name});
    if (!pvc) {
      return std::unexpected(fmt::format("persistentvolumeclaim \"{}\" not found", claim_name));
    }
    const std::string volume_name = stringOr((*pvc)["spec"], "volumeName");
    if (volume_name.empty()) {
      return std::unexpected(
          fmt::format("persistentvolumeclaim \"{}\" is not bound yet", claim_name));
    }
    auto pv = kubelet_.pvs->store().get({"", volume_name});
    if (!pv) return std::unexpected(fmt::format("persistentvolume \"{}\" not found", volume_name));
    const json& pv_spec = (*pv)["spec"];
    std::string path;
    if (pv_spec.contains("hostPath")) path = stringOr(pv_spec["hostPath"], "path");
    if (pv_spec.contains("local")) path = stringOr(pv_spec["local"], "path");
    if (path.empty()) {
      return std::unexpected(fmt::format(
          "persistentvolume \"{}\" is neither hostPath nor local: cannot be mounted here",
          volume_name));
    }
    return fs::path(path);
  }
  (void)pod;
  return std::unexpected(
      fmt::format("volume \"{}\": type not emulated by LocalKubelet ({})", name, volume.dump()));
}

std::expected<void, std::string> LocalKubelet::State::PodWorker::writeVolumes(const json& pod) {
  if (!pod["spec"].contains("volumes")) return {};
  const ObjectSource objects = kubelet_.objectSource();
  const json own_pod = podWithOwnStatus(pod);
  for (const auto& volume : pod["spec"]["volumes"]) {
    const std::string name = stringOr(volume, "name");
    auto dir = volume_dirs_.find(name);
    if (dir == volume_dirs_.end()) continue;
    std::expected<std::vector<VolumeFile>, std::string> files;
    if (auto cm = volume.find("configMap"); cm != volume.end()) {
      files = configMapVolumeFiles(*cm, objects.config_map(key_.ns, stringOr(*cm, "name")));
    } else if (auto secret = volume.find("secret"); secret != volume.end()) {
      files = secretVolumeFiles(*secret, objects.secret(key_.ns, stringOr(*secret, "secretName")));
    } else if (auto downward = volume.find("downwardAPI"); downward != volume.end()) {
      files = downwardApiVolumeFiles(*downward, own_pod);
    } else {
      continue;
    }
    if (!files) return std::unexpected(fmt::format("volume \"{}\": {}", name, files.error()));
    auto written = writeVolumeAtomically(dir->second, *files);
    if (!written) return std::unexpected(fmt::format("volume \"{}\": {}", name, written.error()));
    if (*written) {
      if (auto owned = applyPodFsGroup(pod, dir->second, /*read_only=*/true); !owned)
        return std::unexpected(fmt::format("volume \"{}\": {}", name, owned.error()));
    }
  }
  return {};
}

std::expected<void, std::string> LocalKubelet::State::PodWorker::applyPodFsGroup(
    const json& pod, const fs::path& dir, bool read_only) {
  const json security = pod["spec"].value("securityContext", json::object());
  if (!security.is_object() || !security.contains("fsGroup") ||
      !security["fsGroup"].is_number_integer()) {
    return {};
  }
  return applyFsGroup(dir, security["fsGroup"].get<uint32_t>(), read_only);
}

bool LocalKubelet::State::PodWorker::prepareSandbox(const json& pod) {
  // Every volume must be resolvable before the sandbox exists (kubelet waits for volumes to
  // attach and mount, the pod shows ContainerCreating meanwhile).
  std::map<std::string, fs::path> dirs;
  if (pod["spec"].contains("volumes")) {
    const ObjectSource objects = kubelet_.objectSource();
    for (const auto& volume : pod["spec"]["volumes"]) {
      auto source = volumeSource(pod, volume);
      if (!source) {
        sandbox_problem_ = source.error();
        return false;
      }
      // A missing non-optional ConfigMap/Secret blocks the mount, as in kubelet.
      if (auto cm = volume.find("configMap"); cm != volume.end()) {
        if (auto files =
                configMapVolumeFiles(*cm, objects.config_map(key_.ns, stringOr(*cm, "name")));
            !files) {
          sandbox_problem_ = files.error();
          return false;
        }
      }
      if (auto secret = volume.find("secret"); secret != volume.end()) {
        if (auto files = secretVolumeFiles(
                *secret, objects.secret(key_.ns, stringOr(*secret, "secretName")));
            !files) {
          sandbox_problem_ = files.error();
          return false;
        }
      }
      dirs[stringOr(volume, "name")] = *source;
      if (volume.contains("configMap") || volume.contains("secret") ||
          volume.contains("downwardAPI")) {
        read_only_volumes_.insert(stringOr(volume, "name"));
      }
    }
  }
  if (pod_ip_.empty()) {
    auto ip = kubelet_.ips.allocate();
    if (!ip) {
      sandbox_problem_ = "no free pod IP in 127.0.0.0/8";
      return false;
    }
    pod_ip_ = *ip;
    ip_held_ = true;
  }
  std::error_code ec;
  for (const auto& [name, dir] : dirs) {
    fs::create_directories(dir, ec);
    if (ec) {
      sandbox_problem_ = fmt::format("mkdir {}: {}", dir.string(), ec.message());
      return false;
    }
  }
  // fsGroup on the volumes kubelet manages ownership of (not hostPath): the pod's processes,
  // running as its runAsUser, share the volumes through that group.
  for (const auto& volume : pod["spec"].value("volumes", json::array())) {
    if (volume.contains("hostPath")) continue;
    auto dir = dirs.find(stringOr(volume, "name"));
    if (dir == dirs.end()) continue;
    const bool read_only = read_only_volumes_.contains(dir->first);
    if (auto owned = applyPodFsGroup(pod, dir->second, read_only); !owned) {
      sandbox_problem_ = owned.error();
      return false;
    }
  }
  volume_dirs_ = std::move(dirs);
  if (auto written = writeVolumes(pod); !written) {
    sandbox_problem_ = written.error();
    return false;
  }
  next_volume_refresh_ = steady_clock::now() + kubelet_.options.volume_refresh_interval;
  // The pod's /etc/hosts, with every running pod's names as of now; the control loop keeps it
  // current from here on.
  HostsEntry own;
  json aliases;
  {
    std::lock_guard lock(mu_);
    own = snapshot_.hosts_entry;
    aliases = snapshot_.host_aliases;
  }
  own.ip = pod_ip_;
  std::vector<HostsEntry> all;
  {
    std::lock_guard lock(kubelet_.mu);
    all = kubelet_.hosts_entries;
  }
  all.push_back(own);
  std::sort(all.begin(), all.end());
  if (auto written = writeFileInPlace(
          dir_ / "etc-hosts", renderPodHosts(own, aliases, all, kubelet_.options.cluster_domain));
      !written) {
    sandbox_problem_ = written.error();
    return false;
  }
  sandbox_ready_ = true;
  sandbox_problem_.clear();
  start_time_ = rfc3339Now();
  publish();
  kubelet_.wake();  // hosts files of the other pods
  return true;
}

void LocalKubelet::State::PodWorker::manage(ContainerRun& c, const json& pod,
                                            const std::string& policy) {
  if (c.process) {
    if (auto exit_code = c.process->poll()) onExit(c, *exit_code, policy);
  }
  if (c.running() && c.main_pid < 0) {
    std::ifstream in(dir_ / (c.name + ".pid"));
    pid_t pid = -1;
    if (in >> pid) c.main_pid = pid;
  }
  if (!c.running() && !c.terminal && steady_clock::now() >= c.next_start) tryStart(c, pod);
}

void LocalKubelet::State::PodWorker::tryStart(ContainerRun& c, const json& pod) {
  const std::string image = stringOr(c.spec, "image");
  auto found = kubelet_.options.images.find(image);
  if (found == kubelet_.options.images.end()) {
    // kubelet alternates ErrImagePull and ImagePullBackOff, retrying with its backoff.
    ++c.config_failures;
    c.state = {
        {"waiting",
         {{"reason", c.config_failures == 1 ? "ErrImagePull" : "ImagePullBackOff"},
          {"message", fmt::format("image \"{}\" is not in LocalKubelet's image map", image)}}}};
    c.next_start = steady_clock::now() + kubelet_.options.restart_backoff_initial;
    return;
  }
  auto security = containerSecurity(pod["spec"], c.spec);
  if (!security) {
    c.state = {
        {"waiting", {{"reason", "CreateContainerConfigError"}, {"message", security.error()}}}};
    c.next_start = steady_clock::now() + kNotReadyRetry;
    return;
  }
  const json own_pod = podWithOwnStatus(pod);
  auto env = containerEnv(own_pod, c.spec, kubelet_.objectSource());
  std::expected<std::vector<std::string>, std::string> argv =
      env ? containerArgv(c.spec, found->second, *env)
          : std::expected<std::vector<std::string>, std::string>(std::unexpected(env.error()));
  if (!argv) {
    c.state = {{"waiting", {{"reason", "CreateContainerConfigError"}, {"message", argv.error()}}}};
    c.next_start = steady_clock::now() + kNotReadyRetry;
    return;
  }
  // Mounts: the pod's volumes at their mountPaths, and the pod's hosts file.
  json mounts = json::array();
  bool hosts_mounted = false;
  if (c.spec.contains("volumeMounts")) {
    for (const auto& m : c.spec["volumeMounts"]) {
      const std::string volume = stringOr(m, "name");
      auto dir = volume_dirs_.find(volume);
      if (dir == volume_dirs_.end()) {
        c.state = {{"waiting",
                    {{"reason", "CreateContainerConfigError"},
                     {"message", fmt::format("volumeMount \"{}\": no such volume", volume)}}}};
        c.next_start = steady_clock::now() + kNotReadyRetry;
        return;
      }
      fs::path source = dir->second;
      if (const std::string sub = stringOr(m, "subPath"); !sub.empty()) {
        source /= sub;
        std::error_code ec;
        if (!fs::exists(source)) fs::create_directories(source, ec);
      }
      const std::string target = stringOr(m, "mountPath");
      if (target == "/etc/hosts") hosts_mounted = true;
      // kubelet mounts configMap, secret and downwardAPI volumes read-only.
      const bool read_only = m.value("readOnly", false) || read_only_volumes_.contains(volume);
      mounts.push_back({{"source", source.string()}, {"target", target}, {"read_only", read_only}});
    }
  }
  if (!hosts_mounted) {
    mounts.push_back({{"source", (dir_ / "etc-hosts").string()},
                      {"target", "/etc/hosts"},
                      {"read_only", false}});
  }
  // The image's entrypoint where an image holds it: /usr/local/bin/<name> in the container, a
  // read-only bind of the executable. A non-root user can then run it even when the folder that
  // holds it on this machine is closed to others (CI clones into a mode-0700 directory).
  if (const auto& entrypoint = found->second.entrypoint; !entrypoint.empty() && !argv->empty() &&
                                                         (*argv)[0] == entrypoint[0] &&
                                                         fs::path(entrypoint[0]).is_absolute()) {
    const std::string target = "/usr/local/bin/" + fs::path(entrypoint[0]).filename().string();
    mounts.push_back({{"source", entrypoint[0]}, {"target", target}, {"read_only", true}});
    (*argv)[0] = target;
  }
  std::vector<std::string> env_lines;
  std::set<std::string> names;
  HostsEntry own;
  {
    std::lock_guard lock(mu_);
    own = snapshot_.hosts_entry;
  }
  // The image's ENV, then HOSTNAME, then the container's env, later wins (as a runtime merges).
  std::vector<std::pair<std::string, std::string>> merged;
  auto put = [&merged](const std::string& k, const std::string& v) {
    for (auto& [name, value] : merged) {
      if (name == k) {
        value = v;
        return;
      }
    }
    merged.emplace_back(k, v);
  };
  put("PATH", std::string(kDefaultPath.substr(5)));
  for (const auto& line : found->second.env) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) put(line.substr(0, eq), line.substr(eq + 1));
  }
  put("HOSTNAME", own.hostname);
  for (const auto& [k, v] : *env) put(k, v);
  for (const auto& [k, v] : merged) env_lines.push_back(k + "=" + v);

  const fs::path root = dir_ / "rootfs" / c.name;
  const fs::path pid_file = dir_ / (c.name + ".pid");
  std::error_code ec;
  fs::create_directories(root, ec);
  fs::remove(pid_file, ec);
  json spec = {{"root", root.string()},
               {"hostname", own.hostname},
               {"mounts", mounts},
               {"argv", *argv},
               {"env", env_lines},
               {"working_dir", stringOr(c.spec, "workingDir", "/")},
               {"pid_file", pid_file.string()},
               {"read_only_root", security->read_only_root}};
  if (security->uid) {
    spec["user"] = {{"uid", *security->uid}, {"gid", security->gid}, {"groups", security->groups}};
  }
  const fs::path spec_file = dir_ / (c.name + ".json");
  {
    std::ofstream out(spec_file, std::ios::trunc);
    out << spec.dump(2);
  }
  const fs::path log = kubelet_.logFile(key_.ns, key_.name, c.name);
  {
    std::ofstream out(log, std::ios::app);
    std::string line;
    for (const auto& a : *argv) line += (line.empty() ? "" : " ") + a;
    out << fmt::format(
        "==> {} rtable-local-kubelet: pod {} uid {} container {} start #{} on {}: {}\n",
        rfc3339Now(), key_.toString(), uid_, c.name, c.starts + 1, pod_ip_, line);
  }
  auto process =
      SandboxProcess::start({kubelet_.options.sandbox_binary.string(), spec_file.string()}, log);
  if (!process) {
    c.state = {{"waiting", {{"reason", "RunContainerError"}, {"message", process.error()}}}};
    c.next_start = steady_clock::now() + kNotReadyRetry;
    return;
  }
  c.process.emplace(std::move(*process));
  c.main_pid = -1;
  ++c.starts;
  c.config_failures = 0;
  c.started_steady = steady_clock::now();
  c.started_at = rfc3339Now();
  c.state = {{"running", {{"startedAt", c.started_at}}}};
  c.started = !c.startup.present();
  for (ProbeState* probe : {&c.startup, &c.liveness, &c.readiness}) {
    probe->successes = 0;
    probe->failures = 0;
    probe->ok = false;
    probe->next =
        c.started_steady + std::chrono::seconds(intOr(probe->spec, "initialDelaySeconds", 0));
  }
}

void LocalKubelet::State::PodWorker::onExit(ContainerRun& c, int exit_code,
                                            const std::string& policy, std::string reason) {
  const std::string finished = rfc3339Now();
  const auto ran = steady_clock::now() - c.started_steady;
  c.process.reset();
  c.main_pid = -1;
  if (reason.empty()) reason = exit_code == 0 ? "Completed" : "Error";
  json terminated = {
      {"exitCode", exit_code},
      {"reason", reason},
      {"startedAt", c.started_at},
      {"finishedAt", finished},
      {"containerID", fmt::format("rtable-local://{}/{}/{}", uid_, c.name, c.restartCount())}};
  c.state = {{"terminated", terminated}};
  c.last_state = {{"terminated", terminated}};
  c.succeeded = exit_code == 0;
  const bool restart = policy == "Always" || (policy == "OnFailure" && exit_code != 0);
  if (!restart) {
    c.terminal = true;
    return;
  }
  // kubelet's backoff: the first restart at once, then initial, doubling, up to max; reset
  // after a run longer than the reset period.
  if (ran >= kubelet_.options.restart_backoff_reset) c.crashes = 0;
  ++c.crashes;
  std::chrono::milliseconds delay{0};
  if (c.crashes >= 2) {
    delay = kubelet_.options.restart_backoff_initial;
    for (int i = 2; i < c.crashes && delay < kubelet_.options.restart_backoff_max; ++i) delay *= 2;
    delay = std::min(delay, kubelet_.options.restart_backoff_max);
  }
  c.next_start = steady_clock::now() + delay;
  if (delay.count() > 0) {
    c.state = {{"waiting",
                {{"reason", "CrashLoopBackOff"},
                 {"message", fmt::format("back-off {}ms restarting failed container={} pod={}",
                                         delay.count(), c.name, key_.toString())}}}};
  }
}

bool LocalKubelet::State::PodWorker::probeOnce(const json& probe, const ContainerRun& c) {
  const auto timeout = std::chrono::seconds(
      std::max(1, intOr(probe, "timeoutSeconds", kDefaultProbeTimeoutSeconds)));
  auto portOf = [&c](const json& port) -> int {
    if (port.is_number_integer()) return port.get<int>();
    if (port.is_string() && c.spec.contains("ports")) {
      for (const auto& p : c.spec["ports"]) {
        if (stringOr(p, "name") == port.get<std::string>()) return intOr(p, "containerPort", 0);
      }
      try {
        return std::stoi(port.get<std::string>());
      } catch (const std::exception&) {
        return 0;
      }
    }
    return 0;
  };
  if (auto http = probe.find("httpGet"); http != probe.end()) {
    const std::string host = stringOr(*http, "host", pod_ip_);
    const int port = portOf(http->value("port", json()));
    std::string path = stringOr(*http, "path", "/");
    if (path.empty() || path[0] != '/') path = "/" + path;
    // HTTPS as the kubelet does it: encrypted, the certificate not checked.
    static const auto unverified =
        common::TlsContext::load(common::TlsContext::Side::kUnverifiedClient, common::TlsFiles{});
    auto response = stringOr(*http, "scheme", "HTTP") == "HTTPS"
                        ? (unverified ? common::testing::httpsRequest(**unverified, host, port,
                                                                      "GET", path, "", timeout)
                                      : std::unexpected(unverified.error()))
                        : common::testing::httpRequest(host, port, "GET", path, "", timeout);
    // kubelet: 200 <= code < 400 is success.
    return response && response->status >= 200 && response->status < 400;
  }
  if (auto tcp = probe.find("tcpSocket"); tcp != probe.end()) {
    return tcpConnects(stringOr(*tcp, "host", pod_ip_), portOf(tcp->value("port", json())),
                       timeout);
  }
  if (auto exec = probe.find("exec"); exec != probe.end()) {
    if (c.main_pid <= 0) return false;
    // In the container's namespaces, root and working dir.
    std::vector<std::string> argv = {"nsenter", "--target", std::to_string(c.main_pid),
                                     "--mount", "--uts",    "--pid",
                                     "--root",  "--wd",     "--"};
    for (const auto& a : exec->value("command", json::array())) {
      argv.push_back(a.is_string() ? a.get<std::string>() : a.dump());
    }
    if (argv.back() == "--") return false;
    auto result = common::testing::runCommand(argv, timeout);
    return result && result->exit_code == 0;
  }
  return false;
}

void LocalKubelet::State::PodWorker::runProbes(ContainerRun& c, const json& pod,
                                               const std::string& policy) {
  const auto now = steady_clock::now();
  auto step = [&](ProbeState& probe) -> std::optional<bool> {  // result when it ran
    if (!probe.present() || now < probe.next) return std::nullopt;
    probe.next = now + std::chrono::seconds(probe.period());
    const bool ok = probeOnce(probe.spec, c);
    if (ok) {
      probe.failures = 0;
      if (++probe.successes >= std::max(1, intOr(probe.spec, "successThreshold", 1))) {
        probe.ok = true;
      }
    } else {
      probe.successes = 0;
      if (++probe.failures >=
          std::max(1, intOr(probe.spec, "failureThreshold", kDefaultProbeFailureThreshold))) {
        probe.ok = false;
      }
    }
    return ok;
  };
  auto failed = [](const ProbeState& probe) {
    return probe.failures >=
           std::max(1, intOr(probe.spec, "failureThreshold", kDefaultProbeFailureThreshold));
  };
  if (!c.started) {
    step(c.startup);
    if (c.startup.ok) {
      c.started = true;
    } else if (failed(c.startup)) {
      stopContainer(c, graceFor(&pod), policy);
      return;
    }
    if (!c.started) return;
  }
  if (step(c.liveness).has_value() && failed(c.liveness)) {
    // kubelet kills the container and restarts it per restartPolicy.
    stopContainer(c, graceFor(&pod), policy);
    return;
  }
  step(c.readiness);
}

void LocalKubelet::State::PodWorker::stopContainer(ContainerRun& c, std::chrono::milliseconds grace,
                                                   const std::string& policy) {
  if (!c.process) return;
  c.process->signal(SIGTERM);
  const auto deadline = steady_clock::now() + grace;
  std::optional<int> code;
  while (!(code = c.process->poll()) && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!code) code = c.process->killAndReap();
  onExit(c, *code, policy);
}

void LocalKubelet::State::PodWorker::stopAll(std::chrono::milliseconds grace) {
  // SIGTERM to all at once, one shared deadline, as kubelet kills a pod's containers in parallel.
  for (auto* list : {&init_containers_, &containers_}) {
    for (auto& c : *list) {
      if (c.process) c.process->signal(SIGTERM);
    }
  }
  const auto deadline = steady_clock::now() + grace;
  auto anyRunning = [this] {
    bool running = false;
    for (auto* list : {&init_containers_, &containers_}) {
      for (auto& c : *list) {
        if (c.process) {
          if (auto code = c.process->poll()) {
            onExit(c, *code, "Never");
          } else {
            running = true;
          }
        }
      }
    }
    return running;
  };
  while (anyRunning() && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto* list : {&init_containers_, &containers_}) {
    for (auto& c : *list) {
      if (c.process) onExit(c, c.process->killAndReap(), "Never");
    }
  }
}

std::chrono::milliseconds LocalKubelet::State::PodWorker::graceFor(const json* pod) const {
  int64_t seconds = kDefaultTerminationGraceSeconds;
  if (pod) {
    const json& meta = (*pod)["metadata"];
    const json& spec = (*pod)["spec"];
    if (meta.contains("deletionGracePeriodSeconds") &&
        meta["deletionGracePeriodSeconds"].is_number_integer()) {
      seconds = meta["deletionGracePeriodSeconds"].get<int64_t>();
    } else if (spec.contains("terminationGracePeriodSeconds") &&
               spec["terminationGracePeriodSeconds"].is_number_integer()) {
      seconds = spec["terminationGracePeriodSeconds"].get<int64_t>();
    }
  }
  return std::min<std::chrono::milliseconds>(std::chrono::seconds(std::max<int64_t>(seconds, 0)),
                                             kubelet_.options.max_termination_grace);
}

void LocalKubelet::State::PodWorker::terminate(const json* pod, bool gone) {
  stopAll(graceFor(pod));
  if (gone || !pod) return;
  // Final status (every container terminated), then the deletion kubelet owes the apiserver.
  bool all_ok = true;
  for (const auto& c : containers_) all_ok = all_ok && c.everRan() && c.succeeded;
  terminal_phase_ = all_ok ? "Succeeded" : "Failed";
  patchStatus(*pod);
  DeleteOptions options;
  options.precondition_uid = uid_;
  options.grace_period_seconds = 0;
  auto deleted = kubelet_.client->remove(kPods, key_, options);
  if (!deleted && deleted.error().kind != KubeErrorKind::kNotFound &&
      deleted.error().kind != KubeErrorKind::kConflict) {
    // The next LocalKubelet sync sees the pod again and a new worker retries.
    std::ofstream(kubelet_.logFile(key_.ns, key_.name, "kubelet"), std::ios::app)
        << fmt::format("{} delete failed: {}\n", rfc3339Now(), deleted.error().toString());
  }
}

void LocalKubelet::State::PodWorker::releaseSandbox() {
  if (ip_held_) {
    kubelet_.ips.release(pod_ip_);  // the pod IP stays in status, as with kubelet
    ip_held_ = false;
  }
  sandbox_ready_ = false;
}

std::string LocalKubelet::State::PodWorker::phase() const {
  if (!terminal_phase_.empty()) return terminal_phase_;
  if (!sandbox_ready_) return "Pending";
  for (const auto& c : init_containers_) {
    if (!c.succeeded) return "Pending";
  }
  // kubelet's getPhase (pkg/kubelet/kubelet_pods.go).
  int waiting = 0, running = 0, stopped = 0, succeeded = 0;
  for (const auto& c : containers_) {
    if (c.running()) {
      ++running;
    } else if (c.state.contains("terminated")) {
      ++stopped;
      if (c.succeeded) ++succeeded;
    } else if (c.last_state.contains("terminated")) {
      ++stopped;
    } else {
      ++waiting;
    }
  }
  if (waiting > 0) return "Pending";
  if (running > 0) return "Running";
  if (stopped > 0) {
    if (restart_policy_ == "Always") return "Running";
    if (stopped == succeeded) return "Succeeded";
    if (restart_policy_ == "Never") return "Failed";
    return "Running";
  }
  return "Pending";
}

json LocalKubelet::State::PodWorker::condition(const std::string& type, bool status,
                                               const std::string& reason,
                                               const std::string& message) {
  const std::string value = status ? "True" : "False";
  auto& [last_status, time] = conditions_[type];
  if (last_status != value) {
    last_status = value;
    time = rfc3339Now();
  }
  json c = {
      {"type", type}, {"status", value}, {"lastProbeTime", nullptr}, {"lastTransitionTime", time}};
  if (!reason.empty()) c["reason"] = reason;
  if (!message.empty()) c["message"] = message;
  return c;
}

json LocalKubelet::State::PodWorker::buildStatus(const json& pod) {
  const std::string p = phase();
  auto statuses = [&](const std::vector<ContainerRun>& list) {
    json out = json::array();
    for (const auto& c : list) {
      json state = c.state;
      if (!sandbox_ready_ && !c.everRan() && !sandbox_problem_.empty()) {
        // kubelet reports this as FailedMount events; here it is the waiting message.
        state = {{"waiting", {{"reason", "ContainerCreating"}, {"message", sandbox_problem_}}}};
      }
      json s = {{"name", c.name},
                {"image", stringOr(c.spec, "image")},
                {"imageID", c.everRan() ? "rtable-local://" + stringOr(c.spec, "image") : ""},
                {"ready", c.ready()},
                {"started", c.running() && c.started},
                {"restartCount", c.restartCount()},
                {"state", state},
                {"lastState", c.last_state}};
      if (c.everRan()) {
        s["containerID"] = fmt::format("rtable-local://{}/{}/{}", uid_, c.name, c.restartCount());
      }
      out.push_back(std::move(s));
    }
    return out;
  };
  bool initialized = true;
  for (const auto& c : init_containers_) initialized = initialized && c.succeeded;
  std::vector<std::string> unready;
  for (const auto& c : containers_) {
    if (!c.ready()) unready.push_back(c.name);
  }
  std::string unready_message;
  if (!unready.empty()) {
    std::string names;
    for (const auto& n : unready) names += (names.empty() ? "" : " ") + n;
    unready_message = fmt::format("containers with unready status: [{}]", names);
  }
  const bool terminal = p == "Succeeded" || p == "Failed";
  const bool all_ready = unready.empty() && !terminal && sandbox_ready_;
  const std::string not_ready_reason = terminal ? "PodCompleted" : "ContainersNotReady";
  json conditions = json::array();
  conditions.push_back(condition("PodReadyToStartContainers", sandbox_ready_, "", ""));
  conditions.push_back(
      condition("Initialized", initialized, initialized ? "" : "ContainersNotInitialized", ""));
  conditions.push_back(condition("Ready", all_ready, all_ready ? "" : not_ready_reason,
                                 all_ready || terminal ? "" : unready_message));
  conditions.push_back(condition("ContainersReady", all_ready, all_ready ? "" : not_ready_reason,
                                 all_ready || terminal ? "" : unready_message));
  conditions.push_back(condition("PodScheduled", true, "", ""));
  json status = {{"phase", p},
                 {"conditions", conditions},
                 {"hostIP", "127.0.0.1"},
                 {"hostIPs", json::array({{{"ip", "127.0.0.1"}}})},
                 {"containerStatuses", statuses(containers_)}};
  if (!init_containers_.empty()) status["initContainerStatuses"] = statuses(init_containers_);
  if (!pod_ip_.empty()) {
    status["podIP"] = pod_ip_;
    status["podIPs"] = json::array({{{"ip", pod_ip_}}});
  }
  if (!start_time_.empty()) status["startTime"] = start_time_;
  (void)pod;
  return status;
}

void LocalKubelet::State::PodWorker::patchStatus(const json& pod) {
  json status = buildStatus(pod);
  if (status == last_patch_) return;
  if (steady_clock::now() < next_status_retry_) return;
  PatchOptions options;
  options.subresource = "status";
  auto patched =
      kubelet_.client->patch(kPods, key_, PatchType::kStrategicMerge,
                             json{{"metadata", {{"uid", uid_}}}, {"status", status}}, options);
  if (patched) {
    last_patch_ = std::move(status);
  } else {
    next_status_retry_ = steady_clock::now() + kNotReadyRetry;
  }
}

SteadyTime LocalKubelet::State::PodWorker::nextWake() const {
  SteadyTime next = steady_clock::now() + std::chrono::seconds(1);
  bool any_process = false;
  for (const auto* list : {&init_containers_, &containers_}) {
    for (const auto& c : *list) {
      if (c.running()) {
        any_process = true;
        for (const ProbeState* probe : {&c.startup, &c.liveness, &c.readiness}) {
          if (probe->present()) next = std::min(next, probe->next);
        }
      } else if (!c.terminal && sandbox_ready_) {
        next = std::min(next, c.next_start);
      }
    }
  }
  if (any_process || !sandbox_ready_ || last_patch_.is_null()) {
    next = std::min(next, steady_clock::now() + (sandbox_ready_ ? kProcessPoll : kNotReadyRetry));
  }
  if (sandbox_ready_) next = std::min(next, next_volume_refresh_);
  if (!terminal_phase_.empty()) next = steady_clock::now() + std::chrono::seconds(1);
  return next;
}

// ---------------------------------------------------------------------------------------------
// State: the node, the scheduler, the provisioner, the pod workers.

LocalKubelet::State::~State() {
  stop();
}

void LocalKubelet::State::stop() {
  {
    std::lock_guard lock(mu);
    if (stopping && !control.joinable()) return;
    stopping = true;
    cv.notify_all();
  }
  if (control.joinable()) control.join();
  std::map<std::string, std::unique_ptr<PodWorker>> all;
  {
    std::lock_guard lock(mu);
    all.swap(workers);
  }
  for (auto& [uid, worker] : all) worker->requestShutdown();
  all.clear();  // joins each
  for (auto* informer : {&pods, &pvcs, &pvs, &config_maps, &secrets}) {
    if (*informer) (*informer)->stop();
  }
  if (remove_work_dir && !std::getenv("RTABLE_KEEP_TEST_DIRS")) {
    std::error_code ec;
    fs::remove_all(work_dir, ec);
  }
  remove_work_dir = false;
}

void LocalKubelet::State::wakeWorkers() {
  std::lock_guard lock(mu);
  for (auto& [uid, worker] : workers) worker->notify();
  dirty = true;
  cv.notify_all();
}

void LocalKubelet::State::wakeWorker(const std::string& uid) {
  std::lock_guard lock(mu);
  if (auto it = workers.find(uid); it != workers.end()) it->second->notify();
  dirty = true;
  cv.notify_all();
}

json LocalKubelet::State::nodeStatus() const {
  const std::string now = rfc3339Now();
  auto cond = [this, &now](const char* type, const char* status, const char* reason,
                           const char* message) {
    return json{{"type", type},
                {"status", status},
                {"reason", reason},
                {"message", message},
                {"lastHeartbeatTime", now},
                {"lastTransitionTime", node_transition_time}};
  };
  const json resources = {{"cpu", options.capacity_cpu},
                          {"memory", options.capacity_memory},
                          {"pods", std::to_string(options.capacity_pods)},
                          {"ephemeral-storage", "100Gi"}};
  return {{"capacity", resources},
          {"allocatable", resources},
          {"conditions",
           json::array({cond("MemoryPressure", "False", "KubeletHasSufficientMemory",
                             "kubelet has sufficient memory available"),
                        cond("DiskPressure", "False", "KubeletHasNoDiskPressure",
                             "kubelet has no disk pressure"),
                        cond("PIDPressure", "False", "KubeletHasSufficientPID",
                             "kubelet has sufficient PID available"),
                        cond("Ready", "True", "KubeletReady", "kubelet is posting ready status")})},
          {"addresses", json::array({{{"type", "InternalIP"}, {"address", "127.0.0.1"}},
                                     {{"type", "Hostname"}, {"address", options.node_name}}})},
          {"daemonEndpoints", {{"kubeletEndpoint", {{"Port", 0}}}}},
          {"nodeInfo",
           {{"machineID", ""},
            {"systemUUID", ""},
            {"bootID", ""},
            {"kernelVersion", kernel_version},
            {"osImage", "rtable LocalKubelet"},
            {"containerRuntimeVersion", "rtable-local://0.1"},
            {"kubeletVersion", controlPlaneVersion()},
            {"kubeProxyVersion", ""},
            {"operatingSystem", "linux"},
            {"architecture", "amd64"}}}};
}

std::expected<void, std::string> LocalKubelet::State::registerNode() {
  utsname uts{};
  if (uname(&uts) == 0) kernel_version = uts.release;
  const json node = {{"apiVersion", "v1"},
                     {"kind", "Node"},
                     {"metadata",
                      {{"name", options.node_name},
                       {"labels",
                        {{"kubernetes.io/hostname", options.node_name},
                         {"kubernetes.io/os", "linux"},
                         {"kubernetes.io/arch", "amd64"},
                         {"beta.kubernetes.io/os", "linux"},
                         {"beta.kubernetes.io/arch", "amd64"}}}}},
                     {"spec", json::object()},
                     {"status", nodeStatus()}};
  auto created = client->create(kNodes, node);
  if (created) {
    node_uid = uidOf(*created);
  } else if (created.error().kind == KubeErrorKind::kAlreadyExists) {
    auto existing = client->get(kNodes, {"", options.node_name});
    if (!existing) return std::unexpected("get node: " + existing.error().toString());
    node_uid = uidOf(*existing);
  } else {
    return std::unexpected("create node: " + created.error().toString());
  }
  PatchOptions status_options;
  status_options.subresource = "status";
  auto patched = client->patch(kNodes, {"", options.node_name}, PatchType::kStrategicMerge,
                               json{{"status", nodeStatus()}}, status_options);
  if (!patched) return std::unexpected("patch node status: " + patched.error().toString());
  next_node_status = steady_clock::now() + options.node_status_interval;
  return {};
}

void LocalKubelet::State::heartbeat() {
  const auto now = steady_clock::now();
  if (now >= next_lease_renew) {
    // kubelet's node lease (pkg/kubelet/nodelease): holder = node, owned by the Node.
    const ObjectKey key{std::string(kNodeLeaseNamespace), options.node_name};
    bool renewed = false;
    if (!lease_resource_version.empty()) {
      json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                    {"kind", "Lease"},
                    {"metadata",
                     {{"name", key.name},
                      {"namespace", key.ns},
                      {"resourceVersion", lease_resource_version},
                      {"ownerReferences", json::array({{{"apiVersion", "v1"},
                                                        {"kind", "Node"},
                                                        {"name", options.node_name},
                                                        {"uid", node_uid}}})}}},
                    {"spec",
                     {{"holderIdentity", options.node_name},
                      {"leaseDurationSeconds", options.lease_duration.count()},
                      {"renewTime", rfc3339MicroNow()}}}};
      auto updated = client->update(kLeases, lease);
      if (updated) {
        lease_resource_version = resourceVersionOf(*updated);
        renewed = true;
      } else {
        lease_resource_version.clear();  // read it again
      }
    }
    if (!renewed) {
      auto existing = client->get(kLeases, key);
      if (existing) {
        lease_resource_version = resourceVersionOf(*existing);
        json lease = *existing;
        lease["spec"]["holderIdentity"] = options.node_name;
        lease["spec"]["leaseDurationSeconds"] = options.lease_duration.count();
        lease["spec"]["renewTime"] = rfc3339MicroNow();
        auto updated = client->update(kLeases, lease);
        if (updated) {
          lease_resource_version = resourceVersionOf(*updated);
          renewed = true;
        }
      } else if (existing.error().kind == KubeErrorKind::kNotFound) {
        json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                      {"kind", "Lease"},
                      {"metadata",
                       {{"name", key.name},
                        {"namespace", key.ns},
                        {"ownerReferences", json::array({{{"apiVersion", "v1"},
                                                          {"kind", "Node"},
                                                          {"name", options.node_name},
                                                          {"uid", node_uid}}})}}},
                      {"spec",
                       {{"holderIdentity", options.node_name},
                        {"leaseDurationSeconds", options.lease_duration.count()},
                        {"renewTime", rfc3339MicroNow()}}}};
        auto created = client->create(kLeases, lease);
        if (created) {
          lease_resource_version = resourceVersionOf(*created);
          renewed = true;
        }
      }
    }
    // kubelet retries a failed renewal sooner (its 200 ms .. 7 s backoff); 1 s here.
    next_lease_renew =
        now + (renewed ? options.lease_renew_interval : std::chrono::milliseconds(1000));
  }
  if (now >= next_node_status) {
    PatchOptions status_options;
    status_options.subresource = "status";
    auto patched = client->patch(kNodes, {"", options.node_name}, PatchType::kStrategicMerge,
                                 json{{"status", nodeStatus()}}, status_options);
    next_node_status =
        now + (patched ? options.node_status_interval : std::chrono::milliseconds(1000));
  }
}

void LocalKubelet::State::schedule() {
  const auto now = steady_clock::now();
  std::set<std::string> pending;
  for (const auto& pod : pods->store().list()) {
    const json& spec = (*pod)["spec"];
    if (!stringOr(spec, "nodeName").empty() || isDeleting(*pod)) continue;
    if (stringOr(spec, "schedulerName", "default-scheduler") != "default-scheduler") continue;
    const std::string phase = stringOr((*pod)["status"], "phase", "Pending");
    if (phase != "Pending") continue;
    const std::string uid = uidOf(*pod);
    pending.insert(uid);
    if (auto it = bind_attempts.find(uid);
        it != bind_attempts.end() && now - it->second < kBindRetry) {
      continue;
    }
    bind_attempts[uid] = now;
    const ObjectKey key = objectKeyOf(*pod);
    const json binding = {
        {"apiVersion", "v1"},
        {"kind", "Binding"},
        {"metadata", {{"name", key.name}, {"namespace", key.ns}, {"uid", uid}}},
        {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", options.node_name}}}};
    (void)client->create(kBindings, binding);  // a conflict means someone else bound it
  }
  std::erase_if(bind_attempts, [&](const auto& entry) { return !pending.contains(entry.first); });
}

void LocalKubelet::State::provision() {
  // Pending claims: a PersistentVolume pre-bound to each (an external provisioner's job). The
  // PV controller in kube-controller-manager then binds the claim to it.
  std::set<std::string> claims;
  for (const auto& pvc : pvcs->store().list()) {
    const std::string uid = uidOf(*pvc);
    claims.insert(uid);
    if (isDeleting(*pvc) || !stringOr((*pvc)["spec"], "volumeName").empty()) continue;
    if (provisioned.contains(uid)) continue;
    const ObjectKey key = objectKeyOf(*pvc);
    const json& spec = (*pvc)["spec"];
    const fs::path dir = work_dir / "volumes" / key.ns / fmt::format("{}-{}", key.name, uid);
    std::error_code ec;
    fs::create_directories(dir, ec);
    json access = spec.value("accessModes", json::array());
    if (access.empty()) access = json::array({"ReadWriteOnce"});
    std::string size = "1Gi";
    if (spec.contains("resources") && spec["resources"].contains("requests")) {
      size = stringOr(spec["resources"]["requests"], "storage", size);
    }
    const json pv = {{"apiVersion", "v1"},
                     {"kind", "PersistentVolume"},
                     {"metadata",
                      {{"name", "pvc-" + uid},
                       {"labels", {{"rtable.io/local-kubelet-node", options.node_name}}},
                       {"annotations",
                        {{std::string(kProvisionedByAnnotation), std::string(kProvisionerName)}}}}},
                     {"spec",
                      {{"capacity", {{"storage", size}}},
                       {"accessModes", access},
                       // Delete, done by us as the external provisioner: the PV controller leaves a
                       // PV with a provisioned-by annotation it does not know to that provisioner.
                       {"persistentVolumeReclaimPolicy", "Delete"},
                       {"storageClassName", stringOr(spec, "storageClassName")},
                       {"volumeMode", stringOr(spec, "volumeMode", "Filesystem")},
                       {"claimRef",
                        {{"apiVersion", "v1"},
                         {"kind", "PersistentVolumeClaim"},
                         {"namespace", key.ns},
                         {"name", key.name},
                         {"uid", uid}}},
                       {"hostPath", {{"path", dir.string()}, {"type", "DirectoryOrCreate"}}}}}};
    auto created = client->create(kPersistentVolumes, pv);
    if (created || created.error().kind == KubeErrorKind::kAlreadyExists) provisioned.insert(uid);
  }
  std::erase_if(provisioned, [&](const std::string& uid) { return !claims.contains(uid); });
  // Released volumes of ours (their claim was deleted): the data and the PV go.
  for (const auto& pv : pvs->store().list()) {
    const json& meta = (*pv)["metadata"];
    if (stringOr(meta.value("annotations", json::object()),
                 std::string(kProvisionedByAnnotation).c_str()) != kProvisionerName) {
      continue;
    }
    const std::string phase = stringOr((*pv)["status"], "phase");
    const std::string claim_uid =
        (*pv)["spec"].contains("claimRef") ? stringOr((*pv)["spec"]["claimRef"], "uid") : "";
    if (isDeleting(*pv) || (phase != "Released" && phase != "Failed")) continue;
    if (claims.contains(claim_uid)) continue;
    std::error_code ec;
    fs::remove_all(stringOr((*pv)["spec"]["hostPath"], "path"), ec);
    (void)client->remove(kPersistentVolumes, {"", stringOr(meta, "name")});
  }
}

void LocalKubelet::State::syncWorkers() {
  std::vector<std::unique_ptr<PodWorker>> finished;
  {
    std::lock_guard lock(mu);
    for (auto it = workers.begin(); it != workers.end();) {
      if (it->second->finished()) {
        finished.push_back(std::move(it->second));
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& w : finished) finished_uids.insert(w->uid());
    if (stopping) return;
    std::set<std::string> cached;
    for (const auto& pod : pods->store().list()) {
      const std::string uid = uidOf(*pod);
      cached.insert(uid);
      if (stringOr((*pod)["spec"], "nodeName") != options.node_name) continue;
      if (workers.contains(uid) || finished_uids.contains(uid)) continue;
      auto worker = std::make_unique<PodWorker>(*this, uid, objectKeyOf(*pod));
      worker->start();
      workers.emplace(uid, std::move(worker));
    }
    std::erase_if(finished_uids, [&](const std::string& uid) { return !cached.contains(uid); });
  }
  finished.clear();  // joins, outside the lock
}

void LocalKubelet::State::updateHosts() {
  std::vector<HostsEntry> entries;
  std::vector<WorkerSnapshot> snapshots;
  {
    std::lock_guard lock(mu);
    for (const auto& [uid, worker] : workers) {
      WorkerSnapshot snap = worker->snapshot();
      if (!snap.sandbox_up) continue;
      entries.push_back(snap.hosts_entry);
      snapshots.push_back(std::move(snap));
    }
  }
  std::sort(entries.begin(), entries.end());
  bool changed = false;
  {
    std::lock_guard lock(mu);
    changed = entries != hosts_entries;
    hosts_entries = entries;
  }
  // Every sandbox's file, also when only its own set changed; writeFileInPlace skips equal ones.
  for (const auto& snap : snapshots) {
    (void)writeFileInPlace(snap.hosts_file, renderPodHosts(snap.hosts_entry, snap.host_aliases,
                                                           entries, options.cluster_domain));
  }
  if (changed && !options.host_hosts_file.empty()) {
    std::ifstream in(options.host_hosts_file);
    std::stringstream existing;
    existing << in.rdbuf();
    (void)writeFileInPlace(
        options.host_hosts_file,
        replaceManagedHostsBlock(existing.str(), entries, options.cluster_domain));
  }
}

void LocalKubelet::State::runControl() {
  while (true) {
    {
      std::lock_guard lock(mu);
      if (stopping) return;
      dirty = false;
    }
    heartbeat();
    schedule();
    provision();
    syncWorkers();
    updateHosts();
    std::unique_lock lock(mu);
    const auto deadline = std::min(
        {next_lease_renew, next_node_status, steady_clock::now() + std::chrono::seconds(1)});
    cv.wait_until(lock, deadline, [this] { return dirty || stopping; });
  }
}

// ---------------------------------------------------------------------------------------------

LocalKubelet::LocalKubelet(std::shared_ptr<State> state) : state_(std::move(state)) {}
LocalKubelet::LocalKubelet(LocalKubelet&&) noexcept = default;
LocalKubelet& LocalKubelet::operator=(LocalKubelet&&) noexcept = default;
LocalKubelet::~LocalKubelet() {
  if (state_) state_->stop();
}

std::expected<LocalKubelet, std::string> LocalKubelet::start(LocalKubeletOptions options) {
  auto state = std::make_shared<State>();
  if (options.sandbox_binary.empty()) options.sandbox_binary = defaultSandbox();
  if (!fs::exists(options.sandbox_binary)) {
    return std::unexpected(fmt::format("{} not found (build the rtable-pod-sandbox target)",
                                       options.sandbox_binary.string()));
  }
  if (options.work_dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "rtable-local-kubelet-XXXXXX").string();
    if (!mkdtemp(pattern.data())) return std::unexpected("mkdtemp failed for " + pattern);
    options.work_dir = pattern;
    state->remove_work_dir = true;
  }
  std::error_code ec;
  fs::create_directories(options.work_dir / "pods", ec);
  fs::create_directories(options.work_dir / "logs", ec);
  fs::create_directories(options.work_dir / "volumes", ec);
  if (ec) {
    return std::unexpected(
        fmt::format("cannot create {}: {}", options.work_dir.string(), ec.message()));
  }
  state->work_dir = fs::absolute(options.work_dir);
  state->options = std::move(options);

  auto config = KubeConfig::load(state->options.kubeconfig);
  if (!config) return std::unexpected(config.error().toString());
  auto cluster = config->clusterConfig();
  if (!cluster) return std::unexpected(cluster.error().toString());
  HttpKubeClientOptions client_options;
  client_options.user_agent = "rtable-local-kubelet/" + controlPlaneVersion();
  auto client = HttpKubeClient::create(*cluster, client_options);
  if (!client) return std::unexpected("kube client: " + client.error().toString());
  state->client = std::move(*client);

  if (auto registered = state->registerNode(); !registered) {
    return std::unexpected(registered.error());
  }

  State* raw = state.get();
  auto make = [&](const ResourceType& type, ResourceEventHandlers handlers) {
    InformerOptions informer_options;
    informer_options.type = type;
    informer_options.name = "local-kubelet/" + type.resource;
    auto informer = std::make_unique<Informer>(*raw->client, informer_options);
    informer->addHandlers(std::move(handlers));
    return informer;
  };
  auto wake_all = ResourceEventHandlers{
      [raw](const json&) { raw->wakeWorkers(); },
      [raw](const json&, const json&) { raw->wakeWorkers(); },
      [raw](const json&) { raw->wakeWorkers(); },
  };
  state->pods = make(kPods, {
                                [raw](const json& o) { raw->wakeWorker(uidOf(o)); },
                                [raw](const json&, const json& o) { raw->wakeWorker(uidOf(o)); },
                                [raw](const json& o) { raw->wakeWorker(uidOf(o)); },
                            });
  state->pvcs = make(kPvcs, wake_all);
  state->pvs = make(kPersistentVolumes, wake_all);
  state->config_maps = make(kConfigMaps, wake_all);
  state->secrets = make(kSecrets, wake_all);
  for (auto* informer :
       {&state->pods, &state->pvcs, &state->pvs, &state->config_maps, &state->secrets}) {
    (*informer)->start();
  }
  for (auto* informer :
       {&state->pods, &state->pvcs, &state->pvs, &state->config_maps, &state->secrets}) {
    if (!(*informer)->waitForSync(std::chrono::seconds(60))) {
      auto error = (*informer)->lastError();
      return std::unexpected(
          fmt::format("informer did not sync: {}", error ? error->toString() : "timeout"));
    }
  }
  state->control = std::thread([raw] { raw->runControl(); });
  return LocalKubelet(std::move(state));
}

const std::string& LocalKubelet::nodeName() const {
  return state_->options.node_name;
}
const std::filesystem::path& LocalKubelet::workDir() const {
  return state_->work_dir;
}
void LocalKubelet::keepWorkDir() {
  std::lock_guard lock(state_->mu);
  state_->remove_work_dir = false;
}

std::optional<ContainerInfo> LocalKubelet::container(const std::string& ns, const std::string& pod,
                                                     const std::string& name) const {
  std::lock_guard lock(state_->mu);
  for (const auto& [uid, worker] : state_->workers) {
    if (worker->key() != ObjectKey{ns, pod} || worker->finished()) continue;
    WorkerSnapshot snap = worker->snapshot();
    if (auto it = snap.containers.find(name); it != snap.containers.end()) return it->second;
  }
  return std::nullopt;
}

std::filesystem::path LocalKubelet::logFile(const std::string& ns, const std::string& pod,
                                            const std::string& container) const {
  return state_->logFile(ns, pod, container);
}

std::filesystem::path LocalKubelet::volumeDir(const std::string& ns,
                                              const std::string& claim) const {
  auto pvc = state_->pvcs->store().get({ns, claim});
  if (!pvc) return {};
  return state_->work_dir / "volumes" / ns / fmt::format("{}-{}", claim, uidOf(*pvc));
}

int LocalKubelet::runningPods() const {
  std::lock_guard lock(state_->mu);
  int n = 0;
  for (const auto& [uid, worker] : state_->workers) n += worker->snapshot().sandbox_up ? 1 : 0;
  return n;
}

int LocalKubelet::runningContainers() const {
  std::lock_guard lock(state_->mu);
  int n = 0;
  for (const auto& [uid, worker] : state_->workers) {
    for (const auto& [name, info] : worker->snapshot().containers) n += info.running ? 1 : 0;
  }
  return n;
}

std::vector<HostsEntry> LocalKubelet::hostsEntries() const {
  std::lock_guard lock(state_->mu);
  return state_->hosts_entries;
}

std::filesystem::path defaultPodSandboxBinary() {
  return defaultSandbox();
}

}  // namespace rtable::op::testing
