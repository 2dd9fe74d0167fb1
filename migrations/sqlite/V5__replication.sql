-- Replicated mode (Raft): the last log entry applied to this store and the cluster
-- membership as of it, encoded by crate::raft, written in the same transaction as the
-- entry's changes. One row, absent on a store that was never a cluster member.
CREATE TABLE replication (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    mark BLOB NOT NULL
);
