#!/usr/bin/env bash
# Builds rtable's two images without a daemon, from Debian 12's packages (docs/helm.md, Images):
#   scripts/build-image.sh BIN_DIR [TAG]
#     -> localhost/rtable:TAG           ENTRYPOINT rtable-core     (the replicas)
#        localhost/rtable-operator:TAG  ENTRYPOINT rtable-operator
# Both hold rtable-core, rtable-operator and rtable-inspect (stripped of debug info) on the root
# file system mmdebstrap makes from the Dockerfile's runtime packages, run as 65532:65532, and
# keep nothing writable but what is mounted. The root file system is cached by its package list
# in ${XDG_CACHE_HOME:-~/.cache}/rtable/image. The Dockerfile stays the recipe for users with a
# container engine; this builds the same layers where there is none (podman, buildah, runc:
# crun cannot run on these machines' hybrid cgroups).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=${1:?usage: scripts/build-image.sh BIN_DIR [TAG]}
tag=${2:-dev}
for binary in rtable-core rtable-operator rtable-inspect; do
  [[ -x "$bin_dir/$binary" ]] || { echo "build-image: $bin_dir/$binary is missing" >&2; exit 1; }
done
for tool in mmdebstrap buildah podman runc; do
  command -v "$tool" >/dev/null || {
    echo "build-image: $tool is missing (scripts/install-deps.sh --test)" >&2
    exit 1
  }
done

# The runtime stage's packages, as helm/tests/check_image_packages.py reads them (and checks them
# against the binaries' libraries).
packages=$(cd "$repo/helm/tests" && python3 -c \
  "from check_image_packages import stage_packages; print(','.join(stage_packages('$repo/Dockerfile', 'runtime')))")
[[ -n "$packages" ]] || { echo "build-image: no runtime packages in the Dockerfile" >&2; exit 1; }

# The user and the data directory, as the Dockerfile's runtime stage makes them (the essential
# variant has no useradd). mmdebstrap runs each hook with sh, the root file system as $1.
hooks=(
  'echo "rtable:x:65532:65532::/nonexistent:/usr/sbin/nologin" >>"$1/etc/passwd"'
  'echo "rtable:x:65532:" >>"$1/etc/group"'
  'mkdir -p "$1/var/lib/rtable" && chown 65532:65532 "$1/var/lib/rtable"'
)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/rtable/image"
mkdir -p "$cache"
key=$(printf '%s\n' "$packages" "${hooks[@]}" | sha256sum | cut -c1-16)
rootfs="$cache/rootfs-$key.tar"
base="localhost/rtable-base:$key"

if [[ ! -s "$rootfs" ]]; then
  echo "build-image: root file system ($packages) -> $rootfs"
  # --variant=essential: Debian's Essential:yes set and the packages named, nothing else (no apt).
  # apt runs on the host: a container here reaches no mirror.
  hook_args=()
  for hook in "${hooks[@]}"; do hook_args+=(--customize-hook="$hook"); done
  mmdebstrap --quiet --variant=essential --include="$packages" "${hook_args[@]}" \
    bookworm "$rootfs.part.tar"
  mv "$rootfs.part.tar" "$rootfs"
fi
if ! podman image exists "$base"; then
  podman import --quiet "$rootfs" "$base" >/dev/null
fi

# The binaries without their debug info (the release build keeps -g1 for profiles).
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
for binary in rtable-core rtable-operator rtable-inspect; do
  strip --strip-debug -o "$staging/$binary" "$bin_dir/$binary"
done

image() {
  local name=$1 entrypoint=$2 ctr
  ctr=$(buildah from --quiet "$base")
  for binary in rtable-core rtable-operator rtable-inspect; do
    buildah copy --quiet --chmod 0755 "$ctr" "$staging/$binary" /usr/local/bin/ >/dev/null
  done
  buildah config --user 65532:65532 --workingdir / \
    --entrypoint "[\"/usr/local/bin/$entrypoint\"]" --cmd '' \
    --label org.opencontainers.image.source=https://github.com/rtable/rtable \
    --label "org.opencontainers.image.version=$("$staging/$entrypoint" --version | awk '{print $2}')" \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$name:$tag" >/dev/null
  echo "build-image: $name:$tag"
}
image localhost/rtable rtable-core
image localhost/rtable-operator rtable-operator
