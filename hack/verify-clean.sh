#!/usr/bin/env bash
# Fails when generated files under the given paths differ from what is committed,
# or when generation produced a file git does not track.
set -euo pipefail
cd "$(dirname "$0")/.."
status=$(git status --porcelain --untracked-files=all -- "$@")
if [ -n "$status" ]; then
  echo "verify: generated files are out of date; run 'make manifests generate' and commit:" >&2
  echo "$status" >&2
  git --no-pager diff --stat -- "$@" >&2
  exit 1
fi
echo "verify: generated code and manifests are up to date"
