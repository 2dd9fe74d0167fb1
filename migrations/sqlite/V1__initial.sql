-- The revision log: one row per key change. A row with deleted = 1 is a tombstone.
-- Historical reads, watch catch-up and compaction read it.
CREATE TABLE log (
    revision        INTEGER NOT NULL,
    sub             INTEGER NOT NULL,
    key             BLOB    NOT NULL,
    value           BLOB    NOT NULL,
    create_revision INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    lease           INTEGER NOT NULL,
    deleted         INTEGER NOT NULL,
    PRIMARY KEY (revision, sub)
) WITHOUT ROWID;

-- Finds the newest version of a key at or below a revision.
CREATE INDEX log_key_revision ON log (key, revision);

-- The live keys at the current revision, so current reads never touch history.
CREATE TABLE kv (
    key             BLOB    PRIMARY KEY,
    value           BLOB    NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision    INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    lease           INTEGER NOT NULL
) WITHOUT ROWID;

-- The store's counters, updated inside every write transaction.
-- An empty store is at revision 1 and has never been compacted (-1), as in etcd.
CREATE TABLE meta (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    revision          INTEGER NOT NULL,
    compact_revision  INTEGER NOT NULL,
    compacted_through INTEGER NOT NULL
);
INSERT INTO meta (id, revision, compact_revision, compacted_through) VALUES (1, 1, -1, 0);

-- Named settings that outlive a restart: cluster and member ids, later auth state.
CREATE TABLE settings (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
