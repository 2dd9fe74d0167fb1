//! Read and write transactions on pooled connections: the connection that
//! begins a transaction with its first statement and always ends it, the
//! transaction types, and the write statements.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use anyhow::bail;
use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, RowStream};

use super::key_writes::{KeyWrites, Params};
use super::{Connections, db_error};
use crate::backend::key_reads::{KeyReads, gathered_key};
use crate::backend::read_ahead::ReadAheadCache;
use crate::backend::{
    AlarmRow, AuthKind, BackendResult, CurrentRange, CurrentRangeQuery, KeyRange, LeaseRow,
    LogEntry, ReadAhead, ReadAt, ReadTxn, Revisions, WriteTxn,
};
use crate::proto::mvccpb::KeyValue;

/// A pooled connection running one transaction. Whatever way it ends, the
/// connection goes back to the pool outside any transaction, or is closed.
///
/// Statements go out pipelined: tokio-postgres sends a query as soon as its
/// future is first polled, so the BEGIN not sent yet, the writes nobody
/// waits for (`defer`) and the statements waited for all leave in one
/// flight and cost one round trip together.
pub(super) struct TxnConn {
    pub(super) client: Option<Object>,
    /// The BEGIN not sent yet: it goes out with the first statement, in one
    /// round trip, and a read that issues no statement never begins at all.
    pub(super) begin: Option<&'static str>,
    /// A statement failed, so Postgres has aborted the transaction (and
    /// would answer COMMIT with a silent ROLLBACK).
    pub(super) failed: bool,
    /// Writes not sent yet: they go out ahead of the next statement.
    deferred: Vec<Deferred>,
    /// Key writes not sent yet, gathered: they go out ahead of `deferred`'s
    /// next statement, few statements for many keys.
    key_writes: KeyWrites,
}

/// A write whose result nobody waits for, with its parameters.
struct Deferred {
    sql: &'static str,
    params: Params,
}

/// A statement to run and wait for, with its parameters.
pub(super) type Statement<'a> = (&'a str, &'a [&'a (dyn ToSql + Sync)]);

/// A query's future, boxed so that statements of all kinds go in one list.
type Pending<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a>>;

/// Polls `futures` in their order until all are done; the first round of
/// polls is in that order too, so their statements are sent in it.
async fn all_in_order(
    mut futures: Vec<Pending<'_>>,
) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
    let mut outputs: Vec<Option<Result<Vec<Row>, tokio_postgres::Error>>> =
        futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(result) => *output = Some(result),
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future is done"))
        .collect()
}

impl TxnConn {
    pub(super) fn new(client: Object, begin: &'static str) -> Self {
        TxnConn {
            client: Some(client),
            begin: Some(begin),
            failed: false,
            deferred: Vec::new(),
            key_writes: KeyWrites::default(),
        }
    }

    /// Queues a write; it is sent ahead of the next statement run.
    pub(super) fn defer(&mut self, sql: &'static str, params: Params) {
        self.defer_key_writes();
        self.deferred.push(Deferred { sql, params });
    }

    /// Queues a log row and its `kv` change, gathered with the key writes
    /// queued just before it.
    pub(super) fn write_key(&mut self, entry: &LogEntry) {
        self.key_writes.add(entry);
    }

    /// Queues the gathered key writes' statements.
    fn defer_key_writes(&mut self) {
        for (sql, params) in self.key_writes.take() {
            self.deferred.push(Deferred { sql, params });
        }
    }

    pub(super) async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> BackendResult<Vec<Row>> {
        let mut rows = self.pipeline(&[(sql, params)], None).await?;
        Ok(rows.pop().expect("one result per statement"))
    }

    /// Runs `statements` in one round trip, after the BEGIN and the
    /// deferred writes not sent yet, and then `end` (COMMIT) if given; the
    /// rows of each of `statements`. The first error is the answer.
    pub(super) async fn pipeline(
        &mut self,
        statements: &[Statement<'_>],
        end: Option<&'static str>,
    ) -> BackendResult<Vec<Vec<Row>>> {
        self.defer_key_writes();
        let client = self
            .client
            .as_ref()
            .expect("connection present until the transaction ends");
        let deferred = std::mem::take(&mut self.deferred);
        let begin = self.begin.take();
        let result = async {
            let mut prepared = Vec::with_capacity(deferred.len() + statements.len());
            for sql in deferred
                .iter()
                .map(|d| d.sql)
                .chain(statements.iter().map(|s| s.0))
            {
                prepared.push(client.prepare_cached(sql).await?);
            }
            let deferred_params: Vec<Vec<&(dyn ToSql + Sync)>> = deferred
                .iter()
                .map(|d| {
                    d.params
                        .iter()
                        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                        .collect()
                })
                .collect();
            let params = deferred_params
                .iter()
                .map(Vec::as_slice)
                .chain(statements.iter().map(|s| s.1));
            let mut futures: Vec<Pending<'_>> = Vec::with_capacity(prepared.len() + 2);
            if let Some(begin) = begin {
                futures.push(Box::pin(async move {
                    client.batch_execute(begin).await.map(|()| Vec::new())
                }));
            }
            for (statement, params) in prepared.iter().zip(params) {
                futures.push(Box::pin(client.query(statement, params)));
            }
            if let Some(end) = end {
                futures.push(Box::pin(async move {
                    client.batch_execute(end).await.map(|()| Vec::new())
                }));
            }
            let skip = usize::from(begin.is_some()) + deferred.len();
            let mut rows = Vec::with_capacity(statements.len());
            for (i, result) in all_in_order(futures).await.into_iter().enumerate() {
                let result = result?;
                if i >= skip && rows.len() < statements.len() {
                    rows.push(result);
                }
            }
            Ok(rows)
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
            debug_assert!(
                self.deferred.is_empty() && self.key_writes.is_empty(),
                "a read transaction writes nothing"
            );
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
    /// None until the first statement: a Range of one key that another
    /// read's statement answers never takes a connection.
    conn: Option<TxnConn>,
    connections: Arc<Connections>,
    key_reads: Arc<KeyReads>,
}

impl PostgresRead {
    pub(super) fn new(connections: Arc<Connections>, key_reads: Arc<KeyReads>) -> Self {
        PostgresRead {
            conn: None,
            connections,
            key_reads,
        }
    }

    /// The transaction's connection, taken from the pool at first use.
    pub(super) async fn conn(&mut self) -> BackendResult<&mut TxnConn> {
        if self.conn.is_none() {
            let client = self.connections.pooled().await?;
            self.conn = Some(TxnConn::new(client, BEGIN_READ));
        }
        Ok(self.conn.as_mut().expect("just taken"))
    }
}

/// A write transaction on a pooled connection, holding the `meta` row lock
/// from its first statement on. Its writes are deferred (`TxnConn::defer`)
/// and go out with its next read or its COMMIT; what it read ahead or wrote
/// answers its later reads of the same keys and leases.
pub struct PostgresWrite {
    pub(super) conn: TxnConn,
    /// The counters as locked, or as last set in this transaction; None
    /// until the first statement has locked them.
    pub(super) revisions: Option<Revisions>,
    /// The alarms, keys and leases read with the lock or written since.
    known: ReadAheadCache,
    /// The payload of this instance's NOTIFYs.
    notify_payload: Arc<str>,
}

const READ_ALARMS: &str = "SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm";
const READ_KEYS: &str = "SELECT key, value, create_revision, mod_revision, version, lease \
                         FROM kv WHERE key = ANY($1)";
const READ_LEASES: &str = "SELECT id, ttl, expires_at FROM lease WHERE id = ANY($1)";

impl PostgresWrite {
    pub(super) fn new(conn: TxnConn, notify_payload: Arc<str>) -> Self {
        PostgresWrite {
            conn,
            revisions: None,
            known: ReadAheadCache::default(),
            notify_payload,
        }
    }

    /// Sends BEGIN, locks the counters and reads the alarms (and `ahead`)
    /// in one round trip, unless that was done already.
    async fn lock(&mut self, ahead: Option<&ReadAhead>) -> BackendResult<()> {
        let no_params: &[&(dyn ToSql + Sync)] = &[];
        let keys: Vec<&[u8]> =
            ahead.map_or(Vec::new(), |a| a.keys.iter().map(Vec::as_slice).collect());
        let leases: Vec<i64> = ahead.map_or(Vec::new(), |a| a.leases.clone());
        let key_params: [&(dyn ToSql + Sync); 1] = [&keys];
        let lease_params: [&(dyn ToSql + Sync); 1] = [&leases];
        let mut statements: Vec<Statement<'_>> = Vec::with_capacity(4);
        if self.revisions.is_none() {
            statements.push((LOCK_META, no_params));
            statements.push((READ_ALARMS, no_params));
        }
        if !keys.is_empty() {
            statements.push((READ_KEYS, &key_params));
        }
        if !leases.is_empty() {
            statements.push((READ_LEASES, &lease_params));
        }
        if statements.is_empty() {
            return Ok(());
        }
        let results = self.conn.pipeline(&statements, None).await?.into_iter();
        let locking = self.revisions.is_none();
        if let Some(revisions) = self.known.take_in(results, locking, ahead)? {
            self.revisions = Some(revisions);
        }
        Ok(())
    }

    /// Makes sure the counters are locked before anything else runs.
    async fn locked(&mut self) -> BackendResult<Revisions> {
        if self.revisions.is_none() {
            self.lock(None).await?;
        }
        Ok(self.revisions.expect("locked"))
    }
}

const BEGIN_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
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
            self.conn().await?.range(range, at, limit, keys_only).await
        }

        async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
            self.conn().await?.count(range, at).await
        }

        async fn keys_at(
            &mut self,
            keys: &[Vec<u8>],
            revision: i64,
        ) -> BackendResult<Vec<KeyValue>> {
            self.conn().await?.keys_at(keys, revision).await
        }

        async fn log_entries(&mut self, after: i64, through: i64) -> BackendResult<Vec<LogEntry>> {
            self.conn().await?.log_entries(after, through).await
        }

        async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
            self.conn().await?.setting(name).await
        }

        async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
            self.conn().await?.lease(id).await
        }

        async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
            self.conn().await?.leases().await
        }

        async fn expired_leases(&mut self, now_ms: i64, limit: usize) -> BackendResult<Vec<i64>> {
            self.conn().await?.expired_leases(now_ms, limit).await
        }

        async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
            self.conn().await?.lease_keys(id).await
        }

        async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
            self.conn().await?.alarms().await
        }

        async fn auth_records(&mut self, kind: AuthKind) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
            self.conn().await?.auth_records(kind).await
        }
    };
}

impl ReadTxn for PostgresRead {
    async fn revisions(&mut self) -> BackendResult<Revisions> {
        self.conn().await?.revisions().await
    }

    /// One statement, outside any transaction when it is the first; for
    /// one key, shared with the reads of other keys that come meanwhile.
    async fn current_range(&mut self, query: CurrentRangeQuery<'_>) -> BackendResult<CurrentRange> {
        if self.conn.is_none()
            && let Some(key) = gathered_key(&query)
        {
            let key_reads = self.key_reads.clone();
            let read_keys = async |keys: &[&[u8]]| self.conn().await?.current_keys(keys).await;
            return Ok(key_reads.read(key, read_keys).await?.into_range(query));
        }
        self.conn().await?.current_range(query).await
    }

    forward_reads!();
}

impl ReadTxn for PostgresWrite {
    /// No query once locked: this transaction holds the meta row lock, so
    /// no one else can have changed the counters since it locked or set them.
    async fn revisions(&mut self) -> BackendResult<Revisions> {
        self.locked().await
    }

    async fn range(
        &mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> BackendResult<Vec<KeyValue>> {
        self.locked().await?;
        if at == ReadAt::Current
            && let Some(known) = range.as_single().and_then(|key| self.known.key(key))
        {
            return Ok(known.iter().cloned().collect());
        }
        self.conn.range(range, at, limit, keys_only).await
    }

    async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
        self.locked().await?;
        self.conn.count(range, at).await
    }

    async fn keys_at(&mut self, keys: &[Vec<u8>], revision: i64) -> BackendResult<Vec<KeyValue>> {
        self.locked().await?;
        self.conn.keys_at(keys, revision).await
    }

    async fn log_entries(&mut self, after: i64, through: i64) -> BackendResult<Vec<LogEntry>> {
        self.locked().await?;
        self.conn.log_entries(after, through).await
    }

    async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
        self.locked().await?;
        self.conn.setting(name).await
    }

    async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
        self.locked().await?;
        if let Some(known) = self.known.lease(id) {
            return Ok(known);
        }
        self.conn.lease(id).await
    }

    async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
        self.locked().await?;
        self.conn.leases().await
    }

    async fn expired_leases(&mut self, now_ms: i64, limit: usize) -> BackendResult<Vec<i64>> {
        self.locked().await?;
        self.conn.expired_leases(now_ms, limit).await
    }

    async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
        self.locked().await?;
        self.conn.lease_keys(id).await
    }

    async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
        self.locked().await?;
        if let Some(alarms) = self.known.alarms() {
            return Ok(alarms.clone());
        }
        let alarms = self.conn.alarms().await?;
        self.known.read_alarms(alarms.clone());
        Ok(alarms)
    }

    async fn auth_records(&mut self, kind: AuthKind) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.locked().await?;
        self.conn.auth_records(kind).await
    }
}

/// Boxes a write's parameters for `TxnConn::defer`.
macro_rules! params {
    ($($param:expr),* $(,)?) => {
        vec![$(Box::new($param) as Box<dyn ToSql + Sync + Send>),*]
    };
}

impl WriteTxn for PostgresWrite {
    async fn read_ahead(&mut self, ahead: &ReadAhead) -> BackendResult<()> {
        self.lock(Some(ahead)).await
    }

    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.locked().await?;
        let kv = &entry.kv;
        self.conn.write_key(entry);
        let live = (!entry.deleted).then(|| kv.clone());
        self.known.wrote_key(&kv.key, live);
        Ok(())
    }

    /// Also NOTIFYs the other instances; Postgres delivers it at commit. The
    /// payload names this instance, whose own listener skips it: the writer
    /// publishes its commits itself.
    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "WITH updated AS (\
               UPDATE meta SET revision = $1, compact_revision = $2, compacted_through = $3 \
               WHERE id = 1\
             ) SELECT pg_notify('cetera', $4)",
            params![
                revisions.current,
                revisions.compact,
                revisions.compacted_through,
                self.notify_payload.to_string(),
            ],
        );
        self.revisions = Some(revisions);
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "DELETE FROM log WHERE key = $1 AND (revision, sub) < ($2, $3)",
            params![entry.kv.key.clone(), entry.kv.mod_revision, entry.sub],
        );
        Ok(())
    }

    async fn remove_entry(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "DELETE FROM log WHERE revision = $1 AND sub = $2",
            params![entry.kv.mod_revision, entry.sub],
        );
        Ok(())
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "INSERT INTO settings (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
            params![name.to_string(), value],
        );
        Ok(())
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "INSERT INTO lease (id, ttl, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET ttl = EXCLUDED.ttl, expires_at = EXCLUDED.expires_at",
            params![lease.id, lease.ttl, lease.expires_at],
        );
        self.known.wrote_lease(lease.id, Some(*lease));
        Ok(())
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        self.locked().await?;
        self.conn
            .defer("DELETE FROM lease WHERE id = $1", params![id]);
        self.known.wrote_lease(id, None);
        Ok(())
    }

    async fn add_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "INSERT INTO alarm (member_id, alarm) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            params![alarm.member_id, alarm.alarm],
        );
        self.known.changed_alarms();
        Ok(())
    }

    async fn put_auth_record(
        &mut self,
        kind: AuthKind,
        name: &[u8],
        record: &[u8],
    ) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "INSERT INTO auth (kind, name, record) VALUES ($1, $2, $3) \
             ON CONFLICT (kind, name) DO UPDATE SET record = EXCLUDED.record",
            params![kind.as_str().to_string(), name.to_vec(), record.to_vec()],
        );
        Ok(())
    }

    async fn remove_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "DELETE FROM alarm WHERE member_id = $1 AND alarm = $2",
            params![alarm.member_id, alarm.alarm],
        );
        self.known.changed_alarms();
        Ok(())
    }

    async fn remove_auth_record(&mut self, kind: AuthKind, name: &[u8]) -> BackendResult<()> {
        self.locked().await?;
        self.conn.defer(
            "DELETE FROM auth WHERE kind = $1 AND name = $2",
            params![kind.as_str().to_string(), name.to_vec()],
        );
        Ok(())
    }

    async fn clear(&mut self) -> BackendResult<()> {
        self.locked().await?;
        for sql in [
            "DELETE FROM log",
            "DELETE FROM kv",
            "DELETE FROM lease",
            "DELETE FROM settings",
            "DELETE FROM alarm",
            "DELETE FROM auth",
        ] {
            self.conn.defer(sql, Vec::new());
        }
        self.known.cleared();
        self.set_revisions(Revisions::EMPTY_STORE).await
    }

    /// The deferred writes and COMMIT, in one round trip.
    async fn commit(mut self) -> BackendResult<()> {
        if self.conn.failed {
            // Dropping self rolls back.
            bail!("the transaction was aborted by an earlier error");
        }
        if self.conn.begin.is_some() {
            return Ok(()); // Nothing was sent: nothing to commit.
        }
        let result = self.conn.pipeline(&[], Some("COMMIT")).await;
        let client = self
            .conn
            .client
            .take()
            .expect("connection present until the transaction ends");
        match result {
            Ok(_) => Ok(()), // The connection goes back to the pool.
            Err(error) => {
                // Whether it committed is unknown; do not reuse the connection.
                drop(Object::take(client));
                Err(error.context("COMMIT failed"))
            }
        }
    }
}
