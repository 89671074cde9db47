# Shared by hack/build-control-plane.sh and hack/build-node.sh (sourced, not run):
# pinned builds from the Go module proxy, kept when the installed binary already
# is the wanted version, installed atomically (build to a temp file, rename).
# The caller sets `out` (the install folder) and `log` (a function).

export GOWORK=off GOFLAGS=-mod=mod

# has BIN WANT [ARGS]: the binary exists and its version output (ARGS, default
# --version) mentions WANT. The output is captured first: piping into `grep -q`
# lets grep exit at the first match, the binary then dies of SIGPIPE and
# pipefail turns a match into a failure (seen with etcd).
has() {
  local bin=$1 want=$2 v
  shift 2
  [ -x "$out/$bin" ] && v=$("$out/$bin" "${@:---version}" 2>/dev/null) && grep -q -- "$want" <<<"$v"
}

# has_module BIN MODULE VERSION: the binary was built from MODULE at VERSION
# (what `go version -m` records for `go install module/cmd@version`).
has_module() {
  local v
  [ -x "$out/$1" ] && v=$(go version -m "$out/$1" 2>/dev/null) && grep -qE "^\s+mod\s+$2\s+$3(\s|$)" <<<"$v"
}

# install_bin SRC DST: atomic replace so an interrupted build never leaves a half binary.
install_bin() { chmod +x "$1" && mv -f "$1" "$out/$2"; }

# go_install PKG@VERSION NAME [go build flags...]: `go install` of a pinned
# command into $out/NAME, through a temporary GOBIN so the rename is atomic.
go_install() {
  local spec=$1 name=$2
  shift 2
  local gobin; gobin=$(mktemp -d "$out/.build.XXXXXX")
  trap 'rm -rf "$gobin"; trap - RETURN' RETURN
  GOBIN=$gobin go install "$@" "$spec"
  install_bin "$gobin/$(basename "${spec%@*}")" "$name"
}

# build_kube VERSION STAGING_VERSION CMD...: builds k8s.io/kubernetes/cmd/CMD at
# VERSION in a temporary module that requires k8s.io/kubernetes and replaces its
# v0.0.0 staging modules by STAGING_VERSION, with the version stamped in.
build_kube() {
  local version=$1 staging=$2
  shift 2
  [ $# -gt 0 ] || return 0
  log "building $* $version"
  local mod; mod=$(mktemp -d)
  trap 'rm -rf "$mod"; trap - RETURN' RETURN
  (
    cd "$mod"
    # Learn which staging modules kubernetes requires as v0.0.0 and its go/godebug lines.
    local kmod
    kmod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    {
      echo "module kubelock.local/kube-build"
      grep -E '^go [0-9]' "$kmod"
      grep -E '^godebug [^(]' "$kmod" || true
      sed -n '/^godebug (/,/^)/p' "$kmod"
      echo "require k8s.io/kubernetes $version"
      grep -E '^\s+k8s.io/[a-z0-9-]+ v0\.0\.0$' "$kmod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
    } >go.mod
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for b in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"; done
      printf ')\n'
    } >tools.go
    go mod tidy >/dev/null
    local major minor ld="-s -w" p
    major=$(echo "${version#v}" | cut -d. -f1); minor=$(echo "${version#v}" | cut -d. -f2)
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$version -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    for b in "$@"; do
      go build -ldflags "$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b"
      install_bin "$out/$b.tmp" "$b"
    done
  )
}
