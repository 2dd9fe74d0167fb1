-- The revision log: one row per key change. A row with deleted = TRUE is a tombstone.
-- Historical reads, watch catch-up and compaction read it.
CREATE TABLE log (
    revision        BIGINT  NOT NULL,
    sub             BIGINT  NOT NULL,
    key             BYTEA   NOT NULL,
    value           BYTEA   NOT NULL,
    create_revision BIGINT  NOT NULL,
    version         BIGINT  NOT NULL,
    lease           BIGINT  NOT NULL,
    deleted         BOOLEAN NOT NULL,
    PRIMARY KEY (revision, sub)
);

-- Finds the newest version of a key at or below a revision. The descending
-- columns match `DISTINCT ON (key) ... ORDER BY key, revision DESC, sub DESC`,
-- so a historical range reads this index in order and stops at its LIMIT.
CREATE INDEX log_key_revision ON log (key, revision DESC, sub DESC);

-- The live keys at the current revision, so current reads never touch history.
-- Keys are updated in place all the time: the free space per page lets
-- Postgres keep the new row version on the same page (a HOT update).
CREATE TABLE kv (
    key             BYTEA  PRIMARY KEY,
    value           BYTEA  NOT NULL,
    create_revision BIGINT NOT NULL,
    mod_revision    BIGINT NOT NULL,
    version         BIGINT NOT NULL,
    lease           BIGINT NOT NULL
) WITH (fillfactor = 80);

-- The store's counters, updated inside every write transaction. Writers lock
-- this row first, so instances sharing the database commit one at a time.
-- An empty store is at revision 1 and has never been compacted (-1), as in etcd.
CREATE TABLE meta (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    revision          BIGINT  NOT NULL,
    compact_revision  BIGINT  NOT NULL,
    compacted_through BIGINT  NOT NULL
);
INSERT INTO meta (id, revision, compact_revision, compacted_through) VALUES (1, 1, -1, 0);

-- Named settings that outlive a restart: cluster and member ids, later auth state.
CREATE TABLE settings (
    name  TEXT   PRIMARY KEY,
    value BIGINT NOT NULL
);
