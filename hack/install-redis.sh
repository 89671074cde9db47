#!/usr/bin/env bash
# Installs redis-server from Debian's packages when it is missing. test/bench
# starts its own throwaway server on a free loopback port (the redsync baseline);
# the service the package may start is stopped, nothing uses it.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  echo "install-redis: $(redis-server --version | head -n1)"
  exit 0
fi
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends redis-server
$sudo service redis-server stop >/dev/null 2>&1 || true
echo "install-redis: installed $(redis-server --version | head -n1)"
