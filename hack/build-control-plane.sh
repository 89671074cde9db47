#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the Go
# module proxy into bin/k8s/<k8s version>-<etcd version>/ and prints that folder
# (the value for KUBEBUILDER_ASSETS). Idempotent: a binary that already reports
# the wanted version is kept. Nothing is downloaded from release pages.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=${STAGING_VERSION:-v0.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}

root=$(cd "$(dirname "$0")/.." && pwd)
out=${CONTROL_PLANE_DIR:-$root/bin/k8s/${K8S_VERSION#v}-etcd-${ETCD_VERSION#v}}
mkdir -p "$out"
log() { printf 'build-control-plane: %s\n' "$*" >&2; }
# shellcheck source=lib/build.sh
. "$root/hack/lib/build.sh"

build_etcd() {
  has etcd "${ETCD_VERSION#v}" && return
  log "building etcd $ETCD_VERSION"
  local mod; mod=$(mktemp -d)
  trap 'rm -rf "$mod"; trap - RETURN' RETURN
  (
    cd "$mod"
    go mod init kubelock.local/etcd-build >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    go build -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  install_bin "$out/etcd.tmp" etcd
}

build_etcd
want=()
has kube-apiserver "$K8S_VERSION" || want+=(kube-apiserver)
has kube-controller-manager "$K8S_VERSION" || want+=(kube-controller-manager)
has kubectl "$K8S_VERSION" version --client || want+=(kubectl)
build_kube "$K8S_VERSION" "$STAGING_VERSION" "${want[@]}"
echo "$out"
