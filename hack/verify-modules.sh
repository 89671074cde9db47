#!/usr/bin/env bash
# Fails when go.mod/go.sum of either module (the root, test/bench) are not tidy, or
# when pkg/lock links a benchmark-only dependency. test/bench is a module of its own
# so that gonum/plot, redsync, go-redis, the etcd client and pprof never reach
# users of pkg/lock; pgx belongs to the fencing package, not to the lock client.
# Also fails when product code (anything but tests) links a test-only package
# under test/ (testenv, history, pgtest, faultproxy).
set -euo pipefail
cd "$(dirname "$0")/.."
rc=0
for dir in . test/bench; do
  if ! diff=$(go -C "$dir" mod tidy -diff 2>&1); then
    echo "verify: go.mod/go.sum in $dir are not tidy; run 'go -C $dir mod tidy' and commit:" >&2
    echo "$diff" >&2
    rc=1
  fi
done
forbidden='^(gonum\.org/|github\.com/go-redsync/|github\.com/redis/|go\.etcd\.io/etcd/client/|github\.com/google/pprof/|github\.com/jackc/pgx)'
if bad=$(go list -deps ./pkg/lock ./pkg/fencing | grep -E "$forbidden"); then
  echo "verify: pkg/lock or pkg/fencing links benchmark-only or database packages:" >&2
  echo "$bad" >&2
  rc=1
fi
# go list without -test follows no _test.go file: these are the binaries' and
# libraries' own dependencies.
if bad=$(go list -deps ./api/... ./cmd/... ./config/... ./controllers/... ./internal/... ./pkg/... ./rules/... ./webhook/... | grep '^github\.com/kubelock/kubelock/test/'); then
  echo "verify: product code links test-only packages:" >&2
  echo "$bad" >&2
  rc=1
fi
[ "$rc" = 0 ] && echo "verify: both modules tidy; pkg/lock and pkg/fencing free of benchmark-only dependencies; no test-only package in product code"
exit "$rc"
