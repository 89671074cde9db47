#!/usr/bin/env bash
# Installs the language runtimes test/e2e/agent drives the agent from, when they
# are missing: Node.js and npm (Dapr's JavaScript SDK, installed by the test with
# npm ci from its pinned lockfile, then cached) and Python 3 (the stdlib example of
# docs/examples), from Debian's packages. On a system without apt-get it names
# what is missing and stops.
set -euo pipefail
declare -A package=([node]=nodejs [npm]=npm [python3]=python3)
missing=()
for tool in node npm python3; do
  command -v "$tool" >/dev/null || missing+=("${package[$tool]}")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-runtimes: node $(node --version), npm $(npm --version), $(python3 --version) present"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-runtimes: missing ${missing[*]} and no apt-get to install them: install Node.js 18 or later with npm, and Python 3, then run make test again" >&2
  exit 1
fi
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-runtimes: installed ${missing[*]}: node $(node --version), npm $(npm --version), $(python3 --version)"
