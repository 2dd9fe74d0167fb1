#!/usr/bin/env bash
# Builds the reference servers cetera is tested and measured against, from the Go module
# proxy, into tools/reference/bin (git-ignored):
#   etcd        etcd, etcdctl, etcdutl 3.7.3          (the second differential oracle, a peer)
#   kine        kine v0.17.5                           (a benchmark peer)
#   kwok        kwok v0.8.0                            (fake nodes for the control-plane test)
#   kubernetes  kube-apiserver, kube-controller-manager, kube-scheduler, kubectl v1.37.2
# Each is a Go module of its own beside this script (go.mod and go.sum pin every version);
# the binaries are its `tool` dependencies. Usage: build.sh [PRODUCT...] (default: all).
# A product is rebuilt only when its go.mod, go.sum or build flags change (a stamp file in
# bin/ holds their hash), so a second run takes a second. Tests and benchmarks find the
# binaries through CETERA_ETCD37_BIN, CETERA_ETCDCTL37_BIN, CETERA_ETCDUTL37_BIN,
# CETERA_KINE_BIN, CETERA_KWOK_BIN and CETERA_KUBE_BIN_DIR, which default to this folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin
mkdir -p "$bin"

# kine's own release build (scripts/build in its module): the cgo SQLite driver with these
# options and tags, the version stamped in.
KINE_CGO_CFLAGS="-DSQLITE_DEFAULT_MEMSTATUS=0 -DSQLITE_DISABLE_INTRINSIC -DSQLITE_ENABLE_COLUMN_METADATA -DSQLITE_ENABLE_DBPAGE_VTAB -DSQLITE_ENABLE_DBSTAT_VTAB -DSQLITE_ENABLE_MATH_FUNCTIONS -DSQLITE_ENABLE_MEMORY_MANAGEMENT -DSQLITE_ENABLE_OFFSET_SQL_FUNC -DSQLITE_ENABLE_PREUPDATE_HOOK -DSQLITE_ENABLE_RBU -DSQLITE_ENABLE_RTREE -DSQLITE_ENABLE_SESSION -DSQLITE_ENABLE_SNAPSHOT -DSQLITE_ENABLE_STAT4 -DSQLITE_ENABLE_UNLOCK_NOTIFY -DSQLITE_LIKE_DOESNT_MATCH_BLOBS -DSQLITE_THREADSAFE=1 -DSQLITE_WITHOUT_ZONEMALLOC"
KINE_TAGS="nats,sqlite_unlock_notify,sqlite_vtable,sqlite_stat4,sqlite_preupdate_hook,sqlite_math_functions,sqlite_dbstat,sqlite_column_metadata"
KINE_LDFLAGS="-X github.com/k3s-io/kine/pkg/version.Version=v0.17.5 -X github.com/k3s-io/kine/pkg/version.GitCommit=v0.17.5"
# Without the stamp Kubernetes reports v0.0.0-master, which its own version checks refuse.
KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean"

# build PRODUCT FLAGS_ARRAY BINARY=PACKAGE...: go build each package of the product's module
# with the go build flags in the array named FLAGS_ARRAY.
build() {
    local product=$1
    local -n flags=$2
    shift 2
    local stamp=$bin/.$product.stamp hash
    hash=$(cat "$here/$product/go.mod" "$here/$product/go.sum" <(echo "${flags[@]}" "$@") | sha256sum | cut -d' ' -f1)
    local missing=0 pair
    for pair in "$@"; do [[ -x $bin/${pair%%=*} ]] || missing=1; done
    if [[ $missing == 0 && -f $stamp && $(cat "$stamp") == "$hash" ]]; then
        return 0
    fi
    echo "building $product (Go module tools/reference/$product)" >&2
    local start=$SECONDS
    for pair in "$@"; do
        (cd "$here/$product" && go build -trimpath "${flags[@]}" -o "$bin/${pair%%=*}" "${pair#*=}")
    done
    echo "$hash" >"$stamp"
    echo "built $product in $((SECONDS - start)) s" >&2
}

no_flags=()
kine_flags=(-tags "$KINE_TAGS" -ldflags "$KINE_LDFLAGS")
kube_flags=(-ldflags "$KUBE_LDFLAGS")

products=("$@")
[[ ${#products[@]} -gt 0 ]] || products=(etcd kine kwok kubernetes)
for product in "${products[@]}"; do
    case $product in
    etcd)
        build etcd no_flags etcd=go.etcd.io/etcd/server/v3 etcdctl=go.etcd.io/etcd/etcdctl/v3 \
            etcdutl=go.etcd.io/etcd/etcdutl/v3
        ;;
    kine)
        CGO_ENABLED=1 CGO_CFLAGS=$KINE_CGO_CFLAGS \
            build kine kine_flags kine=github.com/k3s-io/kine
        ;;
    kwok)
        build kwok no_flags kwok=sigs.k8s.io/kwok/cmd/kwok
        ;;
    kubernetes)
        build kubernetes kube_flags \
            kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
            kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
            kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
            kubectl=k8s.io/kubernetes/cmd/kubectl
        ;;
    *)
        echo "unknown product '$product' (etcd, kine, kwok or kubernetes)" >&2
        exit 2
        ;;
    esac
done
