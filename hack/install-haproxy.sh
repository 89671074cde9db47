#!/usr/bin/env bash
# Installs HAProxy from Debian's packages when it is missing: the load balancer in
# front of the apiservers of an HA control plane (internal/localcluster's Balancer:
# the fault suite's HA scenarios, `kubelock-dev --ha`, localcluster's own test). The
# tests run their own on loopback; the package's service is not needed. On a system
# without apt-get it names the package and stops.
set -euo pipefail
found=$(command -v haproxy || ls /usr/sbin/haproxy /usr/local/sbin/haproxy 2>/dev/null | head -n1 || true)
if [ -n "$found" ]; then
  echo "install-haproxy: $("$found" -v | head -n1) present"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-haproxy: no haproxy found and no apt-get to install it: install your system's haproxy package (2.2 or later), then run make again" >&2
  exit 1
fi
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
$sudo apt-get update -q
# policy-rc.d or no init system may refuse to start the package's service: harmless.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends haproxy
$sudo service haproxy stop >/dev/null 2>&1 || true
echo "install-haproxy: installed $(/usr/sbin/haproxy -v | head -n1)"
