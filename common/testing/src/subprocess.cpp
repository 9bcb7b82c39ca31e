#include "rtable/common/testing/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

namespace rtable::common::testing {
namespace {

std::vector<char*> toArgv(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  return argv;
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void execChild(const std::vector<char*>& argv, pid_t parent,
                            std::optional<uid_t> run_as_uid) {
  if (run_as_uid) {
    const gid_t gid = static_cast<gid_t>(*run_as_uid);
    if (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
        setresuid(*run_as_uid, *run_as_uid, *run_as_uid) != 0) {
      _exit(126);
    }
  }
  // After the uid change, which clears the parent-death signal.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before prctl
  execvp(argv[0], argv.data());
  _exit(127);
}

}  // namespace

std::expected<Subprocess, std::string> Subprocess::start(const std::vector<std::string>& args,
                                                         const std::filesystem::path& log_file,
                                                         std::optional<uid_t> run_as_uid) {
  const int log_fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0)
    return std::unexpected(fmt::format("cannot open {}: {}", log_file.string(), strerror(errno)));
  const auto argv = toArgv(args);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(log_fd);
    return std::unexpected(fmt::format("fork failed: {}", strerror(errno)));
  }
  if (pid == 0) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    dup2(null_fd, STDIN_FILENO);
    execChild(argv, parent, run_as_uid);
  }
  ::close(log_fd);
  return Subprocess(pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), wait_status_(other.wait_status_) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    kill();
    pid_ = std::exchange(other.pid_, -1);
    wait_status_ = other.wait_status_;
  }
  return *this;
}

Subprocess::~Subprocess() {
  kill();
}

bool Subprocess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    wait_status_ = status;
    return false;
  }
  return true;
}

std::optional<int> Subprocess::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return std::nullopt;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

void Subprocess::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::expected<CommandResult, std::string> runCommand(const std::vector<std::string>& args,
                                                     std::chrono::milliseconds timeout) {
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    return std::unexpected(fmt::format("pipe failed: {}", strerror(errno)));
  }
  const auto argv = toArgv(args);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return std::unexpected(fmt::format("fork failed: {}", strerror(errno)));
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    dup2(null_fd, STDIN_FILENO);
    execChild(argv, parent, std::nullopt);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  CommandResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    if (poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& fd : fds) {
    if (fd.fd >= 0) ::close(fd.fd);
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) {
    return std::unexpected(
        fmt::format("{} did not finish within {} ms", args.front(), timeout.count()));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

namespace {

// The first port of the kernel's ephemeral range (32768 when it cannot be read).
int ephemeralPortsStart() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (in >> low >> high && low > 1024) return low;
  return 32768;
}

// Whether 127.0.0.1:`port` can be bound now (0: any; the bound port goes to *bound).
bool bindsOnLoopback(int port, int* bound) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (ok && bound) *bound = ntohs(addr.sin_port);
  return ok;
}

}  // namespace

std::expected<int, std::string> findFreeLoopbackPort() {
  // Below the ephemeral range, from 10000 up (well-known and registered services sit lower).
  const int end = ephemeralPortsStart();
  constexpr int kFirst = 10000;
  if (end > kFirst + 100) {
    static std::mt19937 random(static_cast<uint32_t>(std::random_device{}()) ^
                               static_cast<uint32_t>(getpid()));
    static std::mutex mu;
    std::lock_guard lock(mu);
    std::uniform_int_distribution<int> pick(kFirst, end - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int port = pick(random);
      if (bindsOnLoopback(port, nullptr)) return port;
    }
  }
  int bound = 0;
  if (!bindsOnLoopback(0, &bound)) {
    return std::unexpected(fmt::format("bind to 127.0.0.1:0 failed: {}", strerror(errno)));
  }
  return bound;
}

std::string tailOfFile(const std::filesystem::path& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

}  // namespace rtable::common::testing
