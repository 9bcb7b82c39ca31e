#include "rtable/operator/testing/local_control_plane.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "rtable/common/base64.h"
#include "rtable/common/testing/http_client.h"

namespace rtable::op::testing {
namespace {

namespace fs = std::filesystem;
using common::base64Encode;
using common::testing::findFreeLoopbackPort;
using common::testing::httpRequest;
using common::testing::runCommand;
using common::testing::Subprocess;
using common::testing::tailOfFile;

constexpr auto kToolTimeout = std::chrono::seconds(30);
constexpr auto kPollInterval = std::chrono::milliseconds(250);
// SIGTERM lets kube-apiserver drain; it needs a few seconds at most with no clients waiting.
constexpr auto kStopGrace = std::chrono::seconds(15);
// etcd's own key that kube-apiserver's compactor writes the compacted revision to
// (k8s.io/apiserver/pkg/storage/etcd3/compact.go, compactRevKey); outside the /registry prefix.
constexpr std::string_view kCompactRevKey = "compact_rev_key";
// The service CIDR; its first address is the `kubernetes` Service's ClusterIP.
constexpr std::string_view kServiceCidr = "10.0.0.0/24";
constexpr std::string_view kServiceIp = "10.0.0.1";

std::expected<std::string, std::string> readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected("cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TestStatus writeFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return std::unexpected("cannot write " + path.string());
  return {};
}

std::string commandFailure(const std::vector<std::string>& argv, const CommandResult& result) {
  std::string line;
  for (const auto& arg : argv) line += (line.empty() ? "" : " ") + arg;
  return fmt::format("`{}` failed (exit {}): {}{}", line, result.exit_code, result.out, result.err);
}

TestStatus runTool(const std::vector<std::string>& argv) {
  auto result = runCommand(argv, kToolTimeout);
  if (!result) return std::unexpected(result.error());
  if (result->exit_code != 0) return std::unexpected(commandFailure(argv, *result));
  return {};
}

// P-256 keys: quick to make, and Go's TLS takes them for serving and client certificates.
std::vector<std::string> newEcKeyArgs(const fs::path& key) {
  return {"-newkey", "ec",      "-pkeyopt",  "ec_paramgen_curve:prime256v1",
          "-nodes",  "-keyout", key.string()};
}

TestStatus makeCa(const fs::path& pki) {
  std::vector<std::string> argv = {"openssl", "req", "-x509", "-new"};
  for (auto& arg : newEcKeyArgs(pki / "ca.key")) argv.push_back(arg);
  argv.insert(argv.end(), {"-out", (pki / "ca.crt").string(), "-days", "3650", "-subj",
                           "/CN=rtable-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
                           "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"});
  return runTool(argv);
}

// Issues <name>.crt and <name>.key signed by the CA, with the given subject and extensions.
TestStatus issueCertificate(const fs::path& pki, const std::string& name,
                            const std::string& subject, const std::string& extensions) {
  const fs::path key = pki / (name + ".key");
  const fs::path csr = pki / (name + ".csr");
  const fs::path ext = pki / (name + ".ext");
  std::vector<std::string> request = {"openssl", "req", "-new"};
  for (auto& arg : newEcKeyArgs(key)) request.push_back(arg);
  request.insert(request.end(), {"-out", csr.string(), "-subj", subject});
  if (auto made = runTool(request); !made) return made;
  if (auto written = writeFile(ext, extensions); !written) return written;
  return runTool({"openssl", "x509", "-req", "-in", csr.string(), "-CA", (pki / "ca.crt").string(),
                  "-CAkey", (pki / "ca.key").string(), "-CAcreateserial", "-CAserial",
                  (pki / "ca.srl").string(), "-days", "3650", "-extfile", ext.string(), "-out",
                  (pki / (name + ".crt")).string()});
}

TestStatus makeCertificates(const fs::path& pki) {
  if (auto made = makeCa(pki); !made) return made;
  const std::string server_ext = fmt::format(
      "basicConstraints=critical,CA:FALSE\n"
      "keyUsage=critical,digitalSignature,keyEncipherment\n"
      "extendedKeyUsage=serverAuth\n"
      "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:{},DNS:kubernetes,DNS:kubernetes.default,"
      "DNS:kubernetes.default.svc\n",
      kServiceIp);
  const std::string client_ext =
      "basicConstraints=critical,CA:FALSE\n"
      "keyUsage=critical,digitalSignature,keyEncipherment\n"
      "extendedKeyUsage=clientAuth\n";
  if (auto made = issueCertificate(pki, "apiserver", "/CN=kube-apiserver", server_ext); !made) {
    return made;
  }
  // O=system:masters is bound to cluster-admin by RBAC's bootstrap policy (envtest's admin).
  if (auto made =
          issueCertificate(pki, "admin", "/O=system:masters/CN=rtable-test-admin", client_ext);
      !made) {
    return made;
  }
  // The identity kubeadm gives the controller manager; RBAC's bootstrap policy grants it what it
  // needs to mint tokens for each controller's own ServiceAccount.
  if (auto made = issueCertificate(pki, "controller-manager", "/CN=system:kube-controller-manager",
                                   client_ext);
      !made) {
    return made;
  }
  // The service-account token signing key pair.
  if (auto made = runTool({"openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                           "rsa_keygen_bits:2048", "-out", (pki / "sa.key").string()});
      !made) {
    return made;
  }
  return runTool({"openssl", "pkey", "-in", (pki / "sa.key").string(), "-pubout", "-out",
                  (pki / "sa.pub").string()});
}

struct KubeconfigUser {
  std::string name;
  std::string client_certificate;  // PEM, with client_key; or
  std::string client_key;
  std::string token;  // a bearer token
};

std::string kubeconfigYaml(const std::string& server, const std::string& ca_pem,
                           const KubeconfigUser& user) {
  std::string credentials;
  if (!user.token.empty()) {
    credentials = fmt::format("    token: {}\n", user.token);
  } else {
    credentials = fmt::format("    client-certificate-data: {}\n    client-key-data: {}\n",
                              base64Encode(user.client_certificate), base64Encode(user.client_key));
  }
  return fmt::format(
      "apiVersion: v1\n"
      "kind: Config\n"
      "clusters:\n"
      "- name: rtable-test\n"
      "  cluster:\n"
      "    server: {}\n"
      "    certificate-authority-data: {}\n"
      "users:\n"
      "- name: {}\n"
      "  user:\n"
      "{}"
      "contexts:\n"
      "- name: {}\n"
      "  context:\n"
      "    cluster: rtable-test\n"
      "    user: {}\n"
      "current-context: {}\n",
      server, base64Encode(ca_pem), user.name, credentials, user.name, user.name, user.name);
}

TestStatus writeCertKubeconfig(const fs::path& path, const fs::path& pki, const std::string& server,
                               const std::string& user_name, const std::string& cert_name) {
  auto ca = readFile(pki / "ca.crt");
  auto cert = readFile(pki / (cert_name + ".crt"));
  auto key = readFile(pki / (cert_name + ".key"));
  if (!ca) return std::unexpected(ca.error());
  if (!cert) return std::unexpected(cert.error());
  if (!key) return std::unexpected(key.error());
  return writeFile(path, kubeconfigYaml(server, *ca, {user_name, *cert, *key, ""}));
}

fs::path defaultBinDir() {
  if (const char* dir = std::getenv("RTABLE_CONTROL_PLANE_BIN_DIR"); dir && *dir) return dir;
  return RTABLE_CONTROL_PLANE_BIN_DIR;
}

// etcd's gRPC gateway encodes int64 fields as JSON strings.
std::optional<int64_t> jsonInt64(const nlohmann::json& value) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_string()) {
    try {
      return std::stoll(value.get<std::string>());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

struct LocalControlPlane::State {
  LocalControlPlaneOptions options;
  fs::path work_dir;
  bool remove_work_dir = false;
  fs::path kubeconfig;
  int etcd_port = 0;
  int etcd_peer_port = 0;
  int apiserver_port = 0;
  std::optional<Subprocess> etcd;
  std::optional<Subprocess> apiserver;
  std::optional<Subprocess> controller_manager;
  int manifests_written = 0;

  ~State() {
    if (controller_manager) controller_manager->stop(kStopGrace);
    if (apiserver) apiserver->stop(kStopGrace);
    if (etcd) etcd->stop(kStopGrace);
    if (remove_work_dir && !std::getenv("RTABLE_KEEP_TEST_DIRS")) {
      std::error_code ec;
      fs::remove_all(work_dir, ec);
    }
  }

  fs::path pki() const { return work_dir / "pki"; }
  std::string bin(const char* name) const { return (options.bin_dir / name).string(); }
  std::string serverUrl() const { return fmt::format("https://127.0.0.1:{}", apiserver_port); }
  std::string etcdUrl() const { return fmt::format("http://127.0.0.1:{}", etcd_port); }

  std::expected<CommandResult, std::string> kubectl(const fs::path& config,
                                                    const std::vector<std::string>& args,
                                                    std::chrono::milliseconds timeout) const {
    // A discovery cache of our own: the default one in ~/.kube is keyed by host:port, which a
    // later control plane may reuse with other resources.
    std::vector<std::string> argv = {bin("kubectl"), "--kubeconfig=" + config.string(),
                                     "--cache-dir=" + (work_dir / "kubectl-cache").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return runCommand(argv, timeout);
  }

  TestStatus startEtcd() {
    const std::string client_url = etcdUrl();
    const std::string peer_url = fmt::format("http://127.0.0.1:{}", etcd_peer_port);
    auto process = Subprocess::start(
        {bin("etcd"), "--name=rtable-test", "--data-dir=" + (work_dir / "etcd").string(),
         "--listen-client-urls=" + client_url, "--advertise-client-urls=" + client_url,
         "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
         "--initial-cluster=rtable-test=" + peer_url,
         // Test data need not survive a machine crash; fsync would dominate on a shared disk.
         "--unsafe-no-fsync", "--log-level=warn"},
        work_dir / "etcd.log");
    if (!process) return std::unexpected(process.error());
    etcd.emplace(std::move(*process));
    const auto deadline = std::chrono::steady_clock::now() + options.start_timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!etcd->running()) {
        etcd.reset();
        return std::unexpected(fmt::format("etcd on port {} exited during start; log tail:\n{}",
                                           etcd_port, tailOfFile(work_dir / "etcd.log")));
      }
      auto health =
          httpRequest("127.0.0.1", etcd_port, "GET", "/health", "", std::chrono::seconds(2));
      if (health && health->status == 200 &&
          health->body.find("\"health\":\"true\"") != std::string::npos) {
        return {};
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    etcd.reset();
    return std::unexpected(fmt::format("etcd on port {} not healthy after {} s; log tail:\n{}",
                                       etcd_port, options.start_timeout.count(),
                                       tailOfFile(work_dir / "etcd.log")));
  }

  // envtest's flags (docs/control-plane.md), everything on loopback.
  std::vector<std::string> apiServerArgv() const {
    const fs::path p = pki();
    std::vector<std::string> argv = {
        bin("kube-apiserver"),
        "--etcd-servers=" + etcdUrl(),
        "--bind-address=127.0.0.1",
        fmt::format("--secure-port={}", apiserver_port),
        // Else it advertises the default route's address.
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        "--cert-dir=" + p.string(),
        "--tls-cert-file=" + (p / "apiserver.crt").string(),
        "--tls-private-key-file=" + (p / "apiserver.key").string(),
        "--client-ca-file=" + (p / "ca.crt").string(),
        fmt::format("--service-cluster-ip-range={}", kServiceCidr),
        "--service-account-issuer=https://kubernetes.default.svc",
        "--service-account-key-file=" + (p / "sa.pub").string(),
        "--service-account-signing-key-file=" + (p / "sa.key").string(),
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        // Pods are never run, so they need no token volume, and a Pod created before the
        // controller manager made the namespace's `default` ServiceAccount is not refused.
        "--disable-admission-plugins=ServiceAccount",
        // Graceful shutdown ends with the HTTP server's Shutdown, which waits for open watches
        // up to --request-timeout (60 s); with this flag it waits 2 s, and requests that arrive
        // meanwhile get 429 Retry-After as clients of a real rolling restart would.
        "--shutdown-send-retry-after=true",
        "--profiling=false",
    };
    argv.insert(argv.end(), options.extra_apiserver_flags.begin(),
                options.extra_apiserver_flags.end());
    return argv;
  }

  TestStatus launchApiServer() {
    const fs::path log = work_dir / "kube-apiserver.log";
    auto process = Subprocess::start(apiServerArgv(), log);
    if (!process) return std::unexpected(process.error());
    apiserver.emplace(std::move(*process));
    // Ready is /readyz (etcd reachable, RBAC bootstrap policy written, caches synced), not an
    // open port.
    std::string last_answer;
    const auto deadline = std::chrono::steady_clock::now() + options.start_timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!apiserver->running()) {
        apiserver.reset();
        return std::unexpected(
            fmt::format("kube-apiserver on port {} exited during start; log tail:\n{}",
                        apiserver_port, tailOfFile(log)));
      }
      auto ready = kubectl(kubeconfig, {"get", "--raw=/readyz"}, std::chrono::seconds(10));
      if (ready && ready->exit_code == 0 && ready->out.starts_with("ok")) return {};
      last_answer = ready ? ready->out + ready->err : ready.error();
      std::this_thread::sleep_for(kPollInterval);
    }
    apiserver->kill();
    apiserver.reset();
    return std::unexpected(fmt::format(
        "kube-apiserver on port {} not ready after {} s; last answer: {}\nlog tail:\n{}",
        apiserver_port, options.start_timeout.count(), last_answer, tailOfFile(log)));
  }

  // It has no readiness endpoint here (no serving port); tests wait for its effects.
  TestStatus launchControllerManager() {
    const fs::path p = pki();
    auto process = Subprocess::start(
        {bin("kube-controller-manager"),
         "--kubeconfig=" + (work_dir / "controller-manager.kubeconfig").string(),
         "--leader-elect=false", "--controllers=*",
         // kubeadm's setup: each controller acts as its own ServiceAccount, with the RBAC
         // bootstrap policy's role for it.
         "--use-service-account-credentials=true",
         "--service-account-private-key-file=" + (p / "sa.key").string(),
         "--root-ca-file=" + (p / "ca.crt").string(),
         "--cluster-signing-cert-file=" + (p / "ca.crt").string(),
         "--cluster-signing-key-file=" + (p / "ca.key").string(),
         fmt::format("--service-cluster-ip-range={}", kServiceCidr),
         // No HTTPS endpoint (healthz, metrics): nothing here reads it, and no port to pick.
         "--secure-port=0", "--profiling=false"},
        work_dir / "kube-controller-manager.log");
    if (!process) return std::unexpected(process.error());
    controller_manager.emplace(std::move(*process));
    // A bad flag or kubeconfig ends it at once.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (!controller_manager->running()) {
      controller_manager.reset();
      return std::unexpected(
          fmt::format("kube-controller-manager exited during start; log tail:\n{}",
                      tailOfFile(work_dir / "kube-controller-manager.log")));
    }
    return {};
  }
};

LocalControlPlane::LocalControlPlane(std::unique_ptr<State> state) : state_(std::move(state)) {}
LocalControlPlane::LocalControlPlane(LocalControlPlane&&) noexcept = default;
LocalControlPlane& LocalControlPlane::operator=(LocalControlPlane&&) noexcept = default;
LocalControlPlane::~LocalControlPlane() = default;

std::expected<LocalControlPlane, std::string> LocalControlPlane::start(
    LocalControlPlaneOptions options) {
  auto state = std::make_unique<State>();
  if (options.bin_dir.empty()) options.bin_dir = defaultBinDir();
  std::vector<const char*> needed = {"etcd", "kube-apiserver", "kubectl"};
  if (options.controller_manager) needed.push_back("kube-controller-manager");
  for (const char* name : needed) {
    if (!fs::exists(options.bin_dir / name)) {
      return std::unexpected(
          fmt::format("{} not found in {}: run e2e/build-control-plane.sh (or set "
                      "RTABLE_CONTROL_PLANE_BIN_DIR)",
                      name, options.bin_dir.string()));
    }
  }
  if (options.work_dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "rtable-control-plane-XXXXXX").string();
    if (!mkdtemp(pattern.data())) return std::unexpected("mkdtemp failed for " + pattern);
    options.work_dir = pattern;
    state->remove_work_dir = true;
  }
  state->work_dir = options.work_dir;
  state->options = std::move(options);
  std::error_code ec;
  fs::create_directories(state->pki(), ec);
  fs::create_directories(state->work_dir / "manifests", ec);
  if (ec)
    return std::unexpected(
        fmt::format("cannot create {}: {}", state->pki().string(), ec.message()));
  if (auto made = makeCertificates(state->pki()); !made) return std::unexpected(made.error());

  // A port is free when we look; another process may take it before the server binds, so a few
  // tries with fresh ports.
  std::string last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto client = findFreeLoopbackPort();
    auto peer = findFreeLoopbackPort();
    if (!client) return std::unexpected(client.error());
    if (!peer) return std::unexpected(peer.error());
    if (*client == *peer) continue;
    state->etcd_port = *client;
    state->etcd_peer_port = *peer;
    auto started = state->startEtcd();
    if (started) break;
    last_error = started.error();
    fs::remove_all(state->work_dir / "etcd", ec);
  }
  if (!state->etcd) return std::unexpected(last_error);

  state->kubeconfig = state->work_dir / "admin.kubeconfig";
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto port = findFreeLoopbackPort();
    if (!port) return std::unexpected(port.error());
    state->apiserver_port = *port;
    if (auto written = writeCertKubeconfig(state->kubeconfig, state->pki(), state->serverUrl(),
                                           "rtable-test-admin", "admin");
        !written) {
      return std::unexpected(written.error());
    }
    auto started = state->launchApiServer();
    if (started) break;
    last_error = started.error();
  }
  if (!state->apiserver) return std::unexpected(last_error);

  if (state->options.controller_manager) {
    if (auto written = writeCertKubeconfig(state->work_dir / "controller-manager.kubeconfig",
                                           state->pki(), state->serverUrl(),
                                           "system:kube-controller-manager", "controller-manager");
        !written) {
      return std::unexpected(written.error());
    }
    if (auto started = state->launchControllerManager(); !started) {
      return std::unexpected(started.error());
    }
  }
  return LocalControlPlane(std::move(state));
}

const std::filesystem::path& LocalControlPlane::kubeconfigPath() const {
  return state_->kubeconfig;
}
std::string LocalControlPlane::serverUrl() const {
  return state_->serverUrl();
}
std::string LocalControlPlane::etcdUrl() const {
  return state_->etcdUrl();
}
const std::filesystem::path& LocalControlPlane::workDir() const {
  return state_->work_dir;
}
const std::filesystem::path& LocalControlPlane::binDir() const {
  return state_->options.bin_dir;
}
void LocalControlPlane::keepWorkDir() {
  state_->remove_work_dir = false;
}

std::expected<CommandResult, std::string> LocalControlPlane::kubectl(
    const std::vector<std::string>& args, std::chrono::milliseconds timeout) const {
  return state_->kubectl(state_->kubeconfig, args, timeout);
}

std::expected<CommandResult, std::string> LocalControlPlane::kubectlAs(
    const std::filesystem::path& kubeconfig, const std::vector<std::string>& args,
    std::chrono::milliseconds timeout) const {
  return state_->kubectl(kubeconfig, args, timeout);
}

TestStatus LocalControlPlane::kubectlOk(const std::vector<std::string>& args,
                                        std::chrono::milliseconds timeout) const {
  auto result = kubectl(args, timeout);
  if (!result) return std::unexpected(result.error());
  if (result->exit_code != 0) return std::unexpected(commandFailure(args, *result));
  return {};
}

TestStatus LocalControlPlane::apply(const std::string& manifest) const {
  const fs::path file =
      state_->work_dir / "manifests" / fmt::format("{:04}.yaml", ++state_->manifests_written);
  if (auto written = writeFile(file, manifest); !written) return written;
  return kubectlOk({"apply", "-f", file.string()});
}

TestStatus LocalControlPlane::stopApiServer() {
  if (state_->apiserver) {
    state_->apiserver->stop(kStopGrace);
    state_->apiserver.reset();
  }
  return {};
}

TestStatus LocalControlPlane::startApiServer() {
  if (state_->apiserver) return std::unexpected("kube-apiserver is already running");
  return state_->launchApiServer();
}

bool LocalControlPlane::apiServerRunning() const {
  return state_->apiserver && state_->apiserver->running();
}

std::expected<int64_t, std::string> LocalControlPlane::compactEtcd() const {
  // etcd's gRPC gateway (/v3/kv/...): keys and values are base64, int64s are strings.
  auto call = [this](const std::string& path,
                     const nlohmann::json& body) -> std::expected<nlohmann::json, std::string> {
    auto response = httpRequest("127.0.0.1", state_->etcd_port, "POST", path, body.dump(),
                                std::chrono::seconds(30));
    if (!response) return std::unexpected(fmt::format("etcd {}: {}", path, response.error()));
    if (response->status != 200) {
      return std::unexpected(
          fmt::format("etcd {}: HTTP {}: {}", path, response->status, response->body));
    }
    auto json = nlohmann::json::parse(response->body, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded())
      return std::unexpected(fmt::format("etcd {}: not JSON: {}", path, response->body));
    return json;
  };
  const std::string key = base64Encode(kCompactRevKey);
  auto range = call("/v3/kv/range", {{"key", key}});
  if (!range) return std::unexpected(range.error());
  const auto revision = jsonInt64((*range)["header"]["revision"]);
  if (!revision)
    return std::unexpected("etcd /v3/kv/range: no header.revision in " + range->dump());
  // What kube-apiserver's compactor does (etcd3/compact.go): record the revision, then compact.
  auto put = call("/v3/kv/put", {{"key", key}, {"value", base64Encode(std::to_string(*revision))}});
  if (!put) return std::unexpected(put.error());
  auto compacted =
      call("/v3/kv/compaction", {{"revision", std::to_string(*revision)}, {"physical", true}});
  if (!compacted) return std::unexpected(compacted.error());
  return *revision;
}

std::expected<std::filesystem::path, std::string> LocalControlPlane::serviceAccountKubeconfig(
    const std::string& ns, const std::string& name, const std::string& cluster_role) const {
  const std::string manifest = fmt::format(
      "apiVersion: v1\n"
      "kind: Namespace\n"
      "metadata:\n"
      "  name: {0}\n"
      "---\n"
      "apiVersion: v1\n"
      "kind: ServiceAccount\n"
      "metadata:\n"
      "  name: {1}\n"
      "  namespace: {0}\n",
      ns, name);
  const std::string binding = fmt::format(
      "---\n"
      "apiVersion: rbac.authorization.k8s.io/v1\n"
      "kind: ClusterRoleBinding\n"
      "metadata:\n"
      "  name: rtable-test:{0}:{1}\n"
      "roleRef:\n"
      "  apiGroup: rbac.authorization.k8s.io\n"
      "  kind: ClusterRole\n"
      "  name: {2}\n"
      "subjects:\n"
      "- kind: ServiceAccount\n"
      "  name: {1}\n"
      "  namespace: {0}\n",
      ns, name, cluster_role);
  if (auto applied = apply(cluster_role.empty() ? manifest : manifest + binding); !applied)
    return std::unexpected(applied.error());
  const std::vector<std::string> args = {"create", "token", name, "--namespace=" + ns,
                                         "--duration=12h"};
  auto token = kubectl(args);
  if (!token) return std::unexpected(token.error());
  if (token->exit_code != 0 || token->out.empty()) {
    return std::unexpected(commandFailure(args, *token));
  }
  std::string value = token->out;
  while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) value.pop_back();
  auto ca = readFile(state_->pki() / "ca.crt");
  if (!ca) return std::unexpected(ca.error());
  const fs::path path = state_->work_dir / fmt::format("{}-{}.kubeconfig", ns, name);
  const std::string user = fmt::format("system:serviceaccount:{}:{}", ns, name);
  if (auto written = writeFile(path, kubeconfigYaml(serverUrl(), *ca, {user, "", "", value}));
      !written) {
    return std::unexpected(written.error());
  }
  return path;
}

std::string controlPlaneVersion() {
  return RTABLE_KUBE_VERSION;
}

}  // namespace rtable::op::testing
