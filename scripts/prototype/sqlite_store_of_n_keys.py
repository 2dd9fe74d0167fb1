#!/usr/bin/env python3
"""Fills a new cetera SQLite store with N keys, as N puts would leave it.

Measures cetera's start (the key index's build from the log) and memory on
a large store without the minutes of putting N keys through the API:

    cetera --endpoint sqlite:///var/tmp/m1/state.db &   # once: creates the schema; stop it
    python3 scripts/prototype/sqlite_store_of_n_keys.py /var/tmp/m1/state.db 1000000
    cetera --endpoint sqlite:///var/tmp/m1/state.db     # time until it serves; VmRSS

Keys are /registry/pods/namespace-(i % 1000)/pod-i with 256-byte values, one
revision each (the log's row id is revision << 20, migrations/sqlite/V6).
"""
import os
import sqlite3
import sys

path, n = sys.argv[1], int(sys.argv[2])
db = sqlite3.connect(path)
db.execute("BEGIN")
value = b"v" * 256
for i in range(n):
    revision = i + 2
    key = b"/registry/pods/namespace-%d/pod-%d" % (i % 1000, i)
    db.execute(
        "INSERT INTO log (id, key, value, create_revision, version, lease, deleted) "
        "VALUES (?, ?, ?, ?, 1, 0, 0)",
        (revision << 20, key, value, revision),
    )
db.execute("UPDATE meta SET revision = ?", (n + 1,))
db.execute("COMMIT")
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.close()
print(f"{n} keys, {os.path.getsize(path)} bytes")
