#!/usr/bin/env bash
# Installs the PostgreSQL server from Debian's packages when it is missing (make
# test runs it first; on a system without apt-get it names the package and stops). The
# tests start their own throwaway server on loopback (test/pgtest).
set -euo pipefail
if compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null && id postgres >/dev/null 2>&1; then
  echo "install-postgres: $(ls -d /usr/lib/postgresql/*/bin | tail -n1) present"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-postgres: no PostgreSQL server found and no apt-get to install it: install your system's PostgreSQL server package (e.g. 'postgresql'), then run make test again" >&2
  exit 1
fi
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends postgresql
# The package may start a cluster of its own; the tests do not need it.
$sudo pg_ctlcluster --help >/dev/null 2>&1 && $sudo service postgresql stop >/dev/null 2>&1 || true
echo "install-postgres: installed $(ls -d /usr/lib/postgresql/*/bin | tail -n1)"
