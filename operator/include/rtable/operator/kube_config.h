// Where the apiserver is and who we are: kubeconfig files and the in-cluster service account.
//
// Start-up configuration: errors are values naming the file and the field (e.g.
// `/home/u/.kube/config: users["admin"].user.client-key: cannot read ...`). Certificates and keys
// are loaded into memory here; only a token file is re-read later (projected service account
// tokens rotate). Plain values, no shared state.
#pragma once

#include <expected>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::op {

struct KubeConfigError {
  std::string file;   // the file the problem is in (or "" for the environment)
  std::string field;  // e.g. `clusters["prod"].cluster.server`, or "" for the whole file
  std::string message;

  std::string toString() const;
};

// Everything a client needs to reach one apiserver (client-go's rest.Config, trimmed).
struct ClusterConfig {
  std::string server;  // "https://host:port", no trailing slash
  std::string ca_pem;  // empty: the system's trust store
  bool insecure_skip_tls_verify = false;
  std::string client_certificate_pem;
  std::string client_key_pem;
  std::string bearer_token;                         // as read at load time
  std::optional<std::filesystem::path> token_file;  // re-read periodically when set
  std::string ns = "default";                       // the context's (or pod's) namespace
  std::string source;                               // for logs: "kubeconfig <file> context <name>"
};

// A parsed kubeconfig (one file or several merged, as $KUBECONFIG=a:b does).
class KubeConfig {
 public:
  // `file` gives relative paths their base folder and errors their file name.
  static std::expected<KubeConfig, KubeConfigError> parse(std::string_view yaml,
                                                          const std::filesystem::path& file);
  static std::expected<KubeConfig, KubeConfigError> load(const std::filesystem::path& file);
  // Several files, merged the way kubectl does: the first file to define a name (cluster, user,
  // context) or current-context wins. Missing files are skipped; none at all is an error.
  static std::expected<KubeConfig, KubeConfigError> loadMerged(
      const std::vector<std::filesystem::path>& files);

  const std::string& currentContext() const { return current_context_; }
  std::vector<std::string> contextNames() const;

  // The config of a context (empty: current-context). Files named by the context's cluster and
  // user are read here, so an unused entry with a missing file does not matter. Errors name a
  // missing cluster, user or file.
  std::expected<ClusterConfig, KubeConfigError> clusterConfig(std::string_view context = {}) const;

 private:
  // Data fields are decoded; file fields are absolute paths.
  struct Cluster {
    std::string server;
    std::string ca_data;
    std::optional<std::filesystem::path> ca_file;
    bool insecure_skip_tls_verify = false;
    std::string unsupported;  // a field we cannot honour, e.g. "tls-server-name"
  };
  struct User {
    std::string client_certificate_data;
    std::optional<std::filesystem::path> client_certificate_file;
    std::string client_key_data;
    std::optional<std::filesystem::path> client_key_file;
    std::string token;
    std::optional<std::filesystem::path> token_file;
    std::string unsupported;  // e.g. "exec"
  };
  struct Context {
    std::string cluster;
    std::string user;
    std::string ns;
  };
  template <class T>
  struct Named {
    T value;
    std::filesystem::path file;  // where it was defined, for messages
  };
  friend class KubeConfigParser;

  std::map<std::string, Named<Cluster>> clusters_;
  std::map<std::string, Named<User>> users_;
  std::map<std::string, Named<Context>> contexts_;
  std::string current_context_;
  std::filesystem::path current_context_file_;
};

// The process environment, made injectable for tests.
struct ConfigEnvironment {
  std::optional<std::string> kubeconfig;      // $KUBECONFIG, ':'-separated
  std::optional<std::string> service_host;    // $KUBERNETES_SERVICE_HOST
  std::optional<std::string> service_port;    // $KUBERNETES_SERVICE_PORT
  std::optional<std::filesystem::path> home;  // $HOME
  std::filesystem::path service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";

  static ConfigEnvironment fromProcess();
};

// The pod's service account: token, ca.crt, namespace under env.service_account_dir, and the
// apiserver from KUBERNETES_SERVICE_HOST/PORT.
std::expected<ClusterConfig, KubeConfigError> inClusterConfig(const ConfigEnvironment& env);

// controller-runtime's order: $KUBECONFIG, else in-cluster, else ~/.kube/config.
std::expected<ClusterConfig, KubeConfigError> loadDefaultConfig(
    const ConfigEnvironment& env = ConfigEnvironment::fromProcess());

}  // namespace rtable::op
