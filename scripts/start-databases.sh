#!/usr/bin/env bash
# Installs (from Debian), configures and starts the PostgreSQL and MariaDB servers the
# backend tests and benchmarks use, then waits until both answer over TCP:
#   - PostgreSQL: listens on 127.0.0.1:5432, trusts every role connecting from 127.0.0.1
#     (the tests connect as `postgres`, a superuser, and make a database per server);
#   - MariaDB: listens on 127.0.0.1:3306, `root` has no password over TCP;
#   - both have a database `test`, and max_connections=500 (every cetera a test starts keeps
#     up to 16 connections).
# For a developer or CI machine only: nothing here is safe on a host others can reach.
# Idempotent: what is installed, configured or running is left as it is (well under a
# second when both already run). Needs root (or sudo) for the first install.
set -euo pipefail

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

reachable() { timeout 2 bash -c "</dev/tcp/127.0.0.1/$1" 2>/dev/null; }

wait_for_port() {
    local name=$1 port=$2
    for _ in $(seq 1 300); do
        if reachable "$port"; then return 0; fi
        sleep 0.1
    done
    echo "error: $name did not start listening on 127.0.0.1:$port within 30 s" >&2
    return 1
}

install_packages() {
    local packages=()
    [[ -x /usr/bin/pg_ctlcluster && -n "$(ls /usr/lib/postgresql 2>/dev/null)" ]] || packages+=(postgresql)
    [[ -x /usr/sbin/mariadbd ]] || packages+=(mariadb-server)
    [[ ${#packages[@]} -gt 0 ]] || return 0
    echo "installing Debian packages: ${packages[*]}" >&2
    $SUDO apt-get update -qq
    # No init system runs the packages' services here; this script starts them below.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${packages[@]}" >/dev/null
}

# --- PostgreSQL ----------------------------------------------------------------------

configure_postgres() {
    local version=$1
    local etc=/etc/postgresql/$version/main
    if [[ ! -d $etc ]]; then
        $SUDO pg_createcluster "$version" main >/dev/null
    fi
    $SUDO mkdir -p "$etc/conf.d"
    $SUDO tee "$etc/conf.d/cetera-tests.conf" >/dev/null <<'EOF'
# Written by cetera's scripts/start-databases.sh.
listen_addresses = '127.0.0.1'
max_connections = 500
EOF
    # The first matching pg_hba line wins: put ours first, once.
    local hba=$etc/pg_hba.conf marker='# cetera tests: trust 127.0.0.1'
    if ! grep -qF "$marker" "$hba"; then
        { printf '%s\nhost all all 127.0.0.1/32 trust\n' "$marker"; cat "$hba"; } | $SUDO tee "$hba.new" >/dev/null
        $SUDO mv "$hba.new" "$hba"
        $SUDO chown postgres:postgres "$hba"
        # A running server only rereads pg_hba.conf when told.
        $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main reload 2>/dev/null || true
    fi
}

start_postgres() {
    local version
    version=$(ls /usr/lib/postgresql | sort -V | tail -n1)
    configure_postgres "$version"
    if ! reachable 5432; then
        # Status 2 is "already running" (on another address, say): fine.
        local rc=0
        $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start || rc=$?
        if [[ $rc -ne 0 && $rc -ne 2 ]]; then
            echo "error: PostgreSQL $version did not start (status $rc)" >&2
            return 1
        fi
    fi
    wait_for_port PostgreSQL 5432
    if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
        psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test'
    fi
}

# --- MariaDB -------------------------------------------------------------------------

start_mariadb() {
    $SUDO tee /etc/mysql/mariadb.conf.d/99-cetera-tests.cnf >/dev/null <<'EOF'
# Written by cetera's scripts/start-databases.sh.
[mysqld]
bind-address = 127.0.0.1
max_connections = 500
EOF
    if ! reachable 3306; then
        $SUDO mkdir -p /run/mysqld
        $SUDO chown mysql:mysql /run/mysqld
        $SUDO start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    fi
    wait_for_port MariaDB 3306
    # The socket appears once the server accepts logins; root logs in over it by unix_socket.
    for _ in $(seq 1 100); do
        [[ -S /run/mysqld/mysqld.sock ]] && break
        sleep 0.1
    done
    # root without a password over TCP (127.0.0.1 is resolved to localhost unless
    # skip-name-resolve is on, so both), keeping unix_socket login for the local root.
    $SUDO mariadb --protocol=socket -u root <<'EOF'
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS test;
EOF
}

install_packages
start_postgres
start_mariadb
echo "PostgreSQL: postgres://postgres@127.0.0.1:5432/test"
echo "MariaDB:    mysql://root@127.0.0.1:3306/test"
