#!/usr/bin/env python3
"""What SQLite's rollback journal would cost cetera's readers (issue 28).

A design measurement, not the benchmark: it does not run cetera. The record
log (src/backend/sqlite/record_log.rs) takes each second's writes into
SQLite as one batch. In WAL mode, today's, a batch's rows are written twice
(the WAL, then the checkpoint); in rollback-journal mode a page appended
past the end of the file is written once, which is the copy the byte
targets at 400 puts/s and at saturation need gone (BENCHMARKS.md, "What bounds
the targets not met"). The price: a rollback commit takes SQLite's EXCLUSIVE
lock, which waits for every reader to finish and keeps new readers out
meanwhile (its PENDING lock), where WAL readers never wait. This measures
that price.

One store of --rows rows of 1 KiB values (cetera's log table, 4 KiB pages),
then for --duration seconds: an applier process commits one batch a second
of --rate new rows (synchronous=FULL: the batch is durable in SQLite when
the commit returns, so the record log could be cut), and --readers processes
each read one random row by id in a loop (one statement, its own read
transaction, as a one-key Range does), with SQLite's busy timeout (5 s)
as a reader pool would set it. With --long-scan one more process reads the
whole table again and again (a Snapshot, a large RangeStream or an
apiserver's full List holds one read transaction that long).

Reported per journal mode: reads per second, read latency p50, p99, p99.9
and max, the batch commit's duration (p50, max), and bytes written per
applied row (/proc/self/io write_bytes, after a final sync; WAL mode with
one TRUNCATE checkpoint at the end, so its second copy counts).

Run:
  python3 scripts/prototype/rollback_readers.py                 # both modes, no long reader
  python3 scripts/prototype/rollback_readers.py --long-scan
"""
import argparse
import multiprocessing
import os
import random
import sqlite3
import statistics
import tempfile
import time

from record_log import write_bytes  # its sibling in scripts/prototype

PAGE_SIZE = 4096
SCHEMA = """
CREATE TABLE log (
    id INTEGER PRIMARY KEY, key BLOB NOT NULL, value BLOB NOT NULL,
    create_revision INTEGER NOT NULL, version INTEGER NOT NULL,
    lease INTEGER NOT NULL, deleted INTEGER NOT NULL);
"""


def quantile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def fill(path, journal, rows, value):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA page_size={PAGE_SIZE}")
    db.execute(f"PRAGMA journal_mode={journal}")
    db.executescript(SCHEMA)
    db.execute("BEGIN")
    for revision in range(1, rows + 1):
        db.execute(
            "INSERT INTO log VALUES (?, ?, ?, ?, 1, 0, 0)",
            (revision << 20, b"/registry/pods/default/pod-%07d" % revision, value, revision),
        )
    db.execute("COMMIT")
    if journal == "WAL":
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def reader(path, seed, stop, top, out):
    db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    rng = random.Random(seed)
    mine = []
    while time.time() < stop:
        revision = rng.randrange(1, top.value + 1)
        t0 = time.perf_counter()
        db.execute("SELECT value FROM log WHERE id = ?", (revision << 20,)).fetchone()
        mine.append(time.perf_counter() - t0)
    db.close()
    out.put(("reads", mine))


def scanner(path, stop, out):
    db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    scans = 0
    while time.time() < stop:
        db.execute("SELECT sum(length(value)) FROM log").fetchone()
        scans += 1
    db.close()
    out.put(("scans", scans))


def applier(path, journal, rate, value, stop, top, out):
    db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    db.execute("PRAGMA synchronous=FULL")
    if journal == "WAL":
        db.execute("PRAGMA wal_autocheckpoint=0")
    wb0 = write_bytes()
    revision = top.value
    commits = []
    next_at = time.time() + 1
    while next_at < stop:
        time.sleep(max(0, next_at - time.time()))
        next_at += 1
        t0 = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        for _ in range(rate):
            revision += 1
            db.execute(
                "INSERT INTO log VALUES (?, ?, ?, ?, 1, 0, 0)",
                (revision << 20, b"/registry/pods/default/pod-%07d" % revision, value, revision),
            )
        db.execute("COMMIT")
        commits.append(time.perf_counter() - t0)
        top.value = revision
    if journal == "WAL":
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    os.sync()
    out.put(("commits", (commits, write_bytes() - wb0)))


def run(journal, rows, rate, readers, long_scan, duration, tmp):
    d = tempfile.mkdtemp(dir=tmp, prefix="rollback-readers-")
    path = os.path.join(d, "state.db")
    value = random.Random(1).randbytes(1024)
    fill(path, journal, rows, value)
    os.sync()
    top = multiprocessing.Value("q", rows, lock=False)
    out = multiprocessing.Queue()
    stop = time.time() + 0.5 + duration
    procs = [multiprocessing.Process(target=reader, args=(path, i, stop, top, out)) for i in range(readers)]
    procs.append(multiprocessing.Process(target=applier, args=(path, journal, rate, value, stop, top, out)))
    if long_scan:
        procs.append(multiprocessing.Process(target=scanner, args=(path, stop, out)))
    for p in procs:
        p.start()
    reads, commits, written, scans = [], [], 0, 0
    for _ in procs:
        kind, got = out.get()
        if kind == "reads":
            reads.extend(got)
        elif kind == "commits":
            commits, written = got
        else:
            scans = got
    for p in procs:
        p.join()
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    reads.sort()
    commits.sort()
    applied = len(commits) * rate
    ms = lambda s: round(s * 1000, 3)
    return {
        "journal": journal,
        "reads_per_s": round(len(reads) / duration),
        "p50_ms": ms(quantile(reads, 0.5)),
        "p99_ms": ms(quantile(reads, 0.99)),
        "p999_ms": ms(quantile(reads, 0.999)),
        "max_ms": ms(reads[-1]) if reads else None,
        "commit_p50_ms": ms(statistics.median(commits)) if commits else None,
        "commit_max_ms": ms(commits[-1]) if commits else None,
        "scans": scans,
        "kb_per_row": round(written / max(applied, 1) / 1024, 2),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--journal", choices=["WAL", "PERSIST", "both"], default="both")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=400, help="rows applied per 1 s batch")
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--long-scan", action="store_true")
    ap.add_argument("--duration", type=float, default=20)
    args = ap.parse_args()
    tmp = os.environ.get("BENCH_TMP", "/var/tmp")
    modes = ["WAL", "PERSIST"] if args.journal == "both" else [args.journal]
    print("| journal | long scan | reads/s | p50 ms | p99 ms | p99.9 ms | max ms | batch commit p50 / max ms | scans | KB written per row |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for journal in modes:
        r = run(journal, args.rows, args.rate, args.readers, args.long_scan, args.duration, tmp)
        print(f"| {journal} | {'yes' if args.long_scan else 'no'} | {r['reads_per_s']} | {r['p50_ms']} | "
              f"{r['p99_ms']} | {r['p999_ms']} | {r['max_ms']} | {r['commit_p50_ms']} / {r['commit_max_ms']} | "
              f"{r['scans']} | {r['kb_per_row']} |", flush=True)


if __name__ == "__main__":
    main()
