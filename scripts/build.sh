#!/usr/bin/env bash
# Configures and builds one flavour of rtable into its own folder.
#   scripts/build.sh [release|asan|tsan|fuzz] [TARGET...]   (default release, every target;
#                                                             fuzz: the fuzz targets)
#     ->  build/, build-asan/, build-tsan/, build-fuzz/ (clang-19, libFuzzer, ASan + UBSan)
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
  fuzz)
    dir=build-fuzz
    flags=(-DRTABLE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-19)
    ((${#targets[@]})) || targets=(--target fuzz_targets)
    ;;
  *) echo "build.sh: unknown flavour '$flavour' (release, asan, tsan or fuzz)" >&2; exit 2 ;;
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
