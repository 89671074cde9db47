#!/usr/bin/env bash
# Checks what `make release` wrote the way a kubectl user meets it: krew's own
# validator reads the manifest, krew installs the plugin for this machine's
# platform from its local archive (checking its sha256 against the manifest),
# and `kubectl lock` runs through the link krew made.
# Usage: verify-release.sh RELEASE_DIR VERSION KREW VALIDATE_KREW_MANIFEST KUBECTL
set -euo pipefail

dir=$(realpath "$1") want=$2 krew=$(realpath "$3") validate=$(realpath "$4") kubectl=$(realpath "$5")
"$validate" -manifest "$dir/lock.yaml" -skip-install

os=$(go env GOOS) arch=$(go env GOARCH)
archive=$dir/kubectl-lock_${want}_${os}_${arch}.tar.gz
[ -f "$archive" ] || { echo "verify-release: no archive for ${os}/${arch} in $dir" >&2; exit 1; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# kubectl finds plugins on PATH: krew as kubectl-krew, and what krew installs in $KREW_ROOT/bin.
mkdir "$root/tools"
ln -s "$krew" "$root/tools/kubectl-krew"
ln -s "$kubectl" "$root/tools/kubectl"
export KREW_ROOT="$root/krew" PATH="$root/krew/bin:$root/tools:$PATH"
kubectl krew install --manifest="$dir/lock.yaml" --archive="$archive"
help=$(kubectl lock --help)
case $help in
  *"kubectl lock"*) ;;
  *) echo "verify-release: kubectl lock --help does not name kubectl lock:" >&2; echo "$help" >&2; exit 1 ;;
esac
version=$(kubectl lock version)
case $version in
  *" $want "*) ;;
  *) echo "verify-release: kubectl lock version says \"$version\", want $want" >&2; exit 1 ;;
esac
echo "verify-release: krew validated lock.yaml and installed it from $(basename "$archive"); kubectl lock version: $version"
