//! Read and write transactions on pooled connections: the connection that
//! begins a transaction with its first statement and always ends it, the
//! transaction types, and the write statements.

use anyhow::bail;
use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, RowStream};

use super::db_error;
use crate::backend::{
    AlarmRow, AuthKind, BackendResult, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn, Revisions,
    WriteTxn,
};
use crate::proto::mvccpb::KeyValue;

/// A pooled connection running one transaction. Whatever way it ends, the
/// connection goes back to the pool outside any transaction, or is closed.
pub(super) struct TxnConn {
    client: Option<Object>,
    /// The BEGIN not sent yet: it goes out with the first statement, in one
    /// round trip, and a read that issues no statement never begins at all.
    begin: Option<&'static str>,
    /// A statement failed, so Postgres has aborted the transaction (and
    /// would answer COMMIT with a silent ROLLBACK).
    failed: bool,
}

impl TxnConn {
    pub(super) fn new(client: Object, begin: &'static str) -> Self {
        TxnConn {
            client: Some(client),
            begin: Some(begin),
            failed: false,
        }
    }

    pub(super) async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> BackendResult<Vec<Row>> {
        let client = self
            .client
            .as_ref()
            .expect("connection present until the transaction ends");
        let result = async {
            let statement = client.prepare_cached(sql).await?;
            match self.begin.take() {
                None => client.query(&statement, params).await,
                Some(begin) => {
                    // `biased` polls (and so sends) BEGIN first: the
                    // statement must run inside the transaction.
                    let (began, rows) = tokio::join!(
                        biased;
                        client.batch_execute(begin),
                        client.query(&statement, params),
                    );
                    began?;
                    rows
                }
            }
        }
        .await;
        result.map_err(|error| {
            self.failed = true;
            db_error(&error)
        })
    }
}

impl TxnConn {
    /// Runs `sql` and returns its rows as Postgres sends them, for the
    /// caller to take at its pace (tokio-postgres reads no further than the
    /// taker, so the rows wait in Postgres and the socket). The connection
    /// serves nothing else until the stream is dropped or exhausted.
    pub(super) async fn query_stream(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> BackendResult<RowStream> {
        let client = self
            .client
            .as_ref()
            .expect("connection present until the transaction ends");
        let result = async {
            let statement = client.prepare_cached(sql).await?;
            if let Some(begin) = self.begin.take() {
                client.batch_execute(begin).await?;
            }
            client.query_raw(&statement, params.iter().copied()).await
        }
        .await;
        result.map_err(|error| {
            self.failed = true;
            db_error(&error)
        })
    }

    /// Notes that a statement failed (as one of `query_stream`'s rows did):
    /// Postgres has aborted the transaction.
    pub(super) fn note_failure(&mut self) {
        self.failed = true;
    }
}

impl Drop for TxnConn {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if self.begin.is_some() {
            return; // Nothing was sent: the connection goes back as it came.
        }
        roll_back_in_background(client);
    }
}

/// Ends the open transaction of `client` and returns it to the pool; a
/// connection that cannot roll back (or whose task never runs, as when the
/// runtime shuts down) is closed instead, never pooled mid-transaction.
fn roll_back_in_background(client: Object) {
    struct CloseUnlessReturned(Option<Object>);
    impl Drop for CloseUnlessReturned {
        fn drop(&mut self) {
            if let Some(client) = self.0.take() {
                drop(Object::take(client));
            }
        }
    }
    let mut guard = CloseUnlessReturned(Some(client));
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // The guard closes the connection; the server rolls back.
    };
    runtime.spawn(async move {
        let client = guard.0.as_ref().expect("present until returned");
        if client.batch_execute("ROLLBACK").await.is_ok() {
            drop(guard.0.take()); // Back to the pool.
        }
    });
}

/// A read transaction on a pooled connection; a consistent snapshot.
pub struct PostgresRead {
    pub(super) conn: TxnConn,
}

/// A write transaction on a pooled connection, holding the `meta` row lock.
pub struct PostgresWrite {
    pub(super) conn: TxnConn,
    /// The counters as locked, or as last set in this transaction.
    pub(super) revisions: Revisions,
}

pub(super) const BEGIN_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
// READ COMMITTED whatever the server's default: the meta row lock already
// orders writers, and SERIALIZABLE would only add serialization failures.
pub(super) const BEGIN_WRITE: &str = "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE";
pub(super) const LOCK_META: &str =
    "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1 FOR UPDATE";

/// Forwards the read queries other than `revisions` to the transaction's `TxnConn`.
macro_rules! forward_reads {
    () => {
        async fn range(
            &mut self,
            range: &KeyRange,
            at: ReadAt,
            limit: usize,
            keys_only: bool,
        ) -> BackendResult<Vec<KeyValue>> {
            self.conn.range(range, at, limit, keys_only).await
        }

        async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
            self.conn.count(range, at).await
        }

        async fn log_entries(&mut self, after: i64, through: i64) -> BackendResult<Vec<LogEntry>> {
            self.conn.log_entries(after, through).await
        }

        async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
            self.conn.setting(name).await
        }

        async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
            self.conn.lease(id).await
        }

        async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
            self.conn.leases().await
        }

        async fn expired_leases(&mut self, now_ms: i64, limit: usize) -> BackendResult<Vec<i64>> {
            self.conn.expired_leases(now_ms, limit).await
        }

        async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
            self.conn.lease_keys(id).await
        }

        async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
            self.conn.alarms().await
        }

        async fn auth_records(&mut self, kind: AuthKind) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
            self.conn.auth_records(kind).await
        }
    };
}

impl ReadTxn for PostgresRead {
    async fn revisions(&mut self) -> BackendResult<Revisions> {
        self.conn.revisions().await
    }

    forward_reads!();
}

impl ReadTxn for PostgresWrite {
    /// No query: this transaction holds the meta row lock, so no one else
    /// can have changed the counters since it locked or set them.
    async fn revisions(&mut self) -> BackendResult<Revisions> {
        Ok(self.revisions)
    }

    forward_reads!();
}

impl WriteTxn for PostgresWrite {
    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let kv = &entry.kv;
        // One statement, one round trip: the log row and the kv change.
        let sql = if entry.deleted {
            "WITH logged AS (\
               INSERT INTO log (revision, sub, key, value, create_revision, version, lease, deleted) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, TRUE)\
             ) DELETE FROM kv WHERE key = $3"
        } else {
            "WITH logged AS (\
               INSERT INTO log (revision, sub, key, value, create_revision, version, lease, deleted) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, FALSE)\
             ) INSERT INTO kv (key, value, create_revision, mod_revision, version, lease) \
             VALUES ($3, $4, $5, $1, $6, $7) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, \
               create_revision = EXCLUDED.create_revision, mod_revision = EXCLUDED.mod_revision, \
               version = EXCLUDED.version, lease = EXCLUDED.lease"
        };
        self.conn
            .query(
                sql,
                &[
                    &kv.mod_revision,
                    &entry.sub,
                    &kv.key,
                    &kv.value,
                    &kv.create_revision,
                    &kv.version,
                    &kv.lease,
                ],
            )
            .await?;
        Ok(())
    }

    /// Also NOTIFYs the other instances; Postgres delivers it at commit.
    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        let payload = revisions.current.to_string();
        self.conn
            .query(
                "WITH updated AS (\
                   UPDATE meta SET revision = $1, compact_revision = $2, compacted_through = $3 \
                   WHERE id = 1\
                 ) SELECT pg_notify('cetera', $4)",
                &[
                    &revisions.current,
                    &revisions.compact,
                    &revisions.compacted_through,
                    &payload,
                ],
            )
            .await?;
        self.revisions = revisions;
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.conn
            .query(
                "DELETE FROM log WHERE key = $1 AND (revision, sub) < ($2, $3)",
                &[&entry.kv.key, &entry.kv.mod_revision, &entry.sub],
            )
            .await?;
        Ok(())
    }

    async fn remove_entry(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.conn
            .query(
                "DELETE FROM log WHERE revision = $1 AND sub = $2",
                &[&entry.kv.mod_revision, &entry.sub],
            )
            .await?;
        Ok(())
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        self.conn
            .query(
                "INSERT INTO settings (name, value) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                &[&name, &value],
            )
            .await?;
        Ok(())
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        self.conn
            .query(
                "INSERT INTO lease (id, ttl, expires_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET ttl = EXCLUDED.ttl, expires_at = EXCLUDED.expires_at",
                &[&lease.id, &lease.ttl, &lease.expires_at],
            )
            .await?;
        Ok(())
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        self.conn
            .query("DELETE FROM lease WHERE id = $1", &[&id])
            .await?;
        Ok(())
    }

    async fn add_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.conn
            .query(
                "INSERT INTO alarm (member_id, alarm) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&alarm.member_id, &alarm.alarm],
            )
            .await?;
        Ok(())
    }

    async fn put_auth_record(
        &mut self,
        kind: AuthKind,
        name: &[u8],
        record: &[u8],
    ) -> BackendResult<()> {
        self.conn
            .query(
                "INSERT INTO auth (kind, name, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (kind, name) DO UPDATE SET record = EXCLUDED.record",
                &[&kind.as_str(), &name, &record],
            )
            .await?;
        Ok(())
    }

    async fn remove_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.conn
            .query(
                "DELETE FROM alarm WHERE member_id = $1 AND alarm = $2",
                &[&alarm.member_id, &alarm.alarm],
            )
            .await?;
        Ok(())
    }

    async fn remove_auth_record(&mut self, kind: AuthKind, name: &[u8]) -> BackendResult<()> {
        self.conn
            .query(
                "DELETE FROM auth WHERE kind = $1 AND name = $2",
                &[&kind.as_str(), &name],
            )
            .await?;
        Ok(())
    }

    async fn clear(&mut self) -> BackendResult<()> {
        for table in ["log", "kv", "lease", "settings", "alarm", "auth"] {
            self.conn
                .query(&format!("DELETE FROM {table}"), &[])
                .await?;
        }
        self.set_revisions(Revisions::EMPTY_STORE).await
    }

    async fn commit(mut self) -> BackendResult<()> {
        if self.conn.failed {
            // Dropping self rolls back.
            bail!("the transaction was aborted by an earlier error");
        }
        let client = self
            .conn
            .client
            .take()
            .expect("connection present until the transaction ends");
        match client.batch_execute("COMMIT").await {
            Ok(()) => Ok(()), // The connection goes back to the pool.
            Err(error) => {
                // Whether it committed is unknown; do not reuse the connection.
                drop(Object::take(client));
                Err(db_error(&error).context("COMMIT failed"))
            }
        }
    }
}
