#!/usr/bin/env python3
"""Record-log prototype for issue 28: what a put costs the disk when commits go
to an append-only log of records and SQLite is brought up to date in batches.

A design measurement, not the benchmark: it does not run cetera. It performs
the I/O of two write paths for real, on a real file system, with real
fsyncs, at the loads of the issue's table, and reads what the kernel counted
(/proc/self/io write_bytes, which is what scripts/bench.sh reads for the
servers; fsync and fdatasync calls are counted here as they are made).

Paths:
  sqlite   today's cetera: every group commit is one SQLite transaction
           (cetera's log table, keyed by revision << 20 | sub, and its meta
           row), WAL, synchronous=FULL, 2 KiB pages, auto_vacuum=INCREMENTAL;
           a PASSIVE checkpoint (synchronous=FULL: the database file is
           synced) once the WAL holds 8192 pages, then the WAL starts over
           (TRUNCATE), as src/backend/sqlite/checkpointer.rs does.
  log      the record log: every group commit appends its records (a
           24-byte header with length, CRC-32C stand-in and revision, then
           key, value and the row's other fields) to a log file preallocated
           with fallocate and reused, then one fdatasync, then the acknowledgement. Every
           --apply-ms (100) or --apply-mb (4) MiB, one SQLite transaction
           (synchronous=OFF) applies the records since the last batch to the
           same tables, then one fsync of the SQLite WAL makes the batch
           durable, after which the log is cut (its space is reused). The
           checkpoint is as in `sqlite`.
  log-rollback
           as `log`, but SQLite in rollback-journal mode (PERSIST,
           synchronous=FULL) for the batches: a page appended past the end
           of the file is not journaled, so the log table's new rows are
           written once (not to a WAL and again by a checkpoint); only the
           few pages a batch changes in place (the last leaf, its parents,
           the meta row, page 1) go to the journal first. A batch costs
           SQLite's syncs of a rollback commit (journal, its header, the
           database): 4.6 by strace -f -c at 10 puts/s with 1 s batches
           (a 10 s run less a run of no puts), counted as 5.

Loads: puts of --val-size (1024) byte values to random keys of --key-space
(5000), by --clients threads (each waits for its put's acknowledgement, as
an etcd client does), at --rate puts/s over all clients (omit: saturated),
for --duration seconds, on a fresh store each. A writer thread takes every
put queued when it is free: group commit, as cetera's writer does.

Run:
  python3 scripts/prototype/record_log.py                # the issue's table, every path
  python3 scripts/prototype/record_log.py --path log --rate 100 --clients 4
  BENCH_TMP=/var/tmp python3 scripts/prototype/record_log.py --json out.json

Python's own CPU limits the saturated step (the servers are faster); the
bytes and fsyncs per put at a fixed rate do not depend on it.
"""
import argparse
import json
import os
import queue
import random
import sqlite3
import struct
import tempfile
import threading
import time
import zlib

PAGE_SIZE = 2048
CHECKPOINT_PAGES = 8192
LOG_BYTES = 64 << 20
# fsyncs of one rollback-journal commit (PERSIST, synchronous=FULL), measured.
ROLLBACK_SYNCS = 5
HEADER = struct.Struct("<IIQQ")  # length, crc, revision, sub+flags

SCHEMA = """
CREATE TABLE log (
    id INTEGER PRIMARY KEY, key BLOB NOT NULL, value BLOB NOT NULL,
    create_revision INTEGER NOT NULL, version INTEGER NOT NULL,
    lease INTEGER NOT NULL, deleted INTEGER NOT NULL);
CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), revision INTEGER NOT NULL,
    compact_revision INTEGER NOT NULL, compacted_through INTEGER NOT NULL);
INSERT INTO meta VALUES (1, 1, -1, 0);
"""


def write_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


class Store:
    """cetera's SQLite file: tables, pragmas and checkpoint policy."""

    def __init__(self, path, synchronous, journal="WAL"):
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        self.db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        self.db.execute(f"PRAGMA journal_mode={journal}")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("PRAGMA wal_autocheckpoint=0")
        self.db.executescript(SCHEMA)
        self.wal = path + "-wal"
        self.versions = {}
        self.fsyncs = 0

    def apply(self, puts, revision):
        """One transaction: rows for `puts` from `revision` on; returns the next revision."""
        self.db.execute("BEGIN IMMEDIATE")
        for key, value in puts:
            v = self.versions.get(key, (revision, 0))
            self.versions[key] = (v[0], v[1] + 1)
            self.db.execute(
                "INSERT INTO log VALUES (?, ?, ?, ?, ?, 0, 0)",
                (revision << 20, key, value, v[0], v[1] + 1),
            )
            revision += 1
        self.db.execute("UPDATE meta SET revision = ?", (revision - 1,))
        self.db.execute("COMMIT")
        return revision

    def wal_pages(self):
        try:
            return (os.path.getsize(self.wal) - 32) // (PAGE_SIZE + 24)
        except OSError:
            return 0

    def maybe_checkpoint(self):
        if self.wal_pages() >= CHECKPOINT_PAGES:
            # synchronous=FULL for the checkpoint: the WAL, then the database, synced.
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.fsyncs += 2


class RecordLog:
    """A preallocated, reused log file of records."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        # fallocate, as etcd does. Not zeros written in big writes: the page
        # cache then holds the file in large folios, and every later small
        # write dirties (and /proc/PID/io counts, and writeback writes) a
        # whole folio, up to 1 MiB (measured: 1 MiB per 1.1 KB append).
        os.posix_fallocate(self.fd, 0, LOG_BYTES)
        os.fsync(self.fd)
        dfd = os.open(os.path.dirname(path), os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        self.offset = 0

    def append(self, records):
        buf = b"".join(records)
        if self.offset + len(buf) > LOG_BYTES:
            self.offset = 0  # the batches before were applied and the log cut
        os.pwrite(self.fd, buf, self.offset)
        self.offset += len(buf)
        os.fdatasync(self.fd)


def record(revision, key, value):
    body = key + value + struct.pack("<QQQB", revision, 1, 0, 0)
    return HEADER.pack(len(body), zlib.crc32(body), revision, 0) + body


def run(path_kind, rate, clients, duration, val_size, key_space, apply_ms, apply_mb, tmp):
    d = tempfile.mkdtemp(dir=tmp, prefix="record-log-")
    rollback = path_kind == "log-rollback"
    store = Store(
        os.path.join(d, "state.db"),
        "FULL" if path_kind == "sqlite" or rollback else "OFF",
        "PERSIST" if rollback else "WAL",
    )
    log = RecordLog(os.path.join(d, "log")) if path_kind != "sqlite" else None
    os.sync()
    time.sleep(0.5)
    q = queue.Queue()
    stop = time.monotonic() + duration
    acked = [0]
    commits = [0]
    fsyncs = [0]
    lock = threading.Lock()
    pending = []  # records acknowledged, not yet applied (log path)
    rng = random.Random(1)
    value = bytes(rng.getrandbits(8) for _ in range(val_size))

    def client(i):
        crng = random.Random(i)
        per_client = rate / clients if rate else None
        next_at = time.monotonic() + (crng.random() / per_client if per_client else 0)
        while True:
            if per_client:
                now = time.monotonic()
                if next_at > now:
                    time.sleep(next_at - now)
                next_at += 1 / per_client
            if time.monotonic() >= stop:
                return
            done = threading.Event()
            key = f"/registry/pods/default/pod-{crng.randrange(key_space):05d}".encode()
            q.put((key, value, done))
            done.wait()

    def writer():
        revision = 2
        last_apply = time.monotonic()
        while True:
            try:
                first = q.get(timeout=0.05)
            except queue.Empty:
                first = None
            batch = [first] if first else []
            while True:
                try:
                    batch.append(q.get_nowait())
                except queue.Empty:
                    break
            if batch:
                puts = [(k, v) for k, v, _ in batch]
                if log:
                    recs = []
                    for k, v in puts:
                        recs.append(record(revision + len(recs), k, v))
                    log.append(recs)
                    fsyncs[0] += 1
                    with lock:
                        pending.extend(puts)
                    revision += len(puts)
                else:
                    revision = store.apply(puts, revision)
                    fsyncs[0] += 1
                    store.maybe_checkpoint()
                commits[0] += 1
                acked[0] += len(puts)
                for _, _, done in batch:
                    done.set()
            now = time.monotonic()
            if log and pending and (
                now - last_apply >= apply_ms / 1000
                or sum(len(k) + len(v) for k, v in pending) >= apply_mb << 20
            ):
                with lock:
                    todo = pending[:]
                    pending.clear()
                store.apply(todo, revision - len(todo))
                if rollback:
                    # SQLite syncs the journal, its header and the database
                    # itself: 4.6 syncs per batch by strace -f -c (runs of 10 s
                    # and of none, subtracted), counted as 5.
                    fsyncs[0] += ROLLBACK_SYNCS
                else:
                    wfd = os.open(store.wal, os.O_RDONLY)
                    os.fsync(wfd)  # the batch is durable in SQLite: the log may be cut
                    os.close(wfd)
                    fsyncs[0] += 1
                    store.maybe_checkpoint()
                last_apply = now
            if first is None and time.monotonic() >= stop and q.empty():
                return

    wb0 = write_bytes()
    t0 = time.monotonic()
    w = threading.Thread(target=writer)
    w.start()
    cs = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for c in cs:
        c.start()
    for c in cs:
        c.join()
    w.join()
    elapsed = time.monotonic() - t0
    os.sync()  # count what the page cache still held (the checkpoints' writes)
    wb = write_bytes() - wb0
    fs = fsyncs[0] + store.fsyncs
    n = acked[0]
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    return {
        "path": path_kind, "rate": rate, "clients": clients, "puts": n,
        "puts_per_s": round(n / elapsed, 1), "puts_per_commit": round(n / max(commits[0], 1), 2),
        "kb_per_put": round(wb / n / 1024, 2), "fsyncs_per_put": round(fs / n, 3),
        "files_mb_at_end": round(size / 2**20, 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", choices=["sqlite", "log", "log-rollback", "all"], default="all")
    ap.add_argument("--rate", type=float, help="puts/s over all clients (default: the issue's table)")
    ap.add_argument("--clients", type=int)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--val-size", type=int, default=1024)
    ap.add_argument("--key-space", type=int, default=5000)
    ap.add_argument("--apply-ms", type=float, default=100)
    ap.add_argument("--apply-mb", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=2048, help="SQLite page size (cetera's: 2048)")
    ap.add_argument("--json")
    args = ap.parse_args()
    global PAGE_SIZE
    PAGE_SIZE = args.page_size
    tmp = os.environ.get("BENCH_TMP", "/var/tmp")
    loads = [(args.rate, args.clients or 1)] if args.clients else [(10, 1), (100, 4), (400, 16), (None, 64)]
    paths = ["sqlite", "log", "log-rollback"] if args.path == "all" else [args.path]
    rows = []
    print("| load | path | puts/s | puts per commit | KB written per put | fsyncs per put | files MB at end |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for rate, clients in loads:
        for p in paths:
            r = run(p, rate, clients, args.duration, args.val_size, args.key_space,
                    args.apply_ms, args.apply_mb, tmp)
            rows.append(r)
            load = f"{int(rate)} puts/s, {clients} clients" if rate else f"saturated, {clients} clients"
            print(f"| {load} | {p} | {r['puts_per_s']} | {r['puts_per_commit']} | {r['kb_per_put']} | "
                  f"{r['fsyncs_per_put']} | {r['files_mb_at_end']} |", flush=True)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
