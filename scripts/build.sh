#!/usr/bin/env bash
# Configures and builds one flavour of rtable into its own folder.
#   scripts/build.sh [release|asan|tsan] [TARGET...]   (default release, every target)
#     ->  build/, build-asan/, build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."

flavour="${1:-release}"
shift || true
targets=()
for target in "$@"; do targets+=(--target "$target"); done
case "$flavour" in
  release) dir=build; flags=() ;;
  asan) dir=build-asan; flags=(-DRTABLE_SANITIZE=ON) ;;
  tsan) dir=build-tsan; flags=(-DRTABLE_TSAN=ON) ;;
  *) echo "build.sh: unknown flavour '$flavour' (release, asan or tsan)" >&2; exit 2 ;;
esac

# The compiler cache lives outside the clone, so a fresh clone (CI's) reuses what an earlier build
# compiled. Paths are taken relative to the clone, and the working directory is not hashed, so two
# clones of the same commit share every object.
export CCACHE_DIR="${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rtable/ccache}"
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}"
fi
# Two cores: -j2 keeps the machine responsive.
cmake --build "$dir" -j2 "${targets[@]}"
