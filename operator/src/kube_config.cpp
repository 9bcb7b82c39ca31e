#include "rtable/operator/kube_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "rtable/common/base64.h"

namespace rtable::op {

namespace fs = std::filesystem;

std::string KubeConfigError::toString() const {
  std::string out = file;
  if (!field.empty()) out += out.empty() ? field : ": " + field;
  if (!out.empty()) out += ": ";
  return out + message;
}

namespace {

std::expected<std::string, std::string> readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected(fmt::format("cannot read {}", path.string()));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return std::unexpected(fmt::format("error reading {}", path.string()));
  return buffer.str();
}

std::string trimToken(std::string token) {
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  return token;
}

// "clusters[\"prod\"]" or "clusters[2]" when the entry has no usable name.
std::string entryPath(std::string_view list, const std::string& name, std::size_t index) {
  return name.empty() ? fmt::format("{}[{}]", list, index) : fmt::format("{}[\"{}\"]", list, name);
}

}  // namespace

// Reads one kubeconfig document into a KubeConfig. yaml-cpp reports by exception; every one is
// caught here and turned into a KubeConfigError naming the field.
class KubeConfigParser {
 public:
  KubeConfigParser(const fs::path& file) : file_(file), base_(file.parent_path()) {}

  std::expected<KubeConfig, KubeConfigError> parse(std::string_view yaml) {
    YAML::Node root;
    try {
      root = YAML::Load(std::string(yaml));
    } catch (const YAML::Exception& e) {
      return fail("", fmt::format("not valid YAML: {}", e.what()));
    }
    if (root.IsNull()) return KubeConfig{};  // an empty file is an empty config
    if (!root.IsMap()) return fail("", "not a kubeconfig (expected a mapping)");
    KubeConfig config;
    try {
      if (auto error = parseEntries(root, config)) return std::unexpected(*error);
    } catch (const YAML::Exception& e) {
      return fail(field_, fmt::format("bad value: {}", e.msg));
    }
    return config;
  }

 private:
  std::unexpected<KubeConfigError> fail(std::string field, std::string message) const {
    return std::unexpected(KubeConfigError{file_.string(), std::move(field), std::move(message)});
  }
  KubeConfigError error(std::string field, std::string message) const {
    return KubeConfigError{file_.string(), std::move(field), std::move(message)};
  }

  // A string scalar, or "" when absent. Sets field_ so a conversion failure names it.
  std::optional<KubeConfigError> scalar(const YAML::Node& node, const char* key,
                                        const std::string& path, std::string& out) {
    field_ = path + "." + key;
    const YAML::Node value = node[key];
    if (!value || value.IsNull()) return std::nullopt;
    if (!value.IsScalar()) return error(field_, "expected a string");
    out = value.as<std::string>();
    return std::nullopt;
  }

  std::optional<KubeConfigError> path(const YAML::Node& node, const char* key,
                                      const std::string& at, std::optional<fs::path>& out) {
    std::string value;
    if (auto e = scalar(node, key, at, value)) return e;
    if (value.empty()) return std::nullopt;
    fs::path p(value);
    out = p.is_absolute() ? p : base_ / p;
    return std::nullopt;
  }

  std::optional<KubeConfigError> data(const YAML::Node& node, const char* key,
                                      const std::string& at, std::string& out) {
    std::string encoded;
    if (auto e = scalar(node, key, at, encoded)) return e;
    if (encoded.empty()) return std::nullopt;
    auto decoded = common::base64Decode(encoded);
    if (!decoded) return error(field_, "not valid base64: " + decoded.error());
    out = std::move(*decoded);
    return std::nullopt;
  }

  // The entries of `list` (clusters, users, contexts): a sequence of {name, <body_key>: {...}}.
  template <class Fn>
  std::optional<KubeConfigError> forEach(const YAML::Node& root, const char* list,
                                         const char* body_key, Fn&& fn) {
    field_ = list;
    const YAML::Node entries = root[list];
    if (!entries || entries.IsNull()) return std::nullopt;
    if (!entries.IsSequence()) return error(list, "expected a list");
    std::set<std::string> seen;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const YAML::Node entry = entries[i];
      std::string at = entryPath(list, "", i);
      if (!entry.IsMap()) return error(at, "expected a mapping");
      std::string name;
      if (auto e = scalar(entry, "name", at, name)) return e;
      if (name.empty()) return error(at + ".name", "missing");
      if (!seen.insert(name).second)
        return error(at + ".name", fmt::format("duplicate name \"{}\"", name));
      at = entryPath(list, name, i);
      const YAML::Node body = entry[body_key];
      const std::string body_at = at + "." + body_key;
      if (!body || body.IsNull()) return error(body_at, "missing");
      if (!body.IsMap()) return error(body_at, "expected a mapping");
      if (auto e = fn(name, body, body_at)) return e;
    }
    return std::nullopt;
  }

  std::optional<KubeConfigError> parseEntries(const YAML::Node& root, KubeConfig& config) {
    using Cluster = KubeConfig::Cluster;
    using User = KubeConfig::User;
    using Context = KubeConfig::Context;
    auto e =
        forEach(root, "clusters", "cluster",
                [&](const std::string& name, const YAML::Node& body,
                    const std::string& at) -> std::optional<KubeConfigError> {
                  Cluster c;
                  if (auto e = scalar(body, "server", at, c.server)) return e;
                  while (!c.server.empty() && c.server.back() == '/') c.server.pop_back();
                  if (auto e = data(body, "certificate-authority-data", at, c.ca_data)) return e;
                  if (auto e = path(body, "certificate-authority", at, c.ca_file)) return e;
                  field_ = at + ".insecure-skip-tls-verify";
                  if (const YAML::Node v = body["insecure-skip-tls-verify"]; v && !v.IsNull()) {
                    c.insecure_skip_tls_verify = v.as<bool>();
                  }
                  for (const char* key : {"tls-server-name", "proxy-url"}) {
                    if (body[key] && c.unsupported.empty()) c.unsupported = key;
                  }
                  config.clusters_.emplace(name, KubeConfig::Named<Cluster>{c, file_});
                  return std::nullopt;
                });
    if (e) return e;
    e = forEach(root, "users", "user",
                [&](const std::string& name, const YAML::Node& body,
                    const std::string& at) -> std::optional<KubeConfigError> {
                  User u;
                  if (auto e = data(body, "client-certificate-data", at, u.client_certificate_data))
                    return e;
                  if (auto e = path(body, "client-certificate", at, u.client_certificate_file))
                    return e;
                  if (auto e = data(body, "client-key-data", at, u.client_key_data)) return e;
                  if (auto e = path(body, "client-key", at, u.client_key_file)) return e;
                  if (auto e = scalar(body, "token", at, u.token)) return e;
                  if (auto e = path(body, "tokenFile", at, u.token_file)) return e;
                  for (const char* key : {"exec", "auth-provider", "username", "password", "as"}) {
                    if (body[key] && u.unsupported.empty()) u.unsupported = key;
                  }
                  config.users_.emplace(name, KubeConfig::Named<User>{u, file_});
                  return std::nullopt;
                });
    if (e) return e;
    e = forEach(root, "contexts", "context",
                [&](const std::string& name, const YAML::Node& body,
                    const std::string& at) -> std::optional<KubeConfigError> {
                  Context c;
                  if (auto e = scalar(body, "cluster", at, c.cluster)) return e;
                  if (auto e = scalar(body, "user", at, c.user)) return e;
                  if (auto e = scalar(body, "namespace", at, c.ns)) return e;
                  config.contexts_.emplace(name, KubeConfig::Named<Context>{c, file_});
                  return std::nullopt;
                });
    if (e) return e;
    field_ = "current-context";
    if (const YAML::Node current = root["current-context"]; current && !current.IsNull()) {
      if (!current.IsScalar()) return error("current-context", "expected a string");
      config.current_context_ = current.as<std::string>();
      config.current_context_file_ = file_;
    }
    return std::nullopt;
  }

  fs::path file_;
  fs::path base_;
  std::string field_;  // the field being read, for conversion errors
};

std::expected<KubeConfig, KubeConfigError> KubeConfig::parse(std::string_view yaml,
                                                             const fs::path& file) {
  return KubeConfigParser(file).parse(yaml);
}

std::expected<KubeConfig, KubeConfigError> KubeConfig::load(const fs::path& file) {
  auto text = readFile(file);
  if (!text) return std::unexpected(KubeConfigError{file.string(), "", text.error()});
  return parse(*text, file);
}

std::expected<KubeConfig, KubeConfigError> KubeConfig::loadMerged(
    const std::vector<fs::path>& files) {
  KubeConfig merged;
  bool any = false;
  for (const auto& file : files) {
    std::error_code ec;
    if (file.empty() || !fs::exists(file, ec)) continue;
    auto one = load(file);
    if (!one) return one;
    any = true;
    // First definition wins (k8s.io/client-go/tools/clientcmd merging rules); map::insert keeps
    // the existing entry.
    merged.clusters_.insert(one->clusters_.begin(), one->clusters_.end());
    merged.users_.insert(one->users_.begin(), one->users_.end());
    merged.contexts_.insert(one->contexts_.begin(), one->contexts_.end());
    if (merged.current_context_.empty()) {
      merged.current_context_ = one->current_context_;
      merged.current_context_file_ = one->current_context_file_;
    }
  }
  if (!any) {
    std::string names;
    for (const auto& f : files) names += (names.empty() ? "" : ":") + f.string();
    return std::unexpected(KubeConfigError{names, "", "no kubeconfig file exists"});
  }
  return merged;
}

std::vector<std::string> KubeConfig::contextNames() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : contexts_) names.push_back(name);
  return names;
}

std::expected<ClusterConfig, KubeConfigError> KubeConfig::clusterConfig(
    std::string_view context_name) const {
  std::string name(context_name);
  if (name.empty()) {
    if (current_context_.empty()) {
      return std::unexpected(KubeConfigError{current_context_file_.string(), "current-context",
                                             "not set and no context given"});
    }
    name = current_context_;
  }
  auto context_it = contexts_.find(name);
  if (context_it == contexts_.end()) {
    return std::unexpected(KubeConfigError{current_context_file_.string(), "current-context",
                                           fmt::format("context \"{}\" not found", name)});
  }
  const Context& context = context_it->second.value;
  const std::string context_file = context_it->second.file.string();
  const std::string context_at = fmt::format("contexts[\"{}\"].context", name);

  auto cluster_it = clusters_.find(context.cluster);
  if (context.cluster.empty() || cluster_it == clusters_.end()) {
    return std::unexpected(
        KubeConfigError{context_file, context_at + ".cluster",
                        fmt::format("cluster \"{}\" not found", context.cluster)});
  }
  const Cluster& cluster = cluster_it->second.value;
  const std::string cluster_file = cluster_it->second.file.string();
  const std::string cluster_at = fmt::format("clusters[\"{}\"].cluster", context.cluster);

  ClusterConfig out;
  out.source = fmt::format("kubeconfig {} context {}", context_file, name);
  if (!context.ns.empty()) out.ns = context.ns;
  if (!cluster.unsupported.empty()) {
    return std::unexpected(KubeConfigError{cluster_file, cluster_at + "." + cluster.unsupported,
                                           "not supported by rtable-operator"});
  }
  if (cluster.server.empty()) {
    return std::unexpected(KubeConfigError{cluster_file, cluster_at + ".server", "missing"});
  }
  if (!cluster.server.starts_with("https://") && !cluster.server.starts_with("http://")) {
    return std::unexpected(
        KubeConfigError{cluster_file, cluster_at + ".server",
                        fmt::format("'{}' is not an http(s) URL", cluster.server)});
  }
  out.server = cluster.server;
  out.insecure_skip_tls_verify = cluster.insecure_skip_tls_verify;
  // As in client-go, *-data wins over the file form.
  if (!cluster.ca_data.empty()) {
    out.ca_pem = cluster.ca_data;
  } else if (cluster.ca_file) {
    auto pem = readFile(*cluster.ca_file);
    if (!pem) {
      return std::unexpected(
          KubeConfigError{cluster_file, cluster_at + ".certificate-authority", pem.error()});
    }
    out.ca_pem = std::move(*pem);
  }

  if (context.user.empty()) return out;  // anonymous
  auto user_it = users_.find(context.user);
  if (user_it == users_.end()) {
    return std::unexpected(KubeConfigError{context_file, context_at + ".user",
                                           fmt::format("user \"{}\" not found", context.user)});
  }
  const User& user = user_it->second.value;
  const std::string user_file = user_it->second.file.string();
  const std::string user_at = fmt::format("users[\"{}\"].user", context.user);
  if (!user.unsupported.empty()) {
    return std::unexpected(KubeConfigError{user_file, user_at + "." + user.unsupported,
                                           "not supported by rtable-operator"});
  }
  auto load = [&](const std::string& data, const std::optional<fs::path>& file, const char* key,
                  std::string& into) -> std::optional<KubeConfigError> {
    if (!data.empty()) {
      into = data;
    } else if (file) {
      auto pem = readFile(*file);
      if (!pem) return KubeConfigError{user_file, user_at + "." + key, pem.error()};
      into = std::move(*pem);
    }
    return std::nullopt;
  };
  if (auto e = load(user.client_certificate_data, user.client_certificate_file,
                    "client-certificate", out.client_certificate_pem)) {
    return std::unexpected(*e);
  }
  if (auto e = load(user.client_key_data, user.client_key_file, "client-key", out.client_key_pem)) {
    return std::unexpected(*e);
  }
  if (out.client_certificate_pem.empty() != out.client_key_pem.empty()) {
    return std::unexpected(KubeConfigError{
        user_file, user_at + (out.client_key_pem.empty() ? ".client-key" : ".client-certificate"),
        "a client certificate needs both certificate and key"});
  }
  out.bearer_token = user.token;
  if (user.token_file) {
    auto token = readFile(*user.token_file);
    if (!token)
      return std::unexpected(KubeConfigError{user_file, user_at + ".tokenFile", token.error()});
    out.token_file = *user.token_file;
    // client-go: the file's token wins over `token` while the file can be read.
    out.bearer_token = trimToken(std::move(*token));
  }
  return out;
}

ConfigEnvironment ConfigEnvironment::fromProcess() {
  ConfigEnvironment env;
  auto get = [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
  env.kubeconfig = get("KUBECONFIG");
  env.service_host = get("KUBERNETES_SERVICE_HOST");
  env.service_port = get("KUBERNETES_SERVICE_PORT");
  if (auto home = get("HOME")) env.home = fs::path(*home);
  return env;
}

std::expected<ClusterConfig, KubeConfigError> inClusterConfig(const ConfigEnvironment& env) {
  if (!env.service_host || env.service_host->empty() || !env.service_port ||
      env.service_port->empty()) {
    return std::unexpected(KubeConfigError{"", "KUBERNETES_SERVICE_HOST",
                                           "not running in a cluster: KUBERNETES_SERVICE_HOST and "
                                           "KUBERNETES_SERVICE_PORT must both be set"});
  }
  ClusterConfig out;
  const std::string& host = *env.service_host;
  out.server = host.find(':') != std::string::npos
                   ? fmt::format("https://[{}]:{}", host, *env.service_port)  // IPv6
                   : fmt::format("https://{}:{}", host, *env.service_port);
  const fs::path token_path = env.service_account_dir / "token";
  auto token = readFile(token_path);
  if (!token) return std::unexpected(KubeConfigError{token_path.string(), "", token.error()});
  out.bearer_token = trimToken(std::move(*token));
  if (out.bearer_token.empty()) {
    return std::unexpected(KubeConfigError{token_path.string(), "", "the token file is empty"});
  }
  out.token_file = token_path;
  const fs::path ca_path = env.service_account_dir / "ca.crt";
  auto ca = readFile(ca_path);
  if (!ca) return std::unexpected(KubeConfigError{ca_path.string(), "", ca.error()});
  out.ca_pem = std::move(*ca);
  const fs::path ns_path = env.service_account_dir / "namespace";
  if (auto ns = readFile(ns_path); ns && !trimToken(*ns).empty()) out.ns = trimToken(*ns);
  out.source = "in-cluster service account";
  return out;
}

std::expected<ClusterConfig, KubeConfigError> loadDefaultConfig(const ConfigEnvironment& env) {
  if (env.kubeconfig && !env.kubeconfig->empty()) {
    std::vector<fs::path> files;
    std::string_view list = *env.kubeconfig;
    while (!list.empty()) {
      const std::size_t colon = list.find(':');
      files.emplace_back(list.substr(0, colon));
      if (colon == std::string_view::npos) break;
      list.remove_prefix(colon + 1);
    }
    auto config = KubeConfig::loadMerged(files);
    if (!config) return std::unexpected(config.error());
    return config->clusterConfig();
  }
  std::optional<KubeConfigError> in_cluster_error;
  if (env.service_host && env.service_port) {
    auto config = inClusterConfig(env);
    if (config) return config;
    in_cluster_error = config.error();
  }
  if (env.home) {
    const fs::path file = *env.home / ".kube" / "config";
    std::error_code ec;
    if (fs::exists(file, ec)) {
      auto config = KubeConfig::load(file);
      if (!config) return std::unexpected(config.error());
      return config->clusterConfig();
    }
  }
  if (in_cluster_error) return std::unexpected(*in_cluster_error);
  return std::unexpected(KubeConfigError{
      "", "",
      "no cluster configuration: $KUBECONFIG is not set, not running in a cluster, and "
      "~/.kube/config does not exist"});
}

}  // namespace rtable::op
