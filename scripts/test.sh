#!/usr/bin/env bash
# Installs, builds and runs every test: the release build, then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer, then under ThreadSanitizer.
#   scripts/test.sh            everything (what CI runs)
#   scripts/test.sh --quick    the release build only
set -euo pipefail
cd "$(dirname "$0")/.."

flavours=(release asan tsan)
if [[ "${1:-}" == "--quick" ]]; then
  flavours=(release)
fi

scripts/install-deps.sh --test
# The formatting check first: it takes seconds, the builds take minutes.
echo "=== format"
scripts/check-format.sh
# The operator's tests run against a real kube-apiserver built from Go modules; cached by version
# in ~/.cache/rtable/control-plane/ (outside the clone), so only the machine's first run pays.
echo "=== control plane"
e2e/build-control-plane.sh >/dev/null
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
for flavour in "${flavours[@]}"; do
  echo "=== $flavour: build"
  scripts/build.sh "$flavour"
  dir=build
  [[ $flavour != release ]] && dir="build-$flavour"
  echo "=== $flavour: test"
  ctest --test-dir "$dir" --output-on-failure -j2 --timeout 900
done
