#!/usr/bin/env bash
# The project's test command. Installs the reference etcd/etcdctl binaries the
# tests compare cetera against (scripts/install-test-deps.sh), then runs every
# test of every workspace member (`--workspace`) with cargo-nextest (installed
# from crates.io if missing):
#   1. unit tests (each backend's conformance suite included) and the
#      integration tests on SQLite, compared with etcd 3.7.3 (the default
#      oracle, CETERA_TEST_ETCD=3.7);
#   2. the suites that compare cetera with a real etcd again, with etcd 3.5.1
#      as the oracle (CETERA_TEST_ETCD=3.5: cetera reports 3.5.13 and answers
#      as a 3.5 does), on SQLite;
#   3. Kubernetes' own storage tests (k8s.io/apiserver's etcd3 and cacher
#      packages) with a fresh cetera per test (tools/k8s-tests/run.sh),
#      etcd3gw's own test suite against one cetera (scripts/etcd3gw-suite.sh),
#      and a real Kubernetes control plane (kube-apiserver, controller manager,
#      scheduler, KWOK nodes) on cetera on SQLite under load and a restart
#      (scripts/k8s-control-plane.sh, on the debug build);
#   4. the differential suites again with every server a follower of a
#      3-member replicated cluster (CETERA_TEST_CLUSTER=1), but for 3 tests
#      of single-server behaviour (restarts, Status/MemberList of one server);
#   5. the integration tests again on PostgreSQL and on MySQL/MariaDB
#      (CETERA_TEST_BACKEND), each server on a database of its own.
# A database server that cannot be reached is skipped with a warning, except
# in CI (CI=true), where it fails the run.
# Extra arguments go to every `cargo nextest run`, e.g. `scripts/test.sh -E 'test(watch)'`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi

reachable() { timeout 2 bash -c "</dev/tcp/127.0.0.1/$1" 2>/dev/null; }

status=0
echo "=== unit tests, and integration tests on SQLite"
# Where cetera still answers otherwise than etcd 3.7.3 (docs/api-coverage.md,
# "Differences from etcd"): such tests run against etcd 3.5.1 in the next step, and
# are left out here until they are mended. None is known now (`none()`).
KNOWN_37_DIFFERENCES='none()'
cargo nextest run --workspace --no-fail-fast -E "not ($KNOWN_37_DIFFERENCES)" "$@" || status=1

echo "=== the suites that compare with etcd, against etcd 3.5.1"
# Every binary that starts a real etcd (or its etcdctl/etcdutl) beside cetera,
# and those whose answers depend on the version cetera reports.
ORACLE_SUITES='binary(differential) | binary(kv) | binary(watch) | binary(lease) | binary(lock_election) | binary(auth) | binary(maintenance) | binary(gateway) | binary(etcdctl) | binary(etcd_flags) | binary(etcd_logins) | binary(etcd_snapshot) | binary(hash_kv) | binary(range_stream) | binary(downgrade) | binary(kubernetes) | binary(tls) | binary(quota) | binary(auto_compaction) | binary(metrics)'
CETERA_TEST_ETCD=3.5 cargo nextest run --workspace --no-fail-fast -E "$ORACLE_SUITES" "$@" || status=1

echo "=== Kubernetes' storage tests (k8s.io/apiserver etcd3 and cacher) on cetera, SQLite"
# tools/k8s-tests/run.sh: a fresh cetera per test, the binary the tests above built.
CETERA_BIN=${CARGO_TARGET_DIR:-target}/debug/cetera tools/k8s-tests/run.sh --server cetera --backend sqlite || status=1

echo "=== etcd3gw 2.7.0's own tests (a client of etcd's JSON gateway)"
scripts/etcd3gw-suite.sh || status=1

echo "=== a Kubernetes v1.37.2 control plane on cetera (SQLite)"
cargo build --quiet --bin cetera
CETERA_BIN=${CARGO_TARGET_DIR:-target}/debug/cetera scripts/k8s-control-plane.sh || status=1

echo "=== differential suites against a follower of a 3-member cluster"
CLUSTER_SUITES='binary(differential) | binary(kv) | binary(watch) | binary(lease) | binary(lock_election) | binary(auth) | binary(kubernetes) | binary(range_stream)'
# Single-server behaviour (Status and MemberList of one server, restarts and
# shutdown of the server process): nextest reports these 4 as skipped here.
SINGLE_SERVER_ONLY='test(maintenance_and_cluster_for_etcdctl) | test(lease_keeps_remaining_time_across_restart) | test(shutdown_ends_waiting_calls_and_keeps_their_keys) | test(server_chosen_lease_ids_increase_as_etcds_do)'
CETERA_TEST_CLUSTER=1 cargo nextest run --workspace --no-fail-fast \
    -E "($CLUSTER_SUITES) - ($SINGLE_SERVER_ONLY) - ($KNOWN_37_DIFFERENCES)" "$@" || status=1

for backend in postgres mysql; do
    port=5432
    [[ $backend == mysql ]] && port=3306
    if ! reachable "$port"; then
        if [[ "${CI:-}" == "true" ]]; then
            echo "error: $backend (127.0.0.1:$port) is not reachable; CI must test it" >&2
            status=1
        else
            echo "WARNING: $backend (127.0.0.1:$port) is not reachable: SKIPPING its integration tests" >&2
        fi
        continue
    fi
    echo "=== integration tests on $backend"
    CETERA_TEST_BACKEND=$backend cargo nextest run --workspace --no-fail-fast \
        -E "kind(test) and not binary(cluster) and not binary(test_support) and not ($KNOWN_37_DIFFERENCES)" "$@" || status=1
done
exit $status
