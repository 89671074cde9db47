#!/usr/bin/env bash
# Fails when a tracked file still holds a merge's conflict markers: a merge
# resolved by `git add` alone commits them, and nothing else would notice in
# docs.
set -euo pipefail
cd "$(dirname "$0")/.."
if found=$(git grep -n -I -E '^(<{7} |>{7} )' -- . ':!*.sum'); then
  echo "verify: conflict markers left by a merge:" >&2
  echo "$found" >&2
  exit 1
fi
echo "verify: no conflict markers"
