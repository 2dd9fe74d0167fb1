#!/usr/bin/env bash
# Kubernetes' own storage tests against cetera, as kine's CI runs them against kine:
# k8s.io/apiserver's pkg/storage/etcd3 and pkg/storage/cacher tests, with the embedded etcd
# they start per test replaced by a fresh cetera per test (tools/k8s-tests/testserver).
#
#   tools/k8s-tests/run.sh [--server cetera|etcd] [--backend sqlite|postgres|mysql|cluster]
#                          [--suite etcd3|cacher|all] [--run REGEX]
#
# --server etcd runs the same binary on the embedded etcd 3.7.3 of the original
# testserver package (the baseline). --backend postgres|mysql gives each test a fresh
# database on the server CETERA_TEST_POSTGRES_URL / CETERA_TEST_MYSQL_URL names (as the
# integration tests; default the local ones), cetera only. --backend cluster gives each
# test a fresh 3-member replicated cetera cluster (SQLite each; n1 --cluster-init, n2 and
# n3 --join it) and the test's client talks to n2, a follower. --run passes -test.run.
# The cetera binary is $CETERA_BIN, else the newer of target/release/cetera and
# target/debug/cetera.
#
# How: k8s.io/apiserver is copied from the Go module cache into target/k8s-tests/ (never
# committed), the testserver import is rewritten to our package, etcd's modules are raised
# to 3.7.3, the test binaries are built once with `go test -c` (rebuilt only when the inputs
# change) and run with -test.parallel 1. Output: target/k8s-tests/logs/, one summary line
# per suite; the exit status is 1 if any test failed.
#
# Changes to the copied tests and their runs (docs/kubernetes-tests.md), applied on both
# servers so the counts compare:
#   - etcd3's compact_test.go waits 500 ms instead of 100 ms for the compactor to finish a
#     cycle (kine's CI makes the same change): a cycle is a Txn and a Compact, each a
#     durable commit; the test's etcd skips fsync and runs in the test's process, cetera
#     commits to SQLite, PostgreSQL or MariaDB, which on a loaded machine exceeds 100 ms;
#   - the cacher's TestGet runs with -test.parallel 8, not 1: its subtests call t.Parallel()
#     on purpose, and one at a time three of them fail on etcd as on cetera.
#
# Kubernetes' integration test packages (k8s.io/kubernetes test/integration/etcd, apiserver,
# apiserver/apply, storageversion) against a running cetera or etcd: the sibling script
# tools/k8s-tests/integration.sh (docs/kubernetes-tests.md, "Kubernetes' integration tests").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# A relative CETERA_BIN names a file from where the script was started (it changes folder).
[[ -z "${CETERA_BIN:-}" ]] || CETERA_BIN=$(realpath "$CETERA_BIN")
APISERVER_VERSION=v0.37.2
ETCD_VERSION=v3.7.3

server=cetera backend=sqlite suite=all run=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --server) server=$2; shift 2 ;;
        --backend) backend=$2; shift 2 ;;
        --suite) suite=$2; shift 2 ;;
        --run) run=$2; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
case $suite in all) suites=(etcd3 cacher) ;; etcd3|cacher) suites=("$suite") ;;
    *) echo "--suite: etcd3, cacher or all" >&2; exit 2 ;; esac

WORK=$ROOT/target/k8s-tests
COPY=$WORK/apiserver
BIN=$WORK/bin
mkdir -p "$WORK" "$BIN" "$WORK/logs"

# The inputs of the build: the apiserver version, this script and the testserver module.
stamp=$( { echo "$APISERVER_VERSION $ETCD_VERSION"; cat "$0" "$ROOT"/tools/k8s-tests/testserver/go.* \
    "$ROOT"/tools/k8s-tests/testserver/*.go; } | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$BIN/.stamp" 2>/dev/null)" != "$stamp" ]]; then
    echo "=== building k8s.io/apiserver@$APISERVER_VERSION storage tests (a few minutes)"
    src=$(cd "$ROOT/tools/k8s-tests/testserver" && go mod download -json "k8s.io/apiserver@$APISERVER_VERSION" \
        | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    rm -rf "$COPY"
    cp -r "$src" "$COPY"
    chmod -R u+w "$COPY"
    cd "$COPY"
    grep -rlF 'k8s.io/apiserver/pkg/storage/etcd3/testserver' pkg/ \
        | xargs sed -i 's|k8s.io/apiserver/pkg/storage/etcd3/testserver|cetera.invalid/k8s-tests/testserver|'
    sed -i 's|waitTimeout = 100 \* waitDelay|waitTimeout = 500 * waitDelay|' pkg/storage/etcd3/compact_test.go
    grep -q 'waitTimeout = 500 \* waitDelay' pkg/storage/etcd3/compact_test.go
    go mod edit \
        -require=cetera.invalid/k8s-tests/testserver@v0.0.0 \
        -replace=cetera.invalid/k8s-tests/testserver="$ROOT/tools/k8s-tests/testserver" \
        -require=go.etcd.io/etcd/api/v3@$ETCD_VERSION \
        -require=go.etcd.io/etcd/client/pkg/v3@$ETCD_VERSION \
        -require=go.etcd.io/etcd/client/v3@$ETCD_VERSION \
        -require=go.etcd.io/etcd/server/v3@$ETCD_VERSION \
        -require=go.etcd.io/etcd/pkg/v3@$ETCD_VERSION
    go mod tidy
    nice -n 5 go test -c -trimpath -o "$BIN/" ./pkg/storage/etcd3 ./pkg/storage/cacher
    echo "$stamp" > "$BIN/.stamp"
fi

if [[ $server == cetera ]]; then
    if [[ -z "${CETERA_BIN:-}" ]]; then
        # The newer of the two builds, so a stale one is not tested.
        CETERA_BIN=$(ls -t "$ROOT/target/release/cetera" "$ROOT/target/debug/cetera" 2>/dev/null | head -1 || true)
    fi
    [[ -x "${CETERA_BIN:-}" ]] || { echo "no cetera binary: build it or set CETERA_BIN" >&2; exit 2; }
    export CETERA_BIN
    unset CETERA_TEST_ENDPOINT CETERA_TEST_CLUSTER
    case $backend in
        sqlite) ;;
        postgres) export CETERA_TEST_ENDPOINT=${CETERA_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432} ;;
        mysql) export CETERA_TEST_ENDPOINT=${CETERA_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306} ;;
        cluster) export CETERA_TEST_CLUSTER=1 ;;
        *) echo "--backend: sqlite, postgres, mysql or cluster" >&2; exit 2 ;;
    esac
    export CETERA_TEST_SERVER=cetera
    label=cetera-$backend
else
    export CETERA_TEST_SERVER=etcd
    label=etcd
fi

status=0
for s in "${suites[@]}"; do
    log=$WORK/logs/$s-$label.log
    echo "=== $s tests on $label (log: $log)"
    args=(-test.v -test.count 1 -test.parallel 1 -test.timeout "${K8S_TESTS_TIMEOUT:-60m}")
    [[ -n $run ]] && args+=(-test.run "$run")
    if [[ $s == cacher ]]; then
        (cd "$COPY/pkg/storage/$s" && "$BIN/$s.test" "${args[@]}" -test.skip '^TestGet$') > "$log" 2>&1 || status=1
        if [[ -z $run || TestGet =~ $run ]]; then
            (cd "$COPY/pkg/storage/$s" && "$BIN/$s.test" "${args[@]}" -test.run '^TestGet$' -test.parallel 8) \
                >> "$log" 2>&1 || status=1
        fi
    else
        (cd "$COPY/pkg/storage/$s" && "$BIN/$s.test" "${args[@]}") > "$log" 2>&1 || status=1
    fi
    # Leaf results: a test or subtest that has no subtests of its own.
    python3 - "$log" "$s" "$label" <<'PY'
import re, sys
log, suite, label = sys.argv[1:]
results = {}
for line in open(log, errors="replace"):
    m = re.match(r"\s*--- (PASS|FAIL|SKIP): (\S+)", line)
    if m:
        results[m.group(2)] = m.group(1)
leaves = {n: r for n, r in results.items() if not any(o.startswith(n + "/") for o in results)}
count = {r: sum(1 for v in leaves.values() if v == r) for r in ("PASS", "FAIL", "SKIP")}
print(f"{suite} on {label}: {count['PASS']} passed, {count['FAIL']} failed, {count['SKIP']} skipped")
for n, r in sorted(leaves.items()):
    if r == "FAIL":
        print(f"  FAIL {n}")
PY
done
exit $status
