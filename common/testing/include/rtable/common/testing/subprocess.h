// Child processes for tests and the local launcher: real servers (ZooKeeper, ClickHouse) and the
// project's own binaries. A child dies with its parent (PR_SET_PDEATHSIG), so a crashed test leaves
// no server behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <expected>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace rtable::common::testing {

using TestStatus = std::expected<void, std::string>;

class Subprocess {
 public:
  // Starts argv (argv[0] looked up in PATH) with stdout and stderr appended to `log_file`. With
  // `run_as_uid` (the caller must be root), the child runs as that uid and gid with no
  // supplementary groups: its sockets are then its own to match in firewall rules (`meta skuid`),
  // which is how the partition tests cut one process's links and not another's. Every folder on
  // argv[0]'s path, and the files it opens, must then be reachable by that uid.
  static std::expected<Subprocess, std::string> start(const std::vector<std::string>& argv,
                                                      const std::filesystem::path& log_file,
                                                      std::optional<uid_t> run_as_uid = {});
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();  // kills a child that is still running

  pid_t pid() const { return pid_; }
  // False once the child ended (reaped here); its wait status is then waitStatus().
  bool running();
  std::optional<int> waitStatus() const { return wait_status_; }
  // SIGTERM, then SIGKILL after `grace`. Returns the wait status, or nullopt if already reaped.
  std::optional<int> stop(std::chrono::milliseconds grace = std::chrono::seconds(10));
  void kill();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> wait_status_;
};

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;
  std::string err;
};

// Runs argv to completion and captures its output; killed after `timeout`.
std::expected<CommandResult, std::string> runCommand(const std::vector<std::string>& argv,
                                                     std::chrono::milliseconds timeout);

// A loopback TCP port that was free a moment ago (a bind to it succeeded), below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range): a server restarted on its old port (ZooKeeper,
// a replica) must find it free again, and a port in the ephemeral range can meanwhile become the
// local end of any process's outgoing connection (a CI flake: "address already in use").
std::expected<int, std::string> findFreeLoopbackPort();

// The last `max_bytes` of a file, for error messages about a server that would not start.
std::string tailOfFile(const std::filesystem::path& path, std::size_t max_bytes = 2000);

}  // namespace rtable::common::testing
