#!/usr/bin/env bash
# Builds SeaweedFS's `weed`, the S3 server the backup tests run against (docs/backup-storage.md),
# from the Go module proxy into
#   ${XDG_CACHE_HOME:-~/.cache}/rtable/seaweedfs/<SEAWEEDFS_VERSION>/bin/weed
# outside the clone, so that a fresh clone (CI's) on the same machine builds nothing. About 6 min
# cold on 2 cores. Idempotent: exits at once when the binary exists. Prints the binary's path on
# success (last line of stdout).
#   e2e/build-seaweedfs.sh
set -euo pipefail

# The one place the SeaweedFS version is set; backup/testing/CMakeLists.txt reads this line to
# find the binary. The pseudo-version is what the module proxy serves for the upstream commit.
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
module=github.com/seaweedfs/seaweedfs

bin="${XDG_CACHE_HOME:-$HOME/.cache}/rtable/seaweedfs/$SEAWEEDFS_VERSION/bin"
if [[ -x "$bin/weed" ]]; then
  echo "$bin/weed"
  exit 0
fi

mkdir -p "$bin"
# Two cores: one package compile per core. GOMODCACHE and GOCACHE stay at Go's defaults so other
# Go work on the machine shares them.
export GOFLAGS="-p=2 -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local

# The build happens in a temporary folder beside the binary and the result is renamed into place,
# so an interrupted build never leaves a partial `weed` that the check above would take as done.
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
start=$SECONDS
echo "build-seaweedfs: building weed $SEAWEEDFS_VERSION ..." >&2

# `go install $module/weed@VERSION` is refused: SeaweedFS's go.mod has `replace` directives, which
# only apply when building inside the module itself. So: download the module, copy its source
# (the module cache is read-only) and build there.
dir=$(go mod download -json "$module@$SEAWEEDFS_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
if [[ -z "$dir" || ! -d "$dir" ]]; then
  echo "build-seaweedfs: go mod download did not report the source folder of $module@$SEAWEEDFS_VERSION" >&2
  exit 1
fi
cp -R "$dir" "$tmp/src"
chmod -R u+w "$tmp/src"
(cd "$tmp/src" && go build -trimpath -ldflags "-s -w" -o "$tmp/weed" ./weed)
mv "$tmp/weed" "$bin/weed"
echo "build-seaweedfs: built weed in $((SECONDS - start)) s" >&2
echo "$bin/weed"
