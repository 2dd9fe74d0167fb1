#!/usr/bin/env bash
# What a compaction costs each server: the bytes it writes, and the puts that
# wait beside it (issue 28).
#
# For etcd and cetera (SQLite), each fresh and each twice: N puts of 1 KiB values
# over 2,000 keys (16 clients); then a 1-client put loop at 200/s on other keys
# for 12 s, with, 2 s into it, a physical compaction at the revision the N puts
# reached (all but each key's newest goes); then N more puts. The second run is
# the same without the compaction. Bytes are the server process's write_bytes
# over its whole life, its shutdown's checkpoint included (the RUSAGE_CHILDREN
# of a small wrapper), so the difference between the two runs is what the
# compaction wrote, however late its pages reach the disk. The put loop's
# latencies are those of the run with the compaction.
#
# Usage: scripts/bench-compaction.sh [N]      (default 120000)
# Env: BENCH_TMP (parent of the data dirs; default /var/tmp), and those of
#      scripts/bench-lib.sh (CETERA_ETCD_BIN, CETERA_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
N=${1:-120000}
KEYS=2000
cargo build --release --quiet -p cetera -p cetera-bench
BENCH=target/release/cetera-bench
ETCDCTL=$(dirname "$(etcd_bin)")/etcdctl

# Runs the command after the file name and writes the bytes it (and its
# children) wrote over its life to that file; SIGTERM is passed on.
LIFETIME_BYTES='
import resource, signal, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, lambda *_: child.terminate())
child.wait()
written = resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock * 512
open(sys.argv[1], "w").write(str(written))
'

dir="" wrapper=""
results=$(mktemp -d)
trap '[[ -z $wrapper ]] || kill "$wrapper" 2>/dev/null || true; rm -rf "$dir" "$results"' EXIT

# run_once etcd|cetera yes|no: leaves in $results/KIND-COMPACT.{bytes,seconds,json}
# the bytes written, the compaction's seconds and the put loop's results.
run_once() {
    local kind=$1 compact=$2 port url rev t0 t1 loop cmd
    dir=$(mktemp -d "${BENCH_TMP:-/var/tmp}/bench-compaction.XXXXXX")
    port=$(free_port)
    url=http://127.0.0.1:$port
    mapfile -d "" cmd < <(server_command "$kind" "$dir" "$port")
    RUST_LOG=warn python3 -c "$LIFETIME_BYTES" "$dir/bytes" "${cmd[@]}" >"$dir/log" 2>&1 &
    wrapper=$!
    "$BENCH" --endpoints "$url" wait --timeout 30s >/dev/null
    local puts=(--endpoints "$url" --conns 4 --clients 16 --total "$N" --val-size 1024
        --key-space "$KEYS" --no-progress put)
    "$BENCH" "${puts[@]}" >/dev/null
    rev=$("$ETCDCTL" --endpoints "$url" get nothing -w json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
    "$BENCH" --endpoints "$url" --clients 1 --rate 200 --duration 12s --key-space 100000 \
        --prefix /beside/ --val-size 1024 --no-progress --json put >"$dir/beside.json" &
    loop=$!
    sleep 2
    t0=$(date +%s.%N)
    if [[ $compact == yes ]]; then
        "$ETCDCTL" --endpoints "$url" compaction --physical "$rev" >/dev/null
    fi
    t1=$(date +%s.%N)
    wait "$loop"
    "$BENCH" "${puts[@]}" >/dev/null
    kill -TERM "$wrapper"
    wait "$wrapper" || true
    wrapper=""
    cp "$dir/bytes" "$results/$kind-$compact.bytes"
    cp "$dir/beside.json" "$results/$kind-$compact.json"
    python3 -c "print(round($t1 - $t0, 2))" >"$results/$kind-$compact.seconds"
    rm -rf "$dir"
    dir=""
}

echo "N=$N puts of 1 KiB over $KEYS keys, then a physical compaction of their history"
echo
echo "| server | compaction s | MB written with / without | compaction MB | KB per put compacted away | puts beside it: p50 / p99 / max ms |"
echo "|---|---:|---:|---:|---:|---|"
for kind in etcd cetera; do
    run_once "$kind" yes
    run_once "$kind" no
    python3 - "$results/$kind" "$N" "$KEYS" <<'EOF'
import json, os, sys
prefix, n, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kind = os.path.basename(prefix)
read = lambda suffix: open(prefix + suffix).read().strip()
with_, without, seconds = int(read("-yes.bytes")), int(read("-no.bytes")), read("-yes.seconds")
lat = json.load(open(prefix + "-yes.json"))["results"][0]["latency_ms"]
compaction = with_ - without
print(f"| {kind} | {seconds} | {with_ / 1e6:.0f} / {without / 1e6:.0f} | {compaction / 1e6:.0f} "
      f"| {compaction / 1024 / (n - keys):.2f} | {lat['p50']:.2f} / {lat['p99']:.1f} / {lat['max']:.1f} |")
EOF
done
