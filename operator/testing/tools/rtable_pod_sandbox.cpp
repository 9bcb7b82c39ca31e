// rtable-pod-sandbox: runs one container of LocalKubelet (docs/local-kubelet.md) in its own mount,
// PID and UTS namespaces, the way a container runtime would, minus images and cgroups.
//   rtable-pod-sandbox <spec.json>
//
// The spec (written by LocalKubelet) names a root dir, the container's mounts, argv, env, working
// dir, hostname and a pid file. In new namespaces this process forks the container's init (PID 1
// of the new PID namespace), which builds a root on a tmpfs at `root` that mirrors the host's `/`
// (bind mounts of each top-level entry, a fresh /proc), creates missing mount points on tmpfs
// "shadows" of the directories that should hold them (the host is never written), bind-mounts
// the volumes, chroots and execs. This process stays outside as the container's supervisor: it
// forwards SIGTERM and friends, and exits with the container's status (128 + signal when it was
// killed), so LocalKubelet reports the exit code as a runtime would. When this process dies, the
// init gets SIGKILL (PR_SET_PDEATHSIG) and with it every process of the PID namespace; the mount
// namespace goes with its last process, so nothing is left behind.
//
// Single-threaded; exits 125 on a setup error of its own (the message goes to stderr, i.e. the
// container's log), 127 when the command cannot be executed.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

// LeakSanitizer's check at exit clones a tracer thread. After unshare(CLONE_NEWPID) every child
// of this process is born in the container's PID namespace, which refuses new processes once its
// init has exited: the check died with a fatal error and turned every exit status into 134. This
// process only lives as long as its container and frees nothing worth checking: no leak check.
extern "C" __attribute__((used, visibility("default"))) int __lsan_is_turned_off() {
  return 1;
}

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kSetupError = 125;
constexpr int kExecError = 127;

struct Mount {
  std::string source;  // host path
  std::string target;  // absolute path in the container
  bool read_only = false;
};

struct User {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

struct Spec {
  std::string root;
  std::string hostname;
  std::vector<Mount> mounts;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string working_dir = "/";
  std::string pid_file;
  std::optional<User> user;     // runAsUser/runAsGroup/fsGroup; none: root
  bool read_only_root = false;  // readOnlyRootFilesystem: only the volumes (and /dev) writable
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "rtable-pod-sandbox: %s\n", what.c_str());
  std::fflush(stderr);
  _exit(kSetupError);
}

std::string errnoText() {
  return std::strerror(errno);
}

void mountOrFail(const std::string& source, const std::string& target, const char* type,
                 unsigned long flags, const char* data = nullptr) {
  if (::mount(source.c_str(), target.c_str(), type, flags, data) != 0) {
    fail("mount " + source + " on " + target + ": " + errnoText());
  }
}

Spec readSpec(const char* path) {
  std::ifstream in(path);
  if (!in) fail(std::string("cannot read ") + path);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail(std::string(path) + ": not a JSON object");
  Spec spec;
  try {
    spec.root = j.at("root").get<std::string>();
    spec.hostname = j.value("hostname", "");
    spec.argv = j.at("argv").get<std::vector<std::string>>();
    spec.env = j.value("env", std::vector<std::string>{});
    spec.working_dir = j.value("working_dir", "/");
    spec.pid_file = j.value("pid_file", "");
    spec.read_only_root = j.value("read_only_root", false);
    if (j.contains("user")) {
      const json& user = j.at("user");
      spec.user = User{user.at("uid").get<uid_t>(), user.at("gid").get<gid_t>(),
                       user.value("groups", std::vector<gid_t>{})};
    }
    const json mounts = j.value("mounts", json::array());
    for (const auto& m : mounts) {
      spec.mounts.push_back({m.at("source").get<std::string>(), m.at("target").get<std::string>(),
                             m.value("read_only", false)});
    }
  } catch (const json::exception& e) {
    fail(std::string(path) + ": " + e.what());
  }
  if (spec.argv.empty()) fail("empty argv");
  if (spec.working_dir.empty()) spec.working_dir = "/";
  return spec;
}

// The root under construction: which of its directories live on our own tmpfs (a mkdir there
// touches nothing of the host), and which container paths are volumes (a mkdir inside one goes to
// the volume's own dir, as runc does for nested mount points).
class RootBuilder {
 public:
  explicit RootBuilder(const Spec& spec) : spec_(spec), root_(spec.root) {}

  void build() {
    mountOrFail("tmpfs", root_, "tmpfs", MS_NOSUID, "mode=0755");
    scaffold_.insert("/");
    mirrorDirectory("/", root_);
    // A /proc of the new PID namespace, so the container sees its own processes.
    fs::create_directories(root_ + "/proc");
    mountOrFail("proc", root_ + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC);

    std::vector<Mount> mounts = spec_.mounts;
    // Parents before children: a mount point inside another volume must exist in that volume.
    std::stable_sort(mounts.begin(), mounts.end(), [](const Mount& a, const Mount& b) {
      return depth(a.target) < depth(b.target);
    });
    for (const auto& m : mounts) ensureMountPoint(m);
    for (const auto& m : mounts) {
      const std::string target = root_ + normalize(m.target);
      mountOrFail(m.source, target, nullptr, MS_BIND | MS_REC);
      if (m.read_only) {
        mountOrFail(m.source, target, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC);
      }
    }
    if (spec_.read_only_root) makeRootReadOnly();
  }

 private:
  // readOnlyRootFilesystem: every mount that makes up the mirrored root, read-only; the volumes
  // (mounted on top of it) keep their own mode. /dev stays writable (/dev/null, ttys), as a
  // runtime's /dev tmpfs does; /proc and /sys keep theirs.
  void makeRootReadOnly() {
    // Deepest first is not needed (each remount changes one mount), but the root goes last so
    // that nothing below it is looked up through a read-only parent while it changes.
    for (auto it = root_mounts_.rbegin(); it != root_mounts_.rend(); ++it) {
      const std::string& path = *it;
      const std::string inside = path.substr(root_.size());
      if (inside == "/dev" || inside.starts_with("/dev/") || inside == "/sys" ||
          inside.starts_with("/sys/") || inside == "/proc" || inside.starts_with("/proc/")) {
        continue;
      }
      if (::mount("none", path.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
        fail("remount read-only " + path + ": " + errnoText());
      }
    }
    if (::mount("none", root_.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
      fail("remount read-only " + root_ + ": " + errnoText());
    }
  }

  static std::size_t depth(const std::string& path) {
    return static_cast<std::size_t>(std::count(path.begin(), path.end(), '/'));
  }

  static std::string normalize(const std::string& path) {
    std::string out = fs::path(path).lexically_normal().string();
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    if (out.empty() || out[0] != '/') fail("mount target must be absolute: " + path);
    return out;
  }

  // Makes `to` (a dir on our tmpfs) look like host dir `from`: sub-dirs and files are bind
  // mounts of the originals (with what is mounted below them), symlinks are copied.
  void mirrorDirectory(const std::string& from, const std::string& to) {
    DIR* dir = ::opendir(from.c_str());
    if (!dir) fail("opendir " + from + ": " + errnoText());
    std::vector<std::string> names;
    while (dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    for (const auto& name : names) {
      const std::string source = (from == "/" ? "" : from) + "/" + name;
      const std::string target = to + "/" + name;
      if (from == "/" && name == "proc") continue;  // a fresh one, see build()
      struct stat st{};
      if (::lstat(source.c_str(), &st) != 0) continue;  // gone meanwhile
      if (S_ISLNK(st.st_mode)) {
        std::vector<char> link(static_cast<std::size_t>(PATH_MAX) + 1);
        const ssize_t n = ::readlink(source.c_str(), link.data(), PATH_MAX);
        if (n < 0) continue;
        if (::symlink(std::string(link.data(), static_cast<std::size_t>(n)).c_str(),
                      target.c_str()) != 0) {
          fail("symlink " + target + ": " + errnoText());
        }
      } else if (S_ISDIR(st.st_mode)) {
        if (::mkdir(target.c_str(), st.st_mode & 07777) != 0 && errno != EEXIST) {
          fail("mkdir " + target + ": " + errnoText());
        }
        mountOrFail(source, target, nullptr, MS_BIND | MS_REC);
        root_mounts_.push_back(target);
      } else {
        const int fd = ::open(target.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) fail("create " + target + ": " + errnoText());
        ::close(fd);
        mountOrFail(source, target, nullptr, MS_BIND);
        root_mounts_.push_back(target);
      }
    }
  }

  // The volume mount that holds container path `path` (strictly inside), if any.
  const Mount* volumeHolding(const std::string& path) const {
    const Mount* best = nullptr;
    std::size_t best_len = 0;
    for (const auto& m : spec_.mounts) {
      const std::string t = normalize(m.target);
      const std::string prefix = t == "/" ? "/" : t + "/";
      if (path.starts_with(prefix) && prefix.size() > best_len) {
        best = &m;
        best_len = prefix.size();
      }
    }
    return best;
  }

  // Creates mount point `m.target` (a dir, or a file when the source is not a dir).
  void ensureMountPoint(const Mount& m) {
    const std::string target = normalize(m.target);
    struct stat source_stat{};
    if (::stat(m.source.c_str(), &source_stat) != 0) {
      fail("volume source " + m.source + ": " + errnoText());
    }
    const bool want_dir = S_ISDIR(source_stat.st_mode);
    if (const Mount* holder = volumeHolding(target)) {
      // Inside another volume: the mount point goes into that volume's dir.
      const std::string holder_target = normalize(holder->target);
      const std::string rest = target.substr(holder_target == "/" ? 1 : holder_target.size() + 1);
      const fs::path host = fs::path(holder->source) / rest;
      std::error_code ec;
      fs::create_directories(want_dir ? host : host.parent_path(), ec);
      if (!want_dir && !fs::exists(host)) std::ofstream(host).close();
      return;
    }
    // Walk down from "/", shadowing the first existing dir that lacks the next component.
    std::string current = "/";
    const fs::path rel = fs::path(target).relative_path();
    std::vector<std::string> parts;
    for (const auto& p : rel) parts.push_back(p.string());
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const bool last = i + 1 == parts.size();
      const std::string next = (current == "/" ? "" : current) + "/" + parts[i];
      const std::string in_root = root_ + next;
      struct stat st{};
      if (::lstat(in_root.c_str(), &st) == 0) {
        if (S_ISLNK(st.st_mode)) fail("mount target " + target + " crosses symlink " + next);
        current = next;
        continue;
      }
      if (!scaffold_.contains(current)) shadow(current);
      if (last && !want_dir) {
        const int fd = ::open(in_root.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) fail("create " + in_root + ": " + errnoText());
        ::close(fd);
      } else {
        if (::mkdir(in_root.c_str(), 0755) != 0) fail("mkdir " + in_root + ": " + errnoText());
        scaffold_.insert(next);
      }
      current = next;
    }
  }

  // Replaces container dir `path` (a mirror of the host dir of the same path) by a tmpfs holding
  // a mirror of it, so that new entries can be made without writing to the host.
  void shadow(const std::string& path) {
    const std::string in_root = root_ + path;
    mountOrFail("tmpfs", in_root, "tmpfs", MS_NOSUID, "mode=0755");
    root_mounts_.push_back(in_root);
    mirrorDirectory(path, in_root);
    scaffold_.insert(path);
  }

  const Spec& spec_;
  std::string root_;
  std::set<std::string> scaffold_;  // container paths of dirs on our tmpfs
  // Host paths of the mounts that mirror the host's root (not the volumes), in mount order.
  std::vector<std::string> root_mounts_;
};

// `go` is the read end of a pipe the supervisor writes one byte to once it runs: getppid() is 0
// in a new PID namespace, so this is how init learns that the supervisor did not die before
// PR_SET_PDEATHSIG took effect (EOF then).
[[noreturn]] void runInit(const Spec& spec, int go) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  char byte = 0;
  if (::read(go, &byte, 1) != 1) _exit(kSetupError);
  ::close(go);
  if (!spec.hostname.empty() && ::sethostname(spec.hostname.data(), spec.hostname.size()) != 0) {
    fail("sethostname: " + errnoText());
  }
  RootBuilder(spec).build();
  if (::chroot(spec.root.c_str()) != 0) fail("chroot " + spec.root + ": " + errnoText());
  if (::chdir(spec.working_dir.c_str()) != 0) {
    fail("chdir " + spec.working_dir + ": " + errnoText());
  }
  if (spec.user) {
    // Groups, then the group, then the user: after setuid nothing else could be changed.
    if (::setgroups(spec.user->groups.size(), spec.user->groups.data()) != 0)
      fail("setgroups: " + errnoText());
    if (::setgid(spec.user->gid) != 0) fail("setgid: " + errnoText());
    if (::setuid(spec.user->uid) != 0) fail("setuid: " + errnoText());
  }
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // argv[0] is looked up in the container's PATH, as runc does.
  ::environ = envp.data();
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvpe(argv[0], argv.data(), envp.data());
  std::fprintf(stderr, "rtable-pod-sandbox: exec %s: %s\n", argv[0], std::strerror(errno));
  _exit(kExecError);
}

volatile sig_atomic_t g_child = 0;

void forwardSignal(int signo) {
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), signo);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <spec.json>\n", argv[0]);
    return 2;
  }
  const Spec spec = readSpec(argv[1]);
  if (::unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS) != 0) fail("unshare: " + errnoText());
  // Nothing we mount may propagate back to the host's mount namespace.
  mountOrFail("none", "/", nullptr, MS_REC | MS_PRIVATE);

  // Signals that arrive before the child exists are held, then forwarded.
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&forwarded, s);
  sigprocmask(SIG_BLOCK, &forwarded, nullptr);

  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) fail("pipe: " + errnoText());
  const pid_t child = fork();
  if (child < 0) fail("fork: " + errnoText());
  if (child == 0) {
    ::close(go[1]);
    runInit(spec, go[0]);
  }
  ::close(go[0]);
  if (::write(go[1], "g", 1) != 1) fail("pipe write: " + errnoText());
  ::close(go[1]);

  g_child = child;
  if (!spec.pid_file.empty()) {
    const std::string tmp = spec.pid_file + ".tmp";
    std::ofstream(tmp) << child << "\n";
    std::rename(tmp.c_str(), spec.pid_file.c_str());
  }
  struct sigaction action{};
  action.sa_handler = forwardSignal;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaction(s, &action, nullptr);
  sigprocmask(SIG_UNBLOCK, &forwarded, nullptr);

  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) fail("waitpid: " + errnoText());
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kSetupError;
}
