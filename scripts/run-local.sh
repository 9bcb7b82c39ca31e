#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds, then
#   1. rtable-local: its own ZooKeeper, three rtable-core replicas, a deduplicated demo insert,
#      the metrics, and rtable-inspect over a demo tree of tables;
#   2. rtable-local-cluster: the whole stack on Kubernetes — a local kube-apiserver and
#      kube-controller-manager (built from Go modules the first time, cached in ~/.cache/rtable/), the
#      CRDs, a test kubelet, rtable-operator, and a 3-replica ReplicatedTable applied with
#      kubectl, a row inserted on one replica and read back on all three; then the table swap:
#      writers keep inserting, generation 1's log counter is pushed under the headroom threshold,
#      the operator moves the table to generation 2, every replica holds exactly the acknowledged
#      rows once, and rtable-inspect shows the headroom before and after.
# --keep-running leaves the Kubernetes stack up (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
echo "=== control plane binaries (cached after the first run)"
e2e/build-control-plane.sh >/dev/null
echo "=== build"
scripts/build.sh release >/dev/null
build/bin/rtable-local
exec build/bin/rtable-local-cluster "$@"
