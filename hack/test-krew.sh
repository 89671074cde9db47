#!/usr/bin/env bash
# Checks the release as krew sees it: krew's own validator (validate-krew-manifest,
# built from krew's Go module) on RELEASE_DIR/lock.yaml, then, for every platform,
# `kubectl krew install --manifest lock.yaml --archive <its archive>` into a fresh
# KREW_ROOT (krew built from the same module, as the kubectl plugin kubectl-krew);
# each install must hold kubectl-lock and the LICENSE. On this machine's platform
# `kubectl lock --help` then runs through the installed plugin.
#
# Needs KREW, VALIDATE_KREW_MANIFEST and KUBECTL (the Makefile's).
set -euo pipefail
cd "$(dirname "$0")/.."
RELEASE_DIR=${RELEASE_DIR:-release}
manifest="$RELEASE_DIR/lock.yaml"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$VALIDATE_KREW_MANIFEST" -manifest "$manifest" -skip-install
echo "test-krew: $manifest passes krew's validator"

# kubectl finds plugins on PATH: kubectl-krew, then the installed kubectl-lock.
mkdir -p "$work/bin"
ln -s "$KREW" "$work/bin/kubectl-krew"
ln -s "$KUBECTL" "$work/bin/kubectl"
host="$(go env GOOS)_$(go env GOARCH)"
for archive in "$RELEASE_DIR"/kubectl-lock_*.tar.gz; do
  name=$(basename "$archive" .tar.gz) # kubectl-lock_VERSION_OS_ARCH
  arch=${name##*_} rest=${name%_*}
  os=${rest##*_} platform="${rest##*_}_$arch"
  root="$work/krew-$platform"
  KREW_ROOT=$root KREW_OS=$os KREW_ARCH=$arch PATH="$work/bin:$PATH" \
    kubectl krew install --manifest "$manifest" --archive "$archive" </dev/null 2>&1 |
    sed -e '/Detected stdin/d' -e "s/^/  [$platform] /" # krew warns of any stdin that is not a terminal
  for f in kubectl-lock LICENSE; do
    [ -n "$(find "$root/store/lock" -name "$f")" ] || { echo "test-krew: $platform: $f not installed" >&2; exit 1; }
  done
  [ -e "$root/bin/kubectl-lock" ] && [ -e "$root/receipts/lock.yaml" ] ||
    { echo "test-krew: $platform: no kubectl-lock in $root/bin, or no receipt of lock" >&2; exit 1; }
  echo "test-krew: installed $platform from $archive"
  if [ "$platform" = "$host" ]; then
    KREW_ROOT=$root PATH="$root/bin:$work/bin:$PATH" kubectl lock --help >"$work/help.txt"
    grep -q "kubectl lock" "$work/help.txt" || { echo "test-krew: kubectl lock --help did not print kubectl lock's help:" >&2; cat "$work/help.txt" >&2; exit 1; }
    echo "test-krew: kubectl lock --help ran through the plugin krew installed ($(head -n1 "$work/help.txt"))"
  fi
done
