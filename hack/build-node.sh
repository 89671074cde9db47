#!/usr/bin/env bash
# Builds what a real node needs, next to the control plane, from the Go module
# proxy: kubelet, kube-scheduler and kube-proxy into the control plane's folder
# (same Kubernetes version), and containerd v2 (with ctr and the runc shim), runc
# (with seccomp, static), the CNI plugins kubelock-dev's bridge network uses and
# a static etcd (the lock store's image) into bin/node/. Prints the two folders. Pinned and idempotent: a binary that
# already is the wanted version is kept; each install is atomic.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=${STAGING_VERSION:-v0.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-v1.10.0}

root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf 'build-node: %s\n' "$*" >&2; }
# shellcheck source=lib/build.sh
. "$root/hack/lib/build.sh"

out=${CONTROL_PLANE_DIR:-$root/bin/k8s/${K8S_VERSION#v}-etcd-${ETCD_VERSION#v}}
mkdir -p "$out"
want=()
for b in kubelet kube-scheduler kube-proxy; do
  has "$b" "$K8S_VERSION" || want+=("$b")
done
build_kube "$K8S_VERSION" "$STAGING_VERSION" "${want[@]}"
kube_dir=$out

out=${NODE_DIR:-$root/bin/node}
mkdir -p "$out"

# containerd without the snapshotters that need cgo or kernel features we don't use.
ctrd=github.com/containerd/containerd/v2
for c in containerd containerd-shim-runc-v2 ctr; do
  has_module "$c" "$ctrd" "$CONTAINERD_VERSION" && continue
  log "building $c $CONTAINERD_VERSION"
  CGO_ENABLED=0 go_install "$ctrd/cmd/$c@$CONTAINERD_VERSION" "$c" -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w -X $ctrd/version.Version=$CONTAINERD_VERSION"
done

# runc needs cgo (nsenter) and, since containerd 2 gives sandboxes a seccomp
# profile, libseccomp: linked statically (Debian's libseccomp-dev) so the binary
# runs anywhere.
if ! has_module runc github.com/opencontainers/runc "$RUNC_VERSION"; then
  if [ ! -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] && ! pkg-config --exists libseccomp 2>/dev/null; then
    echo "build-node: runc needs the static libseccomp: apt-get install libseccomp-dev" >&2
    exit 1
  fi
  log "building runc $RUNC_VERSION"
  CGO_ENABLED=1 go_install "github.com/opencontainers/runc@$RUNC_VERSION" runc \
    -tags "seccomp netgo osusergo" -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -extldflags -static"
fi

mkdir -p "$out/cni"
cnimod=github.com/containernetworking/plugins
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
  n=$(basename "$p")
  has_module "cni/$n" "$cnimod" "$CNI_PLUGINS_VERSION" && continue
  log "building CNI plugin $n $CNI_PLUGINS_VERSION"
  CGO_ENABLED=0 go_install "$cnimod/plugins/$p@$CNI_PLUGINS_VERSION" "cni/$n" -ldflags "-s -w"
done
# etcd for the lock store's pods (the chart's backend: apiserver), static for
# an image with no libc: the control plane's etcd links it.
if ! { has etcd "${ETCD_VERSION#v}" && [ -z "$(go version -m "$out/etcd" 2>/dev/null | grep -E 'CGO_ENABLED=1')" ]; }; then
  log "building etcd $ETCD_VERSION (static)"
  mod=$(mktemp -d)
  (
    cd "$mod"
    go mod init kubelock.local/etcd-build >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    CGO_ENABLED=0 go build -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  rm -rf "$mod"
  install_bin "$out/etcd.tmp" etcd
fi
echo "$kube_dir"
echo "$out"
