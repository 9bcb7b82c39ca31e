#!/usr/bin/env bash
# Installs what rtable needs to build, run and test, from Debian 12's packages. Idempotent: a
# package already installed is left alone, and apt is not touched when nothing is missing.
#   scripts/install-deps.sh          build and run (ZooKeeper, the C++ libraries, a JDK)
#   scripts/install-deps.sh --test   also what the tests compare against (ClickHouse 18.16)
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config openjdk-17-jdk-headless ccache
  # C++ libraries (DESIGN.md 1)
  libzookeeper-mt-dev libcpprest-dev libssl-dev libyaml-cpp-dev prometheus-cpp-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libgtest-dev libxxhash-dev libzstd-dev
  # simdjson 3.0: JSONEachRow's structural scan (row_format.cpp)
  libsimdjson-dev
  # libcurl 7.88 with OpenSSL: backups to S3, signed by libcurl's own SigV4 (docs/backup-storage.md)
  libcurl4-openssl-dev
  # ZooKeeper 3.8 server and its jars (the local server, the snapshot tool)
  zookeeper libslf4j-java
  # The local Kubernetes control plane makes its certificates with the openssl CLI
  # (docs/control-plane.md); its binaries are built from Go modules, not installed.
  openssl
  # The IANA time zones of BackupSchedule's spec.timeZone (TimeZone reads their TZif files).
  tzdata
)
if [[ "${1:-}" == "--test" ]]; then
  # The side-by-side reference: ClickHouse 18.16's ReplicatedMergeTree on our ZooKeeper.
  packages+=(clickhouse-server clickhouse-client)
  # The Helm chart's tests (helm/test-chart.sh): promtool checks and unit-tests the alert rules;
  # python3-yaml reads the rendered manifests.
  packages+=(prometheus python3-yaml)
  # scripts/check-format.sh: the formatting check the test command runs first.
  packages+=(clang-format-19)
  # The images without a daemon (scripts/build-image.sh, image_tests): the root file system from
  # Debian's packages, the image around it, and runc to run it (crun fails on hybrid cgroups).
  packages+=(mmdebstrap buildah podman runc uidmap)
  # The fuzz targets (fuzz/, docs/fuzzing.md): clang-19 with libFuzzer and the sanitizer
  # runtimes; Debian's default clang 14 cannot compile libstdc++ 12's <expected>.
  packages+=(clang-19 libfuzzer-19-dev libclang-rt-19-dev)
  # The partition tests (network_fault_tests): nftables rules that drop a test process's
  # loopback packets by the uid that owns its sockets.
  packages+=(nftables)
fi

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
# Services that packages would start (ZooKeeper, ClickHouse) are not used: rtable starts its own
# on free loopback ports. policy-rc.d keeps invoke-rc.d from starting them where an init runs.
policy=/usr/sbin/policy-rc.d
created_policy=""
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee $policy >/dev/null
  $sudo chmod +x $policy
  created_policy=1
fi
cleanup() { if [[ -n "$created_policy" ]]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
