// What LocalKubelet (local_kubelet.h) derives from a Pod before it runs a container, as plain
// functions over the Pod JSON, so each rule is tested on its own: Kubernetes' $(VAR) expansion,
// the container's environment (env, envFrom, fieldRef, secretKeyRef, configMapKeyRef), its argv
// from image + command + args, the files of configMap/secret/downwardAPI volumes and the
// kubelet's atomic writer layout for them, the hosts file, and pod IP allocation.
//
// Everything here is stateless and thread-compatible, except PodIpAllocator (thread-safe).
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rtable::op::testing {

// What an image name stands for locally: the image's ENTRYPOINT and CMD, as in a Dockerfile.
struct LocalImage {
  std::vector<std::string> entrypoint;  // e.g. {"/work/build/bin/rtable-core"}
  std::vector<std::string> cmd;         // default args when the container gives none
  std::vector<std::string> env;         // "K=V", the image's ENV (PATH has a default)
};

// Who a container's process is and what it may write (kubelet and the runtime, from the pod's
// securityContext and the container's, the container's winning): runAsUser (none: the image's
// user, root here), runAsGroup (default 0), the pod's fsGroup and supplementalGroups as
// supplementary groups, readOnlyRootFilesystem.
struct ContainerSecurity {
  std::optional<uint32_t> uid;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
  std::optional<uint32_t> fs_group;  // the pod's: applied to its volumes (applyFsGroup)
  bool read_only_root = false;
};

// The container's ContainerSecurity, or kubelet's refusal (CreateContainerConfigError):
// runAsNonRoot with runAsUser 0 or unset (LocalImage has no USER: an image's user is root here).
std::expected<ContainerSecurity, std::string> containerSecurity(const nlohmann::json& pod_spec,
                                                                const nlohmann::json& container);

// fsGroup on a volume's directory, as kubelet's SetVolumeOwnership: every file and directory
// group-owned by `gid` and group-readable, also group-writable (directories setgid) unless
// `read_only`; symlinks are left alone (their targets are in the walk).
std::expected<void, std::string> applyFsGroup(const std::filesystem::path& dir, uint32_t gid,
                                              bool read_only);

// Kubernetes' $(VAR) expansion (k8s.io/kubernetes third_party/forked/golang/expansion):
// `$(NAME)` becomes the value `lookup` gives, or stays as written when there is none; `$$` is a
// literal `$`, so `$$(NAME)` stays `$(NAME)`; a `$` before anything else is kept.
std::string expandVars(std::string_view input,
                       const std::function<std::optional<std::string>(std::string_view)>& lookup);

// Objects an environment or a volume may refer to, by namespace and name; null when absent.
struct ObjectSource {
  std::function<std::optional<nlohmann::json>(const std::string& ns, const std::string& name)>
      config_map;
  std::function<std::optional<nlohmann::json>(const std::string& ns, const std::string& name)>
      secret;
};

using EnvList = std::vector<std::pair<std::string, std::string>>;

// The value of a fieldRef path of `pod` (whose status.podIP/hostIP are those the container will
// see): metadata.name, .namespace, .uid, .labels['k'], .annotations['k'], spec.nodeName,
// spec.serviceAccountName, status.hostIP, status.hostIPs, status.podIP, status.podIPs.
std::expected<std::string, std::string> fieldRefValue(const nlohmann::json& pod,
                                                      std::string_view field_path);

// The container's environment in kubelet's order: envFrom sources, then env entries (a later name
// replaces an earlier one); each env value is expanded against the variables defined before it.
// A missing non-optional Secret or ConfigMap (or key) is an error, as kubelet's
// CreateContainerConfigError.
std::expected<EnvList, std::string> containerEnv(const nlohmann::json& pod,
                                                 const nlohmann::json& container,
                                                 const ObjectSource& objects);

// argv as a runtime builds it: command (else the image's entrypoint) followed by args (else,
// when command was not given, the image's cmd); command and args are $(VAR)-expanded with `env`.
std::expected<std::vector<std::string>, std::string> containerArgv(const nlohmann::json& container,
                                                                   const LocalImage& image,
                                                                   const EnvList& env);

// One file of a projected-style volume: path relative to the volume root, content, mode bits.
struct VolumeFile {
  std::string path;
  std::string content;
  int mode = 0644;
  friend bool operator==(const VolumeFile&, const VolumeFile&) = default;
};

// Files of a configMap / secret volume source (`source` is the volume's `configMap` or `secret`
// field): every key, or only `items` (key -> path, mode), with defaultMode (0644). `object` is
// null when the ConfigMap/Secret does not exist: an error unless the source is optional (then
// no files).
std::expected<std::vector<VolumeFile>, std::string> configMapVolumeFiles(
    const nlohmann::json& source, const std::optional<nlohmann::json>& config_map);
std::expected<std::vector<VolumeFile>, std::string> secretVolumeFiles(
    const nlohmann::json& source, const std::optional<nlohmann::json>& secret);
// A downwardAPI volume: items with fieldRef (resourceFieldRef is not supported).
std::expected<std::vector<VolumeFile>, std::string> downwardApiVolumeFiles(
    const nlohmann::json& source, const nlohmann::json& pod);

// Writes `files` into `dir` the way kubelet's AtomicWriter does: the payload goes into a fresh
// hidden timestamped dir, the `..data` symlink is switched to it with one rename, and each
// top-level name is a symlink `name -> ..data/name`; the previous payload dir is removed. A
// reader therefore sees the old or the new set of files, never a mix. Returns false (and writes
// nothing) when the payload equals what is there.
std::expected<bool, std::string> writeVolumeAtomically(const std::filesystem::path& dir,
                                                       const std::vector<VolumeFile>& files);

// One line of the hosts files: `<ip> <hostname>.<subdomain>.<ns>.svc.<domain>
// <hostname>.<subdomain>.<ns>.svc <hostname>.<subdomain>` (the DNS names a headless Service gives
// a pod with hostname and subdomain), or `<ip> <hostname>` for a pod without subdomain.
struct HostsEntry {
  std::string ip;
  std::string hostname;
  std::string subdomain;
  std::string ns;
  friend auto operator<=>(const HostsEntry&, const HostsEntry&) = default;
};
std::string hostsLine(const HostsEntry& entry, std::string_view cluster_domain = "cluster.local");
// A pod's /etc/hosts: localhost lines, the pod's own entry, spec.hostAliases, then every pod's
// DNS names (entries with a subdomain only).
std::string renderPodHosts(const HostsEntry& own, const nlohmann::json& host_aliases,
                           const std::vector<HostsEntry>& all,
                           std::string_view cluster_domain = "cluster.local");
// Replaces the block between rtable-local-kubelet markers in `existing` (or appends one) with
// the entries with a subdomain: for a hosts file of the host, other lines kept.
std::string replaceManagedHostsBlock(const std::string& existing,
                                     const std::vector<HostsEntry>& all,
                                     std::string_view cluster_domain = "cluster.local");
// Rewrites `path` in place (same inode: a bind mount of it keeps seeing the file) when its content
// differs. A reader may see a short or mixed read while it writes; resolvers read the file anew
// on each lookup, so that lasts one lookup.
std::expected<void, std::string> writeFileInPlace(const std::filesystem::path& path,
                                                  const std::string& content);

// Pod IPs 127.0.X.Y from 127.0.0.2 up (Y in 1..254, 127.0.0.1 is the node), handed out round
// robin so an address is reused only after all others were: a stale DNS answer or connection to a
// gone pod's address finds nothing rather than another pod. Thread-safe.
class PodIpAllocator {
 public:
  explicit PodIpAllocator(int max_addresses = 253 * 256);
  std::optional<std::string> allocate();
  void release(const std::string& ip);
  std::size_t inUse() const;

 private:
  static std::string addressOf(int index);
  mutable std::mutex mu_;
  int max_;
  int next_ = 0;
  std::set<int> used_;
  std::map<std::string, int> index_of_;
};

}  // namespace rtable::op::testing
