#!/usr/bin/env bash
# Installs, builds and runs the tests: every test in the release build, then the tests labelled
# `sanitized` under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer.
#   scripts/test.sh                  what CI runs (the README's test command)
#   scripts/test.sh --quick          the release build only
#   scripts/test.sh --all-sanitized  every test under both sanitizers too (about twice as long)
# The `sanitized` set is the unit tests and the integration tests of the runtime's threads and
# processes (ZooKeeper client, replicas, the operator's informers); the rest run in release only,
# which keeps a warm run near 30 minutes on 2 cores (docs/development.md has the figures).
set -euo pipefail
cd "$(dirname "$0")/.."

flavours=(release asan tsan)
sanitized_scope=(-L sanitized)
case "${1:-}" in
  "") ;;
  --quick) flavours=(release) ;;
  --all-sanitized) sanitized_scope=() ;;
  *) echo "test.sh: unknown option '$1' (--quick or --all-sanitized)" >&2; exit 2 ;;
esac

scripts/install-deps.sh --test
# The formatting check first: it takes seconds, the builds take minutes.
echo "=== format"
scripts/check-format.sh
# The operator's tests run against a real kube-apiserver built from Go modules; cached by version
# in ~/.cache/rtable/control-plane/ (outside the clone), so only the machine's first run pays.
echo "=== control plane"
e2e/build-control-plane.sh >/dev/null
# The backup tests' S3 server, SeaweedFS's weed, is built from Go modules too and cached by version
# in ~/.cache/rtable/seaweedfs/ (docs/backup-storage.md).
echo "=== seaweedfs"
e2e/build-seaweedfs.sh >/dev/null
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
for flavour in "${flavours[@]}"; do
  dir=build
  scope=()
  targets=()
  if [[ $flavour != release ]]; then
    dir="build-$flavour"
    scope=("${sanitized_scope[@]}")
    if ((${#scope[@]})); then
      # Only what those tests need is built (a test's name is its target's).
      scripts/build.sh "$flavour" rtable-core
      mapfile -t targets < <(ctest --test-dir "$dir" -N "${scope[@]}" | sed -n 's/^ *Test *#[0-9]*: //p')
    fi
  fi
  echo "=== $flavour: build"
  scripts/build.sh "$flavour" "${targets[@]}"
  echo "=== $flavour: test"
  ctest --test-dir "$dir" --output-on-failure -j2 --timeout 900 "${scope[@]}"
done
