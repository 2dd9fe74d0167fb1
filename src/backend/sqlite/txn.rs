//! Read and write transactions: the pooled reader's snapshot, the single
//! writer's transaction, their `ReadTxn` and `WriteTxn` impls and the write
//! statements.

use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::OwnedMutexGuard;

use super::checkpointer::{self, Checkpointer};
use super::queries::{
    query_alarms, query_auth_records, query_count, query_expired_leases, query_lease,
    query_lease_keys, query_leases, query_log, query_range, query_revisions, query_setting,
};
use super::return_reader;
use crate::backend::{
    AlarmRow, AuthKind, BackendResult, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn, Revisions,
    WriteTxn,
};
use crate::proto::mvccpb::KeyValue;

/// A read transaction on a pooled connection; the snapshot is released on drop.
pub struct SqliteRead {
    pub(super) conn: Option<Connection>,
    pub(super) pool: Arc<Mutex<Vec<Connection>>>,
}

impl Drop for SqliteRead {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // A connection whose rollback fails is not reused.
            let rollback = conn
                .prepare_cached("ROLLBACK")
                .and_then(|mut stmt| stmt.execute([]));
            if rollback.is_ok() {
                return_reader(&self.pool, conn);
            }
        }
    }
}

/// The write transaction on the single writer connection.
pub struct SqliteWrite {
    pub(super) conn: OwnedMutexGuard<Connection>,
    pub(super) checkpointer: Arc<Checkpointer>,
    /// The `meta` row as this transaction read it (see `query_revisions`).
    pub(super) meta: Option<Revisions>,
    /// The current revision as this transaction read it.
    pub(super) read_current: i64,
    /// The revision of the last log row appended in this transaction.
    pub(super) last_appended: i64,
    pub(super) committed: bool,
}

impl Drop for SqliteWrite {
    fn drop(&mut self) {
        if !self.committed {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// The read queries, shared by read and write transactions.
macro_rules! impl_read_txn {
    ($ty:ty, $conn:ident => $get:expr) => {
        impl ReadTxn for $ty {
            async fn revisions(&mut self) -> BackendResult<Revisions> {
                let (revisions, meta) = {
                    let $conn = &*self;
                    query_revisions($get)?
                };
                self.note_meta(meta, revisions.current);
                Ok(revisions)
            }

            async fn range(
                &mut self,
                range: &KeyRange,
                at: ReadAt,
                limit: usize,
                _keys_only: bool,
            ) -> BackendResult<Vec<KeyValue>> {
                let $conn = self;
                Ok(query_range($get, range, at, limit)?)
            }

            async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
                let $conn = self;
                Ok(query_count($get, range, at)?)
            }

            async fn log_entries(
                &mut self,
                after: i64,
                through: i64,
            ) -> BackendResult<Vec<LogEntry>> {
                let $conn = self;
                Ok(query_log($get, after, through)?)
            }

            async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
                let $conn = self;
                Ok(query_setting($get, name)?)
            }

            async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
                let $conn = self;
                Ok(query_lease($get, id)?)
            }

            async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
                let $conn = self;
                Ok(query_leases($get)?)
            }

            async fn expired_leases(
                &mut self,
                now_ms: i64,
                limit: usize,
            ) -> BackendResult<Vec<i64>> {
                let $conn = self;
                Ok(query_expired_leases($get, now_ms, limit)?)
            }

            async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
                let $conn = self;
                Ok(query_lease_keys($get, id)?)
            }

            async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
                let $conn = self;
                Ok(query_alarms($get)?)
            }

            async fn auth_records(
                &mut self,
                kind: AuthKind,
            ) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
                let $conn = self;
                Ok(query_auth_records($get, kind)?)
            }

            async fn replication_mark(&mut self) -> BackendResult<Option<Vec<u8>>> {
                let $conn = self;
                Ok($get
                    .prepare_cached("SELECT mark FROM replication WHERE id = 1")?
                    .query_row([], |r| r.get(0))
                    .optional()?)
            }
        }
    };
}

impl SqliteRead {
    fn note_meta(&mut self, _meta: Revisions, _current: i64) {}
}

impl SqliteWrite {
    fn note_meta(&mut self, meta: Revisions, current: i64) {
        self.meta = Some(meta);
        self.read_current = current;
    }

    /// True if the log alone tells the store's counters after `revisions`:
    /// the compaction counters are as `meta` has them and the current
    /// revision is the last one logged (or unchanged since it was read).
    fn meta_still_holds(&self, revisions: &Revisions) -> bool {
        self.meta.is_some_and(|meta| {
            meta.compact == revisions.compact
                && meta.compacted_through == revisions.compacted_through
                && (revisions.current == self.last_appended
                    || revisions.current == self.read_current)
        })
    }
}

impl_read_txn!(SqliteRead, txn => txn.conn.as_ref().expect("connection present until drop"));
impl_read_txn!(SqliteWrite, txn => &txn.conn);

impl WriteTxn for SqliteWrite {
    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let kv = &entry.kv;
        self.last_appended = self.last_appended.max(kv.mod_revision);
        self.conn
            .prepare_cached(
                "INSERT INTO log (revision, sub, key, value, create_revision, version, lease, deleted) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                kv.mod_revision,
                entry.sub,
                kv.key,
                kv.value,
                kv.create_revision,
                kv.version,
                kv.lease,
                entry.deleted
            ])?;
        if entry.deleted {
            self.conn
                .prepare_cached("DELETE FROM kv WHERE key = ?1")?
                .execute([&kv.key])?;
        } else {
            self.conn
                .prepare_cached(
                    "INSERT OR REPLACE INTO kv (key, value, create_revision, mod_revision, version, lease) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    kv.key,
                    kv.value,
                    kv.create_revision,
                    kv.mod_revision,
                    kv.version,
                    kv.lease
                ])?;
        }
        Ok(())
    }

    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        if self.meta_still_holds(&revisions) {
            return Ok(());
        }
        self.conn
            .prepare_cached(
                "UPDATE meta SET revision = ?1, compact_revision = ?2, compacted_through = ?3",
            )?
            .execute(params![
                revisions.current,
                revisions.compact,
                revisions.compacted_through
            ])?;
        self.note_meta(revisions, revisions.current);
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.conn
            .prepare_cached(
                "DELETE FROM log WHERE key = ?1 AND revision <= ?2 AND (revision < ?2 OR sub < ?3)",
            )?
            .execute(params![entry.kv.key, entry.kv.mod_revision, entry.sub])?;
        Ok(())
    }

    async fn remove_entry(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.conn
            .prepare_cached("DELETE FROM log WHERE revision = ?1 AND sub = ?2")?
            .execute(params![entry.kv.mod_revision, entry.sub])?;
        Ok(())
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO settings (name, value) VALUES (?1, ?2)")?
            .execute(params![name, value])?;
        Ok(())
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO lease (id, ttl, expires_at) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![lease.id, lease.ttl, lease.expires_at])?;
        Ok(())
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        self.conn
            .prepare_cached("DELETE FROM lease WHERE id = ?1")?
            .execute([id])?;
        Ok(())
    }

    async fn add_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO alarm (member_id, alarm) VALUES (?1, ?2)")?
            .execute(params![alarm.member_id, alarm.alarm])?;
        Ok(())
    }

    async fn remove_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.conn
            .prepare_cached("DELETE FROM alarm WHERE member_id = ?1 AND alarm = ?2")?
            .execute(params![alarm.member_id, alarm.alarm])?;
        Ok(())
    }

    async fn clear(&mut self) -> BackendResult<()> {
        self.conn.execute_batch(
            "DELETE FROM log; DELETE FROM kv; DELETE FROM lease; DELETE FROM settings; DELETE FROM alarm; DELETE FROM auth; DELETE FROM replication;",
        )?;
        self.meta = None;
        self.last_appended = 0;
        self.set_revisions(Revisions::EMPTY_STORE).await
    }

    async fn put_auth_record(
        &mut self,
        kind: AuthKind,
        name: &[u8],
        record: &[u8],
    ) -> BackendResult<()> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO auth (kind, name, record) VALUES (?1, ?2, ?3)")?
            .execute(params![kind.as_str(), name, record])?;
        Ok(())
    }

    async fn set_replication_mark(&mut self, mark: &[u8]) -> BackendResult<()> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO replication (id, mark) VALUES (1, ?1)")?
            .execute([mark])?;
        Ok(())
    }

    async fn remove_auth_record(&mut self, kind: AuthKind, name: &[u8]) -> BackendResult<()> {
        self.conn
            .prepare_cached("DELETE FROM auth WHERE kind = ?1 AND name = ?2")?
            .execute(params![kind.as_str(), name])?;
        Ok(())
    }

    async fn commit(mut self) -> BackendResult<()> {
        self.conn.execute_batch("COMMIT")?;
        self.committed = true;
        self.checkpointer
            .after_commit(&self.conn, checkpointer::wal_pages_after_commit());
        Ok(())
    }
}
