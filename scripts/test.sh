#!/usr/bin/env bash
# Installs, builds and runs the tests: every test in the release build, then the tests labelled
# `sanitized` under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer, then
# each libFuzzer target for a bounded time over its seed corpus (fuzz/, docs/fuzzing.md).
#   scripts/test.sh                  what CI runs (the README's test command)
#   scripts/test.sh --quick          the release build only
#   scripts/test.sh --all-sanitized  every test under both sanitizers too (about twice as long)
# The `sanitized` set is the unit tests and the integration tests of the runtime's threads and
# processes (ZooKeeper client, replicas, the operator's informers); the rest run in release only,
# which keeps a warm run near 30 minutes on 2 cores (docs/development.md has the figures). TSan
# leaves out the tests labelled `single_threaded`: a race needs two threads.
set -euo pipefail
cd "$(dirname "$0")/.."

flavours=(release asan tsan fuzz)
declare -A scope=([asan]="-L sanitized" [tsan]="-L sanitized -LE single_threaded" [fuzz]="-L fuzz")
case "${1:-}" in
  "") ;;
  --quick) flavours=(release) ;;
  --all-sanitized) scope=([asan]="" [tsan]="" [fuzz]="-L fuzz") ;;
  *) echo "test.sh: unknown option '$1' (--quick or --all-sanitized)" >&2; exit 2 ;;
esac

scripts/install-deps.sh --test
# The formatting check first: it takes seconds, the builds take minutes.
echo "=== format"
scripts/check-format.sh
# The operator's tests run against a real kube-apiserver, and the backup tests against SeaweedFS's
# weed, both built from Go modules and cached by version in ~/.cache/rtable/ (outside the clone),
# so only the machine's first run pays (about 9 and 11 minutes). They build while the release
# build compiles: on a cold machine much of their time is the modules' download.
go_log="$(mktemp)"
background=()
# Job control: each background job is its own process group, so that a failure (or Ctrl-C) stops
# it with everything it started.
set -m
trap 'for pid in "${background[@]}"; do kill -- "-$pid" 2>/dev/null || true; done' EXIT
(e2e/build-control-plane.sh && e2e/build-seaweedfs.sh) >"$go_log" 2>&1 &
go_builds=$!
background+=("$go_builds")
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"

# A sanitizer flavour builds only what its tests need (a test's name is its target's).
build_sanitized() {
  local flavour="$1" targets=() selection
  # The fuzz flavour builds its fuzz targets only (scripts/build.sh).
  if [[ "$flavour" == fuzz ]]; then
    scripts/build.sh fuzz
    return
  fi
  read -ra selection <<<"${scope[$flavour]}"
  if ((${#selection[@]})); then
    scripts/build.sh "$flavour" rtable-core || return
    mapfile -t targets < <(ctest --test-dir "build-$flavour" -N "${selection[@]}" |
      sed -n 's/^ *Test *#[0-9]*: //p')
  fi
  scripts/build.sh "$flavour" "${targets[@]}"
}

echo "=== release: build"
scripts/build.sh release
echo "=== control plane, seaweedfs"
wait "$go_builds" || { cat "$go_log"; echo "building the control plane or weed failed" >&2; exit 1; }

# The sanitizer flavours build one after the other beside the release tests, at the lowest
# priority: the tests spend much of their time waiting on servers and processes. Each flavour's
# tests start as soon as its own build is done (the ASan tests beside the TSan build): on a cold
# machine the builds are most of the run (docs/development.md has the figures).
sanitizers=("${flavours[@]:1}")
builds_dir="$(mktemp -d)"
if ((${#sanitizers[@]})); then
  (
    renice -n 19 "$BASHPID" >/dev/null
    for flavour in "${sanitizers[@]}"; do
      rc=0
      build_sanitized "$flavour" >"$builds_dir/$flavour.log" 2>&1 || rc=$?
      echo "$rc" >"$builds_dir/$flavour.rc"
      ((rc == 0)) || exit "$rc"
    done
  ) &
  sanitizer_builds=$!
  background+=("$sanitizer_builds")
fi
echo "=== release: test"
ctest --test-dir build --output-on-failure -j2 --timeout 900

for flavour in "${sanitizers[@]}"; do
  echo "=== $flavour: build"
  while [[ ! -f "$builds_dir/$flavour.rc" ]]; do
    kill -0 "$sanitizer_builds" 2>/dev/null || { echo "the sanitizer builds stopped" >&2; exit 1; }
    sleep 5
  done
  if [[ "$(cat "$builds_dir/$flavour.rc")" != 0 ]]; then
    cat "$builds_dir/$flavour.log"
    echo "the $flavour build failed" >&2
    exit 1
  fi
  tail -n 3 "$builds_dir/$flavour.log"
  echo "=== $flavour: test"
  read -ra selection <<<"${scope[$flavour]}"
  ctest --test-dir "build-$flavour" --output-on-failure -j2 --timeout 900 "${selection[@]}"
done
