#!/usr/bin/env bash
# Latency as Kubernetes sees it: scripts/k8s-control-plane.sh's workload (without the
# datastore restart) on each datastore in turn, one after the other so they never share
# the CPUs, reading the apiserver's own histograms over the workload (its /metrics at the
# start and at the end, subtracted):
#   apiserver_request_duration_seconds  per verb (LIST, GET, POST, PUT, PATCH, DELETE; and
#                                        every mutating verb together), p50 and p99;
#   etcd_request_duration_seconds       per operation (the apiserver's storage calls), p50/p99;
# with the datastore's CPU time and bytes written (/proc, summed over its processes; for
# PostgreSQL backends the database server's own work is not counted).
# Quantiles are histogram_quantile's: linear within the histogram's bucket, whose bounds
# are the apiserver's (5 ms, 25 ms, 50 ms, 100 ms, ... for requests; 5 ms, 10 ms, 25 ms, ...
# for storage calls), so small values are interpolated within the first bucket.
#
# Usage: scripts/k8s-latency.sh [--out DIR] [CONFIG...]
#   CONFIG: etcd, kine-sqlite, kine-postgres, cetera-sqlite, cetera-postgres, cetera-3members
#           (default: all six, in that order)
#   --out DIR  where the metrics, the table (latency.md) and failed runs' logs go
#              (default: a new dir under target/k8s-latency/)
# Env: as scripts/k8s-control-plane.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=""
CONFIGS=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
        *) CONFIGS+=("$1") ;;
    esac
    shift
done
[[ ${#CONFIGS[@]} -gt 0 ]] || CONFIGS=(etcd kine-sqlite kine-postgres cetera-sqlite cetera-postgres cetera-3members)
OUT=${OUT:-target/k8s-latency/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")

status=0
files=()
for config in "${CONFIGS[@]}"; do
    case $config in
        etcd) args=(--datastore etcd) ;;
        kine-sqlite) args=(--datastore kine --backend sqlite) ;;
        kine-postgres) args=(--datastore kine --backend postgres) ;;
        cetera-sqlite) args=(--datastore cetera --backend sqlite) ;;
        cetera-postgres) args=(--datastore cetera --backend postgres) ;;
        cetera-3members) args=(--datastore cetera --members 3) ;;
        *) echo "unknown config $config" >&2; exit 2 ;;
    esac
    echo "=== $config" >&2
    if scripts/k8s-control-plane.sh "${args[@]}" --no-restart --metrics-out "$OUT/$config.json" \
        2>&1 | tee "$OUT/$config.log" >&2; then
        files+=("$OUT/$config.json")
    else
        echo "$config failed; its run is in $OUT/$config.log" >&2
        status=1
        [[ -f $OUT/$config.json ]] && files+=("$OUT/$config.json")
    fi
done

python3 - "${files[@]}" >"$OUT/latency.md" <<'EOF'
import json, math, re, sys

LINE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
MUTATING = {"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"}


def buckets(text, metric, key):
    """{group: {le: count}} of a histogram's buckets, grouped by the label `key`."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m or m.group(1) != metric + "_bucket":
            continue
        labels = dict(LABEL.findall(m.group(2)))
        # Requests for resources only: not /readyz, /metrics and the like; not WATCH, whose
        # duration is the watch's setup.
        if metric.startswith("apiserver_") and (labels.get("resource", "") == "" or labels.get(key) == "WATCH"):
            continue
        le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
        for group in (labels.get(key, ""), "mutating" if labels.get(key) in MUTATING else None):
            if group is not None:
                g = out.setdefault(group, {})
                g[le] = g.get(le, 0.0) + float(m.group(3))
    return out


def delta(start, end):
    return {g: {le: n - start.get(g, {}).get(le, 0.0) for le, n in b.items()} for g, b in end.items()}


def quantile(q, b):
    """Prometheus' histogram_quantile over cumulative buckets {le: count}."""
    les = sorted(b)
    total = b[les[-1]]
    if total <= 0:
        return None, 0
    rank = q * total
    prev_le, prev_n = 0.0, 0.0
    for le in les:
        n = b[le]
        if n >= rank:
            if le == math.inf:
                return prev_le, total
            return prev_le + (le - prev_le) * (rank - prev_n) / max(n - prev_n, 1e-12), total
        prev_le, prev_n = le, n
    return les[-2], total


runs = [json.load(open(f)) for f in sys.argv[1:]]
labels = [r["label"] for r in runs]


def table(metric, key, title, order):
    per = [delta(buckets(r["metrics_start"], metric, key), buckets(r["metrics_end"], metric, key)) for r in runs]
    groups = [g for g in order if any(g in p for p in per)]
    groups += sorted({g for p in per for g in p} - set(groups))
    print(f"### {title}\n")
    print("| " + key + " | " + " | ".join(f"{l} p50 ms | {l} p99 ms | {l} n" for l in labels) + " |")
    print("|---" * (1 + 3 * len(labels)) + "|")
    for g in groups:
        cells = []
        for p in per:
            b = p.get(g)
            p50, n = quantile(0.5, b) if b else (None, 0)
            p99, _ = quantile(0.99, b) if b else (None, 0)
            fmt = lambda v: "-" if v is None else f"{v * 1000:.1f}"
            cells.append(f"{fmt(p50)} | {fmt(p99)} | {int(n)}")
        if any(not c.endswith("| 0") for c in cells):
            print(f"| {g} | " + " | ".join(cells) + " |")
    print()


table("apiserver_request_duration_seconds", "verb", "The apiserver's request latency (apiserver_request_duration_seconds)",
      ["mutating", "POST", "PUT", "PATCH", "DELETE", "GET", "LIST"])
table("etcd_request_duration_seconds", "operation", "The apiserver's storage calls (etcd_request_duration_seconds)",
      ["create", "update", "delete", "get", "list", "listWithCount", "count"])
print("### The datastore over the workload\n")
print("| datastore | workload s | CPU s | MB written |")
print("|---|---|---|---|")
for r in runs:
    print(f"| {r['label']} | {r['seconds']} | {r['datastore_cpu_s']:.1f} | {r['datastore_write_bytes'] / 1e6:.1f} |")
EOF
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)" >>"$OUT/latency.md"
cat "$OUT/latency.md"
echo "written to $OUT/latency.md" >&2
exit $status
