#!/usr/bin/env bash
# Builds the test control plane from Go modules (docs/control-plane.md) into
#   ${XDG_CACHE_HOME:-~/.cache}/rtable/control-plane/<KUBE_VERSION>/bin/{kube-apiserver,
#   kube-controller-manager,kubectl,etcd,helm}
# outside the clone, so that a fresh clone (CI's) on the same machine builds nothing.
# Idempotent: exits at once when all five exist, else builds only the missing ones. Prints the
# bin dir on success (last line of stdout).
#   e2e/build-control-plane.sh
set -euo pipefail

# The one place the Kubernetes version is set. e2e/controlplane/go.mod must require the same
# k8s.io/kubernetes version and replace the staging modules with k8s.io/<m> v0.<minor>.<patch>;
# operator/testing/CMakeLists.txt reads this line to find the bin dir.
KUBE_VERSION=v1.34.4
# etcd comes from e2e/etcd/go.mod; helm (no replace directives) is installed by version.
HELM_VERSION=v3.21.4

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="${XDG_CACHE_HOME:-$HOME/.cache}/rtable/control-plane/$KUBE_VERSION/bin"
binaries=(kube-apiserver kube-controller-manager kubectl etcd helm)

missing=()
for b in "${binaries[@]}"; do
  [[ -x "$bin/$b" ]] || missing+=("$b")
done
if ((${#missing[@]} == 0)); then
  echo "$bin"
  exit 0
fi

if ! grep -q "^require k8s.io/kubernetes $KUBE_VERSION\$" "$repo/e2e/controlplane/go.mod"; then
  echo "build-control-plane: e2e/controlplane/go.mod does not require k8s.io/kubernetes $KUBE_VERSION" >&2
  exit 1
fi

mkdir -p "$bin"
# Two cores: one package compile per core. GOMODCACHE and GOCACHE stay at Go's defaults so other
# Go work on the machine shares them.
export GOFLAGS="-p=2 -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local

# Unstamped builds report v0.0.0 (and Helm's kubeVersion checks then misbehave).
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitCommit=$KUBE_VERSION -X $pkg.gitTreeState=clean"
  kube_ldflags+=" -X $pkg.buildDate=$build_date"
done

# build <name> <dir of the wrapper module or -> <command...>: runs the command, which writes
# $tmp/<name>, then moves it into place so an interrupted build never leaves a partial binary.
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
build() {
  local name=$1 dir=$2
  shift 2
  local start=$SECONDS
  echo "build-control-plane: building $name ..." >&2
  if [[ $dir != - ]]; then
    (cd "$dir" && "$@")
  else
    "$@"
  fi
  mv "$tmp/$name" "$bin/$name"
  echo "build-control-plane: built $name in $((SECONDS - start)) s" >&2
}

for b in "${missing[@]}"; do
  case $b in
    kube-apiserver | kube-controller-manager | kubectl)
      build "$b" "$repo/e2e/controlplane" \
        go build -trimpath -ldflags "$kube_ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
      ;;
    etcd)
      build etcd "$repo/e2e/etcd" \
        go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
      ;;
    helm)
      # The ldflags of helm's Makefile: its version, and the default Capabilities.KubeVersion
      # taken from the client-go it is built with (v0.36 -> 1.36).
      helm_gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" |
        sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
      client_go=$(awk '$1 == "k8s.io/client-go" { print $2 }' "$helm_gomod")
      helm_minor=${client_go#v0.}
      helm_minor=${helm_minor%%.*}
      helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
      helm_ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_minor"
      done
      build helm - env GOBIN="$tmp" GOFLAGS="-p=2 -buildvcs=false" \
        go install -trimpath -ldflags "$helm_ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
      ;;
  esac
done

echo "$bin"
