#!/usr/bin/env bash
# Instances that add up (issue 30): 1, 2 and 4 ceteras on one PostgreSQL or
# MySQL/MariaDB database, the load split evenly over them (cetera-bench spreads
# its connections round-robin over the endpoints), the sums reported.
#
# For each instance count: a new database, the instances started on it, the key
# space written (not measured), then a put step and a range step of 64 clients
# over 8 connections per instance. Reported per step: operations/s over all
# instances, p50/p99, CPU seconds per 1000 requests of the ceteras together and
# of the database server's processes, and the writers' lock waits: sampled
# every 50 ms, the number of the database's sessions waiting on a row lock
# (PostgreSQL: pg_stat_activity wait_event_type 'Lock'; MariaDB: InnoDB
# transactions in LOCK WAIT), averaged over the step. Every writer locks the
# revision row (`meta`), so that average is how many writers queue on it. And
# the requests per commit (the mean batch, from each instance's /metrics).
#
# With --db-delay D (e.g. 500us) the instances reach the database through
# cetera-bench's proxy, which adds D each way: a database across a network hop,
# as a managed one is, where round trips and lock holds cost more than CPU.
#
# With --instance-cpus C each instance runs in a cgroup of its own held to C
# CPUs (the cpu controller's quota): instances as k3s runs them, one per
# server, where one more instance brings CPU of its own instead of sharing
# this machine's with the others, the database and the load generator. Needs
# root and the cgroup v1 cpu controller (/sys/fs/cgroup/cpu) or cgroup v2.
#
# Usage: scripts/bench-instances.sh [--backend postgres|mysql] [--counts 1,2,4]
#                                   [--duration 10s] [--clients 64] [--db-delay D]
#                                   [--instance-cpus C] [--out DIR]
# Env: BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432),
#      BENCH_MYSQL_URL (default mysql://root@127.0.0.1:3306), CETERA_BIN (the
#      cetera binary; default: this checkout's release build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BACKEND=postgres
COUNTS=1,2,4
DURATION=10s
CLIENTS=64
DB_DELAY=""
INSTANCE_CPUS=""
OUT=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --backend) BACKEND=$2; shift ;;
        --counts) COUNTS=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        --clients) CLIENTS=$2; shift ;;
        --db-delay) DB_DELAY=$2; shift ;;
        --instance-cpus) INSTANCE_CPUS=$2; shift ;;
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
PG_URL=${BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432}
MYSQL_URL=${BENCH_MYSQL_URL:-mysql://root@127.0.0.1:3306}
source scripts/mysql-client.sh
OUT=${OUT:-$ROOT/target/bench/instances-$BACKEND-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
DB=cetera_instances_$$

log() { echo "[instances $(date +%H:%M:%S)] $*" >&2; }

case $BACKEND in
    postgres)
        ENDPOINT="$PG_URL/$DB?sslmode=disable"
        sql() { psql "$PG_URL/postgres" -tAqc "$1"; }
        db_sql() { psql "$PG_URL/$DB" -tAqc "$1"; }
        WAITING="SELECT count(*) FROM pg_stat_activity WHERE datname = '$DB' AND wait_event_type = 'Lock'"
        db_pids() { pgrep -x postgres | tr '\n' ' '; } ;;
    mysql)
        ENDPOINT="$MYSQL_URL/$DB"
        sql() { mysql_client -N -e "$1"; }
        db_sql() { sql "$1"; }
        WAITING="SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
        db_pids() { pgrep -x 'mariadbd|mysqld' | tr '\n' ' '; } ;;
    *) echo "unknown backend: $BACKEND (postgres or mysql)" >&2; exit 2 ;;
esac

log "building release binaries"
cargo build --release --quiet -p cetera -p cetera-bench
CETERA=${CETERA_BIN:-$ROOT/target/release/cetera}
BENCH=$ROOT/target/release/cetera-bench

PIDS=()
CGROUPS=()
stop_all() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for dir in "${CGROUPS[@]}"; do rmdir "$dir" 2>/dev/null || true; done
    PIDS=()
    CGROUPS=()
}
# hold_cpus PID NAME: PID (all its threads, and those it starts) in a cgroup
# NAME of its own, held to $INSTANCE_CPUS CPUs.
hold_cpus() {
    local quota dir
    quota=$(awk -v c="$INSTANCE_CPUS" 'BEGIN { printf "%d", c * 100000 }')
    if [[ -w /sys/fs/cgroup/cpu ]]; then
        dir=/sys/fs/cgroup/cpu/$2
        mkdir "$dir"
        echo 100000 >"$dir/cpu.cfs_period_us"
        echo "$quota" >"$dir/cpu.cfs_quota_us"
    elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
        dir=/sys/fs/cgroup/$2
        mkdir "$dir"
        echo "$quota 100000" >"$dir/cpu.max"
    else
        echo "--instance-cpus: no writable cgroup cpu controller (root, cgroup v1 or v2)" >&2
        exit 2
    fi
    CGROUPS+=("$dir")
    echo "$1" >"$dir/cgroup.procs"
}
PROXY_PID=""
trap 'stop_all; [[ -n $PROXY_PID ]] && kill "$PROXY_PID" 2>/dev/null; sql "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true' EXIT

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'
}
# With --db-delay, the instances' endpoint names the delaying proxy instead of
# the server (the script's own statements go straight to the server).
if [[ -n $DB_DELAY ]]; then
    server_url=$([[ $BACKEND == postgres ]] && echo "$PG_URL" || echo "$MYSQL_URL")
    [[ $server_url =~ ^([a-z]+://)([^@/]*@)?([^:/]+)(:([0-9]+))?/?$ ]] ||
        { echo "--db-delay: cannot read the server's address from $server_url" >&2; exit 2; }
    proxy_port=$(free_port)
    "$BENCH" proxy --listen "127.0.0.1:$proxy_port" \
        --to "$(getent ahostsv4 "${BASH_REMATCH[3]}" | awk 'NR==1{print $1}'):${BASH_REMATCH[5]:-$([[ $BACKEND == postgres ]] && echo 5432 || echo 3306)}" \
        --delay "$DB_DELAY" >/dev/null 2>&1 &
    PROXY_PID=$!
    ENDPOINT=${ENDPOINT/"$server_url"/"${BASH_REMATCH[1]}${BASH_REMATCH[2]}127.0.0.1:$proxy_port"}
    log "the instances reach the database through a proxy adding $DB_DELAY each way"
fi

# requests_and_commits URLS...: the writers' batched requests and commits so
# far, summed over the instances (from /metrics).
requests_and_commits() {
    local url
    for url in "$@"; do curl -s "$url/metrics"; done |
        awk '/^cetera_writer_batch_requests_sum/ { r += $2 } /^cetera_writer_commits_total/ { c += $2 }
             END { print r + 0, c + 0 }'
}
cpu_seconds() { # the CPU seconds (user + system) of PIDS so far
    local p
    for p in $1; do awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null; done |
        awk -v hz="$(getconf CLK_TCK)" '{ n += $1 } END { print n / hz }'
}

# step LABEL COUNT ENDPOINTS ARGS...: one measured cetera-bench run.
step() {
    local label=$1 count=$2 endpoints=$3
    shift 3
    local ceteras=${PIDS[*]} database
    database=$(db_pids)
    local cetera0 db0 batched0 instances
    IFS=, read -ra instances <<<"$endpoints"
    batched0=$(requests_and_commits "${instances[@]}")
    cetera0=$(cpu_seconds "$ceteras")
    db0=$(cpu_seconds "$database")
    # The lock-wait sampler: one count per line.
    (while true; do db_sql "$WAITING" 2>/dev/null || true; sleep 0.05; done) >"$OUT/$label-$count.waits" &
    local sampler=$!
    "$BENCH" --endpoints "$endpoints" --conns $((8 * count)) --clients "$CLIENTS" \
        --duration "$DURATION" --no-progress --json "$@" >"$OUT/$label-$count.json" ||
        log "  $label reported errors (see $OUT/$label-$count.json)"
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
    python3 - "$label" "$count" "$OUT/$label-$count.json" "$OUT/$label-$count.waits" \
        "$(awk -v a="$cetera0" -v b="$(cpu_seconds "$ceteras")" 'BEGIN { print b - a }')" \
        "$(awk -v a="$db0" -v b="$(cpu_seconds "$database")" 'BEGIN { print b - a }')" \
        "$batched0" "$(requests_and_commits "${instances[@]}")" \
        >>"$OUT/results.jsonl" <<'EOF'
import json, sys
label, count, path, waits, cetera_cpu, db_cpu, batched0, batched1 = sys.argv[1:9]
requests, commits = (int(float(b)) - int(float(a)) for a, b in zip(batched0.split(), batched1.split()))
result = json.load(open(path))["results"][0]
samples = [int(line) for line in open(waits) if line.strip().isdigit()]
ops = result["count"] or 1
print(json.dumps({
    "step": label, "instances": int(count), "per_sec": round(result["per_sec"]),
    "errors": result["errors"], "p50_ms": result["latency_ms"]["p50"],
    "p99_ms": result["latency_ms"]["p99"],
    "cetera_cpu_ms_per_op": round(1000 * float(cetera_cpu) / ops, 3),
    "db_cpu_ms_per_op": round(1000 * float(db_cpu) / ops, 3),
    "lock_waiters": round(sum(samples) / len(samples), 2) if samples else None,
    "requests_per_commit": round(requests / commits, 1) if commits else None,
}))
EOF
    tail -n1 "$OUT/results.jsonl" >&2
}

: >"$OUT/results.jsonl"
IFS=, read -ra counts <<<"$COUNTS"
for count in "${counts[@]}"; do
    log "$count instance(s) on one $BACKEND database${INSTANCE_CPUS:+, each held to $INSTANCE_CPUS CPUs}"
    sql "DROP DATABASE IF EXISTS $DB" >/dev/null
    urls=()
    for i in $(seq 1 "$count"); do
        port=$(free_port)
        RUST_LOG=warn "$CETERA" --listen-address "127.0.0.1:$port" --endpoint "$ENDPOINT" \
            >"$OUT/cetera-$count-$i.log" 2>&1 &
        PIDS+=($!)
        [[ -n $INSTANCE_CPUS ]] && hold_cpus "$!" "cetera-instance-$$-$i"
        urls+=("http://127.0.0.1:$port")
        # One at a time: the first creates the database and its tables.
        "$BENCH" --endpoints "${urls[-1]}" wait --timeout 30s
    done
    endpoints=$(IFS=,; echo "${urls[*]}")
    "$BENCH" --endpoints "$endpoints" --conns "$count" --clients 16 populate >/dev/null
    step put "$count" "$endpoints" put
    step range "$count" "$endpoints" range
    stop_all
done

python3 - "$OUT/results.jsonl" "$BACKEND" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"\n{sys.argv[2]}: instances on one database, sums over the instances\n")
print("| step | instances | ops/s | p50 ms | p99 ms | cetera CPU ms/op | database CPU ms/op | writers waiting on a lock (mean) | requests per commit |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['step']} | {r['instances']} | {r['per_sec']:,} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
          f"{r['cetera_cpu_ms_per_op']:.3f} | {r['db_cpu_ms_per_op']:.3f} | {r['lock_waiters']} | "
          f"{r['requests_per_commit'] if r['requests_per_commit'] is not None else ''} |")
EOF
