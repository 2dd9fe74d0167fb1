-- The log becomes the only table of keys, ordered by revision: its row id is
-- revision << 20 | sub, so a commit appends at the end of one B-tree. The
-- live-key table and the key-ordered indexes go: the server keeps the key index
-- in memory (src/backend/sqlite/key_index.rs) and builds it from the log at start.
CREATE TABLE log_by_revision (
    id              INTEGER PRIMARY KEY,  -- revision << 20 | sub
    key             BLOB    NOT NULL,
    value           BLOB    NOT NULL,
    create_revision INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    lease           INTEGER NOT NULL,
    deleted         INTEGER NOT NULL
);
INSERT INTO log_by_revision (id, key, value, create_revision, version, lease, deleted)
    SELECT (revision << 20) | sub, key, value, create_revision, version, lease, deleted
    FROM log ORDER BY revision, sub;
DROP TABLE kv;
DROP TABLE log;
ALTER TABLE log_by_revision RENAME TO log;
