#!/usr/bin/env bash
# Builds the kubectl-lock release: for linux and darwin, amd64 and arm64, a static
# kubelock binary named kubectl-lock with the LICENSE in a reproducible tar.gz
# (sorted, owned by 0, dated 0, gzip without a name or time), the archives' sha256
# sums in SHA256SUMS, and the krew plugin manifest lock.yaml from
# dist/krew/lock.yaml.tmpl, all in RELEASE_DIR.
#
# VERSION (v-prefixed semver; default from `git describe`, else v0.0.0-g<commit>)
# is stamped into the binary and the manifest; the manifest's archive addresses are
# RELEASE_URL/<archive> (default the project's release download folder for VERSION).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VERSION:-$(git describe --tags --match 'v*' 2>/dev/null || echo "v0.0.0-g$(git rev-parse --short HEAD)")}
RELEASE_DIR=${RELEASE_DIR:-release}
RELEASE_URL=${RELEASE_URL:-https://github.com/kubelock/kubelock/releases/download/$VERSION}
PLATFORMS=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
[[ $VERSION == v* ]] || { echo "release: VERSION must start with v (krew's rule), got $VERSION" >&2; exit 1; }

rm -rf "$RELEASE_DIR" && mkdir -p "$RELEASE_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms_yaml=
for platform in $PLATFORMS; do
  os=${platform%/*} arch=${platform#*/}
  dir="$work/${os}_$arch"
  mkdir -p "$dir"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath \
    -ldflags "-s -w -X github.com/kubelock/kubelock/cmd/kubelock/cli.Version=$VERSION" \
    -o "$dir/kubectl-lock" ./cmd/kubelock
  cp LICENSE "$dir/"
  archive="kubectl-lock_${VERSION}_${os}_$arch.tar.gz"
  tar -C "$dir" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - kubectl-lock LICENSE |
    gzip -n -9 >"$RELEASE_DIR/$archive"
  sum=$(sha256sum "$RELEASE_DIR/$archive" | cut -d' ' -f1)
  platforms_yaml+="  - selector:
      matchLabels: {os: $os, arch: $arch}
    uri: $RELEASE_URL/$archive
    sha256: $sum
    files:
    - {from: kubectl-lock, to: .}
    - {from: LICENSE, to: .}
    bin: kubectl-lock
"
  echo "release: $archive"
done
(cd "$RELEASE_DIR" && sha256sum -- *.tar.gz >SHA256SUMS)
# The template's placeholders: @VERSION@ and the line @PLATFORMS@.
awk -v version="$VERSION" -v platforms="${platforms_yaml%$'\n'}" \
  '$0 == "@PLATFORMS@" { print platforms; next } { gsub("@VERSION@", version); print }' \
  dist/krew/lock.yaml.tmpl >"$RELEASE_DIR/lock.yaml"
echo "release: $RELEASE_DIR/SHA256SUMS and $RELEASE_DIR/lock.yaml (kubectl-lock $VERSION)"
