// rtable-local-kubelet: LocalKubelet by hand (docs/local-kubelet.md). Registers a node with the
// apiserver of a kubeconfig, binds and runs its pods as local processes until SIGINT or SIGTERM.
//   rtable-local-kubelet [--kubeconfig FILE] [--work-dir DIR] [--node-name NAME]
//                        [--image NAME=EXECUTABLE]... [--hosts-file FILE]
//                        [--restart-backoff-ms N] [--max-grace-seconds N]
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rtable/operator/testing/local_kubelet.h"

namespace {

int usage(const char* argv0) {
  fmt::print(stderr,
             "usage: {} [--kubeconfig FILE] [--work-dir DIR] [--node-name NAME]\n"
             "       [--image NAME=EXECUTABLE]... [--hosts-file FILE]\n"
             "       [--restart-backoff-ms N] [--max-grace-seconds N]\n",
             argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  rtable::op::testing::LocalKubeletOptions options;
  if (const char* env = std::getenv("KUBECONFIG"); env && *env) {
    const std::string first(env);
    options.kubeconfig = first.substr(0, first.find(':'));
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    try {
      if (arg == "--kubeconfig" && has_value) {
        options.kubeconfig = argv[++i];
      } else if (arg == "--work-dir" && has_value) {
        options.work_dir = argv[++i];
      } else if (arg == "--node-name" && has_value) {
        options.node_name = argv[++i];
      } else if (arg == "--hosts-file" && has_value) {
        options.host_hosts_file = argv[++i];
      } else if (arg == "--image" && has_value) {
        const std::string spec = argv[++i];
        const auto eq = spec.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) return usage(argv[0]);
        options.images[spec.substr(0, eq)] = {{spec.substr(eq + 1)}, {}, {}};
      } else if (arg == "--restart-backoff-ms" && has_value) {
        options.restart_backoff_initial = std::chrono::milliseconds(std::stol(argv[++i]));
      } else if (arg == "--max-grace-seconds" && has_value) {
        options.max_termination_grace = std::chrono::seconds(std::stol(argv[++i]));
      } else {
        return usage(argv[0]);
      }
    } catch (const std::exception&) {
      return usage(argv[0]);
    }
  }
  if (options.kubeconfig.empty()) {
    fmt::print(stderr, "rtable-local-kubelet: no --kubeconfig and no $KUBECONFIG\n");
    return 2;
  }
  const bool own_work_dir = !options.work_dir.empty();
  // Blocked before any thread starts, so every thread inherits the mask and sigwait below gets
  // the signal; container processes start with an empty mask (LocalKubelet resets it).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto kubelet = rtable::op::testing::LocalKubelet::start(options);
  if (!kubelet) {
    fmt::print(stderr, "rtable-local-kubelet: {}\n", kubelet.error());
    return 1;
  }
  if (own_work_dir) kubelet->keepWorkDir();
  fmt::print(stderr,
             "rtable-local-kubelet: node {} registered; pods, volumes and logs in {}; Ctrl-C "
             "stops the containers (the Node and Pods stay in the API)\n",
             kubelet->nodeName(), kubelet->workDir().string());
  std::fflush(stderr);
  int received = 0;
  sigwait(&signals, &received);
  return 0;
}
