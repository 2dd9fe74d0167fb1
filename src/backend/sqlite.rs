//! The embedded SQLite backend (rusqlite with a bundled SQLite).
//!
//! One connection writes, a small pool of connections reads. WAL mode lets
//! readers run beside the writer, each on a consistent snapshot. SQLite calls
//! are short and run inline on the async task that makes them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, ToSql, params};
use tokio::sync::OwnedMutexGuard;

use super::{
    AlarmRow, AuthKind, Backend, BackendResult, DatabaseSize, KeyRange, LeaseRow, LogEntry, ReadAt,
    ReadTxn, Revisions, WriteTxn,
};
use crate::proto::mvccpb::KeyValue;

mod checkpointer;

use self::checkpointer::Checkpointer;

mod migrations {
    refinery::embed_migrations!("migrations/sqlite");
}

/// Read connections kept open for reuse; more are opened on demand.
const MAX_IDLE_READERS: usize = 16;

/// A store kept in one SQLite database file.
pub struct Sqlite {
    path: PathBuf,
    writer: Arc<tokio::sync::Mutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    checkpointer: Arc<Checkpointer>,
    /// The lock file, held while the database is open; last, so that it is
    /// released only after the writer has closed.
    _lock: Option<std::fs::File>,
}

impl Sqlite {
    /// Opens (creating if needed) the database at `path` and brings its schema
    /// up to date. Refuses a database another process (or another `Sqlite`)
    /// has open: two servers on one file would share a member id and never
    /// see each other's writes.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        Self::open_locked(path, true)
    }

    /// As `open`, without the lock file: for a new file only its creator
    /// knows of (a snapshot being built), which would leave lock files behind.
    pub fn open_scratch(path: &Path) -> anyhow::Result<Self> {
        Self::open_locked(path, false)
    }

    fn open_locked(path: &Path, lock: bool) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create directory {}", dir.display()))?;
        }
        let lock = if lock {
            Some(lock_database(path)?)
        } else {
            None
        };
        let mut writer = open_connection(path, false)
            .with_context(|| format!("cannot open SQLite database {}", path.display()))?;
        migrations::migrations::runner()
            .run(&mut writer)
            .context("cannot apply SQLite migrations")?;
        checkpointer::watch_wal(&writer);
        Ok(Sqlite {
            path: path.to_path_buf(),
            writer: Arc::new(tokio::sync::Mutex::new(writer)),
            readers: Arc::new(Mutex::new(Vec::new())),
            checkpointer: Arc::new(Checkpointer::start(path)?),
            _lock: lock,
        })
    }

    /// Readies the writer for one very large transaction (a restore or a
    /// snapshot being built): a page cache big enough that SQLite rarely
    /// spills pages to the WAL and reads them back. With `scratch` (a file
    /// nobody else uses, thrown away if anything fails) it also drops the
    /// journal and the fsyncs; `finish_scratch` makes such a file
    /// self-contained again.
    pub async fn prepare_bulk_load(&self, scratch: bool) -> anyhow::Result<()> {
        let conn = self.writer.lock().await;
        conn.pragma_update(None, "cache_size", BULK_LOAD_CACHE_KIB)?;
        if scratch {
            conn.pragma_update(None, "journal_mode", "OFF")?;
            conn.pragma_update(None, "synchronous", "OFF")?;
        }
        Ok(())
    }

    /// Ends a scratch file's bulk load: rollback-journal mode (not WAL), so
    /// that the file alone is the whole database.
    pub async fn finish_scratch(&self) -> anyhow::Result<()> {
        let conn = self.writer.lock().await;
        conn.pragma_update(None, "journal_mode", "DELETE")?;
        Ok(())
    }

    /// Opens a snapshot file (see `crate::backend::snapshot`) for reading without
    /// changing it: immutable, so SQLite takes no locks and writes no journal,
    /// and bytes after the database (the checksum trailer) are ignored.
    /// Refuses a file whose schema is newer than this build's.
    pub fn read_snapshot_file(path: &Path) -> anyhow::Result<SqliteRead> {
        const PATH_SET: &percent_encoding::AsciiSet =
            &percent_encoding::CONTROLS.add(b'%').add(b'?').add(b'#');
        let uri = format!(
            "file:{}?immutable=1",
            percent_encoding::utf8_percent_encode(&path.to_string_lossy(), PATH_SET)
        );
        let conn = Connection::open_with_flags(
            uri,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        let version: Option<i64> = conn
            .query_row(
                "SELECT MAX(version) FROM refinery_schema_history",
                [],
                |r| r.get(0),
            )
            .context("not a cetera snapshot: it has no cetera schema")?;
        let supported = migrations::migrations::runner()
            .get_migrations()
            .iter()
            .map(|m| i64::from(m.version()))
            .max()
            .unwrap_or(0);
        if version.unwrap_or(0) > supported {
            anyhow::bail!(
                "the snapshot has schema version {}, newer than this cetera's {supported}",
                version.unwrap_or(0)
            );
        }
        conn.execute_batch("BEGIN")?;
        Ok(SqliteRead {
            conn: Some(conn),
            pool: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Moves the whole WAL into the database file and empties the WAL, so
    /// that the file alone holds the store (a copy of it is a full backup).
    /// Called when the store closes, after the checkpoint thread stopped.
    fn checkpoint_to_file(conn: &Connection) -> rusqlite::Result<()> {
        // Only a reader that outlived the store can be in the way: wait for
        // it briefly, not the writer's 30 s, at shutdown.
        conn.busy_timeout(Duration::from_secs(1))?;
        let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
        if busy != 0 {
            tracing::warn!("the final WAL checkpoint was blocked by a reader; the WAL is kept");
        }
        Ok(())
    }

    fn take_reader(&self) -> BackendResult<Connection> {
        let idle = self.readers.lock().expect("reader pool poisoned").pop();
        match idle {
            Some(conn) => Ok(conn),
            None => Ok(open_connection(&self.path, true)?),
        }
    }
}

/// Takes the exclusive lock on `PATH.lock`, held until the returned file is
/// closed (by the kernel too, when the process dies, even by SIGKILL). A file
/// of its own: closing any descriptor of the database file itself would drop
/// SQLite's POSIX locks on it. It holds the holder's pid, for the error.
fn lock_database(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::io::Write;
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .with_context(|| format!("cannot open lock file {}", lock_path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
            let holder = match holder.trim() {
                "" => String::new(),
                pid => format!(" (pid {pid})"),
            };
            anyhow::bail!(
                "SQLite database {} is in use by another cetera process{holder}: it holds \
                 the lock file {}; stop that process first, or give this one a file of its own",
                path.display(),
                lock_path.display()
            );
        }
        Err(std::fs::TryLockError::Error(error)) => {
            return Err(error).with_context(|| format!("cannot lock {}", lock_path.display()));
        }
    }
    file.set_len(0)?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
}

impl Drop for Sqlite {
    /// Leaves the database file whole. SQLite does that itself only when the
    /// last connection to close can write, and here the last were the
    /// read-only readers (and the checkpoint thread's, not joined): so the
    /// other connections go first, then the writer empties the WAL, and its
    /// own close, the last one, removes it.
    fn drop(&mut self) {
        if let Some(checkpointer) = Arc::get_mut(&mut self.checkpointer) {
            checkpointer.stop();
        }
        self.readers.lock().expect("reader pool poisoned").clear();
        match self.writer.try_lock() {
            Ok(conn) => {
                if let Err(error) = Self::checkpoint_to_file(&conn) {
                    tracing::warn!("the final WAL checkpoint failed: {error}");
                }
            }
            Err(_) => tracing::warn!("a write is still open at close; the WAL is kept"),
        }
    }
}

/// Opens a connection with the settings every cetera connection uses.
fn open_connection(path: &Path, read_only: bool) -> rusqlite::Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    if !read_only {
        // Takes effect only in a database without tables yet (a new one),
        // so that Defragment can shrink the file without a full VACUUM.
        conn.pragma_update(None, "auto_vacuum", AUTO_VACUUM_INCREMENTAL)?;
    }
    // WAL lets readers work beside the writer. synchronous=FULL fsyncs the WAL
    // on every commit, so an acknowledged write survives power loss, not only
    // a crash of the process; group commit makes that one fsync per batch.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.set_prepared_statement_cache_capacity(64);
    // Plan once per statement: otherwise SQLite re-prepares a cached statement
    // whenever a bound LIMIT changes, which is nearly every Range.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(conn)
}

impl Backend for Sqlite {
    type Read = SqliteRead;
    type Write = SqliteWrite;

    async fn read(&self) -> BackendResult<SqliteRead> {
        let conn = self.take_reader()?;
        // Cached, as every read begins and ends this way: parsing BEGIN and
        // ROLLBACK each time is a visible part of a single-key read.
        conn.prepare_cached("BEGIN")?.execute([])?;
        Ok(SqliteRead {
            conn: Some(conn),
            pool: self.readers.clone(),
        })
    }

    async fn write(&self) -> BackendResult<SqliteWrite> {
        let conn = self.writer.clone().lock_owned().await;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        Ok(SqliteWrite {
            conn,
            checkpointer: self.checkpointer.clone(),
            meta: None,
            read_current: 0,
            last_appended: 0,
            committed: false,
        })
    }

    fn works_on_calling_thread(&self) -> bool {
        true
    }

    /// synchronous=NORMAL: in WAL mode a commit is then consistent after a
    /// power loss but may be lost, and the WAL is synced only by
    /// checkpoints and `make_durable`.
    async fn defer_durability(&self) -> BackendResult<()> {
        let conn = self.writer.lock().await;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(())
    }

    /// Syncs the WAL (every commit so far) and the database file.
    async fn make_durable(&self) -> BackendResult<()> {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let files = [std::path::PathBuf::from(wal), self.path.clone()];
        let synced = tokio::task::spawn_blocking(move || {
            for file in files.iter().filter(|f| f.exists()) {
                std::fs::File::open(file)?.sync_data()?;
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(anyhow::Error::from)?;
        synced.map_err(anyhow::Error::from)?;
        Ok(())
    }

    async fn size(&self) -> BackendResult<DatabaseSize> {
        let conn = self.take_reader()?;
        let sizes = (|| -> rusqlite::Result<DatabaseSize> {
            let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
            let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
            let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
            Ok(DatabaseSize {
                total: page_size * pages,
                in_use: page_size * (pages - free),
            })
        })();
        return_reader(&self.readers, conn);
        Ok(sizes?)
    }

    /// Shrinks the file by the free pages. Databases created by cetera use
    /// auto_vacuum=INCREMENTAL, so `incremental_vacuum` just moves pages and
    /// truncates; an older database is rebuilt by one VACUUM, which also
    /// switches it to incremental for next time. Either holds the writer for
    /// the duration, as etcd's defragmentation blocks writes. The checkpoint
    /// then moves the result from the WAL into the database file.
    async fn defragment(&self) -> BackendResult<()> {
        let conn = self.writer.lock().await;
        let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
        if mode == AUTO_VACUUM_INCREMENTAL {
            // It frees one page per step, so it must be stepped to the end.
            let mut vacuum = conn.prepare("PRAGMA incremental_vacuum")?;
            let mut steps = vacuum.query([])?;
            while steps.next()?.is_some() {}
        } else {
            conn.pragma_update(None, "auto_vacuum", AUTO_VACUUM_INCREMENTAL)?;
            conn.execute_batch("VACUUM")?;
        }
        // Readers holding old snapshots can keep part of the WAL alive; the
        // next checkpoint finishes the job, so a partial one is no error.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }
}

/// Page cache of a bulk load, in KiB (a negative `cache_size` is KiB).
const BULK_LOAD_CACHE_KIB: i64 = -65536;

/// SQLite's `auto_vacuum` setting that lets `incremental_vacuum` shrink the file.
const AUTO_VACUUM_INCREMENTAL: i64 = 2;

fn return_reader(pool: &Mutex<Vec<Connection>>, conn: Connection) {
    let mut idle = pool.lock().expect("reader pool poisoned");
    if idle.len() < MAX_IDLE_READERS {
        idle.push(conn);
    }
}

/// A read transaction on a pooled connection; the snapshot is released on drop.
pub struct SqliteRead {
    conn: Option<Connection>,
    pool: Arc<Mutex<Vec<Connection>>>,
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
    conn: OwnedMutexGuard<Connection>,
    checkpointer: Arc<Checkpointer>,
    /// The `meta` row as this transaction read it (see `query_revisions`).
    meta: Option<Revisions>,
    /// The current revision as this transaction read it.
    read_current: i64,
    /// The revision of the last log row appended in this transaction.
    last_appended: i64,
    committed: bool,
}

impl Drop for SqliteWrite {
    fn drop(&mut self) {
        if !self.committed {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

// Range queries come in two shapes, with and without an upper bound, so that
// SQLite can always use the key index for both ends.
const CURRENT_RANGE: &str = "SELECT key, value, create_revision, mod_revision, version, lease \
     FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key LIMIT ?3";
const CURRENT_RANGE_FROM: &str = "SELECT key, value, create_revision, mod_revision, version, lease \
     FROM kv WHERE key >= ?1 ORDER BY key LIMIT ?3";
// One key: an equality on the primary key lets SQLite stop after the row
// instead of stepping on to the next key to find the end of the range.
const CURRENT_GET: &str = "SELECT key, value, create_revision, mod_revision, version, lease \
     FROM kv WHERE key = ?1";
const CURRENT_COUNT: &str = "SELECT COUNT(*) FROM kv WHERE key >= ?1 AND key < ?2";
const CURRENT_COUNT_FROM: &str = "SELECT COUNT(*) FROM kv WHERE key >= ?1";
// A key's state at revision R is its log row with the largest (revision, sub)
// at or below R: one key can change twice in one revision (a Txn may delete
// from "\0" and put the same key, as etcd allows).
const HISTORY_RANGE: &str = "SELECT key, value, create_revision, revision, version, lease \
     FROM log AS l WHERE key >= ?1 AND key < ?2 AND revision <= ?4 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?4 \
                            ORDER BY revision DESC, sub DESC LIMIT 1) \
     ORDER BY key LIMIT ?3";
const HISTORY_RANGE_FROM: &str = "SELECT key, value, create_revision, revision, version, lease \
     FROM log AS l WHERE key >= ?1 AND revision <= ?4 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?4 \
                            ORDER BY revision DESC, sub DESC LIMIT 1) \
     ORDER BY key LIMIT ?3";
const HISTORY_COUNT: &str = "SELECT COUNT(*) FROM log AS l \
     WHERE key >= ?1 AND key < ?2 AND revision <= ?3 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?3 \
                            ORDER BY revision DESC, sub DESC LIMIT 1)";
const HISTORY_COUNT_FROM: &str = "SELECT COUNT(*) FROM log AS l \
     WHERE key >= ?1 AND revision <= ?3 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?3 \
                            ORDER BY revision DESC, sub DESC LIMIT 1)";

fn kv_from_row(row: &Row<'_>) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key: row.get(0)?,
        value: row.get(1)?,
        create_revision: row.get(2)?,
        mod_revision: row.get(3)?,
        version: row.get(4)?,
        lease: row.get(5)?,
    })
}

/// Runs one of the range or count statements. Parameters are, in order,
/// start, end, then `extra`; each statement uses a prefix of that list.
/// `capacity` is how many rows are expected at most, so that the result is
/// allocated once (0 when unknown).
fn query_keys<T>(
    conn: &Connection,
    sql: &str,
    range: &KeyRange,
    extra: &[&dyn ToSql],
    capacity: usize,
    mut map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    let end: &[u8] = range.end.as_deref().unwrap_or_default();
    let mut stmt = conn.prepare_cached(sql)?;
    let used = stmt.parameter_count();
    let all = [&range.start as &dyn ToSql, &end]
        .into_iter()
        .chain(extra.iter().copied());
    for (index, value) in all.enumerate().take(used) {
        stmt.raw_bind_parameter(index + 1, value)?;
    }
    let mut rows = stmt.raw_query();
    let mut found = Vec::with_capacity(capacity);
    while let Some(row) = rows.next()? {
        found.push(map(row)?);
    }
    Ok(found)
}

/// True if `range` holds exactly one key: `[key, key + "\0")`.
fn is_single_key(range: &KeyRange) -> bool {
    range.end.as_deref().is_some_and(|end| {
        end.len() == range.start.len() + 1 && end.starts_with(&range.start) && end.ends_with(&[0])
    })
}

/// Rows of a range read to allocate for up front: its limit, or one for a
/// single key, up to a bound.
fn expected_rows(range: &KeyRange, limit: usize) -> usize {
    const MOST: usize = 1024;
    match limit {
        0 if is_single_key(range) => 1,
        limit => limit.min(MOST),
    }
}

fn query_range(
    conn: &Connection,
    range: &KeyRange,
    at: ReadAt,
    limit: usize,
) -> rusqlite::Result<Vec<KeyValue>> {
    let capacity = expected_rows(range, limit);
    // SQLite reads a negative LIMIT as no limit.
    let limit = if limit == 0 { -1 } else { limit as i64 };
    match at {
        ReadAt::Current => {
            let sql = if is_single_key(range) {
                CURRENT_GET
            } else if range.end.is_some() {
                CURRENT_RANGE
            } else {
                CURRENT_RANGE_FROM
            };
            query_keys(conn, sql, range, &[&limit], capacity, kv_from_row)
        }
        ReadAt::Revision(rev) => {
            let sql = if range.end.is_some() {
                HISTORY_RANGE
            } else {
                HISTORY_RANGE_FROM
            };
            query_keys(conn, sql, range, &[&limit, &rev], capacity, kv_from_row)
        }
    }
}

fn query_count(conn: &Connection, range: &KeyRange, at: ReadAt) -> rusqlite::Result<i64> {
    let counts = match at {
        ReadAt::Current => {
            let sql = if range.end.is_some() {
                CURRENT_COUNT
            } else {
                CURRENT_COUNT_FROM
            };
            query_keys(conn, sql, range, &[], 1, |r| r.get(0))?
        }
        ReadAt::Revision(rev) => {
            let sql = if range.end.is_some() {
                HISTORY_COUNT
            } else {
                HISTORY_COUNT_FROM
            };
            query_keys(conn, sql, range, &[&rev], 1, |r| r.get(0))?
        }
    };
    Ok(counts.first().copied().unwrap_or(0))
}

/// The counters, and the `meta` row they came from. A commit that only adds
/// revisions leaves `meta` alone (one page less to write per commit): every
/// new revision has a row in the log, so the current revision is the larger
/// of `meta.revision` and the log's last revision. `meta.revision` is
/// brought up to date whenever the compaction counters change, so that
/// compaction removing the log's last rows never takes revisions back.
fn query_revisions(conn: &Connection) -> rusqlite::Result<(Revisions, Revisions)> {
    conn.prepare_cached(
        "SELECT revision, (SELECT MAX(revision) FROM log), compact_revision, compacted_through \
         FROM meta",
    )?
    .query_row([], |r| {
        let meta = Revisions {
            current: r.get(0)?,
            compact: r.get(2)?,
            compacted_through: r.get(3)?,
        };
        let logged: Option<i64> = r.get(1)?;
        let revisions = Revisions {
            current: meta.current.max(logged.unwrap_or(0)),
            ..meta
        };
        Ok((revisions, meta))
    })
}

fn query_log(conn: &Connection, after: i64, through: i64) -> rusqlite::Result<Vec<LogEntry>> {
    let mut stmt = conn.prepare_cached(
        "SELECT key, value, create_revision, revision, version, lease, sub, deleted \
         FROM log WHERE revision > ?1 AND revision <= ?2 ORDER BY revision, sub",
    )?;
    let rows = stmt.query_map(params![after, through], |row| {
        Ok(LogEntry {
            kv: kv_from_row(row)?,
            sub: row.get(6)?,
            deleted: row.get(7)?,
        })
    })?;
    rows.collect()
}

fn lease_from_row(row: &Row<'_>) -> rusqlite::Result<LeaseRow> {
    Ok(LeaseRow {
        id: row.get(0)?,
        ttl: row.get(1)?,
        expires_at: row.get(2)?,
    })
}

fn query_lease(conn: &Connection, id: i64) -> rusqlite::Result<Option<LeaseRow>> {
    conn.prepare_cached("SELECT id, ttl, expires_at FROM lease WHERE id = ?1")?
        .query_row([id], lease_from_row)
        .optional()
}

fn query_leases(conn: &Connection) -> rusqlite::Result<Vec<LeaseRow>> {
    conn.prepare_cached("SELECT id, ttl, expires_at FROM lease ORDER BY expires_at, id")?
        .query_map([], lease_from_row)?
        .collect()
}

fn query_expired_leases(
    conn: &Connection,
    now_ms: i64,
    limit: usize,
) -> rusqlite::Result<Vec<i64>> {
    conn.prepare_cached("SELECT id FROM lease WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2")?
        .query_map(params![now_ms, limit as i64], |r| r.get(0))?
        .collect()
}

fn query_alarms(conn: &Connection) -> rusqlite::Result<Vec<AlarmRow>> {
    conn.prepare_cached("SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm")?
        .query_map([], |r| {
            Ok(AlarmRow {
                member_id: r.get(0)?,
                alarm: r.get(1)?,
            })
        })?
        .collect()
}

/// `lease != 0` lets SQLite use the partial index on kv(lease, key).
fn query_lease_keys(conn: &Connection, id: i64) -> rusqlite::Result<Vec<KeyValue>> {
    conn.prepare_cached(
        "SELECT key, value, create_revision, mod_revision, version, lease \
         FROM kv WHERE lease = ?1 AND lease != 0 ORDER BY key",
    )?
    .query_map([id], kv_from_row)?
    .collect()
}

fn query_setting(conn: &Connection, name: &str) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached("SELECT value FROM settings WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()
}

fn query_auth_records(
    conn: &Connection,
    kind: AuthKind,
) -> rusqlite::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    conn.prepare_cached("SELECT name, record FROM auth WHERE kind = ?1 ORDER BY name")?
        .query_map([kind.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::conformance::TestStore;
    use crate::store::Store;

    async fn open() -> TestStore<Sqlite> {
        let dir = tempfile::tempdir().unwrap();
        let backend = Sqlite::open(&dir.path().join("state.db")).unwrap();
        TestStore {
            store: Store::open(backend).await.unwrap(),
            guard: Box::new(dir),
        }
    }

    crate::conformance_suite!(open);

    fn put(key: &str) -> crate::proto::etcdserverpb::PutRequest {
        put_sized(key, 256)
    }

    fn put_sized(key: &str, value_bytes: usize) -> crate::proto::etcdserverpb::PutRequest {
        crate::proto::etcdserverpb::PutRequest {
            key: key.into(),
            value: vec![7; value_bytes],
            ..Default::default()
        }
    }

    /// Commits leave `meta` alone; the revision comes back from the log after
    /// a restart, and from `meta` when compaction removed the log's last row.
    #[tokio::test]
    async fn revision_survives_reopen_without_meta_updates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
        for key in ["a", "b", "a"] {
            store.put(put("a")).await.unwrap();
            store.put(put(key)).await.unwrap();
        }
        let meta = |path: &Path| -> i64 {
            Connection::open(path)
                .unwrap()
                .query_row("SELECT revision FROM meta", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(meta(&path), 1, "plain commits do not write meta");
        store.shutdown().await;

        let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
        assert_eq!(store.revisions().current, 7);
        // Delete the newest key and compact at the present: the tombstone,
        // the log's last row, goes; the revision must not go back.
        let deleted = store
            .delete_range(crate::proto::etcdserverpb::DeleteRangeRequest {
                key: b"b".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        let revision = deleted.header.unwrap().revision;
        let compaction = crate::proto::etcdserverpb::CompactionRequest {
            revision,
            physical: true,
        };
        store.compact(&compaction).await.unwrap();
        store.shutdown().await;
        assert_eq!(meta(&path), revision);

        let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
        assert_eq!(store.revisions().current, revision);
        let next = store.put(put("c")).await.unwrap();
        assert_eq!(next.header.unwrap().revision, revision + 1);
    }

    /// The checkpoint thread copies the WAL into the database file once it
    /// passes `CHECKPOINT_PAGES`, without the writer doing it.
    #[tokio::test]
    async fn checkpoint_thread_moves_the_wal_into_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
        let size = || std::fs::metadata(&path).unwrap().len();
        let before = size();
        // A 64 KiB value takes 16 pages in the log and 16 in the live-key
        // table: this writes about 1.5 times the checkpoint threshold.
        let value_bytes = 64 * 1024;
        let puts = checkpointer::CHECKPOINT_PAGES as usize * 4096 * 3 / 2 / (2 * value_bytes);
        for i in 0..puts {
            store
                .put(put_sized(&format!("key{i:05}"), value_bytes))
                .await
                .unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while size() < before + (puts * value_bytes) as u64 {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint: the database file stayed at {} bytes",
                size()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
