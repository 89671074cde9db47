#!/usr/bin/env bash
# Builds the release an upgrade starts from (the upgrade suite, test/e2e/upgrade):
# the manager and the kubelock CLI of git commit REF, with its CRDs and webhook
# configuration, into OUT (bin/releases/REF). The source comes from this
# repository's history (git archive), so it needs a clone with that commit in
# it, not a shallow one. Idempotent: a complete OUT is kept.
set -euo pipefail

ref=${1:?usage: build-previous-release.sh REF [OUT]}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$root/bin/releases/$ref}
log() { printf 'build-previous-release: %s\n' "$*" >&2; }

if [ -x "$out/manager" ] && [ -x "$out/kubelock" ] && [ -d "$out/config/crd/bases" ]; then
  exit 0
fi
# A shallow clone lacks the commit: deepen it from its origin once.
if ! git -C "$root" cat-file -e "$ref^{commit}" 2>/dev/null &&
  [ "$(git -C "$root" rev-parse --is-shallow-repository)" = true ]; then
  log "fetching the history this shallow clone lacks"
  git -C "$root" fetch -q --unshallow || true
fi
if ! git -C "$root" cat-file -e "$ref^{commit}" 2>/dev/null; then
  log "commit $ref is not in this clone; the upgrade suite builds the previous release from it"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "building the manager and the kubelock CLI of $ref"
git -C "$root" archive "$ref" | tar -x -C "$tmp"
mkdir -p "$tmp/out/config"
(cd "$tmp" && go build -o out/ ./cmd/manager ./cmd/kubelock)
cp -r "$tmp/config/crd" "$tmp/config/webhook" "$tmp/config/rbac" "$tmp/out/config/"
git -C "$root" rev-parse "$ref^{commit}" >"$tmp/out/commit"
mkdir -p "$(dirname "$out")"
rm -rf "$out"
mv "$tmp/out" "$out"
log "built $out"
