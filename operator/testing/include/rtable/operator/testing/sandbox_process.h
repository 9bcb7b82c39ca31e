#pragma once

#include <sys/types.h>

#include <expected>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace rtable::op::testing {

// A container's supervisor process (rtable-pod-sandbox), as LocalKubelet starts it. Unlike
// common::testing::Subprocess it keeps the exit status. PR_SET_PDEATHSIG fires when the *thread*
// that forked exits, so a pod worker thread never ends while one of its processes runs.
//
// The signals the sandbox forwards (TERM, INT, HUP, QUIT, USR1, USR2) are blocked in the child
// from its first instruction and stay blocked across exec: the sandbox unblocks them once its
// forwarding handlers exist, so a SIGTERM right after start() reaches the container instead of
// killing the supervisor, whose exit would look like the container's (143 where the container,
// ignoring SIGTERM, would end 137 after the grace period).
class SandboxProcess {
 public:
  // Starts args[0] (a path) with stdout and stderr appended to log_file and stdin /dev/null.
  static std::expected<SandboxProcess, std::string> start(const std::vector<std::string>& args,
                                                          const std::filesystem::path& log_file);

  SandboxProcess(SandboxProcess&& other) noexcept;
  SandboxProcess& operator=(SandboxProcess&& other) noexcept;
  ~SandboxProcess();

  pid_t pid() const { return pid_; }
  // The exit code once it ended (128 + signal when killed), else nullopt.
  std::optional<int> poll();
  void signal(int signo) const;
  // SIGKILL, wait, and the exit code (137 unless it had ended by itself before).
  int killAndReap();

 private:
  explicit SandboxProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

}  // namespace rtable::op::testing
