#!/usr/bin/env python3
"""Storage shape prototypes for issue 17 ("the write path"): bytes written per put.

A design measurement, not the benchmark: it does not run cetera. It replays
put loads with Python's sqlite3 against three table layouts and counts what
SQLite writes, to choose a shape before building one in Rust.

Shapes:
  current  cetera's schema today (migrations/sqlite): `log` keyed by
           (revision, sub) plus the index log_key_revision on (key, revision),
           `kv` keyed by key, the partial index kv_lease on kv (lease, key).
  A        etcd's shape: only `log` keyed by (revision, sub), no key index,
           no `kv`; key -> revisions lives in memory (like etcd's treeIndex)
           and is rebuilt at start by scanning the log.
  B        deferred apply: the `log` row (keyed by revision, sub) is the
           durable record of a commit; `kv`, `key_history(key, revision)`
           (in place of log_key_revision) and kv_lease are brought up to date
           in one transaction every 100 ms of (simulated) time, in key order,
           from an in-memory overlay of the puts not yet applied.
  A rowid, B rowid
           the same, with the log as a rowid table (id = revision << 20 | sub):
           SQLite appends to a rowid table's last leaf without rebalancing its
           neighbours, which it does for a WITHOUT ROWID table. At 10 puts/s
           also B applying every 1 s and 10 s, and A rowid with 2 KiB pages.

Settings as cetera's (src/backend/sqlite/, open_connection, and
src/backend/sqlite/checkpointer.rs): page size default (4096),
auto_vacuum=INCREMENTAL on a new file, journal_mode=WAL, synchronous=FULL,
SQLite's automatic checkpoint off, and cetera's checkpoint policy: a
checkpoint once the WAL holds 8192 frames, after which the WAL starts over.
Here that checkpoint runs on the writer's connection right after the commit
(TRUNCATE, so the WAL file's growth is exactly the frames written); cetera
runs it on a thread beside the writer. cetera has no time-based checkpoint,
so at 10 puts/s time only matters to B's apply. Time is simulated (no sleeps):
each put advances the clock by 1/rate.

For each load and shape it counts, from the WAL file's growth after each
commit: WAL frames (a page plus a 24-byte header) and bytes, and the 4 KiB
file blocks each commit's byte range covers (what /proc/PID/io write_bytes
counts when every commit is fsynced: a frame is 4120 bytes, so a one-page
commit dirties two blocks); and at each checkpoint, the distinct pages in
the WAL, which is what a checkpoint copies into the database file. Every run
ends with one more checkpoint, so each put's pages are counted once.

Loads (keys random with a fixed seed, 256-byte values):
  64c      64 clients: group commits of 13 puts, 20k puts, 10k keys, 28k puts/s
  1c       1 client: one put per commit, 5k puts, 10k keys, 3k puts/s
  10/s     one put per commit at 10 puts/s, 3k puts (300 s simulated)
  64c@1M   as 64c on a store preloaded with 1M keys shaped like Kubernetes
           (/registry/pods/namespace-N/pod-M), random keys of the 1M
  leased   as 64c with a lease on every put (Kubernetes Events; a new lease
           every 2000 puts, preloaded keys on an older lease)
The 10k-key stores are preloaded with every key before measuring (a steady
state); preloads go through one big transaction with the journal off, as
cetera's bulk load, and are not counted. Two more rows replay the benchmark's
put case (scripts/bench.sh: a fresh store, 32-byte keys, 100k key space,
1 client then 64 clients on the same store) and its 10 puts/s case (a fresh
store, 10k key space, 200 puts) with the current shape, for comparison with
the KB written per put in BENCHMARKS.md.

For A it also times the rebuild of the in-memory index from the 1M-key log
(Python's per-row overhead makes this an upper bound for Rust; the file is
in the page cache, so a cold start also reads the whole log from disk) and
estimates the index's size as a Rust BTreeMap. For B it reports the overlay's
largest size.

Not measured: CPU in Rust, read paths (A and B read differently), compaction,
deletes, the -shm file, file-system metadata and journal writes.

Run (about 3 minutes on 2 cores; needs about 2 GB free under the temp dir,
deleted at the end):
  python3 scripts/prototype/storage_shape.py            # full run
  python3 scripts/prototype/storage_shape.py --big 100000   # smaller big store
  python3 scripts/prototype/storage_shape.py --json out.json
"""
import argparse
import bisect
import json
import math
import os
import random
import shutil
import sqlite3
import struct
import sys
import tempfile
import time

PAGE = 4096
WAL_HEADER = 32
BLOCK = 4096
CHECKPOINT_PAGES = 8192  # checkpointer.rs CHECKPOINT_PAGES
VALUE_SIZE = 256

SCHEMA_LOG = """
CREATE TABLE log (
    revision INTEGER NOT NULL, sub INTEGER NOT NULL, key BLOB NOT NULL,
    value BLOB NOT NULL, create_revision INTEGER NOT NULL,
    version INTEGER NOT NULL, lease INTEGER NOT NULL, deleted INTEGER NOT NULL,
    PRIMARY KEY (revision, sub)) WITHOUT ROWID;
CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), revision INTEGER NOT NULL,
    compact_revision INTEGER NOT NULL, compacted_through INTEGER NOT NULL,
    applied INTEGER NOT NULL);
INSERT INTO meta VALUES (1, 1, -1, 0, 1);
"""
SCHEMA_KV = """
CREATE TABLE kv (
    key BLOB PRIMARY KEY, value BLOB NOT NULL, create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX kv_lease ON kv (lease, key) WHERE lease != 0;
"""
# The log as a rowid table: id = revision << 20 | sub. SQLite appends to the
# last leaf of a rowid table without rebalancing its neighbours (balance_quick),
# which it does not do for a WITHOUT ROWID table.
SCHEMA_LOG_ROWID = """
CREATE TABLE log (
    id INTEGER PRIMARY KEY, key BLOB NOT NULL, value BLOB NOT NULL,
    create_revision INTEGER NOT NULL, version INTEGER NOT NULL,
    lease INTEGER NOT NULL, deleted INTEGER NOT NULL);
""" + SCHEMA_LOG[SCHEMA_LOG.index("CREATE TABLE meta"):]
HISTORY = """
CREATE TABLE key_history (key BLOB NOT NULL, revision INTEGER NOT NULL,
    PRIMARY KEY (key, revision)) WITHOUT ROWID;"""
SCHEMAS = {
    "current": SCHEMA_LOG + SCHEMA_KV + "CREATE INDEX log_key_revision ON log (key, revision);",
    "A": SCHEMA_LOG,
    "A rowid": SCHEMA_LOG_ROWID,
    "B": SCHEMA_LOG + SCHEMA_KV + HISTORY,
    "B rowid": SCHEMA_LOG_ROWID + SCHEMA_KV + HISTORY,
}
INSERT_LOG = "INSERT INTO log VALUES (?, 0, ?, ?, ?, ?, ?, 0)"
INSERT_LOG_ROWID = "INSERT INTO log VALUES (? << 20, ?, ?, ?, ?, ?, 0)"
UPSERT_KV = "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?, ?)"


def bench_keys(space):
    """cetera-bench's keys: 'bench/' + index zero-padded to 32 bytes."""
    width = max(32 - len("bench/"), len(str(space)))
    return [b"bench/%0*d" % (width, i) for i in range(space)]


def k8s_keys(count):
    """Kubernetes-shaped keys, 1000 pods per namespace."""
    return [b"/registry/pods/namespace-%d/pod-%d" % (i // 1000, i % 1000) for i in range(count)]


class Meter:
    """Counts what the WAL and the checkpoints write, from the WAL file."""

    def __init__(self, conn, wal, page_size=PAGE):
        self.conn, self.wal = conn, wal
        self.page_size, self.frame = page_size, page_size + 24
        self.size = self._wal_size()
        self.reset()

    def reset(self):
        self.commits = {"log": 0, "apply": 0}
        self.frames = {"log": 0, "apply": 0}
        self.wal_bytes = 0
        self.blocks = 0
        self.ckpt_pages = 0
        self.checkpoints = 0

    def _wal_size(self):
        try:
            return os.path.getsize(self.wal)
        except FileNotFoundError:
            return 0

    def after_commit(self, kind="log"):
        size = self._wal_size()
        if size > self.size:
            start = self.size
            frames = (size - max(start, WAL_HEADER)) // self.frame
            self.frames[kind] += frames
            self.wal_bytes += size - start
            self.blocks += math.ceil(size / BLOCK) - start // BLOCK
            self.size = size
        self.commits[kind] += 1
        if (self.size - WAL_HEADER) // self.frame >= CHECKPOINT_PAGES:
            self.checkpoint()

    def checkpoint(self):
        """Counts the distinct pages in the WAL (what a checkpoint copies), then checkpoints."""
        if self.size <= WAL_HEADER:
            return
        with open(self.wal, "rb") as f:
            data = f.read()
        salt = data[16:24]
        pages = set()
        for off in range(WAL_HEADER, len(data) - self.frame + 1, self.frame):
            if data[off + 8:off + 16] != salt:
                break
            pages.add(struct.unpack_from(">I", data, off)[0])
        busy, _, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, "checkpoint blocked"
        self.ckpt_pages += len(pages)
        self.checkpoints += 1
        self.size = self._wal_size()


def open_conn(path, new=False, page_size=PAGE):
    conn = sqlite3.connect(path, isolation_level=None)
    if new:
        conn.execute(f"PRAGMA page_size={page_size}")  # before auto_vacuum, which fixes it
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before the first table, as cetera
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # cetera's WAL hook replaces it
    return conn


class Store:
    """One shape on one database file, with its in-memory parts."""

    def __init__(self, path, shape, page_size=PAGE):
        self.path, self.shape = path, shape
        self.kind = shape[0]  # "c"urrent, "A" or "B"
        self.insert_log = INSERT_LOG_ROWID if "rowid" in shape else INSERT_LOG
        self.page_size = page_size
        self.index = {}      # A: key -> [create_revision, version, [revisions]]
        self.overlay = {}    # B: key -> (value, create, mod, version, lease), not yet applied
        self.pending = []    # B: (key, revision) not yet in key_history
        self.overlay_max = (0, 0, 0)  # B: (puts, distinct keys, bytes) at the largest
        self.revision = 1
        self.clock = 0.0
        self.last_apply = 0.0
        self.apply_every = 0.1

    # -- preload: one transaction, journal off, as cetera's bulk load -------------
    def preload(self, keys, lease=0):
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute(f"PRAGMA page_size={self.page_size}")  # before auto_vacuum, which fixes it
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-65536")
        conn.executescript(SCHEMAS[self.shape])
        conn.execute("BEGIN")
        rng = random.Random(7)
        first = self.revision + 1
        keys = sorted(keys)

        def rows():
            for i, key in enumerate(keys):
                rev = first + i
                yield rev, key, rng.randbytes(VALUE_SIZE), rev, 1, lease
        conn.executemany(self.insert_log, rows())
        if self.kind in "cB":
            rng.seed(7)
            conn.executemany(UPSERT_KV, ((k, v, r, r, 1, l) for r, k, v, _, _, l in rows()))
        if self.kind == "B":
            conn.executemany("INSERT INTO key_history VALUES (?, ?)",
                             ((k, first + i) for i, k in enumerate(keys)))
        self.revision = first + len(keys) - 1
        conn.execute("UPDATE meta SET revision = ?, applied = ?", (self.revision, self.revision))
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.close()

    def open(self):
        new = not os.path.exists(self.path)
        self.conn = open_conn(self.path, new, self.page_size)
        if new:
            self.conn.executescript(SCHEMAS[self.shape])
        actual = self.conn.execute("PRAGMA page_size").fetchone()[0]
        assert actual == self.page_size, (actual, self.page_size)
        self.meter = Meter(self.conn, self.path + "-wal", self.page_size)
        if self.kind == "A":
            self.rebuild_index()

    def rebuild_index(self):
        """A's start: scan the log in revision order into key -> revisions."""
        index = {}
        started = time.perf_counter()
        column = "id >> 20" if "rowid" in self.shape else "revision"
        for rev, key, create, version, deleted in self.conn.execute(
                f"SELECT {column}, key, create_revision, version, deleted FROM log"):
            entry = index.get(key)
            if entry is None:
                index[key] = [create, version, [rev]]
            else:
                entry[0], entry[1] = create, version
                entry[2].append(rev)
        self.rebuild_seconds = time.perf_counter() - started
        self.index = index

    # -- one put --------------------------------------------------------------
    def put(self, key, value, lease):
        self.revision += 1
        rev = self.revision
        c = self.conn
        if self.kind == "c":
            row = c.execute("SELECT create_revision, version FROM kv WHERE key = ?", (key,)).fetchone()
            create, version = (row[0], row[1] + 1) if row else (rev, 1)
            c.execute(self.insert_log, (rev, key, value, create, version, lease))
            c.execute(UPSERT_KV, (key, value, create, rev, version, lease))
        elif self.kind == "A":
            entry = self.index.get(key)
            create, version = (entry[0], entry[1] + 1) if entry else (rev, 1)
            c.execute(self.insert_log, (rev, key, value, create, version, lease))
            if entry:
                entry[1] = version
                entry[2].append(rev)
            else:
                self.index[key] = [create, version, [rev]]
        else:
            prior = self.overlay.get(key)
            if prior is not None:
                create, version = prior[1], prior[3] + 1
            else:
                row = c.execute("SELECT create_revision, version FROM kv WHERE key = ?", (key,)).fetchone()
                create, version = (row[0], row[1] + 1) if row else (rev, 1)
            c.execute(self.insert_log, (rev, key, value, create, version, lease))
            self.overlay[key] = (value, create, rev, version, lease)
            self.pending.append((key, rev))

    def commit_group(self, puts, rate):
        """One write transaction of len(puts) puts, then the checkpoint policy, then B's apply."""
        self.conn.execute("BEGIN IMMEDIATE")
        for key, value, lease in puts:
            self.put(key, value, lease)
        self.conn.execute("COMMIT")
        self.meter.after_commit("log")
        self.clock += len(puts) / rate
        if self.kind == "B" and self.clock - self.last_apply >= self.apply_every:
            self.apply()

    def apply(self):
        """B: the overlay into kv, key_history and kv_lease, in key order, in one transaction."""
        self.last_apply = self.clock
        if not self.pending:
            return
        size = sum(len(k) + len(v[0]) + 40 for k, v in self.overlay.items())
        if size > self.overlay_max[2]:
            self.overlay_max = (len(self.pending), len(self.overlay), size)
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        c.executemany(UPSERT_KV, ((k,) + v for k, v in sorted(self.overlay.items())))
        c.executemany("INSERT INTO key_history VALUES (?, ?)", sorted(self.pending))
        c.execute("UPDATE meta SET applied = ?", (self.revision,))
        c.execute("COMMIT")
        self.meter.after_commit("apply")
        self.overlay.clear()
        self.pending.clear()

    def finish(self):
        if self.kind == "B":
            self.apply()
        self.meter.checkpoint()

    def close(self):
        self.conn.close()

    def db_bytes(self):
        return os.path.getsize(self.path)


def run_load(store, keys, puts, group, rate, seed, lease_every=0, lease_base=0):
    rng = random.Random(seed)
    store.meter.reset()
    store.clock = store.last_apply = 0.0
    started = time.perf_counter()
    done = 0
    while done < puts:
        n = min(group, puts - done)
        batch = []
        for i in range(n):
            lease = lease_base + (done + i) // lease_every if lease_every else 0
            batch.append((keys[rng.randrange(len(keys))], rng.randbytes(VALUE_SIZE), lease))
        store.commit_group(batch, rate)
        done += n
    store.finish()
    m = store.meter
    kb = 1024
    row = {
        "puts": puts,
        "commits": m.commits["log"],
        "pages_per_commit": m.frames["log"] / m.commits["log"],
        "wal_kb_per_commit": m.frames["log"] * m.frame / m.commits["log"] / kb,
        "applies": m.commits["apply"],
        "apply_pages_per_put": m.frames["apply"] / puts,
        "wal_kb_per_put": m.wal_bytes / puts / kb,
        "wal_block_kb_per_put": m.blocks * BLOCK / puts / kb,
        "ckpt_kb_per_put": m.ckpt_pages * m.page_size / puts / kb,
        "checkpoints": m.checkpoints,
        "seconds": time.perf_counter() - started,
        "db_mb": store.db_bytes() / 1e6,
    }
    row["total_kb_per_put"] = row["wal_kb_per_put"] + row["ckpt_kb_per_put"]
    row["disk_kb_per_put"] = row["wal_block_kb_per_put"] + row["ckpt_kb_per_put"]
    if store.kind == "B":
        row["overlay_max"] = {"puts": store.overlay_max[0], "keys": store.overlay_max[1],
                              "kb": store.overlay_max[2] / kb}
    return row


def index_memory(index):
    """Estimated bytes of A's index as a Rust BTreeMap<Vec<u8>, KeyIndex>.

    Assumptions: KeyIndex = {create: i64, version: i64, revs: Vec<(i64, i64)>},
    so a slot is 24 (Vec<u8>) + 40 bytes; leaf nodes hold 11 slots (716 bytes,
    a 768-byte allocation) about 60 % full, so about 116 bytes of node per
    key; the key's heap buffer rounded up to 16 bytes; the revisions' buffer
    at least 4 x 16 bytes (Rust's first allocation), doubling after.
    """
    keys = len(index)
    key_bytes = sum(len(k) for k in index)
    heap = 0
    revs = 0
    for k, (_, _, r) in index.items():
        heap += -(-len(k) // 16) * 16
        n = len(r)
        revs += n
        cap = 4
        while cap < n:
            cap *= 2
        heap += cap * 16
    node = keys * 768 / (11 * 0.6)
    return {"keys": keys, "key_bytes": key_bytes, "revisions": revs,
            "estimated_mb": (node + heap) / 1e6, "per_key_b": (node + heap) / max(keys, 1)}


def fmt(x, d=2):
    return f"{x:,.{d}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big", type=int, default=1_000_000, help="keys of the big store (default 1M)")
    ap.add_argument("--dir", default="/tmp", help="where the temporary directory goes")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="storage-shape-", dir=args.dir)
    results = []
    extra = {}
    t0 = time.perf_counter()

    def record(load, shape, row):
        row.update(load=load, shape=shape)
        results.append(row)
        print(f"{load:>10} {shape:>8}: {fmt(row['disk_kb_per_put'])} KB/put on disk "
              f"(WAL {fmt(row['wal_kb_per_put'])}, checkpoint {fmt(row['ckpt_kb_per_put'])}), "
              f"{fmt(row['pages_per_commit'], 1)} pages/commit, {fmt(row['seconds'], 1)} s",
              file=sys.stderr, flush=True)

    def fresh(name, shape, page_size=PAGE):
        path = os.path.join(tmp, name + ".db")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        return Store(path, shape, page_size)

    def drop(store):
        store.close()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(store.path + suffix):
                os.remove(store.path + suffix)

    try:
        small = bench_keys(10_000)
        loads = [
            # name, puts, group, rate, lease_every, apply_every
            ("64c", 20_000, 13, 28_000.0, 0),
            ("1c", 5_000, 1, 3_000.0, 0),
            ("10/s", 3_000, 1, 10.0, 0),
            ("leased", 20_000, 13, 28_000.0, 2_000),
        ]
        shapes = ("current", "A", "A rowid", "B", "B rowid")
        for load, puts, group, rate, lease_every in loads:
            runs = [(shape, 0.1, PAGE) for shape in shapes]
            if load == "10/s":
                # B applying less often, and A with 2 KiB pages (one frame then covers 1-2 blocks).
                runs += [("B rowid", 1.0, PAGE), ("B rowid", 10.0, PAGE), ("A rowid", 0.1, 2048)]
            for shape, every, page_size in runs:
                s = fresh(f"{load.replace('/', '_')}-{shape.replace(' ', '_')}", shape, page_size)
                s.apply_every = every
                s.preload(small, lease=1 if lease_every else 0)
                s.open()
                label = shape
                if every != 0.1:
                    label += f", apply every {every:g} s"
                if page_size != PAGE:
                    label += f", {page_size // 1024} KiB pages"
                record(load, label, run_load(s, small, puts, group, rate, seed=11,
                                             lease_every=lease_every, lease_base=2))
                drop(s)

        # The big store: preloaded with args.big Kubernetes-shaped keys.
        big = k8s_keys(args.big)
        big_label = f"64c@{args.big // 1000}k" if args.big < 1_000_000 else f"64c@{args.big // 1_000_000}M"
        for shape in shapes:
            s = fresh("big-" + shape.replace(" ", "_"), shape)
            started = time.perf_counter()
            s.preload(big)
            load_s = time.perf_counter() - started
            s.open()
            extra[f"preload_{shape}_s"] = load_s
            extra[f"db_mb_{shape}_big"] = s.db_bytes() / 1e6
            record(big_label, shape, run_load(s, big, 20_000, 13, 28_000.0, seed=13))
            if shape == "A rowid":
                # Start-up: rebuild the index from the log (warm page cache).
                s.close()
                s.conn = open_conn(s.path)
                started = time.perf_counter()
                n = sum(1 for _ in s.conn.execute("SELECT id >> 20, key, create_revision, version, deleted FROM log"))
                scan_s = time.perf_counter() - started
                s.rebuild_index()
                extra["A_rebuild"] = {"log_rows": n, "scan_only_s": scan_s, "scan_and_build_s": s.rebuild_seconds,
                                      "memory": index_memory(s.index)}
                s.index = {}
            drop(s)

        # The benchmark's own put cases, current shape, for BENCHMARKS.md's KB/put.
        bkeys = bench_keys(100_000)
        s = fresh("bench-put", "current")
        s.open()
        record("bench put-1", "current", run_load(s, bkeys, 15_000, 1, 3_000.0, seed=21))
        record("bench put-64", "current", run_load(s, bkeys, 100_000, 13, 17_000.0, seed=22))
        drop(s)
        s = fresh("bench-slow", "current")
        s.open()
        record("bench 10/s", "current", run_load(s, small, 200, 1, 10.0, seed=23))
        drop(s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    extra["total_s"] = time.perf_counter() - t0
    extra["sqlite"] = sqlite3.sqlite_version

    print("| load | shape | puts | commits | pages/commit | WAL KB/commit | B apply pages/put | WAL KB/put | "
          "WAL KB/put, 4 KiB blocks | checkpoint KB/put | total KB/put (WAL + checkpoint) | "
          "disk KB/put (blocks + checkpoint) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        apply = fmt(r["apply_pages_per_put"]) if r["shape"].startswith("B") else ""
        print(f"| {r['load']} | {r['shape']} | {r['puts']:,} | {r['commits']:,} | {fmt(r['pages_per_commit'], 1)} | "
              f"{fmt(r['wal_kb_per_commit'], 1)} | {apply} | {fmt(r['wal_kb_per_put'])} | "
              f"{fmt(r['wal_block_kb_per_put'])} | {fmt(r['ckpt_kb_per_put'])} | {fmt(r['total_kb_per_put'])} | "
              f"**{fmt(r['disk_kb_per_put'])}** |")
    print()
    for r in results:
        if "overlay_max" in r:
            o = r["overlay_max"]
            print(f"- B overlay at its largest, {r['load']} ({r['shape']}): {o['puts']:,} puts, "
                  f"{o['keys']:,} keys, {fmt(o['kb'], 0)} KB (keys + values + 40 B each)")
    a = extra.get("A_rebuild")
    if a:
        m = a["memory"]
        print(f"- A rebuild at {args.big:,} keys: {a['log_rows']:,} log rows, scan only {fmt(a['scan_only_s'])} s, "
              f"scan and build {fmt(a['scan_and_build_s'])} s (Python, warm page cache)")
        print(f"- A index: {m['keys']:,} keys, {fmt(m['key_bytes'] / 1e6, 1)} MB of key bytes, "
              f"{m['revisions']:,} revisions, est. {fmt(m['estimated_mb'], 0)} MB as a Rust BTreeMap "
              f"({fmt(m['per_key_b'], 0)} B per key)")
    for shape in ("current", "A", "A rowid", "B", "B rowid"):
        if f"preload_{shape}_s" in extra:
            print(f"- {shape} big store: preload {fmt(extra[f'preload_{shape}_s'], 1)} s, "
                  f"file {fmt(extra[f'db_mb_{shape}_big'], 0)} MB")
    print(f"- SQLite {extra['sqlite']}, whole run {fmt(extra['total_s'], 0)} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "extra": extra}, f, indent=1)


if __name__ == "__main__":
    main()
