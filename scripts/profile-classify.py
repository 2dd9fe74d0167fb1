#!/usr/bin/env python3
"""Sorts the perf samples of scripts/profile-put.sh into buckets, for cetera and etcd.

Usage: scripts/profile-classify.py DIR   (DIR holds SERVER.script and SERVER-cpu.json)

A sample in the kernel goes to the syscall on its kernel stack (`__x64_sys_NAME`),
else to "kernel, other" (interrupts, page faults, the scheduler). A sample in user
space goes to the bucket of the function it was in, by the function's name (Rust
paths, Go packages, C libraries). Each bucket's share of the samples times the
server's CPU µs per put gives its µs per put. Prints a Markdown table.
"""

import json
import os
import re
import sys
from collections import Counter

# (bucket, pattern on "symbol dso") for user-space samples: the first match wins.
USER = [
    ("SQLite", r"^sqlite3|libsqlite"),
    ("bbolt (etcd's B-tree)", r"go\.etcd\.io/bbolt"),
    ("raft, WAL and apply (etcd)", r"go\.etcd\.io/(etcd/)?raft|/wal\.|/wal/|etcdserver\.\(\*raftNode|etcdserver\.\(\*EtcdServer\)\.apply|etcdserver\.\(\*applier"),
    ("mvcc: the index and the store (etcd)", r"/mvcc|btree"),
    ("gRPC and HTTP/2", r"^(h2|hyper|tonic|tower|http|http_body|httparse)::|<(h2|hyper|tonic|tower)::|google\.golang\.org/grpc|golang\.org/x/net/http2"),
    ("protobuf", r"^prost|<prost|cetera_proto|\.Marshal|\.Unmarshal|\.Size\(|gogo/protobuf|google\.golang\.org/protobuf|proto\."),
    ("allocator and GC", r"^(mi_|_mi_|malloc|free|realloc|calloc|__libc_malloc|_int_malloc|_int_free|cfree)|runtime\.(mallocgc|gc|scan|mark|heap|sweep|mspan|mcache|mcentral|greyobject|findObject|wbBuf|bulkBarrier|memclr|nextFree|deductSweepCredit|(\(\*[a-z]+\))\.(alloc|sweep|next))"),
    ("memory copies and compares", r"^(__memmove|__memcpy|__memset|__memcmp|memcpy|memmove|memcmp|memset|__mem)|runtime\.(memmove|memequal|cmpbody)|bytes\.Compare"),
    ("async runtime and scheduler", r"^(tokio|mio|parking_lot|crossbeam|futures)|<tokio|runtime\.(schedule|findRunnable|park|ready|goready|gopark|mcall|systemstack|futex|notewakeup|notesleep|lock|unlock|netpoll|chan|select|runqget|stealWork|execute|casgstatus|resetspinning|wakep|startm|stopm|usleep|nanotime|procyield|osyield)|^runtime\.|syscall\.|__pthread|pthread_"),
    ("cetera: store, backend, API", r"^cetera::|<cetera::"),
    ("etcd: server, API, auth", r"go\.etcd\.io/etcd"),
]


def bucket(kernel_syscall, symbol, dso):
    if kernel_syscall:
        return f"syscall {kernel_syscall}"
    if "kernel" in dso:
        return "kernel, other (interrupts, page faults, scheduler)"
    text = f"{symbol} {dso}"
    for name, pattern in USER:
        if re.search(pattern, text):
            return name
    if dso.startswith("libc") or "libc.so" in dso:
        return "libc, other"
    return "other user space"


def samples(path):
    """Yields (syscall or None, innermost symbol, its dso) per sample of `perf script`."""
    frames = []
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if not line.strip():
            if frames:
                yield classify_stack(frames)
            frames = []
        elif line.startswith((" ", "\t")):
            m = re.match(r"\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)$", line)
            if m:
                frames.append((m.group(1), os.path.basename(m.group(2))))
    if frames:
        yield classify_stack(frames)


SYSCALL = re.compile(r"^__(x64|do)_sys_([a-z0-9_]+)")


def classify_stack(frames):
    symbol, dso = frames[0]
    syscall = None
    for sym, d in frames:
        m = SYSCALL.match(sym)
        if m:
            syscall = m.group(2)
            break
        if "kernel" not in d:
            break
    # A syscall's return to user space is still the syscall's work.
    if syscall is None and "kernel" in dso:
        for sym, _ in frames:
            if sym.startswith(("entry_SYSCALL", "syscall_exit", "do_syscall")):
                syscall = "entry/exit"
                break
    return syscall, symbol, dso


def main():
    out_dir = sys.argv[1]
    servers = [s for s in ("etcd", "cetera") if os.path.exists(os.path.join(out_dir, f"{s}.script"))]
    counts, cpu = {}, {}
    for s in servers:
        counts[s] = Counter(bucket(*x) for x in samples(os.path.join(out_dir, f"{s}.script")))
        cpu[s] = json.load(open(os.path.join(out_dir, f"{s}-cpu.json")))
    names = sorted({b for c in counts.values() for b in c}, key=lambda b: -sum(c[b] / max(1, sum(c.values())) for c in counts.values()))
    head = "| where |" + "".join(f" {s} share | {s} µs/put |" for s in servers)
    print(head)
    print("|---|" + "---:|---:|" * len(servers))
    for b in names:
        row = f"| {b} |"
        for s in servers:
            total = sum(counts[s].values())
            share = counts[s][b] / total if total else 0
            row += f" {100 * share:.1f} % | {share * cpu[s]['server_us_per_put']:.1f} |"
        print(row)
    row = "| **server CPU per put** |"
    for s in servers:
        row += f" {sum(counts[s].values())} samples | **{cpu[s]['server_us_per_put']:.1f}** |"
    print(row)
    row = "| client (cetera-bench) CPU per put |"
    for s in servers:
        row += f" | {cpu[s]['client_us_per_put']:.1f} |"
    print(row)
    print()
    for s in servers:
        c = cpu[s]
        print(f"- {s}: {c['puts']} puts in the 8 s profiled")


if __name__ == "__main__":
    main()
