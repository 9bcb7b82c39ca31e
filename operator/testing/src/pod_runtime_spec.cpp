#include "rtable/operator/testing/pod_runtime_spec.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "rtable/common/base64.h"

namespace rtable::op::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Where the payload dir's name points; kubelet's AtomicWriter names.
constexpr std::string_view kDataDirName = "..data";
constexpr std::string_view kNewDataDirName = "..data_tmp";
constexpr std::string_view kHostsBegin = "# BEGIN rtable-local-kubelet";
constexpr std::string_view kHostsEnd = "# END rtable-local-kubelet";

std::string textOr(const json& object, const char* key, std::string fallback = {}) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

bool boolOr(const json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_boolean()) return fallback;
  return it->get<bool>();
}

// Kubernetes' C_IDENTIFIER-ish env name rule (IsEnvVarName): printable ASCII without '='.
bool validEnvName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (c == '=' || c < 0x20 || c > 0x7e) return false;
  }
  return !(name[0] >= '0' && name[0] <= '9');
}

void setVar(EnvList& env, const std::string& name, std::string value) {
  for (auto& [n, v] : env) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  env.emplace_back(name, std::move(value));
}

// A ConfigMap's data and binaryData, or a Secret's data (base64) and stringData, as key -> bytes.
std::expected<std::map<std::string, std::string>, std::string> configMapData(const json& cm) {
  std::map<std::string, std::string> out;
  if (auto it = cm.find("data"); it != cm.end() && it->is_object()) {
    for (auto& [k, v] : it->items()) out[k] = v.is_string() ? v.get<std::string>() : "";
  }
  if (auto it = cm.find("binaryData"); it != cm.end() && it->is_object()) {
    for (auto& [k, v] : it->items()) {
      auto bytes = common::base64Decode(v.is_string() ? v.get<std::string>() : "");
      if (!bytes)
        return std::unexpected(
            fmt::format("binaryData key {} is not base64: {}", k, bytes.error()));
      out[k] = *bytes;
    }
  }
  return out;
}

std::expected<std::map<std::string, std::string>, std::string> secretData(const json& secret) {
  std::map<std::string, std::string> out;
  if (auto it = secret.find("data"); it != secret.end() && it->is_object()) {
    for (auto& [k, v] : it->items()) {
      auto bytes = common::base64Decode(v.is_string() ? v.get<std::string>() : "");
      if (!bytes)
        return std::unexpected(fmt::format("data key {} is not base64: {}", k, bytes.error()));
      out[k] = *bytes;
    }
  }
  return out;
}

std::string podNamespace(const json& pod) {
  return pod["metadata"].value("namespace", "default");
}

// The files of a configMap/secret volume from its key -> bytes map.
std::expected<std::vector<VolumeFile>, std::string> keyedVolumeFiles(
    const json& source, const std::optional<std::map<std::string, std::string>>& data,
    const std::string& what) {
  const bool optional = boolOr(source, "optional", false);
  if (!data) {
    if (optional) return std::vector<VolumeFile>{};
    return std::unexpected(what + " not found");
  }
  const int default_mode = source.value("defaultMode", 0644);
  std::vector<VolumeFile> files;
  auto items = source.find("items");
  if (items == source.end() || !items->is_array() || items->empty()) {
    for (const auto& [key, content] : *data) files.push_back({key, content, default_mode});
    return files;
  }
  for (const auto& item : *items) {
    const std::string key = textOr(item, "key");
    auto found = data->find(key);
    if (found == data->end()) {
      if (optional) continue;
      return std::unexpected(fmt::format("configmap references non-existent config key: {}", key));
    }
    files.push_back({textOr(item, "path", key), found->second, item.value("mode", default_mode)});
  }
  return files;
}

std::expected<void, std::string> writeFileWithMode(const fs::path& path, const std::string& content,
                                                   int mode) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    return std::unexpected(fmt::format("mkdir {}: {}", path.parent_path().string(), ec.message()));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return std::unexpected("cannot write " + path.string());
  if (::chmod(path.c_str(), static_cast<mode_t>(mode & 07777)) != 0) {
    return std::unexpected(fmt::format("chmod {}: {}", path.string(), std::strerror(errno)));
  }
  return {};
}

std::optional<std::string> readWholeFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether the payload dir behind `..data` holds exactly `files`.
bool payloadEquals(const fs::path& dir, const std::vector<VolumeFile>& files) {
  std::error_code ec;
  const fs::path data = dir / kDataDirName;
  if (!fs::is_symlink(fs::symlink_status(data, ec))) return false;
  std::size_t count = 0;
  for (auto it = fs::recursive_directory_iterator(data, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) ++count;
  }
  if (ec || count != files.size()) return false;
  for (const auto& f : files) {
    const fs::path path = data / f.path;
    auto content = readWholeFile(path);
    if (!content || *content != f.content) return false;
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0 ||
        static_cast<int>(st.st_mode & 07777) != (f.mode & 07777)) {
      return false;
    }
  }
  return true;
}

std::string fieldLabelValue(const json& map, std::string_view field_path, std::string_view prefix) {
  // metadata.labels['key']
  std::string key(field_path.substr(prefix.size()));
  if (key.size() >= 4 && key.starts_with("['") && key.ends_with("']")) {
    key = key.substr(2, key.size() - 4);
  }
  if (!map.is_object()) return {};
  return textOr(map, key.c_str());
}

}  // namespace

std::string expandVars(std::string_view input,
                       const std::function<std::optional<std::string>(std::string_view)>& lookup) {
  std::string out;
  out.reserve(input.size());
  std::size_t cursor = 0;
  while (cursor < input.size()) {
    const char c = input[cursor];
    if (c == '$' && cursor + 1 < input.size()) {
      const std::string_view rest = input.substr(cursor + 1);
      if (rest[0] == '$') {  // escaped: "$$" is "$"
        out += '$';
        cursor += 2;
        continue;
      }
      if (rest[0] == '(') {
        const std::size_t close = rest.find(')', 1);
        if (close == std::string_view::npos) {  // unterminated: kept as written
          out += '$';
          out += rest;
          break;
        }
        const std::string_view name = rest.substr(1, close - 1);
        if (auto value = lookup(name)) {
          out += *value;
        } else {
          out += "$(";
          out += name;
          out += ')';
        }
        cursor += close + 2;
        continue;
      }
      out += '$';
      out += rest[0];
      cursor += 2;
      continue;
    }
    out += c;
    ++cursor;
  }
  return out;
}

std::expected<std::string, std::string> fieldRefValue(const json& pod, std::string_view path) {
  const json& meta = pod["metadata"];
  const json empty = json::object();
  const json& spec = pod.contains("spec") ? pod["spec"] : empty;
  const json& status = pod.contains("status") ? pod["status"] : empty;
  auto ips = [](const json& list, const std::string& single) {
    std::string out;
    if (list.is_array()) {
      for (const auto& ip : list) {
        if (!out.empty()) out += ',';
        out += textOr(ip, "ip");
      }
    }
    return out.empty() ? single : out;
  };
  if (path == "metadata.name") return textOr(meta, "name");
  if (path == "metadata.namespace") return podNamespace(pod);
  if (path == "metadata.uid") return textOr(meta, "uid");
  if (path.starts_with("metadata.labels")) {
    return fieldLabelValue(meta.value("labels", empty), path, "metadata.labels");
  }
  if (path.starts_with("metadata.annotations")) {
    return fieldLabelValue(meta.value("annotations", empty), path, "metadata.annotations");
  }
  if (path == "spec.nodeName") return textOr(spec, "nodeName");
  if (path == "spec.serviceAccountName") return textOr(spec, "serviceAccountName", "default");
  if (path == "status.hostIP") return textOr(status, "hostIP");
  if (path == "status.hostIPs") {
    return ips(status.value("hostIPs", json()), textOr(status, "hostIP"));
  }
  if (path == "status.podIP") return textOr(status, "podIP");
  if (path == "status.podIPs") {
    return ips(status.value("podIPs", json()), textOr(status, "podIP"));
  }
  return std::unexpected(fmt::format("unsupported fieldRef fieldPath {}", path));
}

std::expected<EnvList, std::string> containerEnv(const json& pod, const json& container,
                                                 const ObjectSource& objects) {
  const std::string ns = podNamespace(pod);
  EnvList env;
  if (auto from = container.find("envFrom"); from != container.end() && from->is_array()) {
    for (const auto& source : *from) {
      const std::string prefix = textOr(source, "prefix");
      std::optional<std::map<std::string, std::string>> data;
      std::string what;
      bool optional = false;
      if (auto ref = source.find("configMapRef"); ref != source.end()) {
        const std::string name = textOr(*ref, "name");
        optional = boolOr(*ref, "optional", false);
        what = fmt::format("configmap \"{}\"", name);
        if (auto cm = objects.config_map(ns, name)) {
          auto d = configMapData(*cm);
          if (!d) return std::unexpected(d.error());
          data = *d;
        }
      } else if (auto sref = source.find("secretRef"); sref != source.end()) {
        const std::string name = textOr(*sref, "name");
        optional = boolOr(*sref, "optional", false);
        what = fmt::format("secret \"{}\"", name);
        if (auto s = objects.secret(ns, name)) {
          auto d = secretData(*s);
          if (!d) return std::unexpected(d.error());
          data = *d;
        }
      } else {
        continue;
      }
      if (!data) {
        if (optional) continue;
        return std::unexpected(what + " not found");
      }
      for (const auto& [k, v] : *data) {
        if (validEnvName(prefix + k)) setVar(env, prefix + k, v);  // kubelet skips bad names
      }
    }
  }
  auto entries = container.find("env");
  if (entries == container.end() || !entries->is_array()) return env;
  for (const auto& entry : *entries) {
    const std::string name = textOr(entry, "name");
    if (name.empty()) continue;
    if (entry.contains("value") || !entry.contains("valueFrom")) {
      const EnvList defined = env;
      auto lookup = [&defined](std::string_view var) -> std::optional<std::string> {
        for (const auto& [n, v] : defined) {
          if (n == var) return v;
        }
        return std::nullopt;
      };
      setVar(env, name, expandVars(textOr(entry, "value"), lookup));
      continue;
    }
    const json& from = entry["valueFrom"];
    if (auto field = from.find("fieldRef"); field != from.end()) {
      auto value = fieldRefValue(pod, textOr(*field, "fieldPath"));
      if (!value) return std::unexpected(value.error());
      setVar(env, name, *value);
    } else if (auto ref = from.find("secretKeyRef"); ref != from.end()) {
      const std::string object = textOr(*ref, "name");
      const std::string key = textOr(*ref, "key");
      const bool optional = boolOr(*ref, "optional", false);
      auto secret = objects.secret(ns, object);
      if (!secret) {
        if (optional) continue;
        return std::unexpected(fmt::format("secret \"{}\" not found", object));
      }
      auto data = secretData(*secret);
      if (!data) return std::unexpected(data.error());
      auto it = data->find(key);
      if (it == data->end()) {
        if (optional) continue;
        return std::unexpected(
            fmt::format("couldn't find key {} in Secret {}/{}", key, ns, object));
      }
      setVar(env, name, it->second);
    } else if (auto cref = from.find("configMapKeyRef"); cref != from.end()) {
      const std::string object = textOr(*cref, "name");
      const std::string key = textOr(*cref, "key");
      const bool optional = boolOr(*cref, "optional", false);
      auto cm = objects.config_map(ns, object);
      if (!cm) {
        if (optional) continue;
        return std::unexpected(fmt::format("configmap \"{}\" not found", object));
      }
      auto data = configMapData(*cm);
      if (!data) return std::unexpected(data.error());
      auto it = data->find(key);
      if (it == data->end()) {
        if (optional) continue;
        return std::unexpected(
            fmt::format("couldn't find key {} in ConfigMap {}/{}", key, ns, object));
      }
      setVar(env, name, it->second);
    } else {
      return std::unexpected(
          fmt::format("env {}: unsupported valueFrom {} (resourceFieldRef is not emulated)", name,
                      from.dump()));
    }
  }
  return env;
}

std::expected<std::vector<std::string>, std::string> containerArgv(const json& container,
                                                                   const LocalImage& image,
                                                                   const EnvList& env) {
  auto lookup = [&env](std::string_view var) -> std::optional<std::string> {
    for (const auto& [n, v] : env) {
      if (n == var) return v;
    }
    return std::nullopt;
  };
  auto strings = [](const json& list) {
    std::vector<std::string> out;
    if (list.is_array()) {
      for (const auto& s : list) out.push_back(s.is_string() ? s.get<std::string>() : s.dump());
    }
    return out;
  };
  const bool has_command = container.contains("command") && !container["command"].empty();
  const bool has_args = container.contains("args") && !container["args"].empty();
  std::vector<std::string> argv;
  if (has_command) {
    for (auto& s : strings(container["command"])) argv.push_back(expandVars(s, lookup));
  } else {
    argv = image.entrypoint;
  }
  if (has_args) {
    for (auto& s : strings(container["args"])) argv.push_back(expandVars(s, lookup));
  } else if (!has_command) {
    argv.insert(argv.end(), image.cmd.begin(), image.cmd.end());
  }
  if (argv.empty()) {
    return std::unexpected("no command: neither the container nor the image gives one");
  }
  return argv;
}

std::expected<std::vector<VolumeFile>, std::string> configMapVolumeFiles(
    const json& source, const std::optional<json>& config_map) {
  std::optional<std::map<std::string, std::string>> data;
  if (config_map) {
    auto d = configMapData(*config_map);
    if (!d) return std::unexpected(d.error());
    data = std::move(*d);
  }
  return keyedVolumeFiles(source, data, fmt::format("configmap \"{}\"", textOr(source, "name")));
}

std::expected<std::vector<VolumeFile>, std::string> secretVolumeFiles(
    const json& source, const std::optional<json>& secret) {
  std::optional<std::map<std::string, std::string>> data;
  if (secret) {
    auto d = secretData(*secret);
    if (!d) return std::unexpected(d.error());
    data = std::move(*d);
  }
  return keyedVolumeFiles(source, data, fmt::format("secret \"{}\"", textOr(source, "secretName")));
}

std::expected<std::vector<VolumeFile>, std::string> downwardApiVolumeFiles(const json& source,
                                                                           const json& pod) {
  const int default_mode = source.value("defaultMode", 0644);
  std::vector<VolumeFile> files;
  if (auto items = source.find("items"); items != source.end() && items->is_array()) {
    for (const auto& item : *items) {
      if (!item.contains("fieldRef")) {
        return std::unexpected("downwardAPI: only fieldRef items are emulated");
      }
      auto value = fieldRefValue(pod, textOr(item["fieldRef"], "fieldPath"));
      if (!value) return std::unexpected(value.error());
      files.push_back({textOr(item, "path"), *value, item.value("mode", default_mode)});
    }
  }
  return files;
}

std::expected<ContainerSecurity, std::string> containerSecurity(const json& pod_spec,
                                                                const json& container) {
  const json pod = pod_spec.value("securityContext", json::object());
  const json own = container.value("securityContext", json::object());
  // The container's field, else the pod's.
  auto field = [&](const char* name) -> const json* {
    if (own.is_object() && own.contains(name) && !own[name].is_null()) return &own[name];
    if (pod.is_object() && pod.contains(name) && !pod[name].is_null()) return &pod[name];
    return nullptr;
  };
  auto id = [&](const char* name) -> std::expected<std::optional<uint32_t>, std::string> {
    const json* value = field(name);
    if (!value) return std::nullopt;
    if (!value->is_number_integer() || value->get<int64_t>() < 0 ||
        value->get<int64_t>() > INT32_MAX) {
      return std::unexpected(fmt::format("securityContext.{}: not a valid id", name));
    }
    return static_cast<uint32_t>(value->get<int64_t>());
  };
  ContainerSecurity security;
  auto uid = id("runAsUser");
  if (!uid) return std::unexpected(uid.error());
  security.uid = *uid;
  auto gid = id("runAsGroup");
  if (!gid) return std::unexpected(gid.error());
  security.gid = gid->value_or(0);
  if (const json* non_root = field("runAsNonRoot");
      non_root && non_root->is_boolean() && non_root->get<bool>()) {
    if (!security.uid) {
      return std::unexpected(
          "container has runAsNonRoot and image will run as root (the image's user is not "
          "known here: give runAsUser)");
    }
    if (*security.uid == 0) {
      return std::unexpected("container's runAsUser breaks non-root policy (runAsUser 0)");
    }
  }
  if (pod.is_object() && pod.contains("fsGroup") && pod["fsGroup"].is_number_integer()) {
    security.fs_group = static_cast<uint32_t>(pod["fsGroup"].get<int64_t>());
    security.groups.push_back(*security.fs_group);
  }
  if (pod.is_object() && pod.contains("supplementalGroups") &&
      pod["supplementalGroups"].is_array()) {
    for (const auto& group : pod["supplementalGroups"]) {
      if (group.is_number_integer()) security.groups.push_back(group.get<uint32_t>());
    }
  }
  if (const json* read_only = field("readOnlyRootFilesystem");
      read_only && read_only->is_boolean()) {
    security.read_only_root = read_only->get<bool>();
  }
  return security;
}

std::expected<void, std::string> applyFsGroup(const fs::path& dir, uint32_t gid, bool read_only) {
  auto apply = [&](const fs::path& path) -> std::expected<void, std::string> {
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0) return {};  // gone meanwhile
    if (S_ISLNK(st.st_mode)) return {};
    if (::lchown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
      return std::unexpected(fmt::format("chown {}: {}", path.string(), std::strerror(errno)));
    }
    mode_t mode = st.st_mode & 07777;
    mode |= S_IRGRP;
    if (S_ISDIR(st.st_mode))
      mode |= S_IXGRP | (read_only ? 0 : (S_IWGRP | S_ISGID));
    else if (!read_only)
      mode |= S_IWGRP;
    if (::chmod(path.c_str(), mode) != 0) {
      return std::unexpected(fmt::format("chmod {}: {}", path.string(), std::strerror(errno)));
    }
    return {};
  };
  if (auto done = apply(dir); !done) return done;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (auto done = apply(it->path()); !done) return done;
  }
  if (ec) return std::unexpected(fmt::format("walking {}: {}", dir.string(), ec.message()));
  return {};
}

std::expected<bool, std::string> writeVolumeAtomically(const fs::path& dir,
                                                       const std::vector<VolumeFile>& files) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return std::unexpected(fmt::format("mkdir {}: {}", dir.string(), ec.message()));
  if (payloadEquals(dir, files)) return false;
  for (const auto& f : files) {
    const fs::path rel = fs::path(f.path).lexically_normal();
    if (rel.empty() || rel.is_absolute() || *rel.begin() == ".." ||
        rel.string().starts_with("..")) {
      return std::unexpected(fmt::format("invalid volume file path {}", f.path));
    }
  }
  // A fresh payload dir, named like kubelet's (..<timestamp>), unique within this dir.
  const auto stamp = std::chrono::system_clock::now().time_since_epoch().count();
  fs::path payload;
  for (int i = 0;; ++i) {
    payload = dir / fmt::format("..{}_{}", stamp, i);
    if (!fs::exists(payload)) break;
  }
  fs::create_directories(payload, ec);
  if (ec) return std::unexpected(fmt::format("mkdir {}: {}", payload.string(), ec.message()));
  for (const auto& f : files) {
    if (auto written = writeFileWithMode(payload / f.path, f.content, f.mode); !written) {
      return std::unexpected(written.error());
    }
  }
  std::string old_payload;
  {
    std::vector<char> target(4096);
    const ssize_t n = ::readlink((dir / kDataDirName).c_str(), target.data(), target.size() - 1);
    if (n > 0) old_payload = std::string(target.data(), static_cast<std::size_t>(n));
  }
  const fs::path tmp_link = dir / kNewDataDirName;
  fs::remove(tmp_link, ec);
  if (::symlink(payload.filename().c_str(), tmp_link.c_str()) != 0) {
    return std::unexpected(fmt::format("symlink {}: {}", tmp_link.string(), std::strerror(errno)));
  }
  if (::rename(tmp_link.c_str(), (dir / kDataDirName).c_str()) != 0) {
    return std::unexpected(
        fmt::format("rename to ..data in {}: {}", dir.string(), std::strerror(errno)));
  }
  // Top-level names point into ..data; names no longer in the payload go.
  std::set<std::string> top;
  for (const auto& f : files) top.insert(fs::path(f.path).lexically_normal().begin()->string());
  for (const auto& name : top) {
    const fs::path link = dir / name;
    if (fs::is_symlink(fs::symlink_status(link, ec))) continue;
    if (::symlink((std::string(kDataDirName) + "/" + name).c_str(), link.c_str()) != 0) {
      return std::unexpected(fmt::format("symlink {}: {}", link.string(), std::strerror(errno)));
    }
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("..")) continue;
    if (!top.contains(name) && fs::is_symlink(entry.symlink_status())) fs::remove(entry.path(), ec);
  }
  if (!old_payload.empty() && old_payload != payload.filename().string()) {
    fs::remove_all(dir / old_payload, ec);
  }
  return true;
}

std::string hostsLine(const HostsEntry& e, std::string_view domain) {
  if (e.subdomain.empty()) return fmt::format("{}\t{}", e.ip, e.hostname);
  const std::string short_name = e.hostname + "." + e.subdomain;
  return fmt::format("{}\t{}.{}.svc.{} {}.{}.svc {}", e.ip, short_name, e.ns, domain, short_name,
                     e.ns, short_name);
}

std::string renderPodHosts(const HostsEntry& own, const json& host_aliases,
                           const std::vector<HostsEntry>& all, std::string_view domain) {
  // kubelet's managed /etc/hosts header and localhost lines (pkg/kubelet/kubelet_pods.go).
  std::string out =
      "# Kubernetes-managed hosts file (rtable LocalKubelet).\n"
      "127.0.0.1\tlocalhost\n"
      "::1\tlocalhost ip6-localhost ip6-loopback\n"
      "fe00::0\tip6-localnet\n"
      "fe00::0\tip6-mcastprefix\n"
      "fe00::1\tip6-allnodes\n"
      "fe00::2\tip6-allrouters\n";
  if (!own.subdomain.empty()) {
    out += fmt::format("{}\t{}.{}.{}.svc.{}\t{}\n", own.ip, own.hostname, own.subdomain, own.ns,
                       domain, own.hostname);
  } else {
    out += fmt::format("{}\t{}\n", own.ip, own.hostname);
  }
  if (host_aliases.is_array() && !host_aliases.empty()) {
    out += "\n# Entries added by HostAliases.\n";
    for (const auto& alias : host_aliases) {
      std::string names;
      for (const auto& h : alias.value("hostnames", json::array())) {
        names += (names.empty() ? "" : "\t") + h.get<std::string>();
      }
      out += fmt::format("{}\t{}\n", textOr(alias, "ip"), names);
    }
  }
  out += "\n# Pods of headless Services (what cluster DNS would answer).\n";
  for (const auto& e : all) {
    if (!e.subdomain.empty()) out += hostsLine(e, domain) + "\n";
  }
  return out;
}

std::string replaceManagedHostsBlock(const std::string& existing,
                                     const std::vector<HostsEntry>& all, std::string_view domain) {
  std::string block = std::string(kHostsBegin) + "\n";
  for (const auto& e : all) {
    if (!e.subdomain.empty()) block += hostsLine(e, domain) + "\n";
  }
  block += std::string(kHostsEnd) + "\n";
  const auto begin = existing.find(kHostsBegin);
  const auto end = existing.find(kHostsEnd);
  if (begin != std::string::npos && end != std::string::npos && end > begin) {
    std::size_t after = end + kHostsEnd.size();
    if (after < existing.size() && existing[after] == '\n') ++after;
    return existing.substr(0, begin) + block + existing.substr(after);
  }
  std::string out = existing;
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out + block;
}

std::expected<void, std::string> writeFileInPlace(const fs::path& path,
                                                  const std::string& content) {
  if (auto current = readWholeFile(path); current && *current == content) return {};
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return std::unexpected(fmt::format("open {}: {}", path.string(), std::strerror(errno)));
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n =
        ::pwrite(fd, content.data() + done, content.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string error = std::strerror(errno);
      ::close(fd);
      return std::unexpected(fmt::format("write {}: {}", path.string(), error));
    }
    done += static_cast<std::size_t>(n);
  }
  // Truncate after writing, so the file is never empty in between.
  const int truncated = ::ftruncate(fd, static_cast<off_t>(content.size()));
  ::close(fd);
  if (truncated != 0) {
    return std::unexpected(fmt::format("truncate {}: {}", path.string(), std::strerror(errno)));
  }
  return {};
}

PodIpAllocator::PodIpAllocator(int max_addresses) : max_(max_addresses) {}

std::string PodIpAllocator::addressOf(int index) {
  // Index 0 is 127.0.0.2; each /24 uses .1 .. .254 except 127.0.0.1 (the node).
  const int n = index + 1;  // skip 127.0.0.1
  return fmt::format("127.0.{}.{}", n / 254, n % 254 + 1);
}

std::optional<std::string> PodIpAllocator::allocate() {
  std::lock_guard lock(mu_);
  for (int tried = 0; tried < max_; ++tried) {
    const int index = (next_ + tried) % max_;
    if (used_.contains(index)) continue;
    used_.insert(index);
    next_ = (index + 1) % max_;
    std::string ip = addressOf(index);
    index_of_[ip] = index;
    return ip;
  }
  return std::nullopt;
}

void PodIpAllocator::release(const std::string& ip) {
  std::lock_guard lock(mu_);
  auto it = index_of_.find(ip);
  if (it == index_of_.end()) return;
  used_.erase(it->second);
  index_of_.erase(it);
}

std::size_t PodIpAllocator::inUse() const {
  std::lock_guard lock(mu_);
  return used_.size();
}

}  // namespace rtable::op::testing
