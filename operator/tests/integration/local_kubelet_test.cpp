// LocalKubelet (operator/testing, docs/local-kubelet.md): first the pure rules it applies to a pod
// spec ($(VAR) expansion, env, argv, volume files, hosts files, IPs) and the container sandbox on
// its own; then, against a real kube-apiserver + kube-controller-manager, a StatefulSet of three
// python HTTP servers: Running and Ready with distinct IPs, ConfigMap file, Secret env and
// POD_NAME seen, peers reached by their headless-Service DNS names, a kill -9 restarts the
// container with its PVC data kept, a deleted pod comes back with the same data, a ConfigMap
// change reaches the mounted file, readiness follows the probe, a scale-down stops processes.
// Also: unknown images, restartPolicy Never, liveness restarts, the node's lease heartbeat.
#include "rtable/operator/testing/local_kubelet.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/testing/local_control_plane.h"
#include "rtable/operator/testing/pod_runtime_spec.h"
#include "rtable/operator/testing/sandbox_process.h"

namespace rtable::op::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

// Polls `predicate` until it holds or `timeout` passes (API calls inside: not a hot loop).
bool waitFor(const std::function<bool()>& predicate, std::chrono::milliseconds timeout,
             std::chrono::milliseconds interval = 200ms) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(interval);
  }
  return predicate();
}

std::optional<std::string> readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<std::string> lookup(const std::map<std::string, std::string>& vars,
                                  std::string_view name) {
  auto it = vars.find(std::string(name));
  if (it == vars.end()) return std::nullopt;
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// The rules, without servers.

TEST(PodRuntimeSpec, ExpandsVarsLikeKubernetes) {
  const std::map<std::string, std::string> vars = {{"A", "x"}, {"POD", "web-0"}};
  auto expand = [&](std::string_view in) {
    return expandVars(in, [&](std::string_view n) { return lookup(vars, n); });
  };
  EXPECT_EQ(expand("$(A)-$(POD)"), "x-web-0");
  EXPECT_EQ(expand("$(MISSING)"), "$(MISSING)");  // undefined: kept as written
  EXPECT_EQ(expand("$$(A)"), "$(A)");             // escaped
  EXPECT_EQ(expand("$$"), "$");
  EXPECT_EQ(expand("a$b"), "a$b");    // '$' before anything else is kept
  EXPECT_EQ(expand("$(A"), "$(A");    // unterminated: kept
  EXPECT_EQ(expand("end$"), "end$");  // trailing '$'
  EXPECT_EQ(expand("$()"), "$()");
}

json testPod() {
  return json::parse(R"({
    "metadata": {"name": "web-0", "namespace": "ns1", "uid": "u-1",
                 "labels": {"app": "web"}, "annotations": {"a/b": "c"}},
    "spec": {"nodeName": "n1", "containers": []},
    "status": {"podIP": "127.0.0.7", "hostIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.7"}]}
  })");
}

ObjectSource testObjects() {
  ObjectSource source;
  source.config_map = [](const std::string& ns, const std::string& name) -> std::optional<json> {
    if (ns != "ns1" || name != "cfg") return std::nullopt;
    return json{{"data", {{"mode", "fast"}, {"level", "3"}}},
                {"binaryData", {{"blob", "AAEC"}}}};  // bytes 0 1 2
  };
  source.secret = [](const std::string& ns, const std::string& name) -> std::optional<json> {
    if (ns != "ns1" || name != "sec") return std::nullopt;
    return json{{"data", {{"token", "czNjcjN0"}}}};  // "s3cr3t"
  };
  return source;
}

TEST(PodRuntimeSpec, ResolvesEnvInKubeletOrder) {
  const json container = json::parse(R"J({
    "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"},
                {"secretRef": {"name": "absent", "optional": true}}],
    "env": [
      {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
      {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
      {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
      {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
      {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
      {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "level"}}},
      {"name": "URL", "value": "http://$(POD_IP):8080/$(LATER)/$(CFG_mode)"},
      {"name": "LATER", "value": "x"},
      {"name": "CFG_mode", "value": "overridden"}
    ]})J");
  auto env = containerEnv(testPod(), container, testObjects());
  ASSERT_TRUE(env) << env.error();
  std::map<std::string, std::string> got(env->begin(), env->end());
  EXPECT_EQ(got["POD_NAME"], "web-0");
  EXPECT_EQ(got["POD_IP"], "127.0.0.7");
  EXPECT_EQ(got["NODE"], "n1");
  EXPECT_EQ(got["APP"], "web");
  EXPECT_EQ(got["TOKEN"], "s3cr3t");
  EXPECT_EQ(got["LEVEL"], "3");
  EXPECT_EQ(got["CFG_blob"], std::string("\0\1\2", 3));
  // Only variables defined before it expand; a later definition replaces the value in place.
  EXPECT_EQ(got["URL"], "http://127.0.0.7:8080/$(LATER)/fast");
  EXPECT_EQ(got["CFG_mode"], "overridden");

  auto missing = containerEnv(testPod(), json::parse(R"({"env": [{"name": "T", "valueFrom":
      {"secretKeyRef": {"name": "sec", "key": "nope"}}}]})"),
                              testObjects());
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("couldn't find key nope"), std::string::npos) << missing.error();
  auto optional = containerEnv(testPod(), json::parse(R"({"env": [{"name": "T", "valueFrom":
      {"secretKeyRef": {"name": "gone", "key": "k", "optional": true}}}]})"),
                               testObjects());
  ASSERT_TRUE(optional) << optional.error();
  EXPECT_TRUE(optional->empty());
}

TEST(PodRuntimeSpec, BuildsArgvFromImageCommandAndArgs) {
  const LocalImage image{{"/bin/server"}, {"--default"}, {}};
  const EnvList env = {{"PORT", "8080"}};
  auto argv = [&](const char* container) {
    auto result = containerArgv(json::parse(container), image, env);
    return result ? *result : std::vector<std::string>{"error: " + result.error()};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(argv("{}"), (V{"/bin/server", "--default"}));
  EXPECT_EQ(argv(R"J({"args": ["--port=$(PORT)"]})J"), (V{"/bin/server", "--port=8080"}));
  EXPECT_EQ(argv(R"({"command": ["sh", "-c"]})"), (V{"sh", "-c"}));  // no image cmd then
  EXPECT_EQ(argv(R"J({"command": ["echo"], "args": ["$(PORT)", "$$(PORT)"]})J"),
            (V{"echo", "8080", "$(PORT)"}));
}

TEST(PodRuntimeSpec, VolumeFilesHonourItemsModesAndOptional) {
  const json cm = {{"data", {{"a", "1"}, {"b", "2"}}}};
  auto all = configMapVolumeFiles(json{{"name", "cfg"}, {"defaultMode", 0600}}, cm);
  ASSERT_TRUE(all) << all.error();
  EXPECT_EQ(*all, (std::vector<VolumeFile>{{"a", "1", 0600}, {"b", "2", 0600}}));
  auto items = configMapVolumeFiles(
      json::parse(R"({"name": "cfg", "items": [{"key": "b", "path": "sub/b.txt", "mode": 256}]})"),
      cm);
  ASSERT_TRUE(items) << items.error();
  EXPECT_EQ(*items, (std::vector<VolumeFile>{{"sub/b.txt", "2", 0400}}));
  EXPECT_FALSE(configMapVolumeFiles(json{{"name", "gone"}}, std::nullopt));
  auto optional = configMapVolumeFiles(json{{"name", "gone"}, {"optional", true}}, std::nullopt);
  ASSERT_TRUE(optional);
  EXPECT_TRUE(optional->empty());
  auto secret = secretVolumeFiles(json{{"secretName", "s"}}, json{{"data", {{"k", "aGk="}}}});
  ASSERT_TRUE(secret);
  EXPECT_EQ(*secret, (std::vector<VolumeFile>{{"k", "hi", 0644}}));
}

TEST(PodRuntimeSpec, WritesVolumesLikeKubeletsAtomicWriter) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rtable-atomic-{}", getpid());
  fs::remove_all(dir);
  auto first = writeVolumeAtomically(dir, {{"a", "1", 0644}, {"sub/b", "2", 0600}});
  ASSERT_TRUE(first) << first.error();
  EXPECT_TRUE(*first);
  EXPECT_TRUE(fs::is_symlink(dir / "..data"));
  EXPECT_TRUE(fs::is_symlink(dir / "a"));
  EXPECT_EQ(fs::read_symlink(dir / "a"), "..data/a");
  EXPECT_EQ(readFile(dir / "a"), "1");
  EXPECT_EQ(readFile(dir / "sub" / "b"), "2");
  struct stat st{};
  ASSERT_EQ(::stat((dir / "sub" / "b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const fs::path old_payload = fs::read_symlink(dir / "..data");

  auto same = writeVolumeAtomically(dir, {{"a", "1", 0644}, {"sub/b", "2", 0600}});
  ASSERT_TRUE(same);
  EXPECT_FALSE(*same);  // nothing changed, nothing written

  auto second = writeVolumeAtomically(dir, {{"a", "changed", 0644}});
  ASSERT_TRUE(second) << second.error();
  EXPECT_TRUE(*second);
  EXPECT_EQ(readFile(dir / "a"), "changed");
  EXPECT_FALSE(fs::exists(dir / "sub"));        // gone from the payload, link removed
  EXPECT_FALSE(fs::exists(dir / old_payload));  // the old payload dir is removed
  fs::remove_all(dir);
}

TEST(PodRuntimeSpec, HostsFilesAndIps) {
  const HostsEntry web0{"127.0.0.2", "web-0", "web", "ns1"};
  EXPECT_EQ(hostsLine(web0),
            "127.0.0.2\tweb-0.web.ns1.svc.cluster.local web-0.web.ns1.svc web-0.web");
  const std::string hosts =
      renderPodHosts(web0, json::array(), {web0, {"127.0.0.3", "x", "", "ns1"}});
  EXPECT_NE(hosts.find("127.0.0.1\tlocalhost"), std::string::npos);
  EXPECT_NE(hosts.find(hostsLine(web0)), std::string::npos);
  EXPECT_EQ(hosts.find("127.0.0.3"), std::string::npos);  // no subdomain: no DNS name

  const std::string host_file = "127.0.0.1 localhost\n";
  const std::string with_block = replaceManagedHostsBlock(host_file, {web0});
  EXPECT_TRUE(with_block.starts_with(host_file));
  EXPECT_NE(with_block.find(hostsLine(web0)), std::string::npos);
  const std::string replaced = replaceManagedHostsBlock(with_block + "# after\n", {});
  EXPECT_EQ(replaced.find(hostsLine(web0)), std::string::npos);
  EXPECT_NE(replaced.find("# after"), std::string::npos);
  EXPECT_TRUE(replaced.starts_with(host_file));

  PodIpAllocator ips(3);
  EXPECT_EQ(ips.allocate(), "127.0.0.2");
  EXPECT_EQ(ips.allocate(), "127.0.0.3");
  ips.release("127.0.0.2");
  EXPECT_EQ(ips.allocate(), "127.0.0.4");  // round robin: the released one comes last
  EXPECT_EQ(ips.allocate(), "127.0.0.2");
  EXPECT_EQ(ips.allocate(), std::nullopt);
  EXPECT_EQ(PodIpAllocator().allocate(), "127.0.0.2");
}

// The sandbox alone: new mount points are made without touching the host, volumes and the hosts
// file are bind-mounted, the hostname and PID namespace are the container's own.
TEST(PodSandbox, MountsVolumesInItsOwnNamespaces) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rtable-sandbox-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "root");
  fs::create_directories(dir / "vol");
  fs::create_directories(dir / "cfg");
  {
    std::ofstream(dir / "vol" / "data.txt") << "volume data";
  }
  {
    std::ofstream(dir / "cfg" / "c.txt") << "config";
  }
  {
    std::ofstream(dir / "hosts") << "127.0.0.9\tpeer.example\n";
  }
  const std::string top = fmt::format("/rtable-sandbox-test-{}", getpid());
  ASSERT_FALSE(fs::exists(top));
  const json spec = {
      {"root", (dir / "root").string()},
      {"hostname", "web-0"},
      {"mounts", json::array({
                     {{"source", (dir / "vol").string()}, {"target", top + "/data"}},
                     {{"source", (dir / "cfg").string()},
                      {"target", "/etc/rtable-test-cfg"},
                      {"read_only", true}},
                     {{"source", (dir / "hosts").string()}, {"target", "/etc/hosts"}},
                 })},
      {"argv", json::array({"sh", "-c",
                            "cat " + top +
                                "/data/data.txt; echo; cat /etc/rtable-test-cfg/c.txt;"
                                " echo; hostname; echo pid=$$; getent hosts peer.example;"
                                " touch /etc/rtable-test-cfg/x 2>/dev/null || echo read-only;"
                                " test -f /etc/passwd && echo etc-mirrored; exit 7"})},
      {"env", json::array({"PATH=/usr/bin:/bin"})},
      {"pid_file", (dir / "pid").string()}};
  {
    std::ofstream(dir / "spec.json") << spec.dump();
  }
  auto result = common::testing::runCommand(
      {defaultPodSandboxBinary().string(), (dir / "spec.json").string()}, 30s);
  ASSERT_TRUE(result) << result.error();
  EXPECT_EQ(result->exit_code, 7) << result->out << result->err;
  EXPECT_EQ(result->out,
            "volume data\nconfig\nweb-0\npid=1\n127.0.0.9       peer.example\nread-only\n"
            "etc-mirrored\n")
      << result->err;
  EXPECT_FALSE(fs::exists(top)) << "the host got a new top-level dir";
  EXPECT_FALSE(fs::exists("/etc/rtable-test-cfg")) << "the host's /etc was written";
  EXPECT_TRUE(fs::exists(dir / "pid"));
  fs::remove_all(dir);
}

// runAsUser/runAsGroup/fsGroup and readOnlyRootFilesystem, as a runtime applies them: the process
// has the ids, the root (every mirrored host directory, /tmp included) refuses writes, the
// volumes and /dev/null take them.
TEST(PodSandbox, RunsAsTheUserOnAReadOnlyRoot) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rtable-sandbox-user-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "root");
  fs::create_directories(dir / "vol");
  ASSERT_EQ(::chown((dir / "vol").c_str(), 0, 10001), 0);
  fs::permissions(dir / "vol", fs::perms::owner_all | fs::perms::group_all);
  // A name nothing else on the machine uses: the check below looks for it on the host.
  const std::string probe = fmt::format("/tmp/rtable-sandbox-probe-{}", getpid());
  const std::string script = fmt::format(
      "echo $(id -u):$(id -g):$(id -G);"
      " touch {} 2>/dev/null || echo tmp-read-only;"
      " touch /etc/x 2>/dev/null || echo etc-read-only;"
      " touch /x 2>/dev/null || echo root-read-only;"
      " echo kept > /data/f && echo volume-written;"
      " echo gone > /dev/null && echo dev-null-written",
      probe);
  const json spec = {
      {"root", (dir / "root").string()},
      {"mounts", json::array({{{"source", (dir / "vol").string()}, {"target", "/data"}}})},
      {"argv", json::array({"sh", "-c", script})},
      {"env", json::array({"PATH=/usr/bin:/bin"})},
      {"user", {{"uid", 10001}, {"gid", 10002}, {"groups", json::array({10001})}}},
      {"read_only_root", true},
      {"pid_file", (dir / "pid").string()}};
  std::ofstream(dir / "spec.json") << spec.dump();
  auto result = common::testing::runCommand(
      {defaultPodSandboxBinary().string(), (dir / "spec.json").string()}, 30s);
  ASSERT_TRUE(result) << result.error();
  EXPECT_EQ(result->exit_code, 0) << result->out << result->err;
  EXPECT_EQ(result->out,
            "10001:10002:10002 10001\ntmp-read-only\netc-read-only\nroot-read-only\n"
            "volume-written\ndev-null-written\n")
      << result->err;
  struct stat st{};
  ASSERT_EQ(::stat((dir / "vol" / "f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 10001u);
  EXPECT_FALSE(fs::exists(probe));
  fs::remove_all(dir);
}

TEST(PodRuntimeSpec, SecurityContextOfPodAndContainer) {
  const json pod = {{"securityContext",
                     {{"runAsNonRoot", true},
                      {"runAsUser", 10001},
                      {"runAsGroup", 10001},
                      {"fsGroup", 10001},
                      {"supplementalGroups", json::array({4000})}}}};
  auto plain = containerSecurity(pod, json::object());
  ASSERT_TRUE(plain) << plain.error();
  EXPECT_EQ(plain->uid, 10001u);
  EXPECT_EQ(plain->gid, 10001u);
  EXPECT_EQ(plain->groups, (std::vector<uint32_t>{10001, 4000}));
  EXPECT_EQ(plain->fs_group, 10001u);
  EXPECT_FALSE(plain->read_only_root);
  // The container's own fields win.
  auto own = containerSecurity(
      pod, {{"securityContext", {{"runAsUser", 65532}, {"readOnlyRootFilesystem", true}}}});
  ASSERT_TRUE(own);
  EXPECT_EQ(own->uid, 65532u);
  EXPECT_TRUE(own->read_only_root);
  // runAsNonRoot without a user (the image's is root here), or with user 0: refused.
  auto no_user = containerSecurity({{"securityContext", {{"runAsNonRoot", true}}}}, json::object());
  ASSERT_FALSE(no_user);
  EXPECT_NE(no_user.error().find("runAsNonRoot"), std::string::npos);
  EXPECT_FALSE(containerSecurity(pod, {{"securityContext", {{"runAsUser", 0}}}}));
  auto none = containerSecurity(json::object(), json::object());
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->uid);
}

TEST(PodRuntimeSpec, FsGroupOwnsAVolumeLikeKubelet) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rtable-fsgroup-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "writable" / "sub");
  std::ofstream(dir / "writable" / "sub" / "f") << "x";
  fs::permissions(dir / "writable" / "sub" / "f", fs::perms::owner_read);
  fs::create_directories(dir / "secret");
  std::ofstream(dir / "secret" / "key") << "s";
  fs::permissions(dir / "secret" / "key", fs::perms::owner_read);
  ASSERT_TRUE(applyFsGroup(dir / "writable", 10001, false));
  ASSERT_TRUE(applyFsGroup(dir / "secret", 10001, true));
  struct stat st{};
  ASSERT_EQ(::stat((dir / "writable" / "sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, 10001u);
  EXPECT_TRUE(st.st_mode & S_ISGID);
  EXPECT_TRUE(st.st_mode & S_IWGRP);
  ASSERT_EQ(::stat((dir / "writable" / "sub" / "f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0460u);
  ASSERT_EQ(::stat((dir / "secret" / "key").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, 10001u);
  EXPECT_EQ(st.st_mode & 0777, 0440u);  // a 0400 Secret file: readable by the group, no more
  fs::remove_all(dir);
}

// Starts `args` `starts` times, each time a SIGTERM at once: the process must still run `settle`
// later (the signal held, not fatal) and end 137 on the SIGKILL that follows.
void expectAnEarlySigtermIsSurvived(const std::vector<std::string>& args, const fs::path& log,
                                    int starts, std::chrono::milliseconds settle) {
  for (int i = 0; i < starts; ++i) {
    auto process = SandboxProcess::start(args, log);
    ASSERT_TRUE(process) << process.error();
    process->signal(SIGTERM);
    std::this_thread::sleep_for(settle);
    EXPECT_EQ(process->poll(), std::nullopt) << "start " << i << " ended on the SIGTERM";
    EXPECT_EQ(process->killAndReap(), 137) << "start " << i;
  }
}

// A liveness kill may come the moment a container started. The SIGTERM must wait for the
// sandbox's forwarding handler, never kill the supervisor (that would report 143 for a
// container that ignores SIGTERM and must end 137 after its grace period). `sleep` started
// directly keeps the blocked mask across exec, so it shows where the signal went: held, not fatal.
TEST(SandboxProcess, ASigtermRightAfterStartNeverKillsTheSupervisor) {
  const fs::path log = fs::temp_directory_path() / fmt::format("rtable-sandbox-{}.log", getpid());
  expectAnEarlySigtermIsSurvived({"/bin/sleep", "30"}, log, 20, 50ms);
  fs::remove(log);
}

// The same through the real sandbox: its init (PID 1 of the container, no handler) ignores the
// forwarded SIGTERM, so only the SIGKILL after the grace period ends it: 137.
TEST(SandboxProcess, TheSandboxForwardsAnEarlySigtermToTheContainer) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("rtable-sandbox-term-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "root");
  const json spec = {{"root", (dir / "root").string()},
                     {"hostname", "term-0"},
                     {"mounts", json::array()},
                     {"argv", json::array({"sh", "-c", "exec sleep 30"})},
                     {"env", json::array({"PATH=/usr/bin:/bin"})},
                     {"pid_file", (dir / "pid").string()}};
  {
    std::ofstream(dir / "spec.json") << spec.dump();
  }
  expectAnEarlySigtermIsSurvived({defaultPodSandboxBinary().string(), (dir / "spec.json").string()},
                                 dir / "log", 3, 300ms);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Against a real control plane.

constexpr const char* kPythonImage = "rtable/test-python:dev";

// The pods' program: an HTTP server on $(POD_IP):8080 that appends its name to a file in its PVC
// at every start and reports what it sees.
constexpr const char* kServer = R"PY(
import http.server, json, os, signal, socket, sys, urllib.request
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
ip, name = os.environ['POD_IP'], os.environ['POD_NAME']
with open('/data/starts.txt', 'a') as f:
    f.write(name + '\n')
ready = [True]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, code, body):
        b = body.encode()
        self.send_response(code)
        self.send_header('Content-Length', str(len(b)))
        self.send_header('Connection', 'close')
        self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        if self.path == '/ready':
            return self.reply(200 if ready[0] else 503, 'ready' if ready[0] else 'not ready')
        if self.path.startswith('/set-ready/'):
            ready[0] = self.path.endswith('/1')
            return self.reply(200, 'ok')
        if self.path == '/info':
            return self.reply(200, json.dumps({
                'pod': name, 'ip': ip, 'hostname': socket.gethostname(), 'pid': os.getpid(),
                'secret': os.environ.get('SECRET_TOKEN'), 'greeting': sys.argv[1],
                'config': open('/etc/app/config.txt').read(),
                'starts': open('/data/starts.txt').read().split()}))
        if self.path.startswith('/peer/'):
            try:
                url = 'http://%s:8080/info' % self.path[len('/peer/'):]
                return self.reply(200, urllib.request.urlopen(url, timeout=5).read().decode())
            except Exception as e:
                return self.reply(502, repr(e))
        self.reply(404, 'not found')
http.server.ThreadingHTTPServer((ip, 8080), H).serve_forever()
)PY";

KubeResult<std::unique_ptr<HttpKubeClient>> clientFor(const fs::path& kubeconfig) {
  auto config = KubeConfig::load(kubeconfig);
  if (!config) return std::unexpected(KubeError::decode(config.error().toString()));
  auto cluster = config->clusterConfig();
  if (!cluster) return std::unexpected(KubeError::decode(cluster.error().toString()));
  return HttpKubeClient::create(*cluster);
}

// The value at a JSON pointer ("/status/podIP"), or null: a pod's status fills in over time.
json at(const json& object, const std::string& pointer) {
  const json::json_pointer p(pointer);
  return object.contains(p) ? object.at(p) : json();
}

json conditionOf(const json& object, const std::string& type) {
  for (const auto& c : at(object, "/status/conditions")) {
    if (c.value("type", "") == type) return c;
  }
  return json::object();
}

bool podReady(const json& pod) {
  return at(pod, "/status/phase") == "Running" &&
         at(conditionOf(pod, "Ready"), "/status") == "True";
}

class LocalKubeletTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LocalControlPlaneOptions plane_options;
    plane_options.controller_manager = true;
    auto plane = LocalControlPlane::start(plane_options);
    ASSERT_TRUE(plane) << plane.error();
    plane_ = new LocalControlPlane(std::move(*plane));

    LocalKubeletOptions options;
    options.kubeconfig = plane_->kubeconfigPath();
    options.images[kPythonImage] = LocalImage{{"python3"}, {}, {}};
    options.images["busybox:test"] = LocalImage{{"sh"}, {}, {}};
    // Short enough for a test, long enough to see kubelet's CrashLoopBackOff.
    options.restart_backoff_initial = 1s;
    options.volume_refresh_interval = 300ms;
    options.lease_renew_interval = 2s;
    options.max_termination_grace = 10s;
    // A hosts file "of the host" (a stand-in for /etc/hosts) that the kubelet keeps a block in.
    host_hosts_ = new fs::path(plane_->workDir() / "host-hosts");
    {
      std::ofstream(*host_hosts_) << "127.0.0.1\tlocalhost\n";
    }
    options.host_hosts_file = *host_hosts_;
    auto kubelet = LocalKubelet::start(options);
    ASSERT_TRUE(kubelet) << kubelet.error();
    kubelet_ = new LocalKubelet(std::move(*kubelet));

    auto client = clientFor(plane_->kubeconfigPath());
    ASSERT_TRUE(client) << client.error().toString();
    client_ = client->release();
  }

  static void TearDownTestSuite() {
    const bool failed = ::testing::UnitTest::GetInstance()->failed_test_count() > 0;
    if (failed && kubelet_) {
      kubelet_->keepWorkDir();
      std::fprintf(stderr, "LocalKubelet work dir kept: %s\n", kubelet_->workDir().c_str());
    }
    if (failed && plane_) {
      plane_->keepWorkDir();
      std::fprintf(stderr, "control plane work dir kept: %s\n", plane_->workDir().c_str());
    }
    delete client_;
    delete kubelet_;  // stops the containers before the apiserver goes
    delete plane_;
    delete host_hosts_;
    host_hosts_ = nullptr;
    client_ = nullptr;
    kubelet_ = nullptr;
    plane_ = nullptr;
  }

  static void apply(const json& object) {
    auto applied = plane_->apply(object.dump());
    ASSERT_TRUE(applied) << applied.error();
  }

  static void createNamespace(const std::string& ns) {
    apply({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  }

  static std::optional<json> getPod(const std::string& ns, const std::string& name) {
    auto pod = client_->get(resources::pods(), {ns, name});
    if (!pod) return std::nullopt;
    return *pod;
  }

  // Waits until `check` holds for pod ns/name; the last state seen goes into the failure.
  static ::testing::AssertionResult waitPod(const std::string& ns, const std::string& name,
                                            const std::function<bool(const json&)>& check,
                                            std::chrono::milliseconds timeout = 60s) {
    json last;
    if (waitFor(
            [&] {
              auto pod = getPod(ns, name);
              if (!pod) return false;
              last = *pod;
              return check(*pod);
            },
            timeout)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << ns << "/" << name << " never got there; last status: "
           << (last.contains("status") ? last["status"].dump() : "(no pod)");
  }

  // The container's main process, once the kubelet knows its pid.
  static pid_t containerPid(const std::string& ns, const std::string& pod) {
    pid_t pid = -1;
    waitFor(
        [&] {
          auto container = kubelet_->container(ns, pod, "server");
          pid = container ? container->pid : -1;
          return pid > 1;
        },
        10s, 50ms);
    return pid;
  }

  static json info(const std::string& ip, const std::string& path = "/info") {
    auto response = common::testing::httpRequest(ip, 8080, "GET", path, "", 10s);
    if (!response || response->status != 200) return json::object();
    json body = json::parse(response->body, nullptr, false);
    return body.is_object() ? body : json::object();
  }

  static inline LocalControlPlane* plane_ = nullptr;
  static inline LocalKubelet* kubelet_ = nullptr;
  static inline HttpKubeClient* client_ = nullptr;
  static inline fs::path* host_hosts_ = nullptr;
};

json statefulSet(const std::string& ns, int replicas) {
  const json container = {
      {"name", "server"},
      {"image", kPythonImage},
      {"command", json::array({"python3", "-c", kServer, "$(GREETING)"})},
      {"env",
       json::array({
           {{"name", "POD_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
           {{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
           {{"name", "GREETING"}, {"value", "hello-$(POD_NAME)"}},
           {{"name", "SECRET_TOKEN"},
            {"valueFrom", {{"secretKeyRef", {{"name", "web-secret"}, {"key", "token"}}}}}},
       })},
      {"ports", json::array({{{"name", "http"}, {"containerPort", 8080}}})},
      {"readinessProbe",
       {{"httpGet", {{"path", "/ready"}, {"port", "http"}}},
        {"periodSeconds", 1},
        {"failureThreshold", 1}}},
      {"volumeMounts", json::array({{{"name", "data"}, {"mountPath", "/data"}},
                                    {{"name", "config"}, {"mountPath", "/etc/app"}}})}};
  return {{"apiVersion", "apps/v1"},
          {"kind", "StatefulSet"},
          {"metadata", {{"name", "web"}, {"namespace", ns}}},
          {"spec",
           {{"serviceName", "web"},
            {"replicas", replicas},
            {"selector", {{"matchLabels", {{"app", "web"}}}}},
            {"template",
             {{"metadata", {{"labels", {{"app", "web"}}}}},
              {"spec",
               {{"terminationGracePeriodSeconds", 5},
                {"containers", json::array({container})},
                {"volumes",
                 json::array({{{"name", "config"}, {"configMap", {{"name", "web-config"}}}}})}}}}},
            {"volumeClaimTemplates",
             json::array({{{"metadata", {{"name", "data"}}},
                           {"spec",
                            {{"accessModes", json::array({"ReadWriteOnce"})},
                             {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}}})}}}};
}

TEST_F(LocalKubeletTest, RunsAStatefulSetLikeAKubelet) {
  const std::string ns = "sts";
  createNamespace(ns);
  apply({{"apiVersion", "v1"},
         {"kind", "ConfigMap"},
         {"metadata", {{"name", "web-config"}, {"namespace", ns}}},
         {"data", {{"config.txt", "version 1"}}}});
  apply({{"apiVersion", "v1"},
         {"kind", "Secret"},
         {"metadata", {{"name", "web-secret"}, {"namespace", ns}}},
         {"stringData", {{"token", "t0ps3cret"}}}});
  apply({{"apiVersion", "v1"},
         {"kind", "Service"},
         {"metadata", {{"name", "web"}, {"namespace", ns}}},
         {"spec",
          {{"clusterIP", "None"},
           {"selector", {{"app", "web"}}},
           {"ports", json::array({{{"name", "http"}, {"port", 8080}}})}}}});
  apply(statefulSet(ns, 3));

  // OrderedReady: web-1 only appears once web-0 is Ready, so all three Ready says a lot.
  std::set<std::string> ips;
  for (const std::string name : {"web-0", "web-1", "web-2"}) {
    ASSERT_TRUE(waitPod(ns, name, podReady, 90s));
    auto pod = getPod(ns, name);
    ASSERT_TRUE(pod);
    const std::string ip = (*pod)["status"].value("podIP", "");
    EXPECT_TRUE(ip.starts_with("127.0.")) << ip;
    EXPECT_EQ((*pod)["status"].value("hostIP", ""), "127.0.0.1");
    EXPECT_EQ((*pod)["spec"].value("nodeName", ""), kubelet_->nodeName());
    EXPECT_EQ(conditionOf(*pod, "PodScheduled").value("status", ""), "True");
    EXPECT_EQ(conditionOf(*pod, "Initialized").value("status", ""), "True");
    EXPECT_EQ(conditionOf(*pod, "ContainersReady").value("status", ""), "True");
    const json& cs = (*pod)["status"]["containerStatuses"][0];
    EXPECT_TRUE(cs["state"].contains("running")) << cs.dump();
    EXPECT_EQ(cs.value("restartCount", -1), 0);
    ips.insert(ip);

    const json seen = info(ip);
    ASSERT_FALSE(seen.empty()) << "no /info from " << name << " at " << ip;
    EXPECT_EQ(seen.value("pod", ""), name);
    EXPECT_EQ(seen.value("ip", ""), ip);
    EXPECT_EQ(seen.value("hostname", ""), name);
    EXPECT_EQ(seen.value("pid", 0), 1);  // PID 1 of its own PID namespace
    EXPECT_EQ(seen.value("secret", ""), "t0ps3cret");
    EXPECT_EQ(seen.value("greeting", ""), "hello-" + name);
    EXPECT_EQ(seen.value("config", ""), "version 1");
    EXPECT_EQ(seen["starts"], json::array({name}));
  }
  EXPECT_EQ(ips.size(), 3u);
  auto pvc = client_->get(resources::persistentVolumeClaims(), {ns, "data-web-0"});
  ASSERT_TRUE(pvc) << pvc.error().toString();
  EXPECT_EQ((*pvc)["status"].value("phase", ""), "Bound");

  // The host's hosts file got the same names, in the kubelet's block, its own line kept.
  const std::string web1_line = fmt::format("web-1.web.{}.svc.cluster.local", ns);
  auto host_hosts_has_web1 = [&] {
    return readFile(*host_hosts_).value_or("").find(web1_line) != std::string::npos;
  };
  EXPECT_TRUE(waitFor(host_hosts_has_web1, 10s));
  EXPECT_TRUE(readFile(*host_hosts_).value_or("").starts_with("127.0.0.1\tlocalhost\n"));

  // Peers by their stable DNS names, from inside a pod.
  const std::string ip0 = (*getPod(ns, "web-0"))["status"]["podIP"];
  for (const std::string peer : {"web-1", "web-2"}) {
    const json answer = info(ip0, fmt::format("/peer/{}.web.{}.svc.cluster.local", peer, ns));
    EXPECT_EQ(answer.value("pod", ""), peer) << "web-0 could not reach " << peer;
  }

  // kill -9 of the container's main process: restarted at once (first restart), data kept.
  {
    const pid_t pid = containerPid(ns, "web-1");
    ASSERT_GT(pid, 1);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    ASSERT_TRUE(waitPod(ns, "web-1", [](const json& pod) {
      return at(pod, "/status/containerStatuses/0/restartCount") == 1 && podReady(pod);
    }));
    auto pod = getPod(ns, "web-1");
    EXPECT_EQ(at(*pod, "/status/containerStatuses/0/lastState/terminated/exitCode"), 137)
        << at(*pod, "/status/containerStatuses/0").dump();
    const json seen = info((*pod)["status"]["podIP"]);
    EXPECT_EQ(seen["starts"], json::array({"web-1", "web-1"}));
  }

  // A ConfigMap change reaches the mounted file (kubelet: eventually).
  apply({{"apiVersion", "v1"},
         {"kind", "ConfigMap"},
         {"metadata", {{"name", "web-config"}, {"namespace", ns}}},
         {"data", {{"config.txt", "version 2"}}}});
  EXPECT_TRUE(waitFor([&] { return info(ip0).value("config", "") == "version 2"; }, 30s));

  // Readiness follows the probe both ways.
  auto set_ready = [&](int value) {
    auto answer =
        common::testing::httpRequest(ip0, 8080, "GET", fmt::format("/set-ready/{}", value));
    return answer && answer->status == 200;
  };
  ASSERT_TRUE(set_ready(0));
  EXPECT_TRUE(waitPod(
      ns, "web-0",
      [](const json& pod) {
        return conditionOf(pod, "Ready").value("status", "") == "False" &&
               at(pod, "/status/containerStatuses/0/ready") == false;
      },
      30s));
  ASSERT_TRUE(set_ready(1));
  EXPECT_TRUE(waitPod(ns, "web-0", podReady, 30s));

  // A deleted pod comes back under its name with a new uid, the same PVC and its data.
  {
    const std::string old_uid = (*getPod(ns, "web-2"))["metadata"]["uid"];
    auto deleted = client_->remove(resources::pods(), {ns, "web-2"});
    ASSERT_TRUE(deleted) << deleted.error().toString();
    ASSERT_TRUE(waitPod(
        ns, "web-2",
        [&](const json& pod) {
          return pod["metadata"].value("uid", "") != old_uid && podReady(pod);
        },
        90s));
    const json seen = info((*getPod(ns, "web-2"))["status"]["podIP"]);
    EXPECT_EQ(seen["starts"], json::array({"web-2", "web-2"}));
    EXPECT_EQ(readFile(kubelet_->volumeDir(ns, "data-web-2") / "starts.txt"), "web-2\nweb-2\n");
  }

  // Scale down: the removed pods' processes stop and their IPs are free again.
  std::vector<pid_t> removed;
  for (const std::string name : {"web-1", "web-2"}) {
    const pid_t pid = containerPid(ns, name);
    ASSERT_GT(pid, 1);
    removed.push_back(pid);
  }
  auto scaled = plane_->kubectl({"scale", "statefulset/web", "--replicas=1", "-n", ns});
  ASSERT_TRUE(scaled && scaled->exit_code == 0) << (scaled ? scaled->err : scaled.error());
  EXPECT_TRUE(waitFor([&] { return !getPod(ns, "web-1") && !getPod(ns, "web-2"); }, 60s));
  EXPECT_TRUE(waitFor([&] { return kubelet_->runningPods() == 1; }, 30s));
  for (pid_t pid : removed) {
    EXPECT_TRUE(waitFor([&] { return ::kill(pid, 0) != 0; }, 10s)) << "pid " << pid << " lives";
  }
  EXPECT_TRUE(waitPod(ns, "web-0", podReady, 10s));
  EXPECT_TRUE(waitFor([&] { return !host_hosts_has_web1(); }, 10s));
}

TEST_F(LocalKubeletTest, ReportsImagesItCannotRun) {
  const std::string ns = "images";
  createNamespace(ns);
  apply({{"apiVersion", "v1"},
         {"kind", "Pod"},
         {"metadata", {{"name", "unknown"}, {"namespace", ns}}},
         {"spec", {{"containers", json::array({{{"name", "c"}, {"image", "nope:1.0"}}})}}}});
  EXPECT_TRUE(waitPod(ns, "unknown", [](const json& pod) {
    const json reason = at(pod, "/status/containerStatuses/0/state/waiting/reason");
    return at(pod, "/status/phase") == "Pending" &&
           (reason == "ErrImagePull" || reason == "ImagePullBackOff");
  }));
}

TEST_F(LocalKubeletTest, RunsPodsToCompletionAndLogsThem) {
  const std::string ns = "jobs";
  createNamespace(ns);
  auto pod = [&](const std::string& name, const std::string& script) {
    return json{
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", ns}}},
        {"spec",
         {{"restartPolicy", "Never"},
          {"containers",
           json::array(
               {{{"name", "main"},
                 {"image", "busybox:test"},
                 {"args", json::array({"-c", script})},
                 {"env", json::array({
                             {{"name", "NODE"},
                              {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
                             {{"name", "MSG"}, {"value", "on $(NODE)"}},
                         })}}})}}}};
  };
  apply(pod("fails", "echo \"$(MSG)\"; exit 3"));
  apply(pod("succeeds", "echo done"));
  EXPECT_TRUE(waitPod(ns, "fails", [](const json& p) {
    return at(p, "/status/phase") == "Failed" &&
           at(p, "/status/containerStatuses/0/state/terminated/exitCode") == 3;
  }));
  EXPECT_TRUE(waitPod(ns, "succeeds", [](const json& p) {
    return at(p, "/status/phase") == "Succeeded" &&
           conditionOf(p, "Ready").value("reason", "") == "PodCompleted";
  }));
  auto log = readFile(kubelet_->logFile(ns, "fails", "main"));
  ASSERT_TRUE(log);
  EXPECT_NE(log->find("on " + kubelet_->nodeName()), std::string::npos) << *log;
  auto failed = getPod(ns, "fails");
  ASSERT_TRUE(failed);
  EXPECT_EQ(at(*failed, "/status/containerStatuses/0/restartCount"), 0);
}

TEST_F(LocalKubeletTest, LivenessFailureRestartsWithBackoff) {
  const std::string ns = "liveness";
  createNamespace(ns);
  // `sleep` as PID 1 ignores SIGTERM (no handler), so the kill takes the 1 s grace and SIGKILL.
  apply({{"apiVersion", "v1"},
         {"kind", "Pod"},
         {"metadata", {{"name", "dead"}, {"namespace", ns}}},
         {"spec",
          {{"terminationGracePeriodSeconds", 1},
           {"containers", json::array({{{"name", "main"},
                                        {"image", "busybox:test"},
                                        {"args", json::array({"-c", "exec sleep 1000"})},
                                        {"livenessProbe",
                                         {{"tcpSocket", {{"port", 9}}},  // nothing listens there
                                          {"periodSeconds", 1},
                                          {"failureThreshold", 1}}}}})}}}});
  EXPECT_TRUE(waitPod(
      ns, "dead",
      [](const json& p) {
        const json restarts = at(p, "/status/containerStatuses/0/restartCount");
        return restarts.is_number() && restarts.get<int>() >= 2 &&
               at(p, "/status/containerStatuses/0/lastState/terminated/exitCode") == 137;
      },
      60s));
}

TEST_F(LocalKubeletTest, ExecProbesRunInTheContainersNamespaces) {
  const std::string ns = "exec";
  createNamespace(ns);
  // Ready only where the hostname is the pod's: the probe runs in the container's UTS namespace.
  auto pod = [&](const std::string& name, const std::string& expected_hostname) {
    return json{
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", ns}}},
        {"spec",
         {{"terminationGracePeriodSeconds", 1},
          {"containers",
           json::array(
               {{{"name", "main"},
                 {"image", "busybox:test"},
                 {"args", json::array({"-c", "exec sleep 1000"})},
                 {"readinessProbe",
                  {{"exec",
                    {{"command",
                      json::array({"sh", "-c", "test \"$(hostname)\" = " + expected_hostname})}}},
                   {"periodSeconds", 1}}}}})}}}};
  };
  apply(pod("probed", "probed"));
  apply(pod("unready", "someone-else"));
  EXPECT_TRUE(waitPod(ns, "probed", podReady, 30s));
  EXPECT_TRUE(waitPod(
      ns, "unready",
      [](const json& p) {
        return at(p, "/status/phase") == "Running" &&
               at(conditionOf(p, "Ready"), "/status") == "False";
      },
      30s));
  auto unready = getPod(ns, "unready");
  ASSERT_TRUE(unready);
  EXPECT_EQ(at(*unready, "/status/containerStatuses/0/ready"), false);
}

TEST_F(LocalKubeletTest, KeepsItsNodeAlive) {
  auto node = client_->get(ResourceType{"", "v1", "nodes", "Node", false, true},
                           {"", kubelet_->nodeName()});
  ASSERT_TRUE(node) << node.error().toString();
  EXPECT_EQ(conditionOf(*node, "Ready").value("status", ""), "True");
  auto renewTime = [&]() -> std::string {
    auto lease = client_->get(resources::leases(), {"kube-node-lease", kubelet_->nodeName()});
    const json time = lease ? at(*lease, "/spec/renewTime") : json();
    return time.is_string() ? time.get<std::string>() : "";
  };
  const std::string first = renewTime();
  ASSERT_FALSE(first.empty());
  EXPECT_TRUE(waitFor([&] { return renewTime() != first; }, 15s)) << "lease not renewed";
  // The node lifecycle controller would taint a node it considers unhealthy.
  node = client_->get(ResourceType{"", "v1", "nodes", "Node", false, true},
                      {"", kubelet_->nodeName()});
  ASSERT_TRUE(node);
  EXPECT_FALSE((*node)["spec"].contains("taints")) << (*node)["spec"].dump();
}

}  // namespace
}  // namespace rtable::op::testing
