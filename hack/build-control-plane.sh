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
export GOWORK=off GOFLAGS=-mod=mod

log() { printf 'build-control-plane: %s\n' "$*" >&2; }

# has BIN WANT: the binary exists and its version output mentions WANT. The output
# is captured first: piping into `grep -q` lets grep exit at the first match, the
# binary then dies of SIGPIPE and pipefail turns a match into a failure (seen with etcd).
has() {
  local v
  [ -x "$out/$1" ] && v=$("$out/$1" --version 2>/dev/null) && grep -q -- "$2" <<<"$v"
}
has_kubectl() {
  local v
  [ -x "$out/kubectl" ] && v=$("$out/kubectl" version --client 2>/dev/null) && grep -q -- "$K8S_VERSION" <<<"$v"
}

# install SRC DST: atomic replace so an interrupted build never leaves a half binary.
install_bin() { chmod +x "$1" && mv -f "$1" "$out/$2"; }

build_etcd() {
  has etcd "${ETCD_VERSION#v}" && return
  log "building etcd $ETCD_VERSION"
  local mod; mod=$(mktemp -d)
  trap 'rm -rf "$mod"' RETURN
  (
    cd "$mod"
    go mod init kubelock.local/etcd-build >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    go build -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  install_bin "$out/etcd.tmp" etcd
}

build_kube() {
  local want=()
  has kube-apiserver "$K8S_VERSION" || want+=(kube-apiserver)
  has kube-controller-manager "$K8S_VERSION" || want+=(kube-controller-manager)
  has_kubectl || want+=(kubectl)
  [ ${#want[@]} -gt 0 ] || return 0
  log "building ${want[*]} $K8S_VERSION"
  local mod; mod=$(mktemp -d)
  trap 'rm -rf "$mod"' RETURN
  (
    cd "$mod"
    # Learn which staging modules kubernetes requires as v0.0.0 and its go/godebug lines.
    local kmod
    kmod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    {
      echo "module kubelock.local/kube-build"
      grep -E '^go [0-9]' "$kmod"
      grep -E '^godebug [^(]' "$kmod" || true
      sed -n '/^godebug (/,/^)/p' "$kmod"
      echo "require k8s.io/kubernetes $K8S_VERSION"
      grep -E '^\s+k8s.io/[a-z0-9-]+ v0\.0\.0$' "$kmod" | awk -v v="$STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
    } >go.mod
    cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    go mod tidy >/dev/null
    local pkg=k8s.io/component-base/version cgo=k8s.io/client-go/pkg/version
    local major minor
    major=$(echo "${K8S_VERSION#v}" | cut -d. -f1); minor=$(echo "${K8S_VERSION#v}" | cut -d. -f2)
    local ld="-s -w"
    for p in $pkg $cgo; do
      ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    for b in "${want[@]}"; do
      go build -ldflags "$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b"
      install_bin "$out/$b.tmp" "$b"
    done
  )
}

build_etcd
build_kube
echo "$out"
