#!/usr/bin/env bash
# Installs the PostgreSQL server from Debian's packages when it is missing (make
# test runs it first; on a system without apt-get it names the package and stops). The
# tests start their own throwaway server on loopback (test/pgtest), from PG_BIN if set,
# else from Debian's /usr/lib/postgresql/*/bin.
set -euo pipefail
if [ -n "${PG_BIN:-}" ] && [ -x "$PG_BIN/postgres" ]; then
  echo "install-postgres: $PG_BIN (PG_BIN) present"
  exit 0
fi
if compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null && id postgres >/dev/null 2>&1; then
  echo "install-postgres: $(ls -d /usr/lib/postgresql/*/bin | tail -n1) present"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  # Other systems put the server elsewhere (Fedora: /usr/bin): the tests find it through PG_BIN.
  found=$(command -v postgres || true)
  if [ -n "$found" ]; then
    echo "install-postgres: PostgreSQL server found at $found: run make test again with PG_BIN=$(dirname "$found")" >&2
  else
    echo "install-postgres: no PostgreSQL server found and no apt-get to install it: install your system's PostgreSQL server package ('postgresql-server' on Fedora/RHEL, 'postgresql' on Arch, Alpine or Homebrew), then run make test again with PG_BIN set to the folder of its postgres binary" >&2
  fi
  exit 1
fi
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends postgresql
# The package may start a cluster of its own; the tests do not need it.
$sudo pg_ctlcluster --help >/dev/null 2>&1 && $sudo service postgresql stop >/dev/null 2>&1 || true
echo "install-postgres: installed $(ls -d /usr/lib/postgresql/*/bin | tail -n1)"
