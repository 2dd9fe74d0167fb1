#!/usr/bin/env bash
# A real Kubernetes control plane on cetera (or, as the baseline, on etcd 3.7.3 or kine):
# kube-apiserver, kube-controller-manager and kube-scheduler v1.37.2 and KWOK v0.8.0 (fake
# nodes, pods made Running without a kubelet), all on this machine, under the workload of a
# k3s user, checked for convergence. Every process and file lives in a temp dir that goes
# away at the end (--keep keeps it); the script ends every process it started.
#
# The datastore:
#   cetera (default): --backend sqlite (a file in the temp dir) or postgres (a fresh database
#     on CETERA_TEST_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432); --members 3
#     runs a 3-member replicated cluster (SQLite, Raft; README "Replicated mode").
#   etcd: etcd 3.7.3, one member.   kine: kine v0.17.5 on --backend sqlite or postgres.
# The apiserver: self-signed serving certs (--cert-dir), service-account keys made with
# openssl, a token file (admin, controller manager, scheduler), RBAC,
# --etcd-compaction-interval 30s, --etcd-servers naming every member.
#
# The workload (each kubectl call retried until it succeeds, so the outcome is exact):
#   - 3 fake nodes managed by KWOK (node leases renewing); namespaces app-1, app-2, watched;
#   - Deployments web and api in app-1 and app-2: created at 2 replicas, scaled to 8, a
#     rollout of web (a new ReplicaSet), scaled down to 3: ReplicaSets and Pods made by the
#     controller manager, bound by the scheduler, Running through KWOK;
#   - a CRD (widgets.cetera.test) and 30 widgets, half of them updated;
#   - ConfigMap churn in `watched` and Secret churn in app-1: 20 of each written in every one
#     of 12 rounds (one round every 2 s), then 5 of each deleted;
#   - `kubectl get -w` watches on the ConfigMaps (events recorded) and on all Pods, open
#     from before the first write to the end;
#   - in round 5, the datastore killed with SIGKILL and restarted on its data (the cluster:
#     its leader killed and restarted), unless --no-restart.
# The checks (any failure: exit 1):
#   - every Pod bound to a node and Running, 12 of them; the Deployments ready at 3;
#     6 ReplicaSets; 15 ConfigMaps, 15 Secrets, 30 widgets; 3 namespaces;
#   - a paginated list (--chunk-size 7) names exactly what the full list names;
#   - the ConfigMap watch saw every write of every ConfigMap in order, no gap and no repeat
#     (ADDED 1, MODIFIED 2..12, DELETED), and both watches are still open at the end;
#   - every node lease renewed after the restart; the apiserver compacted (the version of
#     compact_rev_key went up);
#   - the apiserver's /readyz ok; its etcd_request_errors_total did not grow after the
#     restart window; no error line in the datastore's log; every process still alive.
#
# Usage: scripts/k8s-control-plane.sh [--datastore cetera|etcd|kine] [--backend sqlite|postgres]
#                                     [--members 1|3] [--no-restart] [--metrics-out FILE]
#                                     [--keep]
#   --metrics-out FILE  write the apiserver's /metrics at the start and at the end of the
#                       workload, and the datastore's CPU time and bytes written over it,
#                       as JSON (scripts/k8s-latency.sh reads it)
# Env: CETERA_BIN (default: target/release/cetera, built if missing), CETERA_KUBE_BIN_DIR
#      (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl),
#      CETERA_ETCD37_BIN, CETERA_ETCDCTL37_BIN, CETERA_KINE_BIN, CETERA_KWOK_BIN (default:
#      tools/reference/bin, made by tools/reference/build.sh), CETERA_TEST_POSTGRES_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DATASTORE=cetera
BACKEND=sqlite
MEMBERS=1
RESTART=1
METRICS_OUT=""
KEEP=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --datastore) DATASTORE=$2; shift ;;
        --backend) BACKEND=$2; shift ;;
        --members) MEMBERS=$2; shift ;;
        --no-restart) RESTART=0 ;;
        --metrics-out) METRICS_OUT=$(realpath -m "$2"); shift ;;
        --keep) KEEP=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case $DATASTORE/$BACKEND/$MEMBERS in
    cetera/sqlite/1 | cetera/postgres/1 | cetera/sqlite/3 | etcd/sqlite/1 | kine/sqlite/1 | kine/postgres/1) ;;
    *) echo "unsupported: --datastore $DATASTORE --backend $BACKEND --members $MEMBERS" >&2; exit 2 ;;
esac
LABEL=$DATASTORE-$BACKEND$([[ $MEMBERS == 3 ]] && echo -3members || true)
[[ $DATASTORE == etcd ]] && LABEL=etcd-3.7.3

REF=$ROOT/tools/reference/bin
KUBE=${CETERA_KUBE_BIN_DIR:-$REF}
ETCD=${CETERA_ETCD37_BIN:-$REF/etcd}
ETCDCTL=${CETERA_ETCDCTL37_BIN:-$REF/etcdctl}
KINE=${CETERA_KINE_BIN:-$REF/kine}
KWOK=${CETERA_KWOK_BIN:-$REF/kwok}
PG_URL=${CETERA_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432}
for b in "$KUBE/kube-apiserver" "$KUBE/kube-controller-manager" "$KUBE/kube-scheduler" \
    "$KUBE/kubectl" "$KWOK" "$ETCDCTL"; do
    if [[ ! -x $b ]]; then
        echo "missing $b: run tools/reference/build.sh" >&2
        exit 1
    fi
done
if [[ $DATASTORE == cetera ]]; then
    CETERA=${CETERA_BIN:-$ROOT/target/release/cetera}
    if [[ -z ${CETERA_BIN:-} ]]; then
        cargo build --release --quiet --bin cetera
    fi
fi

log() { echo "[k8s-control-plane $LABEL $(date -u +%H:%M:%S)] $*" >&2; }
FAILED=0
fail() { log "CHECK FAILED: $*"; FAILED=1; }
ok() { log "ok: $*"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/k8s-control-plane.XXXXXX")
PIDS=()
cleanup() {
    local rc=$? p
    for p in "${PIDS[@]}" "${DS_PIDS[@]}"; do
        [[ -n $p ]] && kill "$p" 2>/dev/null || true
    done
    # What has not ended 15 s after SIGTERM gets SIGKILL.
    for _ in $(seq 30); do
        jobs -r | grep -q . || break
        sleep 0.5
    done
    for p in $(jobs -pr); do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ -n ${PG_DB:-} ]]; then
        psql -q "$PG_URL/postgres" -c "DROP DATABASE IF EXISTS $PG_DB" >/dev/null 2>&1 || true
    fi
    if [[ $KEEP == 1 || $rc != 0 ]]; then
        log "files kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---------------------------------------------------------------------------------
# The datastore
# ---------------------------------------------------------------------------------
DS_PIDS=() DS_URLS=() DS_PEERS=() DS_CMDS=()
PG_DB=""
if [[ $BACKEND == postgres ]]; then
    PG_DB=k8scp_$(date +%s)_$$
fi
for ((i = 0; i < MEMBERS; i++)); do
    DS_URLS[i]=http://127.0.0.1:$(free_port)
    DS_PEERS[i]=$(free_port)
    mkdir -p "$WORK/ds$i"
done
ETCD_SERVERS=$(IFS=,; echo "${DS_URLS[*]}")

# start_member I: starts (or restarts on its data) datastore member I.
start_member() {
    local i=$1 addr=${DS_URLS[$1]#http://} dir=$WORK/ds$1
    case $DATASTORE in
    cetera)
        local endpoint=sqlite://$dir/state.db role=()
        [[ $BACKEND == postgres ]] && endpoint="$PG_URL/$PG_DB?sslmode=disable"
        if [[ $MEMBERS == 3 ]]; then
            role=(--cluster-init)
            [[ $i == 0 ]] || role=(--join "http://127.0.0.1:${DS_PEERS[0]}")
            role+=(--name "n$i" --peer-listen-address "127.0.0.1:${DS_PEERS[i]}" --token k8s-cp)
        fi
        "$CETERA" --listen-address "$addr" --endpoint "$endpoint" "${role[@]}" \
            >>"$dir/server.log" 2>&1 &
        ;;
    etcd)
        "$ETCD" --name default --data-dir "$dir/data" \
            --listen-client-urls "${DS_URLS[i]}" --advertise-client-urls "${DS_URLS[i]}" \
            --listen-peer-urls "http://127.0.0.1:${DS_PEERS[i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${DS_PEERS[i]}" \
            --initial-cluster "default=http://127.0.0.1:${DS_PEERS[i]}" \
            --log-level warn >>"$dir/server.log" 2>&1 &
        ;;
    kine)
        local endpoint="sqlite://$dir/state.db?_journal=WAL&cache=shared&_busy_timeout=30000"
        [[ $BACKEND == postgres ]] && endpoint="$PG_URL/$PG_DB?sslmode=disable"
        "$KINE" --listen-address "$addr" --endpoint "$endpoint" --metrics-bind-address 0 \
            >>"$dir/server.log" 2>&1 &
        ;;
    esac
    DS_PIDS[i]=$!
}

# wait_member I: waits (60 s at most) until member I answers a linearizable read.
wait_member() {
    local deadline=$((SECONDS + 60))
    until "$ETCDCTL" --endpoints "${DS_URLS[$1]}" --command-timeout 2s get /probe >/dev/null 2>&1; do
        if ((SECONDS > deadline)) || ! kill -0 "${DS_PIDS[$1]}" 2>/dev/null; then
            log "datastore member $1 did not start; its log:"
            tail -50 "$WORK/ds$1/server.log" >&2
            exit 1
        fi
        sleep 0.2
    done
}

# leader_index: the index of the member that leads (0 for a single server).
leader_index() {
    local i status leader
    [[ $MEMBERS == 1 ]] && { echo 0; return; }
    for ((i = 0; i < MEMBERS; i++)); do
        status=$("$ETCDCTL" --endpoints "${DS_URLS[i]}" endpoint status -w json 2>/dev/null) || continue
        leader=$(jq -r '.[0].Status.leader' <<<"$status")
        if [[ $leader == "$(jq -r '.[0].Status.header.member_id' <<<"$status")" ]]; then
            echo "$i"
            return
        fi
    done
    echo 0
}

log "starting $DATASTORE ($BACKEND, $MEMBERS member(s)) in $WORK"
for ((i = 0; i < MEMBERS; i++)); do
    start_member "$i"
    wait_member "$i"
done
DS_LOG_MARK=()

# ---------------------------------------------------------------------------------
# The control plane
# ---------------------------------------------------------------------------------
mkdir -p "$WORK/pki"
# A CA, the apiserver's serving certificate from it, and the service-account key pair.
(
    cd "$WORK/pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
        -subj /CN=k8s-control-plane-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
        -subj /CN=kube-apiserver 2>/dev/null
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc" \
        "basicConstraints=CA:FALSE" "extendedKeyUsage=serverAuth" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -extfile apiserver.ext -out apiserver.crt 2>/dev/null
)
openssl genrsa -out "$WORK/pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$WORK/pki/sa.key" -pubout -out "$WORK/pki/sa.pub" 2>/dev/null
ADMIN_TOKEN=$(openssl rand -hex 16)
KCM_TOKEN=$(openssl rand -hex 16)
SCHED_TOKEN=$(openssl rand -hex 16)
cat >"$WORK/pki/tokens.csv" <<EOF
$ADMIN_TOKEN,admin,admin,"system:masters"
$KCM_TOKEN,system:kube-controller-manager,kcm
$SCHED_TOKEN,system:kube-scheduler,scheduler
EOF
APORT=$(free_port)
API=https://127.0.0.1:$APORT
kubeconfig() {
    cat >"$WORK/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cetera
  cluster: {server: "$API", certificate-authority: "$WORK/pki/ca.crt"}
users:
- name: $1
  user: {token: "$2"}
contexts:
- name: default
  context: {cluster: cetera, user: $1}
current-context: default
EOF
}
kubeconfig admin "$ADMIN_TOKEN"
kubeconfig kcm "$KCM_TOKEN"
kubeconfig scheduler "$SCHED_TOKEN"
export KUBECONFIG=$WORK/admin.kubeconfig
k() { "$KUBE/kubectl" --request-timeout 20s "$@"; }
# retry CMD...: runs CMD until it succeeds (3 minutes at most; the restart window's errors).
retry() {
    local deadline=$((SECONDS + 180))
    until "$@" >>"$WORK/retries.log" 2>&1; do
        if ((SECONDS > deadline)); then
            log "gave up after 3 minutes: $*"
            tail -20 "$WORK/retries.log" >&2
            return 1
        fi
        echo "retry: $*" >>"$WORK/retries.log"
        sleep 1
    done
}
raw() { curl -s --cacert "$WORK/pki/ca.crt" --max-time 10 -H "Authorization: Bearer $ADMIN_TOKEN" "$API$1"; }

log "starting kube-apiserver on $API (--etcd-servers $ETCD_SERVERS)"
"$KUBE/kube-apiserver" --etcd-servers "$ETCD_SERVERS" --etcd-compaction-interval 30s \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APORT" \
    --tls-cert-file "$WORK/pki/apiserver.crt" --tls-private-key-file "$WORK/pki/apiserver.key" \
    --client-ca-file "$WORK/pki/ca.crt" --token-auth-file "$WORK/pki/tokens.csv" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$WORK/pki/sa.pub" \
    --service-account-signing-key-file "$WORK/pki/sa.key" \
    --authorization-mode RBAC --service-cluster-ip-range 10.0.0.0/24 \
    --endpoint-reconciler-type none --allow-privileged \
    >"$WORK/kube-apiserver.log" 2>&1 &
APISERVER_PID=$!
PIDS+=("$APISERVER_PID")
deadline=$((SECONDS + 120))
until [[ $(raw /readyz) == ok ]]; do
    if ((SECONDS > deadline)) || ! kill -0 "$APISERVER_PID" 2>/dev/null; then
        log "kube-apiserver did not get ready; its log:"
        tail -40 "$WORK/kube-apiserver.log" >&2
        exit 1
    fi
    sleep 1
done
log "kube-apiserver ready"

"$KUBE/kube-controller-manager" --kubeconfig "$WORK/kcm.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --service-account-private-key-file "$WORK/pki/sa.key" \
    --root-ca-file "$WORK/pki/ca.crt" --use-service-account-credentials \
    >"$WORK/kube-controller-manager.log" 2>&1 &
PIDS+=($!)
KCM_PID=$!
"$KUBE/kube-scheduler" --kubeconfig "$WORK/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    >"$WORK/kube-scheduler.log" 2>&1 &
PIDS+=($!)
SCHED_PID=$!
# KWOK's "fast" stages (from its module): nodes Ready at once, their leases renewed, pods
# Running once bound, deleted pods removed.
STAGES=$(cd tools/reference/kwok && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
"$KWOK" --kubeconfig "$WORK/admin.kubeconfig" --manage-all-nodes=false \
    -c "$STAGES/node/fast/node-initialize.yaml" \
    -c "$STAGES/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
    -c "$STAGES/pod/fast/pod-ready.yaml" -c "$STAGES/pod/fast/pod-complete.yaml" \
    -c "$STAGES/pod/fast/pod-delete.yaml" \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds 40 --cidr 10.1.0.0/16 --node-ip 10.1.0.1 \
    --server-address "127.0.0.1:$(free_port)" \
    >"$WORK/kwok.log" 2>&1 &
PIDS+=($!)
KWOK_PID=$!

for n in 1 2 3; do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$n
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {kubernetes.io/hostname: kwok-node-$n, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
EOF
done >"$WORK/nodes.yaml"
retry k apply -f "$WORK/nodes.yaml"
deadline=$((SECONDS + 120))
until [[ $(k get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c True) == 3 ]]; do
    if ((SECONDS > deadline)); then
        log "the KWOK nodes did not get Ready"
        tail -20 "$WORK/kwok.log" >&2
        exit 1
    fi
    sleep 1
done
log "3 KWOK nodes Ready"

# ---------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------
metrics() { raw /metrics; }
if [[ -n $METRICS_OUT ]]; then
    metrics >"$WORK/metrics-start.txt"
fi
ds_counter() { # ds_counter utime+stime|write_bytes: summed over the datastore's processes
    local p s=0
    for p in "${DS_PIDS[@]}"; do
        if [[ $1 == cpu ]]; then
            s=$((s + $(awk '{ print $14 + $15 }' "/proc/$p/stat")))
        else
            s=$((s + $(awk '$1 == "write_bytes:" { print $2 }' "/proc/$p/io")))
        fi
    done
    echo $s
}
DS_CPU0=$(ds_counter cpu)
DS_IO0=$(ds_counter io)
START=$SECONDS

cat >"$WORK/namespaces.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: watched, labels: {cetera-test: "1"}}
---
apiVersion: v1
kind: Namespace
metadata: {name: app-1, labels: {cetera-test: "1"}}
---
apiVersion: v1
kind: Namespace
metadata: {name: app-2, labels: {cetera-test: "1"}}
EOF
retry k apply -f "$WORK/namespaces.yaml"

# The watches, open from before the first write to the end.
"$KUBE/kubectl" get configmaps -n watched -w --output-watch-events -o json \
    >"$WORK/watch-configmaps.json" 2>"$WORK/watch-configmaps.err" &
WATCH_CM_PID=$!
PIDS+=("$WATCH_CM_PID")
"$KUBE/kubectl" get pods -A -w --output-watch-events -o name \
    >"$WORK/watch-pods.txt" 2>"$WORK/watch-pods.err" &
WATCH_PODS_PID=$!
PIDS+=("$WATCH_PODS_PID")

cat >"$WORK/crd.yaml" <<EOF
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.cetera.test}
spec:
  group: cetera.test
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
EOF
retry k apply -f "$WORK/crd.yaml"
retry k wait --for condition=Established --timeout 60s crd/widgets.cetera.test

deployment() { # deployment NAMESPACE NAME REPLICAS REVISION
    cat <<EOF
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: $2, namespace: $1, labels: {app: $2}}
spec:
  replicas: $3
  selector: {matchLabels: {app: $2}}
  template:
    metadata: {labels: {app: $2}}
    spec:
      containers:
      - name: app
        image: registry.invalid/$2:1
        env: [{name: REVISION, value: "$4"}]
        resources: {requests: {cpu: 10m, memory: 16Mi}}
EOF
}
deployments() { # deployments REPLICAS WEB_REVISION
    local ns
    for ns in app-1 app-2; do
        deployment "$ns" web "$1" "$2"
        deployment "$ns" api "$1" 1
    done
}
deployments 2 1 >"$WORK/deploy-2.yaml"
retry k apply -f "$WORK/deploy-2.yaml"

for i in $(seq 1 30); do
    printf -- '---\napiVersion: cetera.test/v1\nkind: Widget\nmetadata: {name: widget-%d, namespace: app-1}\nspec: {size: %d}\n' "$i" "$i"
done >"$WORK/widgets.yaml"
retry k apply -f "$WORK/widgets.yaml"

# churn_round R: writes ConfigMaps cm-1..20 in `watched` and Secrets sec-1..20 in app-1
# with value R.
churn_round() {
    local r=$1 i
    for i in $(seq 1 20); do
        printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm-%d, namespace: watched}\ndata: {v: "%d"}\n' "$i" "$r"
        printf -- '---\napiVersion: v1\nkind: Secret\nmetadata: {name: sec-%d, namespace: app-1}\nstringData: {v: "%d"}\n' "$i" "$r"
    done >"$WORK/churn-$r.yaml"
    retry k apply -f "$WORK/churn-$r.yaml"
}
ROUNDS=12
RESTART_ROUND=5
churn() {
    local r next=$SECONDS
    for r in $(seq 1 $ROUNDS); do
        while ((SECONDS < next)); do sleep 0.2; done
        next=$((next + 2))
        churn_round "$r" || return 1
        echo "$r" >"$WORK/churn-done"
    done
}
: >"$WORK/churn-done"
churn &
CHURN_PID=$!
PIDS+=("$CHURN_PID")

log "scaling the Deployments to 8"
deployments 8 1 >"$WORK/deploy-8.yaml"
retry k apply -f "$WORK/deploy-8.yaml"

RESTART_AT=""
if [[ $RESTART == 1 ]]; then
    until [[ $(cat "$WORK/churn-done") -ge $RESTART_ROUND ]]; do sleep 0.2; done
    victim=$(leader_index)
    INITS_MARK=$(metrics | awk '/^apiserver_watch_cache_initializations_total/ { s += $NF } END { print s + 0 }')
    log "killing datastore member $victim (SIGKILL) under load"
    RESTART_AT=$SECONDS
    kill -9 "${DS_PIDS[victim]}"
    wait "${DS_PIDS[victim]}" 2>/dev/null || true
    sleep 2
    start_member "$victim"
    wait_member "$victim"
    log "datastore member $victim back after $((SECONDS - RESTART_AT)) s"
    deadline=$((SECONDS + 60))
    until [[ $(raw /readyz) == ok ]]; do
        if ((SECONDS > deadline)); then
            fail "apiserver /readyz not ok 60 s after the restart: $(raw '/readyz?verbose' | grep -v '\[+\]')"
            break
        fi
        sleep 1
    done
    log "apiserver ready again $((SECONDS - RESTART_AT)) s after the kill"
fi

# rollouts: waits until the 4 Deployments have rolled out.
rollouts() {
    local ns d
    for ns in app-1 app-2; do
        for d in web api; do
            retry k rollout status -n "$ns" "deployment/$d" --timeout 120s
        done
    done
}
# The first ReplicaSets exist before the rollout (else the rollout could make the only one).
rollouts
log "rollout of web (a new ReplicaSet), then scaling down to 3"
deployments 8 2 >"$WORK/deploy-8b.yaml"
retry k apply -f "$WORK/deploy-8b.yaml"
for ns in app-1 app-2; do
    retry k rollout status -n "$ns" deployment/web --timeout 120s
done
deployments 3 2 >"$WORK/deploy-3.yaml"
retry k apply -f "$WORK/deploy-3.yaml"
for i in $(seq 1 15); do
    retry k patch -n app-1 widget "widget-$i" --type merge -p "{\"spec\":{\"size\":$((i + 100))}}"
done

if ! wait "$CHURN_PID"; then
    fail "the ConfigMap/Secret churn did not finish"
fi
retry k delete -n watched configmap cm-16 cm-17 cm-18 cm-19 cm-20
retry k delete -n app-1 secret sec-16 sec-17 sec-18 sec-19 sec-20
STORAGE_ERRORS_MARK=$(metrics | awk '/^etcd_request_errors_total/ { s += $NF } END { print s + 0 }')
LEASES_MARK=$(k get leases -n kube-node-lease -o jsonpath='{range .items[*]}{.metadata.name}={.spec.renewTime}{"\n"}{end}')

log "waiting for the Deployments to converge"
rollouts
deadline=$((SECONDS + 120))
while :; do
    pods=$(k get pods -n app-1 -o json 2>/dev/null; k get pods -n app-2 -o json 2>/dev/null)
    total=$(jq -s '[.[].items[]] | length' <<<"$pods")
    running=$(jq -s '[.[].items[] | select(.spec.nodeName != null and .status.phase == "Running" and .metadata.deletionTimestamp == null)] | length' <<<"$pods")
    [[ $total == 12 && $running == 12 ]] && break
    if ((SECONDS > deadline)); then
        break
    fi
    sleep 2
done
if [[ -n $METRICS_OUT ]]; then
    metrics >"$WORK/metrics-end.txt"
    DS_CPU1=$(ds_counter cpu)
    DS_IO1=$(ds_counter io)
    jq -n --arg name "$LABEL" --rawfile start "$WORK/metrics-start.txt" \
        --rawfile finish "$WORK/metrics-end.txt" --argjson secs $((SECONDS - START)) \
        --argjson cpu_ticks $((DS_CPU1 - DS_CPU0)) --argjson hz "$(getconf CLK_TCK)" \
        --argjson write_bytes $((DS_IO1 - DS_IO0)) \
        '{label: $name, seconds: $secs, datastore_cpu_s: ($cpu_ticks / $hz),
          datastore_write_bytes: $write_bytes, metrics_start: $start, metrics_end: $finish}' \
        >"$METRICS_OUT"
fi
# The node leases renew every 10 s (a quarter of their 40 s): wait for one renewal.
sleep 12

# ---------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------
log "checking (workload took $((SECONDS - START)) s)"
if [[ $total == 12 && $running == 12 ]]; then
    ok "12 Pods, every one bound to a KWOK node and Running"
else
    fail "$running of $total Pods bound and Running (want 12 of 12)"
    jq -s -r '.[].items[] | "\(.metadata.namespace)/\(.metadata.name) node=\(.spec.nodeName) phase=\(.status.phase)"' <<<"$pods" >&2
fi
unbound=$(k get pods -A -o json | jq '[.items[] | select(.spec.nodeName == null)] | length')
[[ $unbound == 0 ]] && ok "no Pod left unbound" || fail "$unbound Pods unbound"

# count WHAT WANT [kubectl get args...]
count() {
    local what=$1 want=$2 got
    shift 2
    got=$(k get "$@" -o name | wc -l)
    [[ $got == "$want" ]] && ok "$got $what" || fail "$got $what (want $want)"
}
count "test namespaces" 3 namespaces -l cetera-test=1
count "Deployments" 4 deployments -A -l 'app in (web,api)'
count "ReplicaSets (2 rollouts of web)" 6 replicasets -A -l 'app in (web,api)'
count "ConfigMaps cm-*" 15 configmaps -n watched --field-selector metadata.name!=kube-root-ca.crt
count "Secrets (opaque) in app-1" 15 secrets -n app-1 --field-selector type=Opaque
count "widgets" 30 widgets.cetera.test -n app-1
ready=$(k get deployments -A -l 'app in (web,api)' -o json | jq '[.items[] | select(.status.readyReplicas == 3 and .status.updatedReplicas == 3 and .status.replicas == 3)] | length')
[[ $ready == 4 ]] && ok "4 Deployments ready at 3 replicas" || fail "$ready of 4 Deployments ready at 3 replicas"
sizes=$(k get widgets.cetera.test -n app-1 -o json | jq '[.items[] | select(.spec.size > 100)] | length')
[[ $sizes == 15 ]] && ok "15 widgets updated" || fail "$sizes widgets updated (want 15)"
cmvals=$(k get configmaps -n watched -o json | jq -r '[.items[] | select(.metadata.name | startswith("cm-")) | .data.v] | unique | join(",")')
[[ $cmvals == "$ROUNDS" ]] && ok "every ConfigMap holds the last round's value" || fail "ConfigMap values $cmvals (want $ROUNDS)"

for kind in pods configmaps secrets replicasets widgets.cetera.test leases events; do
    full=$(k get "$kind" -A --chunk-size 0 -o name | sort)
    paged=$(k get "$kind" -A --chunk-size 7 -o name | sort)
    if [[ $full == "$paged" ]]; then
        ok "paginated list of $kind (chunks of 7) = full list ($(wc -l <<<"$full") objects)"
    else
        fail "paginated list of $kind differs from the full list: $(diff <(echo "$full") <(echo "$paged") | head -5)"
    fi
done
# A raw paginated list walked page by page with continue tokens.
cont="" pages=0 names=0
while :; do
    page=$(raw "/api/v1/namespaces/app-1/secrets?limit=4${cont:+&continue=$cont}")
    names=$((names + $(jq '.items | length' <<<"$page")))
    pages=$((pages + 1))
    cont=$(jq -r '.metadata.continue // ""' <<<"$page")
    [[ -n $cont ]] || break
done
all=$(raw /api/v1/namespaces/app-1/secrets | jq '.items | length')
[[ $names == "$all" && $pages -ge 4 ]] && ok "raw list of app-1's Secrets in $pages pages of 4 = $all" ||
    fail "raw paginated list: $names in $pages pages, full list $all"

# The ConfigMap watch: per ConfigMap, the events in order.
if jq -r 'select(.object.metadata.name | startswith("cm-")) | "\(.object.metadata.name) \(.type) \(.object.data.v)"' \
    "$WORK/watch-configmaps.json" >"$WORK/watch-configmaps.txt" 2>"$WORK/watch-parse.err"; then
    want="ADDED 1"
    for r in $(seq 2 $ROUNDS); do want+=" MODIFIED $r"; done
    bad=0
    for i in $(seq 1 20); do
        exp=$want
        [[ $i -gt 15 ]] && exp+=" DELETED $ROUNDS"
        got=$(awk -v n="cm-$i" '$1 == n { printf "%s%s %s", sep, $2, $3; sep = " " }' "$WORK/watch-configmaps.txt")
        if [[ $got != "$exp" ]]; then
            bad=$((bad + 1))
            log "cm-$i watched: $got"
        fi
    done
    [[ $bad == 0 ]] && ok "the ConfigMap watch saw every write of the 20 ConfigMaps, in order, no gap or repeat ($(wc -l <"$WORK/watch-configmaps.txt") events)" ||
        fail "the ConfigMap watch missed or repeated events of $bad ConfigMaps"
else
    fail "the ConfigMap watch's output does not parse: $(head -3 "$WORK/watch-parse.err")"
fi
for w in "$WATCH_CM_PID:configmaps" "$WATCH_PODS_PID:pods"; do
    if kill -0 "${w%%:*}" 2>/dev/null; then
        ok "the kubectl watch on ${w#*:} is still open"
    else
        fail "the kubectl watch on ${w#*:} ended: $(tail -3 "$WORK/watch-${w#*:}.err")"
    fi
done
pod_events=$(wc -l <"$WORK/watch-pods.txt")
((pod_events > 40)) && ok "the Pod watch saw $pod_events events" || fail "the Pod watch saw only $pod_events events"

leases_now=$(k get leases -n kube-node-lease -o jsonpath='{range .items[*]}{.metadata.name}={.spec.renewTime}{"\n"}{end}')
renewed=$(comm -13 <(sort <<<"$LEASES_MARK") <(sort <<<"$leases_now") | wc -l)
[[ $renewed == 3 && $(wc -l <<<"$leases_now") == 3 ]] && ok "the 3 node leases renewed after the restart" ||
    fail "$renewed of $(wc -l <<<"$leases_now") node leases renewed: $leases_now"
COMPACT_NOW=$("$ETCDCTL" --endpoints "$ETCD_SERVERS" get compact_rev_key -w json | jq -r '.kvs[0].version // 0')
((COMPACT_NOW >= 2)) && ok "the apiserver compacted $COMPACT_NOW times (compact_rev_key's version)" ||
    fail "the apiserver compacted $COMPACT_NOW times"

if [[ -n ${INITS_MARK:-} ]]; then
    inits=$(metrics | awk '/^apiserver_watch_cache_initializations_total/ { s += $NF } END { print s + 0 }')
    [[ $inits == "$INITS_MARK" ]] && ok "no watch cache reinitialised (relisted) after the restart" ||
        fail "$((inits - INITS_MARK)) watch cache (re)initialisations after the restart: $(metrics | grep '^apiserver_watch_cache_initializations_total' | tr '\n' ' ')"
fi
[[ $(raw /readyz) == ok ]] && ok "apiserver /readyz ok" || fail "apiserver /readyz: $(raw '/readyz?verbose' | grep -v '\[+\]')"
errors_now=$(metrics | awk '/^etcd_request_errors_total/ { s += $NF } END { print s + 0 }')
if [[ $errors_now == "$STORAGE_ERRORS_MARK" ]]; then
    ok "no storage error since the end of the churn (etcd_request_errors_total $errors_now in all)"
else
    fail "etcd_request_errors_total grew from $STORAGE_ERRORS_MARK to $errors_now after the restart window"
    metrics | grep '^etcd_request_errors_total' >&2
fi
for ((i = 0; i < MEMBERS; i++)); do
    case $DATASTORE in
        cetera) pattern=' ERROR |"level":"ERROR"|panicked' ;;
        etcd) pattern='"level":"(error|fatal|panic)"' ;;
        kine) pattern='level=(error|fatal|panic)' ;;
    esac
    # openraft logs a peer that did not answer (the killed member, or a heartbeat late on a
    # loaded machine) at ERROR, where etcd warns: counted and shown, not failed on.
    raft_net='openraft::.*(Unreachable node|NetworkError|timeout after|did not answer|timeout while)'
    grep -E "$pattern" "$WORK/ds$i/server.log" | grep -E "$raft_net" >"$WORK/ds$i/raft-network.txt" || true
    if [[ -s $WORK/ds$i/raft-network.txt ]]; then
        log "note: $(wc -l <"$WORK/ds$i/raft-network.txt") openraft ERROR lines about unreachable or late peers in member $i's log"
    fi
    if grep -E "$pattern" "$WORK/ds$i/server.log" | grep -v -E "$raft_net" >"$WORK/ds$i/errors.txt"; then
        fail "$(wc -l <"$WORK/ds$i/errors.txt") error lines in datastore member $i's log: $(head -3 "$WORK/ds$i/errors.txt")"
    else
        ok "no error in datastore member $i's log"
    fi
done
for p in "$APISERVER_PID:kube-apiserver" "$KCM_PID:kube-controller-manager" \
    "$SCHED_PID:kube-scheduler" "$KWOK_PID:kwok"; do
    kill -0 "${p%%:*}" 2>/dev/null || fail "${p#*:} died: $(tail -3 "$WORK/${p#*:}.log")"
done
for ((i = 0; i < MEMBERS; i++)); do
    kill -0 "${DS_PIDS[i]}" 2>/dev/null || fail "datastore member $i died: $(tail -3 "$WORK/ds$i/server.log")"
done
ok "the control plane's processes and the datastore are alive"
retries=$(grep -c '^retry:' "$WORK/retries.log" 2>/dev/null || true)
log "kubectl calls retried: ${retries:-0}"

if [[ $FAILED == 0 ]]; then
    log "PASS ($((SECONDS - START)) s of workload)"
else
    log "FAIL (files kept in $WORK)"
    KEEP=1
    exit 1
fi
