#!/usr/bin/env bash
# Bytes per put until the data is at rest, for the rate steps of issue 28.
#
# `scripts/bench.sh --only rates` counts a server's write_bytes during each
# step. What a server writes after the step is left out: cetera's last batch
# (up to a second of puts; and, in WAL mode, which cetera used for batches
# until 2026-12-05, the checkpoint that copied the WAL into the database file
# once it held 32 MiB), etcd's last backend commit (every 100 ms). Here each
# step is counted twice: during the step, as bench.sh does, and through a
# clean stop of the server right after it (SIGTERM: cetera applies its batch;
# etcd commits its backend), from the kernel's count for the exited process
# (the ru_oublock of wait4, the same counter as write_bytes).
#
# Fresh servers for every step, etcd and cetera one after the other; data dirs
# under BENCH_TMP (default /var/tmp), on a disk.
#
# Usage: scripts/bytes-at-rest.sh [--duration 10s] [--steps rate-10,rate-100,rate-400,rate-max]
# Env: CETERA_ETCD_BIN, CETERA_BIN (see scripts/bench-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

DURATION=10s
STEPS=rate-10,rate-100,rate-400,rate-max
while [[ $# -gt 0 ]]; do
    case $1 in
        --duration) DURATION=$2; shift ;;
        --steps) STEPS=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

cargo build --release --quiet -p cetera -p cetera-bench
BENCH=target/release/cetera-bench
WORK=$(mktemp -d "${BENCH_TMP:-/var/tmp}/bytes-at-rest.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# The load of each step, as in bench.sh's rates.
declare -A LOAD=(
    [rate-10]="--clients 1 --conns 1 --rate 10"
    [rate-100]="--clients 4 --conns 4 --rate 100"
    [rate-400]="--clients 16 --conns 4 --rate 400"
    [rate-max]="--clients 64 --conns 8"
)

echo "| step | server | puts | KB per put in the step | KB per put through a clean stop |"
echo "|---|---|---:|---:|---:|"
IFS=, read -ra steps <<<"$STEPS"
for step in "${steps[@]}"; do
    [[ -n ${LOAD[$step]:-} ]] || { echo "unknown step $step" >&2; exit 2; }
    for kind in etcd cetera; do
        dir=$WORK/$step-$kind
        mkdir -p "$dir"
        port=$(free_port)
        mapfile -d "" server_cmd < <(server_command "$kind" "$dir" "$port")
        python3 - "$BENCH" "http://127.0.0.1:$port" "$step" "$kind" "$dir/log" \
            "put ${LOAD[$step]} --key-space 5000 --val-size 1024 --duration $DURATION" \
            "${server_cmd[@]}" <<'EOF'
import json, os, signal, subprocess, sys
bench, url, step, kind, log, load, *server = sys.argv[1:]

def write_bytes(pid):
    for line in open(f"/proc/{pid}/io"):
        if line.startswith("write_bytes:"):
            return int(line.split()[1])

with open(log, "w") as out:
    proc = subprocess.Popen(server, stdout=out, stderr=out, env=dict(os.environ, RUST_LOG="warn"))
try:
    subprocess.run([bench, "--endpoints", url, "wait", "--timeout", "30s"], check=True,
                   stdout=subprocess.DEVNULL)
    before = write_bytes(proc.pid)
    result = subprocess.run([bench, "--endpoints", url, "--json", "--no-progress", *load.split()],
                            check=True, capture_output=True, text=True)
    in_step = write_bytes(proc.pid) - before
finally:
    proc.send_signal(signal.SIGTERM)
    _, _, usage = os.wait4(proc.pid, 0)
at_rest = usage.ru_oublock * 512 - before
puts = json.loads(result.stdout)["results"][0]["count"]
print(f"| {step} | {kind} | {puts:,} | {in_step / puts / 1024:.2f} | {at_rest / puts / 1024:.2f} |")
EOF
        rm -rf "$dir"
    done
done
