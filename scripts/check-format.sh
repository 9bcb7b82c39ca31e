#!/usr/bin/env bash
# Checks that every C++ file git tracks is formatted as .clang-format says (Google style, 100
# columns), with clang-format 19 (scripts/install-deps.sh --test installs it). Prints the files that
# are not and exits 1; with --fix, formats them in place.
#   scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=clang-format-19
if ! command -v "$clang_format" >/dev/null; then
  echo "check-format: $clang_format is missing (scripts/install-deps.sh --test)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h')
if [[ "${1:-}" == "--fix" ]]; then
  "$clang_format" -i "${files[@]}"
  exit 0
fi
bad=()
for file in "${files[@]}"; do
  if ! "$clang_format" --dry-run --Werror "$file" >/dev/null 2>&1; then bad+=("$file"); fi
done
if ((${#bad[@]} > 0)); then
  echo "check-format: ${#bad[@]} file(s) not formatted as .clang-format says (scripts/check-format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
