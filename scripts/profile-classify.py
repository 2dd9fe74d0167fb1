#!/usr/bin/env python3
"""Sorts the perf samples of scripts/profile-put.sh (or scripts/profile-rpc.sh) into
buckets, for cetera and etcd.

Usage: scripts/profile-classify.py DIR   (DIR holds SERVER.script and SERVER-cpu.json)

A sample in the kernel goes to the syscall on its kernel stack (`__x64_sys_NAME`),
else to "kernel, other" (interrupts, page faults, the scheduler). A sample in user
space goes to the bucket of the function it was in, by the function's name (Rust
paths, Go packages, C libraries). etcd's release binary is stripped; its function
names are read from the Go runtime's own table of them (.gopclntab, Go 1.16's layout). Each bucket's share of the samples times the
server's CPU µs per put (per operation, for profile-rpc.sh) gives its µs per put.
Prints a Markdown table.
"""

import bisect
import json
import os
import re
import struct
import sys
from collections import Counter

# (bucket, pattern on "symbol dso") for user-space samples: the first match wins.
USER = [
    ("SQLite", r"^sqlite3|libsqlite|^rusqlite|<rusqlite|drop_in_place<rusqlite"),
    ("bbolt (etcd's B-tree)", r"go\.etcd\.io/bbolt"),
    ("raft, WAL and apply (etcd)", r"go\.etcd\.io/(etcd/)?raft|/wal\.|/wal/|etcdserver\.\(\*raftNode|etcdserver\.\(\*EtcdServer\)\.apply|etcdserver\.\(\*applier"),
    ("mvcc: the index and the store (etcd)", r"etcd/server/v3/mvcc|google/btree"),
    ("gRPC and HTTP/2", r"^(h2|hyper|hyper_util|tonic|tower|http|http_body|http_body_util|httparse|bytes|slab)::|<(h2|hyper|hyper_util|tonic|tower|http|http_body|http_body_util|bytes)::|drop_in_place<\[?(h2|hyper|http|tonic)::|google\.golang\.org/grpc|golang\.org/x/net/http2"),
    ("protobuf", r"^prost|<prost|cetera_proto|\.Marshal|\.Unmarshal|\.Size\(|gogo/protobuf|google\.golang\.org/protobuf|proto\."),
    ("allocator, GC and stack growth", r"^(mi_|_mi_|malloc|free|realloc|calloc|__libc_malloc|_int_malloc|_int_free|cfree)|^runtime\.(mallocgc|gc|scan|mark|heap|sweep|mspan|mcache|mcentral|greyobject|findObject|wbBuf|bulkBarrier|memclr|nextFree|deductSweepCredit|newobject|makeslice|growslice|step|pcvalue|findfunc|gentraceback|getStackMap|funcInfo|adjust|copystack|morestack|newstack|(\(\*[a-zA-Z]+\))\.(alloc|sweep|next|tryAlloc|refill))"),
    ("memory copies and compares", r"^(__memmove|__memcpy|__memset|__memcmp|memcpy|memmove|memcmp|memset|__mem)|^(runtime\.)?(memmove|memequal|cmpbody|memeqbody)|bytes\.Compare"),
    ("clock reads", r"clock_gettime|^runtime\.nanotime|^time\.now"),
    ("metrics", r"^prometheus|<prometheus|client_golang/prometheus"),
    ("async runtime, scheduler and locks", r"^(tokio|mio|parking_lot|crossbeam|futures|std::sync|std::thread)|<tokio|^runtime\.|^(context|sync)\.|syscall\.|__pthread|pthread_"),
    ("cetera: store, backend, API (key index included)", r"^cetera::|<cetera::|alloc::collections::btree"),
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
    # The only C code linked into cetera on this path is SQLite (bundled).
    if dso == "cetera" and re.fullmatch(r"[A-Za-z_][\w.]*", symbol):
        return "SQLite"
    return "other user space"


class GoFunctions:
    """Function names of a stripped Go 1.16 binary, from its .gopclntab section."""

    def __init__(self, path):
        data = open(path, "rb").read()
        sections = elf_sections(data)
        table_off, _ = sections[".gopclntab"]
        self.base = load_base(data)
        magic, _, _, _, ptr = struct.unpack_from("<IBBBB", data, table_off)
        if magic != 0xFFFFFFFA or ptr != 8:
            raise ValueError("not a Go 1.16 pclntab")
        nfunc, _, names, _, _, _, pcln = struct.unpack_from("<7Q", data, table_off + 8)
        self.entries, self.names = [], []
        for i in range(nfunc):
            entry, func = struct.unpack_from("<QQ", data, table_off + pcln + 16 * i)
            name_off, = struct.unpack_from("<i", data, table_off + pcln + func + 8)
            start = table_off + names + name_off
            self.entries.append(entry)
            self.names.append(data[start:data.index(b"\0", start)].decode(errors="replace"))

    def name(self, offset):
        """The function at `offset` from the binary's first mapping (as `perf
        script` gives a sample's own address in a non-PIE binary)."""
        address = offset + self.base
        i = bisect.bisect_right(self.entries, address) - 1
        return self.names[i] if i >= 0 else "[unknown]"


def load_base(data):
    """The address the first loadable segment of a 64-bit ELF file is mapped at."""
    phoff, = struct.unpack_from("<Q", data, 0x20)
    size, count = struct.unpack_from("<HH", data, 0x36)
    for i in range(count):
        kind, _, offset, vaddr = struct.unpack_from("<IIQQ", data, phoff + i * size)
        if kind == 1 and offset == 0:
            return vaddr
    return 0


def elf_sections(data):
    """{name: (file offset, address)} of a 64-bit little-endian ELF file."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * size) for i in range(count)]
    names_off = headers[names_index][4]
    out = {}
    for name, _, _, addr, off, _ in headers:
        start = names_off + name
        out[data[start:data.index(b"\0", start)].decode()] = (off, addr)
    return out


GO_BINARIES = {}


def go_name(symbol, dso_path, address):
    """The function name of a sample's own `address` in a stripped Go binary, else
    `symbol`. Only the innermost frame is named: etcd's call chains do not unwind."""
    if symbol != "[unknown]" or not dso_path.startswith("/"):
        return symbol
    if dso_path not in GO_BINARIES:
        try:
            GO_BINARIES[dso_path] = GoFunctions(dso_path)
        except (OSError, KeyError, ValueError, struct.error):
            GO_BINARIES[dso_path] = None
    table = GO_BINARIES[dso_path]
    return table.name(address) if table else symbol


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
            m = re.match(r"\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)$", line)
            if m:
                symbol = m.group(2)
                if not frames:
                    symbol = go_name(symbol, m.group(3), int(m.group(1), 16))
                frames.append((symbol, os.path.basename(m.group(3))))
    if frames:
        yield classify_stack(frames)


# Kernel functions on a syscall's stack that say what the syscall does.
SYSCALL_KINDS = [
    ("fsync, fdatasync", ("ext4_sync_file", "do_fsync", "fdatasync", "fsync")),
    ("network send", ("tcp_sendmsg", "sock_sendmsg", "sock_write_iter")),
    ("network receive", ("tcp_recvmsg", "sock_recvmsg", "sock_read_iter")),
    ("file write (WAL, pages)", ("ext4_buffered_write_iter", "ext4_file_write_iter", "generic_perform_write")),
    ("file read (pages)", ("ext4_file_read_iter", "filemap_read")),
]


def classify_stack(frames):
    """(syscall or None, innermost symbol, its dso) of one sample's frames."""
    symbol, dso = frames[0]
    if "kernel" not in dso:
        return None, symbol, dso
    kernel = []
    for sym, d in frames:
        if "kernel" not in d:
            break
        kernel.append(sym)
    if "do_syscall_64" not in kernel:
        return None, symbol, dso
    entry = kernel.index("do_syscall_64")
    for kind, marks in SYSCALL_KINDS:
        if any(sym.startswith(marks) for sym in kernel[:entry]):
            return kind, symbol, dso
    if entry == 0:
        return "entry and exit, preemption on return", symbol, dso
    # The function do_syscall_64 called, less its prefix: futex, epoll_wait, ...
    name = re.sub(r"^(__x64_sys_|__do_sys_|__se_sys_|ksys_|__sys_|do_)", "", kernel[entry - 1])
    if name.startswith(("syscall_exit", "exit_to_user")):
        name = "entry and exit, preemption on return"
    return name, symbol, dso


def main():
    out_dir = sys.argv[1]
    servers = [s for s in ("etcd", "cetera") if os.path.exists(os.path.join(out_dir, f"{s}.script"))]
    counts, cpu = {}, {}
    for s in servers:
        counts[s] = Counter(bucket(*x) for x in samples(os.path.join(out_dir, f"{s}.script")))
        cpu[s] = json.load(open(os.path.join(out_dir, f"{s}-cpu.json")))
    shares = {s: {b: n / max(1, sum(c.values())) for b, n in c.items()} for s, c in counts.items()}
    # Buckets under 0.5 % on every server are summed into one row.
    small = {b for c in shares.values() for b in c if all(shares[s].get(b, 0) < 0.005 for s in servers)}
    for s in servers:
        counts[s]["the rest (each under 0.5 %)"] = sum(counts[s].pop(b, 0) for b in small)
    names = sorted({b for c in counts.values() for b in c}, key=lambda b: (b.startswith("the rest"), -sum(c[b] / max(1, sum(c.values())) for c in counts.values())))
    # profile-put.sh's puts, or profile-rpc.sh's operations of one family.
    unit = "op" if all("server_us_per_op" in cpu[s] for s in servers) else "put"
    us = {s: cpu[s][f"server_us_per_{unit}"] for s in servers}
    head = "| where |" + "".join(f" {s} share | {s} µs/{unit} |" for s in servers)
    print(head)
    print("|---|" + "---:|---:|" * len(servers))
    for b in names:
        row = f"| {b} |"
        for s in servers:
            total = sum(counts[s].values())
            share = counts[s][b] / total if total else 0
            row += f" {100 * share:.1f} % | {share * us[s]:.1f} |"
        print(row)
    row = f"| **server CPU per {unit}** |"
    for s in servers:
        row += f" {sum(counts[s].values())} samples | **{us[s]:.1f}** |"
    print(row)
    if unit == "op":
        print()
        for s in servers:
            print(f"- {s}: {cpu[s]['ops']:.0f} {cpu[s]['row']} operations in the window profiled")
        return
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
