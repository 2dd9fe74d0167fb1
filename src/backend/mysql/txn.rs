//! Read and write transactions on pooled connections: the session that
//! always ends its transaction, the `ReadTxn` and `WriteTxn` impls, and the
//! write statements.

use std::sync::Arc;

use anyhow::{Context, bail};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row};

use super::key_writes::KeyWrites;
use super::queries::{
    bytes_literal, execute, query_alarms, query_auth_records, query_count, query_current_keys,
    query_current_range, query_expired_leases, query_keys_at, query_lease, query_lease_keys,
    query_leases, query_log, query_range, query_revisions, query_setting,
};
use super::{MAX_KEY_BYTES, db_error};
use crate::backend::key_reads::{KeyReads, gathered_key};
use crate::backend::read_ahead::ReadAheadCache;
use crate::backend::{
    AlarmRow, AuthKind, BackendResult, CurrentRange, CurrentRangeQuery, KeyRange, LeaseRow,
    LogEntry, ReadAhead, ReadAt, ReadTxn, Revisions, WriteTxn,
};
use crate::proto::mvccpb::KeyValue;

/// A pooled connection for one transaction, taken at its first statement
/// (a read that another read's statement answers never needs one), begun
/// with its first statements. If it is dropped before the transaction ends,
/// the transaction is rolled back before the connection goes back to the
/// pool.
pub(super) struct Session {
    conn: Option<Conn>,
    /// A transaction is (or may be) open on `conn`.
    pub(super) open: bool,
    /// The statement that begins the transaction, not sent yet: it goes out
    /// with the first statements, and a read answered by one statement
    /// outside any transaction never sends it.
    pub(super) begin: Option<&'static str>,
    /// Where the connection comes from, and a connection found dead before
    /// anything happened on it is replaced from.
    pool: Pool,
}

/// How often a connection found dead at its first statement is replaced:
/// the pool checks a connection's socket before handing it out, but a
/// server restart can still leave a dead one to be found on first use.
const FIRST_STATEMENT_ATTEMPTS: usize = 3;

impl Session {
    pub(super) fn new(pool: Pool, begin: &'static str) -> Self {
        Session {
            conn: None,
            open: false,
            begin: Some(begin),
            pool,
        }
    }

    /// The connection, taken from the pool at first use. Errors are the
    /// driver's, so that the caller can tell a dead connection.
    pub(super) async fn connection(&mut self) -> mysql_async::Result<&mut Conn> {
        if self.conn.is_none() {
            self.conn = Some(self.pool.get_conn().await?);
        }
        Ok(self.conn.as_mut().expect("just taken"))
    }

    /// `connection`, for callers that only report errors.
    pub(super) async fn conn(&mut self) -> BackendResult<&mut Conn> {
        self.connection()
            .await
            .map_err(db_error)
            .context("cannot get a MySQL connection")
    }

    /// Lets the connection go (it was found dead before anything happened
    /// on it): the next statement takes another.
    pub(super) fn replace_conn(&mut self) {
        self.conn = None;
    }

    /// The connection, with the transaction begun.
    pub(super) async fn begun(&mut self) -> BackendResult<&mut Conn> {
        if self.begin.is_some() {
            self.first_text(&[]).await?;
        }
        self.conn().await
    }

    /// Sends the BEGIN not sent yet and `statements` as one multi-statement
    /// text query, one round trip, and returns the rows of each of
    /// `statements`. A connection found dead is replaced (nothing happened
    /// on it).
    pub(super) async fn first_text(
        &mut self,
        statements: &[String],
    ) -> BackendResult<Vec<Vec<Row>>> {
        let begin = self.begin.take();
        let mut text: Vec<&str> = begin.iter().copied().collect();
        text.extend(statements.iter().map(String::as_str));
        let text = text.join("; ");
        self.open |= begin.is_some();
        let mut attempts = 0;
        loop {
            let conn = self.conn().await?;
            match run_text(conn, &text, usize::from(begin.is_some()) + statements.len()).await {
                Ok(mut sets) => {
                    if begin.is_some() {
                        sets.remove(0);
                    }
                    return Ok(sets);
                }
                Err(error)
                    if begin.is_some()
                        && error.is_fatal()
                        && attempts < FIRST_STATEMENT_ATTEMPTS =>
                {
                    attempts += 1;
                    self.replace_conn();
                }
                Err(error) => return Err(db_error(error).context("MySQL statements failed")),
            }
        }
    }

    async fn end(&mut self, statement: &str) -> BackendResult<()> {
        self.conn()
            .await?
            .query_drop(statement)
            .await
            .map_err(db_error)
            .with_context(|| format!("MySQL: {statement}"))?;
        self.open = false;
        Ok(())
    }
}

/// Runs `text`, `count` statements, and collects each one's rows (none for
/// a statement that returns no result set).
async fn run_text(conn: &mut Conn, text: &str, count: usize) -> mysql_async::Result<Vec<Vec<Row>>> {
    let mut result = conn.query_iter(text).await?;
    let mut sets = Vec::with_capacity(count);
    for _ in 0..count {
        sets.push(result.collect::<Row>().await?);
    }
    result.drop_result().await?;
    Ok(sets)
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
    /// Where a first read of one key waits to go out with others.
    pub(super) key_reads: Arc<KeyReads>,
}

/// A write transaction, holding the lock on the `meta` row from its first
/// statement until it ends. Its key, lease and counter writes are deferred
/// and go out as one multi-statement text query with its next read or its
/// COMMIT; what it read ahead or wrote answers its later reads of the same
/// keys and leases.
pub struct MysqlWrite {
    pub(super) session: Session,
    /// The counters as locked (and as last stored by this transaction);
    /// None until the first statement has locked them.
    pub(super) revisions: Option<Revisions>,
    /// The alarms, keys and leases read with the lock or written since.
    known: ReadAheadCache,
    /// Key writes not sent yet; they go out ahead of `deferred`'s next
    /// statement, few statements for many keys.
    key_writes: KeyWrites,
    /// Deferred writes, as SQL text with their values written out.
    deferred: Vec<String>,
    /// Their length in bytes.
    deferred_bytes: usize,
}

/// Deferred writes are sent before their text grows past this, well below
/// MySQL's smallest default `max_allowed_packet` (4 MiB in MySQL 5.7).
const DEFERRED_BYTES: usize = 1 << 20;

/// A log row with a value longer than this is written at once with a
/// prepared statement, its value sent as bytes, rather than deferred as text.
const LARGE_VALUE_BYTES: usize = 64 << 10;

const LOCK_META: &str =
    "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1 FOR UPDATE";
const READ_ALARMS: &str = "SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm";

impl MysqlWrite {
    pub(super) fn new(session: Session) -> Self {
        MysqlWrite {
            session,
            revisions: None,
            known: ReadAheadCache::default(),
            key_writes: KeyWrites::default(),
            deferred: Vec::new(),
            deferred_bytes: 0,
        }
    }

    /// Begins, locks the counters and reads the alarms (and `ahead`), in
    /// one round trip with the deferred writes, unless done already.
    async fn lock(&mut self, ahead: Option<&ReadAhead>) -> BackendResult<()> {
        self.send_key_writes_next();
        let mut statements = std::mem::take(&mut self.deferred);
        self.deferred_bytes = 0;
        let writes = statements.len();
        let locking = self.revisions.is_none();
        if locking {
            statements.push(LOCK_META.to_string());
            statements.push(READ_ALARMS.to_string());
        }
        let keys = ahead.map_or(&[][..], |a| a.keys.as_slice());
        let leases = ahead.map_or(&[][..], |a| a.leases.as_slice());
        if !keys.is_empty() {
            let list: Vec<String> = keys.iter().map(|k| bytes_literal(k)).collect();
            statements.push(format!(
                "SELECT `key`, value, create_revision, mod_revision, version, lease \
                 FROM kv WHERE `key` IN ({})",
                list.join(", ")
            ));
        }
        if !leases.is_empty() {
            let list: Vec<String> = leases.iter().map(i64::to_string).collect();
            statements.push(format!(
                "SELECT id, ttl, expires_at FROM lease WHERE id IN ({})",
                list.join(", ")
            ));
        }
        if statements.is_empty() {
            return Ok(());
        }
        let sets = self
            .session
            .first_text(&statements)
            .await?
            .into_iter()
            .skip(writes);
        if let Some(revisions) = self.known.take_in(sets, locking, ahead)? {
            self.revisions = Some(revisions);
        }
        Ok(())
    }

    /// Turns the key writes gathered so far into deferred statements.
    fn send_key_writes_next(&mut self) {
        for sql in self.key_writes.take() {
            self.deferred_bytes += sql.len();
            self.deferred.push(sql);
        }
    }

    /// The connection, with the counters locked and the deferred writes sent.
    async fn ready(&mut self) -> BackendResult<&mut Conn> {
        if self.revisions.is_none() || !self.deferred.is_empty() || !self.key_writes.is_empty() {
            self.lock(None).await?;
        }
        self.session.conn().await
    }

    /// Queues a write, sending the queue once it is long.
    async fn defer(&mut self, sql: String) -> BackendResult<()> {
        if self.revisions.is_none() {
            self.lock(None).await?;
        }
        self.send_key_writes_next();
        self.deferred_bytes += sql.len();
        self.deferred.push(sql);
        if self.deferred_bytes > DEFERRED_BYTES {
            self.lock(None).await?;
        }
        Ok(())
    }
}

/// The read queries, shared by read and write transactions; `revisions`
/// differs between them, and a write transaction answers reads of what it
/// read ahead or wrote itself.
macro_rules! impl_read_txn {
    ($ty:ty) => {
        impl ReadTxn for $ty {
            async fn revisions(&mut self) -> BackendResult<Revisions> {
                self.current_revisions().await
            }

            async fn current_range(
                &mut self,
                query: CurrentRangeQuery<'_>,
            ) -> BackendResult<CurrentRange> {
                self.read_current_range(query).await
            }

            async fn range(
                &mut self,
                range: &KeyRange,
                at: ReadAt,
                limit: usize,
                keys_only: bool,
            ) -> BackendResult<Vec<KeyValue>> {
                if let Some(known) = self.known_range(range, at) {
                    return Ok(known);
                }
                query_range(self.read_conn().await?, range, at, limit, keys_only).await
            }

            async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
                query_count(self.read_conn().await?, range, at).await
            }

            async fn keys_at(
                &mut self,
                keys: &[Vec<u8>],
                revision: i64,
            ) -> BackendResult<Vec<KeyValue>> {
                query_keys_at(self.read_conn().await?, keys, revision).await
            }

            async fn log_entries(
                &mut self,
                after: i64,
                through: i64,
            ) -> BackendResult<Vec<LogEntry>> {
                query_log(self.read_conn().await?, after, through).await
            }

            async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
                query_setting(self.read_conn().await?, name).await
            }

            async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
                if let Some(known) = self.known_lease(id) {
                    return Ok(known);
                }
                query_lease(self.read_conn().await?, id).await
            }

            async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
                query_leases(self.read_conn().await?).await
            }

            async fn expired_leases(
                &mut self,
                now_ms: i64,
                limit: usize,
            ) -> BackendResult<Vec<i64>> {
                query_expired_leases(self.read_conn().await?, now_ms, limit).await
            }

            async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
                query_lease_keys(self.read_conn().await?, id).await
            }

            async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
                if let Some(known) = self.known_alarms() {
                    return Ok(known);
                }
                query_alarms(self.read_conn().await?).await
            }

            async fn auth_records(
                &mut self,
                kind: AuthKind,
            ) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
                query_auth_records(self.read_conn().await?, kind).await
            }
        }
    };
}

impl_read_txn!(MysqlRead);
impl_read_txn!(MysqlWrite);

impl MysqlRead {
    async fn current_revisions(&mut self) -> BackendResult<Revisions> {
        query_revisions(self.session.begun().await?, false).await
    }

    async fn read_conn(&mut self) -> BackendResult<&mut Conn> {
        self.session.begun().await
    }

    /// One statement outside any transaction when it is the first (one
    /// snapshot, one round trip, nothing to roll back; for one key, shared
    /// with the reads of other keys that come meanwhile); else in the
    /// transaction.
    async fn read_current_range(
        &mut self,
        query: CurrentRangeQuery<'_>,
    ) -> BackendResult<CurrentRange> {
        if self.session.begin.is_none() {
            let conn = self.session.conn().await?;
            return query_current_range(conn, query).await.map_err(db_error);
        }
        let mut attempts = 0;
        let one_key = gathered_key(&query);
        loop {
            let session = &mut self.session;
            let read = match one_key {
                Some(key) => {
                    let read_keys = async |keys: &[&[u8]]| {
                        query_current_keys(session.connection().await?, keys).await
                    };
                    (self.key_reads.read(key, read_keys).await).map(|read| read.into_range(query))
                }
                None => {
                    async { query_current_range(session.connection().await?, query).await }.await
                }
            };
            match read {
                Ok(read) => return Ok(read),
                Err(error) if error.is_fatal() && attempts < FIRST_STATEMENT_ATTEMPTS => {
                    attempts += 1;
                    self.session.replace_conn();
                }
                Err(error) => return Err(db_error(error).context("MySQL range failed")),
            }
        }
    }

    fn known_range(&self, _range: &KeyRange, _at: ReadAt) -> Option<Vec<KeyValue>> {
        None
    }

    fn known_lease(&self, _id: i64) -> Option<Option<LeaseRow>> {
        None
    }

    fn known_alarms(&self) -> Option<Vec<AlarmRow>> {
        None
    }
}

impl MysqlWrite {
    /// The counters, locked `FOR UPDATE` by the transaction's first
    /// statements (so that other instances' writers wait for this one),
    /// and kept up to date by `set_revisions`.
    async fn current_revisions(&mut self) -> BackendResult<Revisions> {
        if self.revisions.is_none() {
            self.lock(None).await?;
        }
        Ok(self.revisions.expect("locked"))
    }

    async fn read_conn(&mut self) -> BackendResult<&mut Conn> {
        self.ready().await
    }

    async fn read_current_range(
        &mut self,
        query: CurrentRangeQuery<'_>,
    ) -> BackendResult<CurrentRange> {
        let revisions = self.current_revisions().await?;
        let kvs = match query.rows {
            true => {
                self.range(query.range, ReadAt::Current, query.limit, query.keys_only)
                    .await?
            }
            false => Vec::new(),
        };
        let count = match query.count {
            true => Some(self.count(query.range, ReadAt::Current).await?),
            false => None,
        };
        Ok(CurrentRange {
            revisions,
            kvs,
            count,
        })
    }

    fn known_range(&self, range: &KeyRange, at: ReadAt) -> Option<Vec<KeyValue>> {
        if at != ReadAt::Current || self.revisions.is_none() {
            return None;
        }
        let known = self.known.key(range.as_single()?)?;
        Some(known.iter().cloned().collect())
    }

    fn known_lease(&self, id: i64) -> Option<Option<LeaseRow>> {
        self.revisions.and(self.known.lease(id))
    }

    fn known_alarms(&self) -> Option<Vec<AlarmRow>> {
        self.revisions.and(self.known.alarms().cloned())
    }
}

impl WriteTxn for MysqlWrite {
    async fn read_ahead(&mut self, ahead: &ReadAhead) -> BackendResult<()> {
        self.lock(Some(ahead)).await
    }

    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let kv = &entry.kv;
        if kv.key.len() > MAX_KEY_BYTES {
            bail!(
                "key of {} bytes is longer than the {MAX_KEY_BYTES} bytes the MySQL backend stores",
                kv.key.len()
            );
        }
        if self.revisions.is_none() {
            self.lock(None).await?;
        }
        if kv.value.len() > LARGE_VALUE_BYTES {
            // A round trip of its own, after the writes before it: as hex
            // text the value would take twice its size, and mysql_async
            // keeps the buffers of large queries in its pool.
            let conn = self.ready().await?;
            execute(
                conn,
                "INSERT INTO log (revision, sub, `key`, value, create_revision, version, lease, \
                 deleted) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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
        } else {
            self.key_writes.log_row(format!(
                "({}, {}, {}, {}, {}, {}, {}, {})",
                kv.mod_revision,
                entry.sub,
                bytes_literal(&kv.key),
                bytes_literal(&kv.value),
                kv.create_revision,
                kv.version,
                kv.lease,
                i64::from(entry.deleted),
            ));
        }
        let row = (!entry.deleted).then_some((kv.mod_revision, entry.sub));
        self.key_writes.key(&kv.key, row);
        if self.deferred_bytes + self.key_writes.bytes() > DEFERRED_BYTES {
            self.lock(None).await?;
        }
        let live = (!entry.deleted).then(|| kv.clone());
        self.known.wrote_key(&kv.key, live);
        Ok(())
    }

    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        self.defer(format!(
            "UPDATE meta SET revision = {}, compact_revision = {}, compacted_through = {} \
             WHERE id = 1",
            revisions.current, revisions.compact, revisions.compacted_through,
        ))
        .await?;
        self.revisions = Some(revisions);
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        execute(
            self.ready().await?,
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
            self.ready().await?,
            "DELETE FROM log WHERE revision = ? AND sub = ?",
            (entry.kv.mod_revision, entry.sub),
        )
        .await
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        execute(
            self.ready().await?,
            "INSERT INTO settings (name, value) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE value = VALUES(value)",
            (name, value),
        )
        .await
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        self.defer(format!(
            "INSERT INTO lease (id, ttl, expires_at) VALUES ({}, {}, {}) \
             ON DUPLICATE KEY UPDATE ttl = VALUES(ttl), expires_at = VALUES(expires_at)",
            lease.id, lease.ttl, lease.expires_at,
        ))
        .await?;
        self.known.wrote_lease(lease.id, Some(*lease));
        Ok(())
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        self.defer(format!("DELETE FROM lease WHERE id = {id}"))
            .await?;
        self.known.wrote_lease(id, None);
        Ok(())
    }

    async fn add_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.known.changed_alarms();
        execute(
            self.ready().await?,
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
            self.ready().await?,
            "INSERT INTO auth (kind, name, record) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE record = VALUES(record)",
            (kind.as_str(), name, record),
        )
        .await
    }

    async fn remove_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.known.changed_alarms();
        execute(
            self.ready().await?,
            "DELETE FROM alarm WHERE member_id = ? AND alarm = ?",
            (alarm.member_id, alarm.alarm),
        )
        .await
    }

    async fn remove_auth_record(&mut self, kind: AuthKind, name: &[u8]) -> BackendResult<()> {
        execute(
            self.ready().await?,
            "DELETE FROM auth WHERE kind = ? AND name = ?",
            (kind.as_str(), name),
        )
        .await
    }

    async fn clear(&mut self) -> BackendResult<()> {
        for table in ["log", "kv", "lease", "settings", "alarm", "auth"] {
            execute(self.ready().await?, &format!("DELETE FROM {table}"), ()).await?;
        }
        self.known.cleared();
        self.set_revisions(Revisions::EMPTY_STORE).await
    }

    /// The deferred writes and COMMIT, in one round trip.
    async fn commit(mut self) -> BackendResult<()> {
        if self.session.begin.is_some() {
            return Ok(()); // Nothing was sent: nothing to commit.
        }
        self.send_key_writes_next();
        if self.deferred.is_empty() {
            return self.session.end("COMMIT").await;
        }
        let mut text = std::mem::take(&mut self.deferred);
        text.push("COMMIT".to_string());
        let count = text.len();
        run_text(self.session.conn().await?, &text.join("; "), count)
            .await
            .map_err(db_error)
            .context("MySQL: COMMIT with the transaction's last writes")?;
        self.session.open = false;
        Ok(())
    }
}
