#!/usr/bin/env bash
# Server CPU per operation, several servers side by side (issue 51): etcd
# releases and cetera builds, each a fresh one-member server per step.
#
# For each round, each scenario and each server (the servers' order rotated
# every round, so that none always runs first or last), it starts a fresh
# server on a new data dir, fills it if the scenario needs it (unmeasured),
# runs the scenario's cetera-bench step and reads the server's CPU time
# (/proc/PID/stat utime + stime) before and after it. It prints, per scenario
# and server, the median over the rounds of ops/s, p50 latency and server CPU
# µs per op, and each one's ratio to the first server given, with the load
# average at the start and the end. CPU per op varies less than throughput on
# a machine others load too, but still does: compare servers of one run.
#
# Usage: scripts/cpu-per-op.sh [--rounds N] [--duration D] [--only LIST] [--out DIR]
#                              NAME=KIND:BINARY...
#   NAME=KIND:BINARY  a server: KIND is etcd or cetera, e.g.
#                     etcd-3.5.1=etcd:/path/to/etcd cetera=cetera:target/release/cetera
#   --rounds N        rounds (default 3)
#   --duration D      length of each measured step (default 10s)
#   --only LIST       comma-separated scenarios (default all): range-64 (one key,
#                     64 clients), put-64, txn-64 (CAS), put-1
#   --out DIR         where results go (default: a new dir under target/cpu-per-op/)
# Env: BENCH_TMP (parent of the servers' data dirs; default /var/tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/bench-lib.sh

ROUNDS=3
DURATION=10s
ONLY=range-64,put-64,txn-64,put-1
OUT=$ROOT/target/cpu-per-op/$(date -u +%Y%m%dT%H%M%SZ)
SERVERS=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) ROUNDS=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *=etcd:*|*=cetera:*) SERVERS+=("$1") ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ ${#SERVERS[@]} -gt 0 ]] || { echo "name at least one server (see --help)" >&2; exit 2; }
mkdir -p "$OUT"

cargo build --release --quiet -p cetera-bench
BENCH=$ROOT/target/release/cetera-bench

# The scenarios: the populate's arguments (empty: none) and the step's.
declare -A POPULATE=(
    [range-64]="--key-space 10000"
    [put-64]=""
    [txn-64]="--key-space 10000"
    [put-1]=""
)
declare -A STEP=(
    [range-64]="range --clients 64 --conns 8 --key-space 10000"
    [put-64]="put --clients 64 --conns 8 --key-space 100000"
    [txn-64]="txn-cas --clients 64 --conns 8 --key-space 10000"
    [put-1]="put --clients 1 --conns 1 --key-space 100000"
)
IFS=, read -r -a SCENARIOS <<<"$ONLY"
for scenario in "${SCENARIOS[@]}"; do
    [[ -n ${STEP[$scenario]:-} ]] || { echo "unknown scenario $scenario" >&2; exit 2; }
done

WORK=$(mktemp -d "${BENCH_TMP:-/var/tmp}/cetera-cpu-per-op.XXXXXX")
PID=""
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
RESULTS=$OUT/results.jsonl
: >"$RESULTS"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

# measure ROUND SCENARIO NAME KIND BINARY: one fresh server, one step; appends a line
# to results.jsonl.
measure() {
    local round=$1 scenario=$2 name=$3 kind=$4 binary=$5 port dir url
    port=$(free_port)
    dir=$WORK/$name-$scenario-$round
    mkdir -p "$dir"
    url=http://127.0.0.1:$port
    local command=()
    mapfile -d '' command < <(
        if [[ $kind == etcd ]]; then
            CETERA_ETCD_BIN=$binary server_command etcd "$dir" "$port"
        else
            CETERA_BIN=$binary server_command cetera "$dir" "$port"
        fi
    )
    RUST_LOG=warn "${command[@]}" >"$dir/server.log" 2>&1 &
    PID=$!
    "$BENCH" --endpoints "$url" wait --timeout 30s
    if [[ -n ${POPULATE[$scenario]} ]]; then
        # shellcheck disable=SC2086
        "$BENCH" --endpoints "$url" --conns 4 --clients 16 ${POPULATE[$scenario]} populate >/dev/null
        sleep 1
    fi
    local before after
    before=$(ticks "$PID")
    # shellcheck disable=SC2086
    "$BENCH" --endpoints "$url" --json ${STEP[$scenario]} --duration "$DURATION" \
        >"$OUT/$scenario-$name-$round.json" || echo "  errors: see $OUT/$scenario-$name-$round.json" >&2
    after=$(ticks "$PID")
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=""
    rm -rf "$dir"
    python3 - "$round" "$scenario" "$name" "$((after - before))" "$HZ" \
        "$OUT/$scenario-$name-$round.json" "$(cut -d' ' -f1 /proc/loadavg)" >>"$RESULTS" <<'EOF'
import json, sys
round_, scenario, name, ticks, hz, path, load = sys.argv[1:]
results = json.load(open(path))["results"]
ops = sum(r["count"] for r in results if r["unit"] == "op") or results[0]["count"]
first = results[0]
print(json.dumps({"round": int(round_), "scenario": scenario, "server": name, "ops": ops,
                  "per_sec": first["per_sec"], "p50_ms": first["latency_ms"]["p50"],
                  "cpu_us_per_op": int(ticks) / int(hz) * 1e6 / ops if ops else None,
                  "load1": float(load)}))
EOF
    tail -1 "$RESULTS" >&2
}

for ((round = 0; round < ROUNDS; round++)); do
    for scenario in "${SCENARIOS[@]}"; do
        n=${#SERVERS[@]}
        for ((i = 0; i < n; i++)); do
            server=${SERVERS[$(((i + round) % n))]}
            name=${server%%=*} rest=${server#*=}
            measure "$round" "$scenario" "$name" "${rest%%:*}" "${rest#*:}"
        done
    done
done

{
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); $ROUNDS rounds of $DURATION steps; servers in rotated order"
    echo "- command: scripts/cpu-per-op.sh --rounds $ROUNDS --duration $DURATION --only $ONLY ${SERVERS[*]}"
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); load average (1, 5, 15 min) at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    python3 - "$RESULTS" "${SERVERS[@]%%=*}" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = sys.argv[2:]
median = lambda xs: statistics.median(xs) if xs else None
print("| scenario | server | ops/s | p50 ms | CPU µs/op | ops/s ratio | CPU ratio | load (1 min) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for scenario in dict.fromkeys(r["scenario"] for r in rows):
    of = lambda name, key: median([r[key] for r in rows
                                   if r["scenario"] == scenario and r["server"] == name and r[key] is not None])
    for name in names:
        ops, cpu = of(name, "per_sec"), of(name, "cpu_us_per_op")
        base_ops, base_cpu = of(names[0], "per_sec"), of(names[0], "cpu_us_per_op")
        print(f"| {scenario} | {name} | {ops:,.0f} | {of(name, 'p50_ms'):.2f} | {cpu:.1f} | "
              f"{ops / base_ops:.2f} | {cpu / base_cpu:.2f} | {of(name, 'load1'):.1f} |")
EOF
} | tee "$OUT/report.md"
