#include "rtable/operator/testing/sandbox_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace rtable::op::testing {

std::expected<SandboxProcess, std::string> SandboxProcess::start(
    const std::vector<std::string>& args, const std::filesystem::path& log_file) {
  const int log_fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return std::unexpected(fmt::format("open {}: {}", log_file.string(), std::strerror(errno)));
  }
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // Blocked in this thread *before* fork(), so that the child is born with them blocked: a
  // liveness kill can come the moment start() returns, before the child ran an instruction.
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&forwarded, s);
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &forwarded, &previous);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {  // async-signal-safe calls only until exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    dup2(null_fd, STDIN_FILENO);
    sigprocmask(SIG_SETMASK, &forwarded, nullptr);  // nothing else blocked
    execv(argv[0], argv.data());
    _exit(127);
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(log_fd);
  if (pid < 0) return std::unexpected(fmt::format("fork: {}", std::strerror(fork_errno)));
  return SandboxProcess(pid);
}

SandboxProcess::SandboxProcess(SandboxProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), exit_code_(other.exit_code_) {}

SandboxProcess& SandboxProcess::operator=(SandboxProcess&& other) noexcept {
  if (this != &other) {
    killAndReap();
    pid_ = std::exchange(other.pid_, -1);
    exit_code_ = other.exit_code_;
  }
  return *this;
}

SandboxProcess::~SandboxProcess() {
  killAndReap();
}

std::optional<int> SandboxProcess::poll() {
  if (pid_ <= 0) return exit_code_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return exit_code_;
}

void SandboxProcess::signal(int signo) const {
  if (pid_ > 0) ::kill(pid_, signo);
}

int SandboxProcess::killAndReap() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return exit_code_.value_or(137);
}

}  // namespace rtable::op::testing
