//! Read and write transactions on pooled connections: the session that
//! always ends its transaction, the `ReadTxn` and `WriteTxn` impls, and the
//! write statements.

use anyhow::{Context, bail};
use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::queries::{
    execute, query_alarms, query_auth_records, query_count, query_expired_leases, query_lease,
    query_lease_keys, query_leases, query_log, query_range, query_revisions, query_setting,
};
use super::{MAX_KEY_BYTES, db_error};
use crate::backend::{
    AlarmRow, AuthKind, BackendResult, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn, Revisions,
    WriteTxn,
};
use crate::proto::mvccpb::KeyValue;

/// A pooled connection with an open transaction. If it is dropped before the
/// transaction ends, the transaction is rolled back before the connection
/// goes back to the pool.
pub(super) struct Session {
    pub(super) conn: Option<Conn>,
    /// A transaction is open on `conn`.
    pub(super) open: bool,
}

impl Session {
    pub(super) fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("connection present until drop")
    }

    async fn end(&mut self, statement: &str) -> BackendResult<()> {
        self.conn()
            .query_drop(statement)
            .await
            .map_err(db_error)
            .with_context(|| format!("MySQL: {statement}"))?;
        self.open = false;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.open {
            return; // back to the pool as it is
        }
        // Ending the transaction takes a round trip, which Drop cannot wait
        // for: a task does it and then lets the connection go back to the
        // pool. Without a runtime, the pool's reset (COM_RESET_CONNECTION)
        // ends it instead, at the price of the connection's prepared statements.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if conn.query_drop("ROLLBACK").await.is_err() {
                        conn.reset_connection(true);
                    }
                });
            }
            Err(_) => conn.reset_connection(true),
        }
    }
}

/// A read transaction: a consistent snapshot on a pooled connection.
pub struct MysqlRead {
    pub(super) session: Session,
}

/// A write transaction, holding the lock on the `meta` row until it ends.
pub struct MysqlWrite {
    pub(super) session: Session,
    /// The counters as locked (and as last stored by this transaction).
    pub(super) revisions: Option<Revisions>,
}

/// The read queries, shared by read and write transactions; `revisions`
/// differs between them.
macro_rules! impl_read_txn {
    ($ty:ty) => {
        impl ReadTxn for $ty {
            async fn revisions(&mut self) -> BackendResult<Revisions> {
                self.current_revisions().await
            }

            async fn range(
                &mut self,
                range: &KeyRange,
                at: ReadAt,
                limit: usize,
                keys_only: bool,
            ) -> BackendResult<Vec<KeyValue>> {
                query_range(self.session.conn(), range, at, limit, keys_only).await
            }

            async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
                query_count(self.session.conn(), range, at).await
            }

            async fn log_entries(
                &mut self,
                after: i64,
                through: i64,
            ) -> BackendResult<Vec<LogEntry>> {
                query_log(self.session.conn(), after, through).await
            }

            async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
                query_setting(self.session.conn(), name).await
            }

            async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
                query_lease(self.session.conn(), id).await
            }

            async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
                query_leases(self.session.conn()).await
            }

            async fn expired_leases(
                &mut self,
                now_ms: i64,
                limit: usize,
            ) -> BackendResult<Vec<i64>> {
                query_expired_leases(self.session.conn(), now_ms, limit).await
            }

            async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
                query_lease_keys(self.session.conn(), id).await
            }

            async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
                query_alarms(self.session.conn()).await
            }

            async fn auth_records(
                &mut self,
                kind: AuthKind,
            ) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
                query_auth_records(self.session.conn(), kind).await
            }
        }
    };
}

impl_read_txn!(MysqlRead);
impl_read_txn!(MysqlWrite);

impl MysqlRead {
    async fn current_revisions(&mut self) -> BackendResult<Revisions> {
        query_revisions(self.session.conn(), false).await
    }
}

impl MysqlWrite {
    /// The counters, locked `FOR UPDATE` when the transaction began (so that
    /// other instances' writers wait for this one), and kept up to date by
    /// `set_revisions`.
    async fn current_revisions(&mut self) -> BackendResult<Revisions> {
        match self.revisions {
            Some(revisions) => Ok(revisions),
            None => {
                let revisions = query_revisions(self.session.conn(), true).await?;
                self.revisions = Some(revisions);
                Ok(revisions)
            }
        }
    }
}

impl WriteTxn for MysqlWrite {
    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let kv = &entry.kv;
        if kv.key.len() > MAX_KEY_BYTES {
            bail!(
                "key of {} bytes is longer than the {MAX_KEY_BYTES} bytes the MySQL backend stores",
                kv.key.len()
            );
        }
        let conn = self.session.conn();
        execute(
            conn,
            "INSERT INTO log (revision, sub, `key`, value, create_revision, version, lease, deleted) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                kv.mod_revision,
                entry.sub,
                kv.key.as_slice(),
                kv.value.as_slice(),
                kv.create_revision,
                kv.version,
                kv.lease,
                i64::from(entry.deleted),
            ),
        )
        .await?;
        if entry.deleted {
            execute(conn, "DELETE FROM kv WHERE `key` = ?", (kv.key.as_slice(),)).await
        } else {
            // VALUES() rather than MySQL 8's row alias, which MariaDB lacks.
            execute(
                conn,
                "INSERT INTO kv (`key`, value, create_revision, mod_revision, version, lease) \
                 VALUES (?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value), \
                 create_revision = VALUES(create_revision), mod_revision = VALUES(mod_revision), \
                 version = VALUES(version), lease = VALUES(lease)",
                (
                    kv.key.as_slice(),
                    kv.value.as_slice(),
                    kv.create_revision,
                    kv.mod_revision,
                    kv.version,
                    kv.lease,
                ),
            )
            .await
        }
    }

    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "UPDATE meta SET revision = ?, compact_revision = ?, compacted_through = ? WHERE id = 1",
            (
                revisions.current,
                revisions.compact,
                revisions.compacted_through,
            ),
        )
        .await?;
        self.revisions = Some(revisions);
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "DELETE FROM log WHERE `key` = ? AND revision <= ? AND (revision < ? OR sub < ?)",
            (
                entry.kv.key.as_slice(),
                entry.kv.mod_revision,
                entry.kv.mod_revision,
                entry.sub,
            ),
        )
        .await
    }

    async fn remove_entry(&mut self, entry: &LogEntry) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "DELETE FROM log WHERE revision = ? AND sub = ?",
            (entry.kv.mod_revision, entry.sub),
        )
        .await
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "INSERT INTO settings (name, value) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE value = VALUES(value)",
            (name, value),
        )
        .await
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "INSERT INTO lease (id, ttl, expires_at) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE ttl = VALUES(ttl), expires_at = VALUES(expires_at)",
            (lease.id, lease.ttl, lease.expires_at),
        )
        .await
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        execute(self.session.conn(), "DELETE FROM lease WHERE id = ?", (id,)).await
    }

    async fn add_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "INSERT IGNORE INTO alarm (member_id, alarm) VALUES (?, ?)",
            (alarm.member_id, alarm.alarm),
        )
        .await
    }

    async fn put_auth_record(
        &mut self,
        kind: AuthKind,
        name: &[u8],
        record: &[u8],
    ) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "INSERT INTO auth (kind, name, record) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE record = VALUES(record)",
            (kind.as_str(), name, record),
        )
        .await
    }

    async fn remove_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "DELETE FROM alarm WHERE member_id = ? AND alarm = ?",
            (alarm.member_id, alarm.alarm),
        )
        .await
    }

    async fn remove_auth_record(&mut self, kind: AuthKind, name: &[u8]) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "DELETE FROM auth WHERE kind = ? AND name = ?",
            (kind.as_str(), name),
        )
        .await
    }

    async fn clear(&mut self) -> BackendResult<()> {
        for table in ["log", "kv", "lease", "settings", "alarm", "auth"] {
            execute(self.session.conn(), &format!("DELETE FROM {table}"), ()).await?;
        }
        self.set_revisions(Revisions::EMPTY_STORE).await
    }

    async fn commit(mut self) -> BackendResult<()> {
        self.session.end("COMMIT").await
    }
}
