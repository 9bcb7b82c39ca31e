// rtable-control-plane: the tests' LocalControlPlane by hand (docs/control-plane.md). Starts etcd,
// kube-apiserver and, with --controller-manager, kube-controller-manager on loopback, prints an
// `export KUBECONFIG=...` line and runs until SIGINT or SIGTERM.
//   rtable-control-plane [--work-dir DIR] [--controller-manager]
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <string_view>

#include "rtable/operator/testing/local_control_plane.h"

int main(int argc, char** argv) {
  rtable::op::testing::LocalControlPlaneOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--controller-manager") {
      options.controller_manager = true;
    } else if (arg == "--work-dir" && i + 1 < argc) {
      options.work_dir = argv[++i];
    } else {
      fmt::print(stderr, "usage: {} [--work-dir DIR] [--controller-manager]\n", argv[0]);
      return 2;
    }
  }
  auto plane = rtable::op::testing::LocalControlPlane::start(options);
  if (!plane) {
    fmt::print(stderr, "rtable-control-plane: {}\n", plane.error());
    return 1;
  }
  // Blocked only now: the children inherit the signal mask, and must still take SIGTERM.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  fmt::print("export KUBECONFIG={}\n", plane->kubeconfigPath().string());
  fmt::print(stderr, "rtable-control-plane: {} (etcd {}), logs in {}; Ctrl-C stops it\n",
             plane->serverUrl(), plane->etcdUrl(), plane->workDir().string());
  std::fflush(stdout);
  int received = 0;
  sigwait(&signals, &received);
  return 0;
}
