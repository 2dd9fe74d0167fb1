-- The MySQL/MariaDB schema: the same tables, columns and meaning as
-- migrations/sqlite (see ARCHITECTURE.md), in InnoDB.
--
-- Keys are VARBINARY, compared bytewise like etcd's keys (a binary string has
-- no collation, so no case folding and no trailing-space padding).
--
-- Key length limit: 3056 bytes. InnoDB (DYNAMIC row format, 16 KiB pages)
-- allows at most 3072 bytes per index, and the longest index holding a key is
-- log_key_revision: key + revision (8) + sub (8) = 3072. kv_lease holds
-- lease (8) + key. The backend refuses a longer key with a clear error before
-- it reaches the server, and the session runs in strict mode, so a key is
-- never silently truncated. (Servers with 4 or 8 KiB pages have a lower index
-- limit and refuse this schema outright.)

-- The revision log: one row per key change. A row with deleted = 1 is a tombstone.
-- Historical reads, watch catch-up and compaction read it.
CREATE TABLE log (
    revision        BIGINT           NOT NULL,
    sub             BIGINT           NOT NULL,
    `key`           VARBINARY(3056)  NOT NULL,
    value           LONGBLOB         NOT NULL,
    create_revision BIGINT           NOT NULL,
    version         BIGINT           NOT NULL,
    lease           BIGINT           NOT NULL,
    deleted         TINYINT          NOT NULL,
    PRIMARY KEY (revision, sub),
    -- Finds the newest version of a key at or below a revision.
    INDEX log_key_revision (`key`, revision, sub)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- The live keys at the current revision, so current reads never touch history.
CREATE TABLE kv (
    `key`           VARBINARY(3056)  NOT NULL,
    value           LONGBLOB         NOT NULL,
    create_revision BIGINT           NOT NULL,
    mod_revision    BIGINT           NOT NULL,
    version         BIGINT           NOT NULL,
    lease           BIGINT           NOT NULL,
    PRIMARY KEY (`key`)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- The store's counters, updated inside every write transaction; writers lock
-- this row (SELECT ... FOR UPDATE) first, so several cetera instances on one
-- database take revisions one after another.
-- An empty store is at revision 1 and has never been compacted (-1), as in etcd.
CREATE TABLE meta (
    id                TINYINT NOT NULL PRIMARY KEY CHECK (id = 1),
    revision          BIGINT  NOT NULL,
    compact_revision  BIGINT  NOT NULL,
    compacted_through BIGINT  NOT NULL
) ENGINE = InnoDB;
INSERT INTO meta (id, revision, compact_revision, compacted_through) VALUES (1, 1, -1, 0);

-- Named settings that outlive a restart: cluster and member ids, later auth state.
CREATE TABLE settings (
    name  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    value BIGINT NOT NULL
) ENGINE = InnoDB;
