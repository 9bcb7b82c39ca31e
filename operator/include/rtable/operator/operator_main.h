// The rtable-operator command: its flags (named as controller-runtime's kubebuilder main.go names
// them) and a main that wires an OperatorProcess from them, so that a later main (the one in
// controllers/) only adds its controllers:
//
//   int main(int argc, char** argv) {
//     return rtable::op::runOperatorMain(argc, argv, [](rtable::op::OperatorProcess& process)
//         -> std::expected<void, std::string> {
//       auto controller = std::make_shared<Controller>(...);  // registry: &process.registry()
//       process.addController(*controller);
//       process.adopt(controller);
//       return {};
//     });
//   }
//
// Exit codes: 0 after SIGTERM/SIGINT and a clean stop; 1 when leader election was lost, a stop
// timed out, or start-up failed (no kubeconfig, a port in use); 2 for a bad flag (the message
// names it). A second SIGTERM/SIGINT during the shutdown exits 1 at once.
//
// Thread safety: runOperatorMain() once per process, from main().
#pragma once

#include <expected>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/common/clock.h"

namespace rtable::op {

class OperatorProcess;

struct OperatorFlags {
  std::string kubeconfig;  // empty: $KUBECONFIG, else in-cluster, else ~/.kube/config
  bool leader_elect = true;
  std::string leader_election_namespace;  // empty: the kubeconfig context's or the pod's
  std::string leader_election_id = "rtable-operator-lock";
  common::Clock::Duration lease_duration = std::chrono::seconds(15);
  common::Clock::Duration renew_deadline = std::chrono::seconds(10);
  common::Clock::Duration retry_period = std::chrono::seconds(2);
  std::string health_probe_bind_address = ":8081";
  std::string metrics_bind_address = ":8080";
  common::Clock::Duration graceful_shutdown_timeout = std::chrono::seconds(30);
  std::string log_level = "info";
  bool help = false;
  bool version = false;
};

struct FlagError {
  std::string flag;  // "--leader-elect", or the unknown argument as given
  std::string message;
  std::string toString() const;  // "--flag: message"
};

// Arguments without the program name. Forms: --name=value, --name value, -name=value; booleans
// also as bare --name. Checks values (durations, bind addresses, log level, election timings).
std::expected<OperatorFlags, FlagError> parseOperatorFlags(const std::vector<std::string>& args);
std::string operatorUsage();

// A Go duration ("15s", "1m30s", "500ms", "2h"): what controller-runtime's flags take.
std::expected<common::Clock::Duration, std::string> parseGoDuration(std::string_view text);

// Adds controllers, informers and checks to the process before it starts; an error aborts the
// start (exit 1).
using OperatorSetup = std::function<std::expected<void, std::string>(OperatorProcess& process)>;

// The whole main: flags, logging, the client, the process, signals. Returns the exit code; when
// leader tasks had to be abandoned it ends the process itself (std::_Exit) instead.
int runOperatorMain(int argc, char** argv, const OperatorSetup& setup = {});

}  // namespace rtable::op
