#!/usr/bin/env python3
"""Compaction prototype for issue 28: the WAL pages SQLite writes to remove a
log's superseded rows, by the order of the deletes and how many go in one
commit.

A design measurement, not the benchmark: it does not run cetera. It builds
cetera's log table (a rowid table keyed by revision << 20, 4 KiB pages, WAL,
auto_vacuum=INCREMENTAL, secure_delete off as in the SQLite cetera bundles)
with N puts of 1 KiB values over K keys, then removes what a compaction at
the last revision removes (every row but each key's newest), and counts the
frames the WAL grew by. Orders:
  cetera   as compaction steps walk the log: for each row, the previous row
           of its key (which lags by about K revisions);
  sorted   the same removals, in row id order within each commit.
Groupings: one commit per step of 1,000 revisions (each step its own
commit), or commits of at most M removals (the steps' removals gathered),
or everything in one commit.

Usage: python3 scripts/prototype/compaction_pages.py [N] [K]
"""
import os
import random
import sqlite3
import sys
import tempfile

N = int(sys.argv[1]) if len(sys.argv) > 1 else 120_000
K = int(sys.argv[2]) if len(sys.argv) > 2 else 2_000
STEP = 1_000  # revisions per compaction step (src/store/writer.rs)
FRAME = 4096 + 24  # a WAL frame: a page and its header


def build(path, keys):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA page_size=4096")
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    db.execute("PRAGMA secure_delete=0")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE log (id INTEGER PRIMARY KEY, key BLOB, value BLOB)")
    db.execute("BEGIN")
    for revision in range(1, N + 1):
        db.execute(
            "INSERT INTO log VALUES (?, ?, ?)",
            (revision << 20, b"/registry/pods/default/%08d" % keys[revision], os.urandom(1024)),
        )
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def removals_by_step(keys):
    """The ids each step of 1,000 revisions removes, in the order it meets them."""
    previous, steps = {}, []
    for start in range(1, N + 1, STEP):
        step = []
        for revision in range(start, min(start + STEP, N + 1)):
            key = keys[revision]
            if key in previous:
                step.append(previous[key] << 20)
            previous[key] = revision
        steps.append(step)
    return steps


def commits(steps, order, most):
    """The removals grouped into commits: per step (most=None) or gathered
    until a commit holds `most` (0: all in one)."""
    if most is None:
        groups = steps
    else:
        groups, current = [], []
        for step in steps:
            current.extend(step)
            if most and len(current) >= most:
                groups.append(current)
                current = []
        if current:
            groups.append(current)
    return [sorted(g) if order == "sorted" else g for g in groups]


def measure(keys, order, most):
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP", "/var/tmp")) as tmp:
        path = os.path.join(tmp, "log.db")
        db = build(path, keys)
        before = os.path.getsize(path + "-wal")
        removed = 0
        for group in commits(removals_by_step(keys), order, most):
            db.execute("BEGIN")
            for row in group:
                db.execute("DELETE FROM log WHERE id = ?", (row,))
            db.execute("COMMIT")
            removed += len(group)
        frames = (os.path.getsize(path + "-wal") - before) / FRAME
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.close()
    return frames, removed, pages


def main():
    random.seed(1)
    keys = [random.randrange(K) for _ in range(N + 1)]
    print(f"{N} puts of 1 KiB over {K} keys; a compaction at the last revision removes every row but each key's newest")
    print()
    print("| order | commits | WAL frames | of the table's pages | bytes per removed row |")
    print("|---|---|---:|---:|---:|")
    for order, most, label in [
        ("cetera", None, "one per step"),
        ("sorted", None, "one per step"),
        ("cetera", 0, "one"),
        ("sorted", 4096, "one per 4,096 removals"),
        ("sorted", 16384, "one per 16,384 removals"),
        ("sorted", 0, "one"),
    ]:
        frames, removed, pages = measure(keys, order, most)
        print(f"| {order} | {label} | {frames:,.0f} | {frames / pages:.2f} | {frames * FRAME / removed:,.0f} |")


if __name__ == "__main__":
    main()
