#!/usr/bin/env bash
# Runs one fuzz target for a bounded time (ctest's fuzz_* tests, fuzz/CMakeLists.txt):
#   fuzz/run-fuzzer.sh BINARY WORK_DIR SECONDS SEED_CORPUS
# First every seed input (the repository's corpus, which keeps each input that once failed: the
# regression tests), then new inputs for SECONDS. New corpus entries and any failing input go to
# WORK_DIR, never into the repository; a failure prints the input's path and how to replay it.
set -euo pipefail
binary="$1" work="$2" seconds="$3" seeds="$4"
mkdir -p "$work/corpus" "$work/crashes"
# -timeout: one input taking over 10 s is a finding (a hang); so is using over 2 GiB.
if "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/crashes/" "$work/corpus" "$seeds"; then
  exit 0
fi
echo "run-fuzzer: $(basename "$binary") failed; the input is in $work/crashes/." >&2
echo "Replay it with: $binary $work/crashes/<file>; add it to $seeds once fixed." >&2
exit 1
