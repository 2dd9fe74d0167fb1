//! Storage primitives, one implementation per SQL dialect.
//!
//! A backend knows SQL, not etcd: it stores rows of the revision log and the
//! live-key table and reads them back inside a transaction. Every etcd rule
//! (revisions, versions, txn compares, compaction) lives in `crate::store`, so
//! a new dialect is a new `Backend` and nothing else.

pub mod changes;
pub mod datastore;
mod key_reads;
pub mod mysql;
pub mod open;
pub mod postgres;
pub mod range_stream;
mod read_ahead;
mod rows;
pub mod settings;
pub mod snapshot;
pub mod sqlite;

use std::future::Future;

use self::changes::ChangeFeed;
use self::range_stream::StreamRange;
use crate::proto::mvccpb::KeyValue;

/// How startup connection retries report the time they took: "gave up after 30.1s".
pub(crate) fn gave_up_after_text(elapsed: std::time::Duration) -> String {
    format!("gave up after {:.1}s", elapsed.as_secs_f64())
}

/// Asserts that connection retries begun at `started` lasted `patience` and
/// that `error` reports the time they really took (`gave_up_after_text`).
#[cfg(test)]
pub(crate) fn assert_gave_up_after(
    error: &anyhow::Error,
    started: std::time::Instant,
    patience: std::time::Duration,
) {
    let took = started.elapsed();
    assert!(took >= patience, "gave up after {took:?}");
    let message = format!("{error:#}");
    let reported: f64 = message
        .split("gave up after ")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|seconds| seconds.parse().ok())
        .expect(&message);
    assert!(reported >= patience.as_secs_f64(), "{message}");
    assert!(reported <= took.as_secs_f64() + 0.05, "{message}");
}

/// Errors from the database itself; the store reports them as internal
/// errors, or as [`Unavailable`] when that is in their chain.
pub type BackendError = anyhow::Error;
/// Result of a backend call.
pub type BackendResult<T> = Result<T, BackendError>;

/// The database is out of reach: down, unreachable, refusing connections or
/// not answering in time. etcd answers a member that cannot serve (one
/// without quorum) with code Unavailable, on which etcd clients retry, on
/// another endpoint when they have one; so a backend marks these errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(String);

impl Unavailable {
    /// An error with `message` that says the database is out of reach.
    pub fn error(message: impl std::fmt::Display) -> BackendError {
        anyhow::Error::new(Unavailable(message.to_string()))
    }

    /// Whether `error`, or an error it wraps, says the database is out of reach.
    pub fn is(error: &BackendError) -> bool {
        error.chain().any(|cause| cause.is::<Unavailable>())
    }
}

/// The database's storage is full: SQLite's SQLITE_FULL, PostgreSQL's
/// disk_full (53100), MySQL's ER_RECORD_FILE_FULL (1114) or ER_DISK_FULL
/// (1021), or ENOSPC from the file system. The store answers it as etcd
/// answers a database over its quota: the NOSPACE alarm, and `mvcc: database
/// space exceeded`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DiskFull(String);

/// ENOSPC on Linux.
const ENOSPC: i32 = 28;

impl DiskFull {
    /// An error with `message` that says the database's storage is full.
    pub fn error(message: impl std::fmt::Display) -> BackendError {
        anyhow::Error::new(DiskFull(message.to_string()))
    }

    /// Whether `error`, or an error it wraps, says the storage is full.
    pub fn is(error: &BackendError) -> bool {
        error.chain().any(|cause| {
            if cause.is::<DiskFull>() {
                return true;
            }
            if let Some(rusqlite::Error::SqliteFailure(failure, _)) =
                cause.downcast_ref::<rusqlite::Error>()
            {
                return failure.code == rusqlite::ErrorCode::DiskFull;
            }
            if let Some(error) = cause.downcast_ref::<tokio_postgres::Error>() {
                return error.code() == Some(&tokio_postgres::error::SqlState::DISK_FULL);
            }
            if let Some(mysql_async::Error::Server(error)) =
                cause.downcast_ref::<mysql_async::Error>()
            {
                return matches!(error.code, 1114 | 1021);
            }
            if let Some(error) = cause.downcast_ref::<std::io::Error>() {
                return error.raw_os_error() == Some(ENOSPC);
            }
            false
        })
    }
}

/// A read at a revision whose rows a compaction removed after the read's
/// snapshot began (a backend that keeps its key index outside the database's
/// transactions can tell only then); the store answers it as etcd answers
/// any read below the compact revision.
#[derive(Debug, thiserror::Error)]
#[error("mvcc: required revision has been compacted")]
pub struct Compacted;

impl Compacted {
    /// Whether `error`, or an error it wraps, is a `Compacted`.
    pub fn is(error: &BackendError) -> bool {
        error.chain().any(|cause| cause.is::<Compacted>())
    }
}

/// Revisions of the log read per query by copies and hashes that walk it
/// page by page, so a large store is never in memory at once.
pub const LOG_PAGE_REVISIONS: i64 = 1000;

/// A half-open key interval `[start, end)`; `end == None` means every key >= start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// First key of the interval.
    pub start: Vec<u8>,
    /// Exclusive upper bound, or `None` for no upper bound.
    pub end: Option<Vec<u8>>,
}

impl KeyRange {
    /// The interval holding exactly `key`.
    pub fn single(key: &[u8]) -> Self {
        let mut end = Vec::with_capacity(key.len() + 1);
        end.extend_from_slice(key);
        end.push(0);
        KeyRange {
            start: key.to_vec(),
            end: Some(end),
        }
    }

    /// True if `key` lies in the interval.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.end.as_deref().is_none_or(|end| key < end)
    }

    /// True if no key can lie in the interval.
    pub fn is_empty(&self) -> bool {
        self.end
            .as_deref()
            .is_some_and(|end| end <= self.start.as_slice())
    }
}

/// Which state a read sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAt {
    /// The live-key table: the latest state, including this transaction's writes.
    Current,
    /// The revision log as it was at this revision.
    Revision(i64),
}

/// The store's counters, kept in one row that every write transaction updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Revisions {
    /// The store's current revision (1 for an empty store).
    pub current: i64,
    /// Reads below this revision are refused; -1 until the first compaction.
    pub compact: i64,
    /// Physical compaction has removed superseded rows up to this revision.
    pub compacted_through: i64,
}

impl Revisions {
    /// The counters of a store no one has written to.
    pub const EMPTY_STORE: Revisions = Revisions {
        current: 1,
        compact: -1,
        compacted_through: 0,
    };
}

/// One row of the revision log: a key's state after a change.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// The key as it is after the change (`mod_revision` is the change's revision).
    pub kv: KeyValue,
    /// Position of the change among the changes of its revision.
    pub sub: i64,
    /// True for a deletion (a tombstone); `kv` then carries only key and mod_revision.
    pub deleted: bool,
}

#[cfg(test)]
impl LogEntry {
    /// A change of `key` at `revision` (sub 0), for tests: a bare put, or
    /// its deletion.
    pub(crate) fn of_key(key: &str, revision: i64, deleted: bool) -> Self {
        LogEntry {
            kv: KeyValue {
                key: key.into(),
                mod_revision: revision,
                ..Default::default()
            },
            sub: 0,
            deleted,
        }
    }
}

/// A lease as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    /// The lease id.
    pub id: i64,
    /// The TTL it was granted, in seconds.
    pub ttl: i64,
    /// When it expires, in Unix milliseconds.
    pub expires_at: i64,
}

/// A raised alarm as stored (etcd's AlarmMember).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlarmRow {
    /// The member that raised it, as a signed 64-bit number.
    pub member_id: i64,
    /// etcdserverpb.AlarmType number.
    pub alarm: i32,
}

/// The two kinds of auth records (table `auth`): the backend stores them as
/// opaque bytes (etcd's authpb encoding), keyed by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthKind {
    /// An `authpb.User`.
    User,
    /// An `authpb.Role`.
    Role,
}

impl AuthKind {
    /// The value of the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthKind::User => "user",
            AuthKind::Role => "role",
        }
    }
}

/// What [`ReadTxn::current_range`] reads: a range at the current revision.
#[derive(Clone, Copy, Debug)]
pub struct CurrentRangeQuery<'a> {
    /// The keys.
    pub range: &'a KeyRange,
    /// Whether to read the keys themselves (false: only the counters and
    /// the count).
    pub rows: bool,
    /// At most this many keys (0 = all).
    pub limit: usize,
    /// The values may be left empty.
    pub keys_only: bool,
    /// Whether to count the keys in the range, whatever the limit.
    pub count: bool,
}

/// What [`ReadTxn::current_range`] read, all from one snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct CurrentRange {
    /// The counters of the state read.
    pub revisions: Revisions,
    /// The keys, ascending (empty unless rows were asked for).
    pub kvs: Vec<KeyValue>,
    /// The number of keys in the range, when it was asked for.
    pub count: Option<i64>,
}

/// What a batch of write requests is about to read: the live state of
/// single keys and leases. A backend that talks to a server reads them
/// ahead in the transaction's first round trip.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadAhead {
    /// Keys whose live state will be read (each as `KeyRange::single`).
    pub keys: Vec<Vec<u8>>,
    /// Leases that will be looked up.
    pub leases: Vec<i64>,
}

impl ReadAhead {
    /// Whether there is nothing to read ahead.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.leases.is_empty()
    }
}

impl KeyRange {
    /// The one key of an interval made by [`KeyRange::single`], if it is one.
    pub fn as_single(&self) -> Option<&[u8]> {
        let end = self.end.as_deref()?;
        (end.len() == self.start.len() + 1 && end.ends_with(&[0]) && end.starts_with(&self.start))
            .then_some(self.start.as_slice())
    }
}

/// A consistent, read-only view of the database.
///
/// With one exception, on SQLite's server file: a long read of the log or of
/// many rows lets a waiting batch commit go first and goes on in a later
/// snapshot (`sqlite::queries::yield_to_commit`). The log rows it reads are
/// the same in either (a compaction that overtook it fails it with
/// [`Compacted`]), but leases, settings, auth records and alarms may not be:
/// a reader that needs them as of its revisions reads them before the log.
pub trait ReadTxn: Send {
    /// The counters as of this view.
    fn revisions(&mut self) -> impl Future<Output = BackendResult<Revisions>> + Send;

    /// Keys in `range` at `at`, ascending by key, at most `limit` (0 = all).
    /// With `keys_only` the values may be left empty.
    fn range(
        &mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> impl Future<Output = BackendResult<Vec<KeyValue>>> + Send;

    /// The state of each of `keys` at `revision`, in no particular order;
    /// a key that did not exist then is left out. Asked key by key unless a
    /// backend answers all in one statement (a server database, where each
    /// statement is a round trip).
    fn keys_at(
        &mut self,
        keys: &[Vec<u8>],
        revision: i64,
    ) -> impl Future<Output = BackendResult<Vec<KeyValue>>> + Send {
        async move {
            let mut found = Vec::with_capacity(keys.len());
            for key in keys {
                let at = ReadAt::Revision(revision);
                found.extend(self.range(&KeyRange::single(key), at, 1, false).await?);
            }
            Ok(found)
        }
    }

    /// Number of keys in `range` at `at`.
    fn count(
        &mut self,
        range: &KeyRange,
        at: ReadAt,
    ) -> impl Future<Output = BackendResult<i64>> + Send;

    /// The counters, and the keys of a range at the current revision (and
    /// their count when asked), from one snapshot. Called as the first and
    /// only read of a view, a server backend answers it with one statement
    /// outside any explicit transaction: one round trip. The default reads
    /// them one after another in this view.
    fn current_range(
        &mut self,
        query: CurrentRangeQuery<'_>,
    ) -> impl Future<Output = BackendResult<CurrentRange>> + Send {
        async move {
            let revisions = self.revisions().await?;
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
    }

    /// Log rows with `after < revision <= through`, in revision order.
    fn log_entries(
        &mut self,
        after: i64,
        through: i64,
    ) -> impl Future<Output = BackendResult<Vec<LogEntry>>> + Send;

    /// A named setting, if set.
    fn setting(&mut self, name: &str) -> impl Future<Output = BackendResult<Option<i64>>> + Send;

    /// The lease `id`, if granted and not yet revoked.
    fn lease(&mut self, id: i64) -> impl Future<Output = BackendResult<Option<LeaseRow>>> + Send;

    /// Every lease, soonest deadline first.
    fn leases(&mut self) -> impl Future<Output = BackendResult<Vec<LeaseRow>>> + Send;

    /// Up to `limit` leases whose deadline is at or before `now_ms`.
    fn expired_leases(
        &mut self,
        now_ms: i64,
        limit: usize,
    ) -> impl Future<Output = BackendResult<Vec<i64>>> + Send;

    /// The live keys attached to lease `id`, ascending by key.
    fn lease_keys(&mut self, id: i64) -> impl Future<Output = BackendResult<Vec<KeyValue>>> + Send;

    /// Every raised alarm, by member id and then alarm type.
    fn alarms(&mut self) -> impl Future<Output = BackendResult<Vec<AlarmRow>>> + Send;

    /// Every stored auth record of `kind` as (name, encoded record), ascending by name.
    fn auth_records(
        &mut self,
        kind: AuthKind,
    ) -> impl Future<Output = BackendResult<Vec<(Vec<u8>, Vec<u8>)>>> + Send;

    /// The replicated-log position this store was last brought to (see
    /// `crate::raft`), if it ever was. Only SQLite serves replicated mode.
    fn replication_mark(&mut self) -> impl Future<Output = BackendResult<Option<Vec<u8>>>> + Send {
        async { Ok(None) }
    }
}

/// A write transaction: nothing is visible to readers until `commit`.
pub trait WriteTxn: ReadTxn {
    /// Reads the live state of `ahead`'s keys and leases ahead, so that the
    /// later reads of them in this transaction (`range` of one of those
    /// keys at `ReadAt::Current`, `lease`) cost no round trip. A backend
    /// with no round trips to save does nothing.
    fn read_ahead(&mut self, ahead: &ReadAhead) -> impl Future<Output = BackendResult<()>> + Send {
        let _ = ahead;
        std::future::ready(Ok(()))
    }

    /// Appends `entry` to the log and applies it to the live-key table.
    fn append(&mut self, entry: &LogEntry) -> impl Future<Output = BackendResult<()>> + Send;

    /// Stores the counters.
    fn set_revisions(
        &mut self,
        revisions: Revisions,
    ) -> impl Future<Output = BackendResult<()>> + Send;

    /// Removes every log row of `entry`'s key that comes before `entry`.
    fn remove_history_before(
        &mut self,
        entry: &LogEntry,
    ) -> impl Future<Output = BackendResult<()>> + Send;

    /// Removes the log row of `entry`.
    fn remove_entry(&mut self, entry: &LogEntry) -> impl Future<Output = BackendResult<()>> + Send;

    /// Sets a named setting.
    fn set_setting(
        &mut self,
        name: &str,
        value: i64,
    ) -> impl Future<Output = BackendResult<()>> + Send;

    /// Stores a lease (new, or with a new deadline).
    fn put_lease(&mut self, lease: &LeaseRow) -> impl Future<Output = BackendResult<()>> + Send;

    /// Forgets lease `id`.
    fn remove_lease(&mut self, id: i64) -> impl Future<Output = BackendResult<()>> + Send;

    /// Records a raised alarm (nothing happens if it is already there).
    fn add_alarm(&mut self, alarm: &AlarmRow) -> impl Future<Output = BackendResult<()>> + Send;

    /// Forgets a raised alarm.
    fn remove_alarm(&mut self, alarm: &AlarmRow) -> impl Future<Output = BackendResult<()>> + Send;

    /// Empties the store: no log rows, keys, leases, settings, alarms or auth records, and the
    /// counters of a new store (revision 1, never compacted). For restore.
    fn clear(&mut self) -> impl Future<Output = BackendResult<()>> + Send;

    /// Stores (inserts or replaces) the auth record `name` of `kind`.
    fn put_auth_record(
        &mut self,
        kind: AuthKind,
        name: &[u8],
        record: &[u8],
    ) -> impl Future<Output = BackendResult<()>> + Send;

    /// Removes the auth record `name` of `kind`, if present.
    fn remove_auth_record(
        &mut self,
        kind: AuthKind,
        name: &[u8],
    ) -> impl Future<Output = BackendResult<()>> + Send;

    /// Stores the replicated-log position the changes of this transaction
    /// bring the store to.
    fn set_replication_mark(
        &mut self,
        _mark: &[u8],
    ) -> impl Future<Output = BackendResult<()>> + Send {
        async { anyhow::bail!("replicated mode keeps its data in SQLite only") }
    }

    /// Makes every change durable and visible.
    fn commit(self) -> impl Future<Output = BackendResult<()>> + Send;
}

/// A database holding one cetera store.
pub trait Backend: Send + Sync + 'static {
    /// Read transaction type; it can also stream a range (RangeStream).
    type Read: ReadTxn + StreamRange;
    /// Write transaction type.
    type Write: WriteTxn;

    /// Opens a consistent read-only view.
    fn read(&self) -> impl Future<Output = BackendResult<Self::Read>> + Send;

    /// Opens a consistent read-only view of the database alone: what a
    /// backend holds in memory on its way to the database (SQLite's batch)
    /// is committed to it first, so that everything read, the replication
    /// mark included, is as of one commit. For copies, not for serving.
    fn read_applied(&self) -> impl Future<Output = BackendResult<Self::Read>> + Send {
        self.read()
    }

    /// Starts a write transaction; only one is open at a time per instance.
    fn write(&self) -> impl Future<Output = BackendResult<Self::Write>> + Send;

    /// Size of the database in bytes, and the part of it in use.
    fn size(&self) -> impl Future<Output = BackendResult<DatabaseSize>> + Send;

    /// The bytes that count against --quota-backend-bytes: what the
    /// database takes on disk, free pages included, as etcd counts its file.
    fn quota_bytes(&self, size: &DatabaseSize) -> i64 {
        size.total
    }

    /// Gives space freed by deleted rows back, online (etcd's Defragment).
    fn defragment(&self) -> impl Future<Output = BackendResult<()>> + Send;

    /// Makes the space of rows a compaction removed reusable by new rows,
    /// where the database does not do that by itself soon enough. SQLite and
    /// InnoDB reuse freed pages at once; PostgreSQL needs a VACUUM.
    fn reclaim_compacted(&self) -> impl Future<Output = BackendResult<()>> + Send {
        async { Ok(()) }
    }

    /// True if the backend's calls do their work on the calling thread
    /// (an embedded database) rather than waiting on a server. The store
    /// then runs its writer on a thread of its own, so that a commit's
    /// fsync never stalls one of the runtime's few worker threads.
    fn works_on_calling_thread(&self) -> bool {
        false
    }

    /// True if its write transactions read ahead (`WriteTxn::read_ahead`):
    /// the writer then lists what a batch will read, which costs a copy of
    /// every key, only where it saves round trips.
    fn reads_ahead(&self) -> bool {
        false
    }

    /// True if this process is the database's only writer (SQLite's file
    /// is locked to one server), so the store may hold state ahead of the
    /// database, as it does with lease deadlines. A server database may be
    /// shared by other instances.
    fn is_only_writer(&self) -> bool {
        false
    }

    /// Longest key the schema can store and index, in bytes.
    fn max_key_bytes(&self) -> usize {
        usize::MAX
    }

    /// From now on a commit need not be durable by itself: something else
    /// (a replicated member's Raft log) keeps every write until
    /// `make_durable` has run. Backends that cannot defer keep syncing.
    fn defer_durability(&self) -> impl Future<Output = BackendResult<()>> + Send {
        std::future::ready(Ok(()))
    }

    /// Makes every commit so far durable (after `defer_durability`).
    fn make_durable(&self) -> impl Future<Output = BackendResult<()>> + Send {
        std::future::ready(Ok(()))
    }

    /// A new follower's feed of other instances' commits on a shared
    /// database (Postgres: each other instance's NOTIFY, and the poll
    /// interval at the latest; MySQL: the poll interval). A backend no one
    /// else writes to never wakes its followers.
    fn change_feed(&self) -> ChangeFeed {
        ChangeFeed::never()
    }

    /// True while this instance holds the database-wide lock `name`, taking it
    /// if it is free. Jobs that must run on one instance at a time (lease
    /// expiry, physical compaction) check it; a lock dies with its holder.
    fn hold_lock(&self, name: &str) -> impl Future<Output = BackendResult<bool>> + Send {
        let _ = name;
        std::future::ready(Ok(true))
    }
}

/// Space taken by the database.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatabaseSize {
    /// Bytes allocated on disk.
    pub total: i64,
    /// Bytes holding live data (allocated minus free pages).
    pub in_use: i64,
}
