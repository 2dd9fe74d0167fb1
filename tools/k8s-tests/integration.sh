#!/usr/bin/env bash
# Kubernetes' own integration tests (k8s.io/kubernetes v1.37.2, -tags=run_integration_tests)
# against a running cetera or etcd 3.7.3, one fresh server per test package:
#
#   tools/k8s-tests/integration.sh [--server cetera|etcd] [--backend sqlite|postgres|mysql|cluster]
#                                  [--package NAME]... [--run REGEX] [--skip REGEX]
#
# Packages (--package, repeatable; default all four):
#   etcd            test/integration/etcd: every served resource stored and read back raw
#   apiserver       test/integration/apiserver (the package itself: lists, chunking,
#                   watch cache with two etcds, patch, CRD, metadata, field validation)
#   apply           test/integration/apiserver/apply: server-side apply
#   storageversion  test/integration/storageversion
# --server etcd is the baseline, tools/reference/bin/etcd (3.7.3, built by
# tools/reference/build.sh etcd). --backend postgres|mysql gives the package's cetera a
# fresh database on CETERA_TEST_POSTGRES_URL / CETERA_TEST_MYSQL_URL (default the local
# servers); --backend cluster a fresh 3-member replicated cluster (SQLite each, founded by
# the first with --cluster-init, the others --join it), the tests talking to the second
# member, a follower unless an election moved the leadership. The cetera binary is
# $CETERA_BIN, else the newer of target/release/cetera and target/debug/cetera.
#
# How: a scratch Go module in target/k8s-tests/kube/mod (never committed) requires
# k8s.io/kubernetes v1.37.2 with tools/reference/kubernetes's go.mod (its staging modules
# replaced by the released v0.37.2 ones) and builds each package's test binary with
# `go test -c -tags=run_integration_tests` (rebuilt only when the inputs change). The
# tests run from a copy of the module's source (target/k8s-tests/kube/src) so the
# fixtures they read by relative path are there; k8s.io/api's testdata, which the module
# zip lacks, is copied to staging/src/k8s.io/api/testdata. For each package the script
# starts a fresh server on a free port and sets KUBE_INTEGRATION_ETCD_URL; tests that
# start an `etcd` of their own (framework.RunCustomEtcd) find one first on PATH: for
# cetera, target/k8s-tests/kube/path/etcd, a wrapper that starts cetera with etcd's flags
# (cetera takes them: --data-dir, --listen-client-urls unix://..., -log-level ...).
# Logs: target/k8s-tests/logs/kube-PACKAGE-SERVER.log and the server's log beside it; one
# summary line per package; the exit status is 1 if any test failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[[ -z "${CETERA_BIN:-}" ]] || CETERA_BIN=$(realpath "$CETERA_BIN")
KUBE_VERSION=v1.37.2
STAGING_VERSION=v0.37.2

server=cetera backend=sqlite run="" skip="" packages=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --server) server=$2; shift 2 ;;
        --backend) backend=$2; shift 2 ;;
        --package) packages+=("$2"); shift 2 ;;
        --run) run=$2; shift 2 ;;
        --skip) skip=$2; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[[ ${#packages[@]} -gt 0 ]] || packages=(etcd apiserver apply storageversion)

# Package name -> import path inside k8s.io/kubernetes.
pkg_path() {
    case $1 in
        etcd) echo test/integration/etcd ;;
        apiserver) echo test/integration/apiserver ;;
        apply) echo test/integration/apiserver/apply ;;
        storageversion) echo test/integration/storageversion ;;
        *) echo "--package: etcd, apiserver, apply or storageversion" >&2; exit 2 ;;
    esac
}
for p in "${packages[@]}"; do pkg_path "$p" >/dev/null; done

WORK=$ROOT/target/k8s-tests/kube
MOD=$WORK/mod
SRC=$WORK/src
TESTSRC=$WORK/testsrc
BIN=$WORK/bin
WRAP=$WORK/path
LOGS=$ROOT/target/k8s-tests/logs
mkdir -p "$WORK" "$BIN" "$WRAP" "$LOGS"

moddir() {
    (cd "$MOD" && go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
}

# The scratch module: tools/reference/kubernetes's go.mod and go.sum under another name.
all_packages=(etcd apiserver apply storageversion)
stamp=$( { echo "$KUBE_VERSION"; cat "$0" "$ROOT"/tools/reference/kubernetes/go.*; } \
    | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$BIN/.stamp" 2>/dev/null)" != "$stamp" ]]; then
    echo "=== building k8s.io/kubernetes@$KUBE_VERSION integration tests (minutes)"
    rm -rf "$MOD"
    mkdir -p "$MOD"
    cp "$ROOT"/tools/reference/kubernetes/go.mod "$ROOT"/tools/reference/kubernetes/go.sum "$MOD/"
    (cd "$MOD" && go mod edit -module cetera.invalid/k8s-tests/kube -droptool=k8s.io/kubernetes/cmd/kube-apiserver \
        -droptool=k8s.io/kubernetes/cmd/kube-controller-manager -droptool=k8s.io/kubernetes/cmd/kube-scheduler \
        -droptool=k8s.io/kubernetes/cmd/kubectl -require=k8s.io/kubernetes@$KUBE_VERSION)
    # The source tree the tests run in, with k8s.io/api's serialization fixtures.
    kube=$(moddir "k8s.io/kubernetes@$KUBE_VERSION")
    api=$(moddir "k8s.io/api@$STAGING_VERSION")
    rm -rf "$SRC"
    cp -r "$kube" "$SRC"
    chmod -R u+w "$SRC"
    mkdir -p "$SRC/staging/src/k8s.io/api"
    cp -r "$api/testdata" "$SRC/staging/src/k8s.io/api/testdata"
    chmod -R u+w "$SRC/staging"
    # The folders the -trimpath test servers look for (see TEST_SRCDIR below): a binary's
    # file names are module@version/..., a replaced staging module's version v0.0.0. The
    # apiextensions test server writes its certificates there, so they are writable copies.
    rm -rf "$TESTSRC"
    mkdir -p "$TESTSRC/ws/k8s.io"
    ln -s "$SRC" "$TESTSRC/ws/k8s.io/kubernetes@$KUBE_VERSION"
    cp -r "$(moddir "k8s.io/apiextensions-apiserver@$STAGING_VERSION")" "$TESTSRC/ws/k8s.io/apiextensions-apiserver@v0.0.0"
    chmod -R u+w "$TESTSRC"
    for p in "${all_packages[@]}"; do
        path=$(pkg_path "$p")
        (cd "$MOD" && nice -n 5 go test -mod=mod -c -trimpath -tags=run_integration_tests \
            -o "$BIN/$p.test" "k8s.io/kubernetes/$path")
    done
    echo "$stamp" > "$BIN/.stamp"
fi
for p in "${packages[@]}"; do
    [[ -x $BIN/$p.test ]] || { echo "no $BIN/$p.test: remove $BIN/.stamp and rerun" >&2; exit 2; }
done

ETCD_BIN=${CETERA_ETCD37_BIN:-$ROOT/tools/reference/bin/etcd}
if [[ $server == cetera ]]; then
    if [[ -z "${CETERA_BIN:-}" ]]; then
        CETERA_BIN=$(ls -t "$ROOT/target/release/cetera" "$ROOT/target/debug/cetera" 2>/dev/null | head -1 || true)
    fi
    [[ -x "${CETERA_BIN:-}" ]] || { echo "no cetera binary: build it or set CETERA_BIN" >&2; exit 2; }
    case $backend in
        sqlite|cluster) db_server="" ;;
        postgres) db_server=${CETERA_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432} ;;
        mysql) db_server=${CETERA_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306} ;;
        *) echo "--backend: sqlite, postgres, mysql or cluster" >&2; exit 2 ;;
    esac
    label=cetera-$backend
    # `etcd` for the tests that start their own: cetera with etcd's flags; on PostgreSQL
    # or MySQL a database of its own (named after the data dir, dropped by this script).
    cat > "$WRAP/etcd" <<EOF
#!/usr/bin/env bash
# Written by tools/k8s-tests/integration.sh: etcd's command line, served by cetera.
set -euo pipefail
# etcd's default progress-notify interval (10 minutes) unless the test sets one. Go's flag
# package takes -flag as --flag; cetera's parser wants the two dashes.
args=() dir="" prev="" progress=(--watch-progress-notify-interval 10m)
for a in "\$@"; do
    [[ \$a == -[a-z]* ]] && a=-\$a
    case \$a in --watch-progress-notify-interval*) progress=() ;; --data-dir=*) dir=\${a#*=} ;; esac
    [[ \$prev == --data-dir ]] && dir=\$a
    args+=("\$a") prev=\$a
done
db_server='$db_server'
if [[ -n \$db_server && -n \$dir ]]; then
    name=k8s_\$(echo "\$dir" | sha256sum | cut -c1-16)
    echo "\$name" >> '$WORK/databases'
    args+=(--endpoint "\${db_server%/}/\$name")
fi
export RUST_LOG=\${CETERA_TEST_LOG:-warn}
exec '$CETERA_BIN' "\${progress[@]}" "\${args[@]}"
EOF
else
    [[ -x $ETCD_BIN ]] || { echo "no $ETCD_BIN: run tools/reference/build.sh etcd" >&2; exit 2; }
    label=etcd
    ln -sf "$ETCD_BIN" "$WRAP/etcd"
fi
chmod +x "$WRAP/etcd"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

drop_database() {
    local name=$1
    case $backend in
        postgres) PGOPTIONS=--client-min-messages=warning psql "${db_server%/}/postgres" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null || true ;;
        mysql)
            local u=${db_server#mysql://} host port user
            user=${u%%@*}; u=${u#*@}; u=${u%%/*}; host=${u%%:*}; port=${u##*:}
            mysql -h "$host" -P "$port" -u "$user" -e "DROP DATABASE IF EXISTS $name" || true ;;
    esac
}

server_pids=()
stop_server() {
    local pid
    for pid in "${server_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${server_pids[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    server_pids=()
    if [[ -f $WORK/databases ]]; then
        while read -r name; do drop_database "$name"; done < "$WORK/databases"
        rm -f "$WORK/databases"
    fi
}
trap stop_server EXIT

# wait_healthy URL PID LOG: until URL/health answers, or the process exits.
wait_healthy() {
    local url=$1 pid=$2 log=$3
    for _ in $(seq 600); do
        if curl -sf "$url/health" >/dev/null 2>&1; then return 0; fi
        kill -0 "$pid" 2>/dev/null || { echo "the server exited: $log" >&2; tail -20 "$log" >&2; return 1; }
        sleep 0.1
    done
    echo "the server did not become healthy: $log" >&2
    return 1
}

# start_server PACKAGE: a fresh server on a free port; sets url.
start_server() {
    local p=$1 port dir log
    port=$(free_port)
    dir=$WORK/data/$p
    rm -rf "$dir"
    mkdir -p "$dir"
    log=$LOGS/kube-$p-$label.server.log
    url=http://127.0.0.1:$port
    if [[ $backend == cluster && $server == cetera ]]; then
        # Three members; the tests get the second one's URL.
        local i join=() peer0="" member_url
        : > "$log"
        for i in 1 2 3; do
            local cport=$port peer
            [[ $i == 2 ]] || cport=$(free_port)
            peer=127.0.0.1:$(free_port)
            member_url=http://127.0.0.1:$cport
            if [[ $i == 1 ]]; then join=(--cluster-init); peer0=http://$peer; else join=(--join "$peer0"); fi
            mkdir -p "$dir/n$i"
            RUST_LOG=${CETERA_TEST_LOG:-warn} "$CETERA_BIN" --name "n$i" --listen-address "127.0.0.1:$cport" \
                --endpoint "sqlite://$dir/n$i/state.db" --peer-listen-address "$peer" "${join[@]}" \
                --token k8s-integration --watch-progress-notify-interval 10m \
                --quota-backend-bytes $((8 * 1024 * 1024 * 1024)) > "$log.n$i" 2>&1 &
            server_pids+=($!)
            wait_healthy "$member_url" "$!" "$log.n$i" || return 1
        done
        return 0
    fi
    if [[ $server == cetera ]]; then
        local endpoint=sqlite://$dir/state.db
        if [[ -n $db_server ]]; then
            local name=k8s_$p
            drop_database "$name"
            echo "$name" >> "$WORK/databases"
            endpoint=${db_server%/}/$name
        fi
        RUST_LOG=${CETERA_TEST_LOG:-warn} "$CETERA_BIN" --listen-address "127.0.0.1:$port" \
            --endpoint "$endpoint" --watch-progress-notify-interval 10m \
            --quota-backend-bytes $((8 * 1024 * 1024 * 1024)) > "$log" 2>&1 &
    else
        "$ETCD_BIN" --data-dir "$dir" --listen-client-urls "$url" --advertise-client-urls "$url" \
            --listen-peer-urls "http://127.0.0.1:$(free_port)" --log-level warn \
            --quota-backend-bytes $((8 * 1024 * 1024 * 1024)) > "$log" 2>&1 &
    fi
    server_pids+=($!)
    wait_healthy "$url" "$!" "$log"
}

status=0
for p in "${packages[@]}"; do
    path=$(pkg_path "$p")
    log=$LOGS/kube-$p-$label.log
    start_server "$p"
    echo "=== k8s.io/kubernetes/$path on $label at $url (log: $log)"
    args=(-test.v -test.count 1 -test.timeout "${K8S_TESTS_TIMEOUT:-60m}")
    [[ -n $run ]] && args+=(-test.run "$run")
    [[ -n $skip ]] && args+=(-test.skip "$skip")
    start=$SECONDS
    # TEST_SRCDIR/TEST_WORKSPACE: the binaries are built with -trimpath, so a file's path is
    # module@version/...; the test servers of kube-apiserver and apiextensions-apiserver
    # find their own folder as bazel's TEST_SRCDIR/TEST_WORKSPACE/path.
    (cd "$SRC/$path" && PATH="$WRAP:$PATH" KUBE_INTEGRATION_ETCD_URL=$url \
        TEST_SRCDIR=$TESTSRC TEST_WORKSPACE=ws \
        "$BIN/$p.test" "${args[@]}") > "$log" 2>&1 || status=1
    elapsed=$((SECONDS - start))
    stop_server
    python3 - "$log" "$p" "$label" "$elapsed" <<'PY'
import re, sys
log, pkg, label, elapsed = sys.argv[1:]
results = {}
for line in open(log, errors="replace"):
    m = re.match(r"\s*--- (PASS|FAIL|SKIP): (\S+)", line)
    if m:
        results[m.group(2)] = m.group(1)
tops = {n: r for n, r in results.items() if "/" not in n}
count = {r: sum(1 for v in tops.values() if v == r) for r in ("PASS", "FAIL", "SKIP")}
leaves = {n: r for n, r in results.items() if not any(o.startswith(n + "/") for o in results)}
lcount = {r: sum(1 for v in leaves.values() if v == r) for r in ("PASS", "FAIL", "SKIP")}
print(f"{pkg} on {label} ({elapsed} s): tests {count['PASS']} passed, {count['FAIL']} failed, "
      f"{count['SKIP']} skipped; leaves {lcount['PASS']} passed, {lcount['FAIL']} failed, {lcount['SKIP']} skipped")
for n, r in sorted(leaves.items()):
    if r == "FAIL":
        print(f"  FAIL {n}")
PY
    # A test binary that ends normally prints PASS or FAIL last; one that does not was
    # ended by something else (klog.Fatal of a leftover apiserver, a panic, the timeout),
    # and the tests after that point did not run: the counts above miss them.
    if ! tail -n 100 "$log" | grep -qE '^(PASS|FAIL)$'; then
        echo "  the test binary ended early; tests after that point did not run. Its last words:" >&2
        grep -E '^(F[0-9]{4} |panic:)' "$log" | head -3 | cut -c1-300 | sed 's/^/    /' >&2 || true
        status=1
    fi
done
exit $status
