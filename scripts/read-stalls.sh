#!/usr/bin/env bash
# Point reads beside writes and long reads: what a batch commit costs readers.
#
# On SQLite, cetera commits the record log's batches in rollback journal
# mode, where a commit waits until no reader holds the database and readers
# wait for the commit (src/backend/sqlite/journal.rs). This measures what a
# reader of single keys sees meanwhile: 1 client of point reads, beside 400
# puts/s of 1 KiB values, alone and with 1 client reading a 10k-key prefix
# (2.6 MB) over and over, on a fresh server each time; etcd 3.5.1 the same.
# Reported: the point reads' ops/s, p50, p99 and max, the puts' p99 and max,
# the long reads' count.
#
# Usage: scripts/read-stalls.sh [--duration 20s] [--servers etcd,cetera]
# Env: CETERA_ETCD_BIN, CETERA_BIN (see scripts/bench-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

DURATION=20s
SERVERS=etcd,cetera
while [[ $# -gt 0 ]]; do
    case $1 in
        --duration) DURATION=$2; shift ;;
        --servers) SERVERS=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

cargo build --release --quiet -p cetera -p cetera-bench
BENCH=target/release/cetera-bench
WORK=$(mktemp -d "${BENCH_TMP:-/var/tmp}/read-stalls.XXXXXX")
SERVER_PID=
cleanup() {
    [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

# summary FILE: the figures of a cetera-bench --json report.
summary() {
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
h = r["latency_ms"]
print("%.0f/s, p50 %.3f, p99 %.3f, max %.1f ms (%d errors)"
      % (r["per_sec"], h["p50"], h["p99"], h["max"], r["errors"]))
' "$1"
}

echo "| server | long reader | point reads | puts |"
echo "|---|---|---|---|"
IFS=, read -r -a servers <<<"$SERVERS"
for server in "${servers[@]}"; do
    for long in no yes; do
        dir=$WORK/$server-$long
        mkdir -p "$dir"
        port=$(free_port)
        url=http://127.0.0.1:$port
        mapfile -d '' cmd < <(server_command "$server" "$dir" "$port")
        "${cmd[@]}" >"$dir/log" 2>&1 &
        SERVER_PID=$!
        "$BENCH" --endpoints "$url" wait >/dev/null
        common=(--endpoints "$url" --no-progress --json)
        "$BENCH" "${common[@]}" --prefix /big/ --key-space 10000 --populate --total 1 range >/dev/null
        "$BENCH" "${common[@]}" --prefix /w/ --key-space 5000 --val-size 1024 --populate --total 1 put >/dev/null
        "$BENCH" "${common[@]}" --prefix /w/ --key-space 5000 --val-size 1024 --clients 4 \
            --rate 400 --duration "$DURATION" put >"$dir/puts.json" &
        puts=$!
        if [[ $long == yes ]]; then
            "$BENCH" "${common[@]}" --prefix /big/ --key-space 10000 --duration "$DURATION" \
                range --prefix-limit 10000 >"$dir/long.json" &
            longpid=$!
        fi
        "$BENCH" "${common[@]}" --prefix /big/ --key-space 10000 --duration "$DURATION" \
            range >"$dir/reads.json"
        wait "$puts"
        longs=-
        if [[ $long == yes ]]; then
            wait "$longpid"
            longs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][0]["count"])' "$dir/long.json")
        fi
        echo "| $server | $longs | $(summary "$dir/reads.json") | $(summary "$dir/puts.json") |"
        kill "$SERVER_PID"
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    done
done
