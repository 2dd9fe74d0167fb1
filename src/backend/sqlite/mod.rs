//! The embedded SQLite backend (rusqlite with a bundled SQLite).
//!
//! One connection writes, a small pool of connections reads. WAL mode lets
//! readers run beside the writer, each on a consistent snapshot. SQLite calls
//! are short and run inline on the async task that makes them.
//!
//! The database holds one table of keys, the log, ordered by revision: a
//! commit appends rows at its end. Which row holds a key's state at a
//! revision is the key index's answer, kept in memory (`key_index`).
//!
//! A commit whose changes are log rows, leases and settings (a put, a
//! delete, a Txn, a lease grant or revoke) is made durable by the record log, not by an SQLite commit, and reaches SQLite
//! in batches (`journal`): SQLite's WAL logs whole pages, several for one
//! row, where the record log takes the row's own bytes.
//!
//! The code is split by concern: this file opens the database (its lock
//! file, connections, migrations, the key index) and implements `Backend`;
//! `txn` holds the transactions and their writes, `queries` the statements
//! they read with, `key_index` the index, `range_stream` RangeStream's
//! chunks, `record_log` the record log's file, `journal` the commits
//! through it and their batches, `applier` applies a batch while the writer
//! is idle, `readers` the read connections and the transactions they keep
//! between reads, and `checkpointer` moves the WAL into the database file on
//! its own thread.

mod applier;
mod checkpointer;
mod journal;
mod key_index;
mod queries;
mod range_stream;
mod readers;
mod record_log;
mod txn;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rusqlite::{Connection, OpenFlags};

use self::applier::Applier;
use self::checkpointer::Checkpointer;
use self::journal::{Journal, UnappliedView};
use self::key_index::KeyIndex;
use self::readers::Readers;
use self::txn::SharedIndex;
pub use self::txn::{SqliteRead, SqliteWrite};
use super::{Backend, BackendResult, DatabaseSize, ReadTxn};

mod migrations {
    refinery::embed_migrations!("migrations/sqlite");
}

/// A store kept in one SQLite database file.
pub struct Sqlite {
    path: PathBuf,
    writer: Arc<tokio::sync::Mutex<Connection>>,
    readers: Arc<Readers>,
    checkpointer: Arc<Checkpointer>,
    index: SharedIndex,
    /// The record log commits go through (see `journal`); None for a
    /// scratch file.
    journal: Option<Arc<Journal>>,
    /// Applies the record log's batches while the writer is idle.
    applier: Option<Applier>,
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
        Self::open_as(path, true, RECORD_LOG_PAGE_SIZE)
    }

    /// As `open`, for a member of a replicated cluster: the store's commits
    /// will be recorded by the Raft log, not the record log, and its file
    /// kept in WAL mode (`defer_durability`), so a new file gets pages of
    /// `PAGE_SIZE`.
    pub fn open_replica(path: &Path) -> anyhow::Result<Self> {
        Self::open_as(path, true, PAGE_SIZE)
    }

    /// As `open`, without the lock file: for a new file only its creator
    /// knows of (a snapshot being built), which would leave lock files behind.
    pub fn open_scratch(path: &Path) -> anyhow::Result<Self> {
        Self::open_as(path, false, PAGE_SIZE)
    }

    /// The journal while commits go through the record log (rollback
    /// journal mode; not after `defer_durability`, which puts the file in
    /// WAL mode): readers then let a batch commit through, as SQLite
    /// commits only once no reader holds the database.
    fn recording(&self) -> Option<&Arc<Journal>> {
        self.journal.as_ref().filter(|journal| journal.recording())
    }

    /// Opens the file at `path`, holding its lock file if `lock`; a new file
    /// gets pages of `page_size` bytes.
    fn open_as(path: &Path, lock: bool, page_size: i64) -> anyhow::Result<Self> {
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
        // Both take effect only in a new file (the page size also in the
        // VACUUM that gives an older one auto-vacuum, see `defragment`), and
        // the page size only if set first. Incremental auto-vacuum lets
        // Defragment shrink the file without a full VACUUM.
        writer.pragma_update(None, "page_size", page_size)?;
        writer.pragma_update(None, "auto_vacuum", AUTO_VACUUM_INCREMENTAL)?;
        // The record log, and with it batches, only for the server's own file.
        let journal_mode = if lock.is_some() { "PERSIST" } else { "WAL" };
        set_journal_mode(&writer, journal_mode)
            .with_context(|| format!("cannot open SQLite database {}", path.display()))?;
        migrations::migrations::runner()
            .run(&mut writer)
            .context("cannot apply SQLite migrations")?;
        checkpointer::watch_wal(&writer);
        let readers = Arc::new(Readers::new(path.to_path_buf()));
        // A scratch file is written in one transaction and synced whole.
        let journal = match lock.is_some() {
            true => open_journal(path, &writer, &readers)?,
            false => None,
        };
        let index = KeyIndex::load(&writer).context("cannot read the log into the key index")?;
        if journal.is_some() {
            // A batch's pages stay in the cache until it is applied: never
            // written out before its commit, which in rollback journal mode
            // would wait for every reader (see `journal`).
            writer.pragma_update(None, "cache_size", BATCH_CACHE_KIB)?;
            writer.pragma_update(None, "cache_spill", false)?;
            // Each write is a savepoint in the batch, and SQLite keeps the
            // pages a savepoint changes in a statement journal, by default
            // a temporary file: its writes cost 2-3 KB per Txn at 64 clients.
            writer.pragma_update(None, "temp_store", "MEMORY")?;
        }
        let writer = Arc::new(tokio::sync::Mutex::new(writer));
        let checkpointer = Arc::new(Checkpointer::start(path)?);
        let applier = match &journal {
            Some(journal) => Some(Applier::start(
                writer.clone(),
                journal.clone(),
                checkpointer.clone(),
            )?),
            None => None,
        };
        Ok(Sqlite {
            path: path.to_path_buf(),
            writer,
            readers,
            checkpointer,
            index: Arc::new(std::sync::RwLock::new(index)),
            journal,
            applier,
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
            self.readers
                .committing(|| conn.pragma_update(None, "journal_mode", "OFF"))?;
            conn.pragma_update(None, "synchronous", "OFF")?;
        }
        Ok(())
    }

    /// Ends a scratch file's bulk load: rollback-journal mode (not WAL), so
    /// that the file alone is the whole database.
    pub async fn finish_scratch(&self) -> anyhow::Result<()> {
        let conn = self.writer.lock().await;
        self.readers
            .committing(|| conn.pragma_update(None, "journal_mode", "DELETE"))?;
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
        let version = version.unwrap_or(0);
        if version > supported {
            anyhow::bail!(
                "the snapshot has schema version {version}, newer than this cetera's {supported}"
            );
        }
        if version < LOG_BY_REVISION_VERSION {
            // An older cetera's snapshot: its log, keyed by (revision, sub),
            // is read through a copy in the connection's own temporary
            // database, which the file cannot be changed to hold.
            conn.execute_batch(
                "CREATE TEMP TABLE log (id INTEGER PRIMARY KEY, key BLOB NOT NULL, \
                     value BLOB NOT NULL, create_revision INTEGER NOT NULL, \
                     version INTEGER NOT NULL, lease INTEGER NOT NULL, deleted INTEGER NOT NULL);
                 INSERT INTO temp.log SELECT (revision << 20) | sub, key, value, create_revision, \
                     version, lease, deleted FROM main.log ORDER BY revision, sub;",
            )
            .context("cannot read the log of an older snapshot")?;
        }
        conn.execute_batch("BEGIN")?;
        Ok(SqliteRead {
            conn: Some(conn),
            readers: None,
            began_after: 0,
            index: None,
            snapshot_revision: None,
            unapplied: None,
            commit_waiting: None,
            removed_below: 0,
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

    /// A read transaction that sees `unapplied` beyond what SQLite holds
    /// (taken before it: see `journal`); its SQLite transaction may be one
    /// a connection kept from its last read (see `readers`).
    fn reader(&self, unapplied: Option<UnappliedView>) -> BackendResult<SqliteRead> {
        let reader = self.readers.take()?;
        let removed_below = self
            .index
            .read()
            .expect("key index poisoned")
            .removed_below();
        Ok(SqliteRead {
            began_after: reader.began_after,
            conn: Some(reader.conn),
            readers: Some(self.readers.clone()),
            index: Some(self.index.clone()),
            snapshot_revision: None,
            commit_waiting: self.recording().map(|_| self.readers.commit_waiting()),
            unapplied,
            removed_below,
        })
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
        if let Some(mut applier) = self.applier.take() {
            applier.stop();
        }
        if let Some(checkpointer) = Arc::get_mut(&mut self.checkpointer) {
            checkpointer.stop();
        }
        self.readers.close_idle();
        match self.writer.try_lock() {
            Ok(conn) => {
                if let Some(journal) = &self.journal {
                    journal.apply(&conn, &self.checkpointer);
                }
                if let Err(error) = Self::checkpoint_to_file(&conn) {
                    tracing::warn!("the final WAL checkpoint failed: {error}");
                }
            }
            Err(_) => tracing::warn!("a write is still open at close; the WAL is kept"),
        }
    }
}

/// Opens the record log of the database at `path`. Without room for its
/// file, commits go straight to SQLite, as before the record log: a log
/// that took blocks as it went could fill the disk with commits the
/// database then had no room to take.
fn open_journal(
    path: &Path,
    writer: &Connection,
    readers: &Arc<Readers>,
) -> anyhow::Result<Option<Arc<Journal>>> {
    match Journal::open(path, writer, readers.clone()) {
        Ok(journal) => Ok(Some(Arc::new(journal))),
        Err(error) if super::DiskFull::is(&error) => {
            tracing::warn!(
                "no room for the record log ({error:#}); commits go straight to the database"
            );
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// Sets the journal mode of the database `conn` writes: `PERSIST` (a
/// rollback journal, kept between commits, its header zeroed) where the
/// record log makes commits durable and SQLite takes them in batches: the
/// batch's new pages are then written once, into the database file, where
/// WAL mode writes each page twice, to the WAL and at the checkpoint
/// (docs/benchmarks/record-log.md); readers let go of the database while a batch
/// commits (`journal`). `WAL` elsewhere: where every write commits to SQLite
/// itself (a member of a cluster, whose Raft log is the durable record), as
/// readers then never wait. Changing out of WAL needs the database to
/// itself; a connection that cannot change the mode is an error.
fn set_journal_mode(conn: &Connection, mode: &str) -> anyhow::Result<()> {
    let set: String = conn.pragma_update_and_check(None, "journal_mode", mode, |row| row.get(0))?;
    if !set.eq_ignore_ascii_case(mode) {
        anyhow::bail!("cannot change the SQLite journal mode from {set} to {mode}");
    }
    Ok(())
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
    // synchronous=FULL syncs every commit, so that a commit SQLite makes
    // survives power loss, not only a crash of the process. Readers take the
    // journal mode the writer set (`set_journal_mode`).
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
        // Before the snapshot starts (see `journal`).
        let unapplied = self.journal.as_ref().map(|journal| journal.view());
        self.reader(unapplied)
    }

    async fn read_applied(&self) -> BackendResult<SqliteRead> {
        let Some(journal) = &self.journal else {
            return self.read().await;
        };
        let writer = self.writer.lock().await;
        journal.try_apply(&writer, &self.checkpointer)?;
        let mut read = self.reader(None)?;
        // The snapshot starts at the first read: here, before the writer
        // can commit anything more.
        read.revisions().await?;
        drop(writer);
        Ok(read)
    }

    async fn write(&self) -> BackendResult<SqliteWrite> {
        let conn = self.writer.clone().lock_owned().await;
        let journal = self.journal.clone();
        match &journal {
            Some(journal) => journal.begin(&conn)?,
            None => conn.execute_batch("BEGIN IMMEDIATE")?,
        }
        Ok(SqliteWrite {
            conn,
            checkpointer: self.checkpointer.clone(),
            readers: self.readers.clone(),
            meta: None,
            read_current: 0,
            last_appended: 0,
            committed: false,
            index: self.index.clone(),
            replacement: None,
            undo: Vec::new(),
            removals: Vec::new(),
            removed_rows: Vec::new(),
            journal,
            records: Vec::new(),
            record_bytes: 0,
            mark: None,
            direct: false,
            finishes_compaction: false,
        })
    }

    fn works_on_calling_thread(&self) -> bool {
        true
    }

    /// The lock file keeps every other server off the database.
    fn is_only_writer(&self) -> bool {
        true
    }

    /// Commits stop going through the record log and reach SQLite only in
    /// the journal's batches, each second or so, as etcd's backend commits
    /// every 100 ms: a commit one entry at a time wrote each page it
    /// changed to the WAL, and again at the checkpoint
    /// (docs/benchmarks/replicated.md). WAL mode with synchronous=NORMAL: a
    /// batch's commit is then consistent after a power loss but may be
    /// lost, and the WAL is synced only by checkpoints and `make_durable`.
    async fn defer_durability(&self) -> BackendResult<()> {
        let conn = self.writer.lock().await;
        if let Some(journal) = &self.journal {
            journal.stop_recording(&conn, &self.checkpointer);
        }
        self.readers.committing(|| set_journal_mode(&conn, "WAL"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(())
    }

    /// Commits the batch, then syncs the WAL (every commit so far) and the
    /// database file.
    async fn make_durable(&self) -> BackendResult<()> {
        if let Some(journal) = &self.journal {
            let conn = self.writer.lock().await;
            journal.try_apply(&conn, &self.checkpointer)?;
        }
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
        let reader = self.readers.take()?;
        let conn = &reader.conn;
        let sizes = (|| -> rusqlite::Result<DatabaseSize> {
            let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
            let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
            let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
            Ok(DatabaseSize {
                total: page_size * pages,
                in_use: page_size * (pages - free),
            })
        })();
        self.readers.give_back(reader);
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
        if let Some(journal) = &self.journal {
            journal.apply(&conn, &self.checkpointer);
        }
        let vacuum = || -> rusqlite::Result<()> {
            let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
            if mode == AUTO_VACUUM_INCREMENTAL {
                // It frees one page per step, so it must be stepped to the end.
                let mut vacuum = conn.prepare("PRAGMA incremental_vacuum")?;
                let mut steps = vacuum.query([])?;
                while steps.next()?.is_some() {}
                Ok(())
            } else {
                conn.pragma_update(None, "auto_vacuum", AUTO_VACUUM_INCREMENTAL)?;
                conn.execute_batch("VACUUM")
            }
        };
        // Its commit, as a batch's, needs the database to itself.
        self.readers.committing(vacuum)?;
        // Readers holding old snapshots can keep part of the WAL alive; the
        // next checkpoint finishes the job, so a partial one is no error.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }
}

/// Page size of a new database in WAL mode (a member of a replicated
/// cluster, a scratch file), in bytes: every commit writes each page it
/// changes whole, so a smaller page is a smaller commit. Chosen while a
/// member committed each applied entry alone; since its entries reach the
/// file in batches (`journal`) the server file's 8 KiB may suit it too, not
/// measured. (Before the record log every database used 2 KiB pages; those
/// keep them.)
pub(crate) const PAGE_SIZE: i64 = 4096;

/// Page size of a new server file, whose rows reach SQLite in batches from
/// the record log (see `journal`), in bytes: a batch appends whole pages of
/// rows, and a page of 8 KiB holds seven rows of a 1 KiB value where one of
/// 4 KiB holds three. Measured against 4 KiB (docs/benchmarks/record-log.md):
/// 0.1 KB less per put at 400 puts/s and saturated, and less in the
/// Kubernetes soak; more at 10 puts/s, where a batch's fixed pages (the
/// last leaf, the counters, page 1, each also copied to the journal)
/// weigh most.
pub(crate) const RECORD_LOG_PAGE_SIZE: i64 = 8192;

/// The schema version whose log is keyed by row id (V6__log_by_revision.sql).
const LOG_BY_REVISION_VERSION: i64 = 6;

/// Page cache of a bulk load, in KiB (a negative `cache_size` is KiB).
const BULK_LOAD_CACHE_KIB: i64 = -65536;

/// The writer's page cache, in KiB, when commits go through the record
/// log: twice `journal::APPLY_BYTES`, so that a batch is not spilled to the
/// WAL before it is applied.
const BATCH_CACHE_KIB: i64 = -2 * (journal::APPLY_BYTES as i64 >> 10);

/// SQLite's `auto_vacuum` setting that lets `incremental_vacuum` shrink the file.
const AUTO_VACUUM_INCREMENTAL: i64 = 2;

#[cfg(test)]
pub(crate) mod tests {
    use super::record_log::Change;
    use super::*;
    use crate::backend::{
        Compacted, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn, Revisions, WriteTxn,
    };
    use crate::proto::mvccpb::KeyValue;

    /// A fresh, empty database in a temporary directory, which the guard
    /// removes.
    pub(crate) async fn test_database() -> (Sqlite, Box<dyn Send>) {
        let dir = tempfile::tempdir().unwrap();
        let backend = Sqlite::open(&dir.path().join("state.db")).unwrap();
        (backend, Box::new(dir))
    }

    /// A new store at `state.db` in a temporary dir, opened by `open`, with
    /// the file's path; the dir goes when dropped.
    fn new_store(
        open: fn(&Path) -> anyhow::Result<Sqlite>,
    ) -> (tempfile::TempDir, std::path::PathBuf, Sqlite) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let backend = open(&path).unwrap();
        (dir, path, backend)
    }

    /// Commits a put of `key` at `revision` (its first version).
    async fn put(backend: &Sqlite, revision: i64, key: &str, value: &[u8]) {
        let mut txn = backend.write().await.unwrap();
        let mut revisions = txn.revisions().await.unwrap();
        let kv = KeyValue {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: 0,
        };
        txn.append(&LogEntry {
            kv,
            sub: 0,
            deleted: false,
        })
        .await
        .unwrap();
        revisions.current = revision;
        txn.set_revisions(revisions).await.unwrap();
        txn.commit().await.unwrap();
    }

    /// The values of `keys` at the current revision, as a reader sees them.
    async fn read_values(txn: &mut SqliteRead, keys: &[&str]) -> Vec<Option<Vec<u8>>> {
        let mut values = Vec::new();
        for key in keys {
            let range = KeyRange {
                start: key.as_bytes().to_vec(),
                end: None,
            };
            let found = txn.range(&range, ReadAt::Current, 0, false).await.unwrap();
            values.push(found.into_iter().next().map(|kv| kv.value));
        }
        values
    }

    /// Log rows in the database file, as another process would see them.
    fn rows_in_file(path: &Path) -> i64 {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        conn.query_row("SELECT COUNT(*) FROM log", [], |r| r.get(0))
            .unwrap()
    }

    /// Applies the record log's batch now, as the applier thread would.
    async fn apply_now(backend: &Sqlite) {
        let conn = backend.writer.lock().await;
        backend
            .journal
            .as_ref()
            .unwrap()
            .apply(&conn, &backend.checkpointer);
    }

    /// Rolls the open batch back, as a failed commit of it leaves SQLite.
    async fn lose_the_batch(backend: &Sqlite) {
        let conn = backend.writer.lock().await;
        conn.execute_batch("ROLLBACK").unwrap();
    }

    /// A put is acknowledged once it is in the record log: readers see it at
    /// once, the database file only after its batch is applied (by the
    /// applier thread, the writer being idle).
    #[tokio::test]
    async fn puts_reach_the_database_file_in_batches() {
        let (_dir, path, backend) = new_store(Sqlite::open);
        put(&backend, 2, "a", b"one").await;
        put(&backend, 3, "b", b"two").await;
        assert_eq!(rows_in_file(&path), 0, "applied before its batch was due");
        let mut reader = backend.read().await.unwrap();
        assert_eq!(reader.revisions().await.unwrap().current, 3);
        assert_eq!(
            read_values(&mut reader, &["a", "b"]).await,
            [Some(b"one".to_vec()), Some(b"two".to_vec())]
        );
        assert_eq!(reader.log_entries(1, 3).await.unwrap().len(), 2);
        drop(reader);
        let deadline = std::time::Instant::now() + journal::APPLY_INTERVAL * 10;
        while rows_in_file(&path) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the batch was never applied"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A write that changed nothing (a Txn whose compare failed) leaves the
    /// batch as it was: committing it would cost a batch's syncs and pages
    /// for each such Txn.
    #[tokio::test]
    async fn a_write_that_changed_nothing_leaves_the_batch() {
        let (_dir, path, backend) = new_store(Sqlite::open);
        put(&backend, 2, "a", b"one").await;
        let mut txn = backend.write().await.unwrap();
        assert_eq!(txn.revisions().await.unwrap().current, 2);
        txn.commit().await.unwrap();
        assert_eq!(rows_in_file(&path), 0, "the batch was committed");
        // Nor does it leave a transaction open when there is no batch.
        apply_now(&backend).await;
        let mut txn = backend.write().await.unwrap();
        txn.revisions().await.unwrap();
        txn.commit().await.unwrap();
        assert!(backend.writer.lock().await.is_autocommit());
        put(&backend, 3, "b", b"two").await;
        let mut reader = backend.read().await.unwrap();
        assert_eq!(
            read_values(&mut reader, &["a", "b"]).await,
            [Some(b"one".to_vec()), Some(b"two".to_vec())]
        );
        drop(reader);
        apply_now(&backend).await;
        assert_eq!(rows_in_file(&path), 2);
    }

    /// A reader that started while rows were unapplied finds them after
    /// their batch is applied (in its memory view or its snapshot, whichever
    /// has them), and its log holds each row once.
    #[tokio::test]
    async fn a_reader_keeps_its_rows_across_an_apply() {
        let (backend, _dir) = test_database().await;
        put(&backend, 2, "a", b"one").await;
        let mut before = backend.read().await.unwrap();
        apply_now(&backend).await;
        put(&backend, 3, "a", b"two").await;
        assert_eq!(
            read_values(&mut before, &["a"]).await,
            [Some(b"one".to_vec())]
        );
        assert_eq!(before.log_entries(0, 2).await.unwrap().len(), 1);
        let mut after = backend.read().await.unwrap();
        assert_eq!(
            read_values(&mut after, &["a"]).await,
            [Some(b"two".to_vec())]
        );
        assert_eq!(after.log_entries(0, 3).await.unwrap().len(), 2);
    }

    /// At open, the record log's rows newer than the database are applied,
    /// and older ones (already applied) skipped.
    #[tokio::test]
    async fn the_record_log_is_replayed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        put(&Sqlite::open(&path).unwrap(), 2, "a", b"one").await;
        let row = |revision, key, value| record_log::tests::row(revision, 0, key, value);
        // As a process that died before applying its batch leaves it.
        let (mut log, _) = record_log::RecordLog::open(&path).unwrap();
        assert!(log.append(&[row(2, "a", "stale")]).unwrap());
        assert!(log.append(&[row(3, "b", "two")]).unwrap());
        assert!(
            log.append(&[Change::Lease(LEASE), Change::LeaseRemoved(8)])
                .unwrap()
        );
        drop(log);

        let backend = Sqlite::open(&path).unwrap();
        assert_eq!(rows_in_file(&path), 2);
        let mut reader = backend.read().await.unwrap();
        assert_eq!(reader.revisions().await.unwrap().current, 3);
        assert_eq!(
            read_values(&mut reader, &["a", "b"]).await,
            [Some(b"one".to_vec()), Some(b"two".to_vec())]
        );
        assert_eq!(reader.lease(7).await.unwrap(), Some(LEASE));
    }

    const LEASE: LeaseRow = LeaseRow {
        id: 7,
        ttl: 60,
        expires_at: 4_102_444_800_000,
    };

    /// A record log generation the database notes it holds (its batch was
    /// committed, and the process died before the cut) is not applied
    /// again: a lease revoked since would come back.
    #[tokio::test]
    async fn a_generation_the_database_holds_is_not_applied_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(Sqlite::open(&path).unwrap());
        let (mut log, _) = record_log::RecordLog::open(&path).unwrap();
        assert!(log.append(&[Change::Lease(LEASE)]).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.execute(
            "INSERT INTO settings (name, value) VALUES ('record_log_applied_generation', ?1)",
            [log.generation() as i64],
        )
        .unwrap();
        drop((log, conn));

        let backend = Sqlite::open(&path).unwrap();
        assert_eq!(backend.read().await.unwrap().lease(7).await.unwrap(), None);
    }

    /// Leases and settings committed through the record log are read from
    /// memory until their batch is applied, and from the file after.
    #[tokio::test]
    async fn unapplied_leases_and_settings_are_read_as_committed() {
        let (backend, _dir) = test_database().await;
        let mut txn = backend.write().await.unwrap();
        txn.put_lease(&LEASE).await.unwrap();
        txn.put_lease(&LeaseRow { id: 8, ..LEASE }).await.unwrap();
        txn.set_setting("a_setting", 5).await.unwrap();
        txn.commit().await.unwrap();
        let mut txn = backend.write().await.unwrap();
        txn.remove_lease(8).await.unwrap();
        txn.put_lease(&LeaseRow {
            id: 9,
            expires_at: 1,
            ..LEASE
        })
        .await
        .unwrap();
        txn.commit().await.unwrap();
        for applied in [false, true] {
            if applied {
                apply_now(&backend).await;
            }
            let mut reader = backend.read().await.unwrap();
            assert_eq!(
                reader.lease(7).await.unwrap(),
                Some(LEASE),
                "applied: {applied}"
            );
            assert_eq!(reader.lease(8).await.unwrap(), None);
            let expired = LeaseRow {
                id: 9,
                expires_at: 1,
                ..LEASE
            };
            assert_eq!(reader.leases().await.unwrap(), [expired, LEASE]);
            assert_eq!(reader.expired_leases(1000, 10).await.unwrap(), [9]);
            assert_eq!(reader.setting("a_setting").await.unwrap(), Some(5));
        }
    }

    /// Should SQLite drop the open batch (a failed commit rolls it back),
    /// the next write rebuilds it from the unapplied rows: nothing
    /// acknowledged is lost.
    #[tokio::test]
    async fn a_batch_sqlite_lost_is_rebuilt() {
        let (_dir, path, backend) = new_store(Sqlite::open);
        put(&backend, 2, "a", b"one").await;
        lose_the_batch(&backend).await;
        put(&backend, 3, "b", b"two").await;
        apply_now(&backend).await;
        assert_eq!(rows_in_file(&path), 2);
    }

    /// A compaction step (a row removed, the counters moved) is a commit of
    /// the record log like a put: readers see the new counters at once, the
    /// database file only when the batch is applied, and a batch SQLite
    /// lost is rebuilt with the removal in it. The step that finishes the
    /// compaction applies the batch with it.
    #[tokio::test]
    async fn compaction_rides_in_the_batch() {
        let (_dir, path, backend) = new_store(Sqlite::open);
        for (revision, value) in [(2, b"one"), (3, b"two"), (4, b"thr")] {
            put(&backend, revision, "a", value).await;
        }
        apply_now(&backend).await;
        assert_eq!(rows_in_file(&path), 3);
        // Compaction at 4, one step at a time: each drops the history before
        // the step's entries.
        let step = |through: i64| {
            let backend = &backend;
            async move {
                let mut txn = backend.write().await.unwrap();
                let mut revisions = txn.revisions().await.unwrap();
                let newest = txn.log_entries(through - 1, through).await.unwrap();
                txn.remove_history_before(&newest[0]).await.unwrap();
                revisions.compact = 4;
                revisions.compacted_through = through;
                txn.set_revisions(revisions).await.unwrap();
                txn.commit().await.unwrap();
                revisions
            }
        };

        let halfway = step(3).await;
        assert_eq!(rows_in_file(&path), 3, "committed outside the batch");
        let mut reader = backend.read().await.unwrap();
        assert_eq!(reader.revisions().await.unwrap(), halfway);
        drop(reader);
        lose_the_batch(&backend).await;
        put(&backend, 5, "b", b"fou").await;
        apply_now(&backend).await;
        assert_eq!(rows_in_file(&path), 3, "a@2 removed, b@5 added");

        let done = step(4).await;
        assert_eq!(rows_in_file(&path), 2, "the last step was not applied");
        let mut reader = backend.read().await.unwrap();
        assert_eq!(reader.revisions().await.unwrap(), done);
        assert_eq!(reader.log_entries(0, 5).await.unwrap().len(), 2);
    }

    /// A compaction step the process died before applying is applied at
    /// open, from the record log.
    #[tokio::test]
    async fn a_compaction_step_is_replayed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let backend = Sqlite::open(&path).unwrap();
            put(&backend, 2, "a", b"one").await;
            put(&backend, 3, "a", b"two").await;
        }
        let compacted = Revisions {
            current: 3,
            compact: 3,
            compacted_through: 3,
        };
        let (mut log, _) = record_log::RecordLog::open(&path).unwrap();
        assert!(
            log.append(&[
                Change::RowRemoved(key_index::row_id(2, 0)),
                Change::Revisions(compacted)
            ])
            .unwrap()
        );
        drop(log);

        let backend = Sqlite::open(&path).unwrap();
        assert_eq!(rows_in_file(&path), 1);
        let mut reader = backend.read().await.unwrap();
        assert_eq!(reader.revisions().await.unwrap(), compacted);
        assert_eq!(
            read_values(&mut reader, &["a"]).await,
            [Some(b"two".to_vec())]
        );
    }

    /// Replicated mode (commits not synced, the Raft log being the record):
    /// the batch is applied and the record log's file removed; later
    /// commits, the replication mark with them, reach the file in batches,
    /// and a read for a copy (`read_applied`) or `make_durable` commits the
    /// batch first, so that the mark read is that of the rows read.
    #[tokio::test]
    async fn deferred_durability_commits_in_batches_with_the_mark() {
        let (_dir, path, backend) = new_store(Sqlite::open_replica);
        let records = record_log::RecordLog::path_of(&path);
        put(&backend, 2, "a", b"one").await;
        assert!(records.exists());
        backend.defer_durability().await.unwrap();
        assert_eq!(rows_in_file(&path), 1);
        assert!(!records.exists());

        apply_entry(&backend, Some(3), b"mark 3").await;
        assert_eq!(rows_in_file(&path), 1, "committed before its batch was due");
        let mut reader = backend.read().await.unwrap();
        assert_eq!(read_values(&mut reader, &["k3"]).await, [Some(Vec::new())]);
        drop(reader);
        // An entry that changes no key (a blank or membership entry) moves
        // the mark alone, and a batch SQLite lost is rebuilt with it.
        apply_entry(&backend, None, b"mark 4").await;
        lose_the_batch(&backend).await;
        let mut copy = backend.read_applied().await.unwrap();
        assert_eq!(copy.revisions().await.unwrap().current, 3);
        assert_eq!(copy.replication_mark().await.unwrap().unwrap(), b"mark 4");
        drop(copy);
        assert_eq!(rows_in_file(&path), 2);

        apply_entry(&backend, Some(5), b"mark 5").await;
        backend.make_durable().await.unwrap();
        assert_eq!(rows_in_file(&path), 3);
        let file = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let mark: Vec<u8> = file
            .query_row("SELECT mark FROM replication", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mark, b"mark 5");
    }

    /// Commits a Raft entry's application: a put of `k{revision}` if given,
    /// and the replication `mark`.
    async fn apply_entry(backend: &Sqlite, revision: Option<i64>, mark: &[u8]) {
        let mut txn = backend.write().await.unwrap();
        if let Some(revision) = revision {
            let mut revisions = txn.revisions().await.unwrap();
            txn.append(&LogEntry::of_key(&format!("k{revision}"), revision, false))
                .await
                .unwrap();
            revisions.current = revision;
            txn.set_revisions(revisions).await.unwrap();
        }
        txn.set_replication_mark(mark).await.unwrap();
        txn.commit().await.unwrap();
    }

    /// The server's file takes batches in rollback journal mode (PERSIST);
    /// a member of a cluster, whose every write commits to SQLite, in WAL
    /// mode; and a file left in WAL mode by an older cetera opens in
    /// rollback mode with everything it held.
    #[tokio::test]
    async fn journal_mode_follows_the_record_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        // A rollback journal mode is the connection's; WAL the file's.
        async fn mode(backend: &Sqlite) -> String {
            let conn = backend.writer.lock().await;
            conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap()
        }
        {
            let backend = Sqlite::open(&path).unwrap();
            assert_eq!(mode(&backend).await, "persist");
            put(&backend, 2, "a", b"one").await;
            backend.defer_durability().await.unwrap();
            assert_eq!(mode(&backend).await, "wal");
            put(&backend, 3, "b", b"two").await;
            assert!(path.with_extension("db-wal").exists());
            let mut reader = backend.read().await.unwrap();
            assert_eq!(
                read_values(&mut reader, &["a", "b"]).await,
                [Some(b"one".to_vec()), Some(b"two".to_vec())]
            );
        }
        let backend = Sqlite::open(&path).unwrap();
        assert_eq!(mode(&backend).await, "persist");
        assert!(!path.with_extension("db-wal").exists(), "the WAL is left");
        let mut reader = backend.read().await.unwrap();
        assert_eq!(
            read_values(&mut reader, &["a", "b"]).await,
            [Some(b"one".to_vec()), Some(b"two".to_vec())]
        );
    }

    /// A server file, whose rows come in batches, gets the larger pages; a
    /// replica's or a scratch file, committed to one commit at a time, the
    /// smaller; and a file keeps the size it was created with.
    #[tokio::test]
    async fn page_size_follows_the_record_log() {
        let dir = tempfile::tempdir().unwrap();
        // The file's own, as another process reads it.
        let page_size = |path: &Path| -> i64 {
            let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
            conn.query_row("PRAGMA page_size", [], |r| r.get(0))
                .unwrap()
        };
        let server = dir.path().join("server.db");
        let replica = dir.path().join("replica.db");
        let scratch = dir.path().join("scratch.db");
        drop(Sqlite::open(&server).unwrap());
        drop(Sqlite::open_replica(&replica).unwrap());
        drop(Sqlite::open_scratch(&scratch).unwrap());
        assert_eq!(page_size(&server), RECORD_LOG_PAGE_SIZE);
        assert_eq!(page_size(&replica), PAGE_SIZE);
        assert_eq!(page_size(&scratch), PAGE_SIZE);
        drop(Sqlite::open_replica(&server).unwrap());
        drop(Sqlite::open(&replica).unwrap());
        assert_eq!(page_size(&server), RECORD_LOG_PAGE_SIZE);
        assert_eq!(page_size(&replica), PAGE_SIZE);
    }

    /// A new store, as the server's (rollback journal mode, the record log)
    /// or, with `wal`, as a member of a cluster's once it defers its
    /// durability to the Raft log (WAL mode).
    async fn store_in_mode(wal: bool) -> (tempfile::TempDir, std::path::PathBuf, Sqlite) {
        if !wal {
            return new_store(Sqlite::open);
        }
        let (dir, path, backend) = new_store(Sqlite::open_replica);
        backend.defer_durability().await.unwrap();
        (dir, path, backend)
    }

    /// A read connection keeps its SQLite transaction from one read to the
    /// next (no system call to begin one), and a commit of the writer ends
    /// it: in rollback journal mode a transaction kept would hold the
    /// commit up for the writer's busy timeout, and in WAL mode it would
    /// go on showing the snapshot from before the commit. A read that
    /// holds its transaction across a commit (WAL mode lets the commit
    /// through) sees its own snapshot to the end, and its connection then
    /// ends the transaction.
    #[tokio::test]
    async fn a_kept_transaction_serves_reads_until_a_commit() {
        for wal in [false, true] {
            let (_dir, _path, backend) = store_in_mode(wal).await;
            put(&backend, 2, "a", b"one").await;
            apply_now(&backend).await;
            let one = [Some(b"one".to_vec())];
            for _ in 0..3 {
                let mut reader = backend.read().await.unwrap();
                assert_eq!(read_values(&mut reader, &["a"]).await, one, "wal: {wal}");
                drop(reader);
                assert_eq!(
                    backend.readers.idle_in_transaction(),
                    1,
                    "the transaction was not kept (wal: {wal})"
                );
            }

            put(&backend, 3, "a", b"two").await;
            apply_now(&backend).await;
            assert!(!backend.journal.as_ref().unwrap().stalled(), "wal: {wal}");
            assert_eq!(backend.readers.idle_in_transaction(), 0, "wal: {wal}");
            let mut reader = backend.read().await.unwrap();
            let two = [Some(b"two".to_vec())];
            assert_eq!(read_values(&mut reader, &["a"]).await, two, "wal: {wal}");
            if wal {
                put(&backend, 4, "a", b"three").await;
                apply_now(&backend).await;
                assert_eq!(read_values(&mut reader, &["a"]).await, two);
                drop(reader);
                assert_eq!(backend.readers.idle_in_transaction(), 0);
                let mut reader = backend.read().await.unwrap();
                assert_eq!(
                    read_values(&mut reader, &["a"]).await,
                    [Some(b"three".to_vec())]
                );
            }
        }
    }

    /// Readers racing the writer always see whole revisions, whether a
    /// revision is in the unapplied changes, in the batch being committed
    /// or in the file, and whether their connection kept its transaction
    /// or began another: every revision puts each of `KEYS` keys to its
    /// own number, and every read of them all finds one number, never
    /// below one the same reader found before. In rollback journal mode and
    /// in WAL mode.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn readers_racing_batch_commits_see_whole_revisions() {
        const KEYS: i64 = 8;
        const REVISIONS: i64 = 300;
        async fn put_all(backend: &Sqlite, revision: i64) {
            let mut txn = backend.write().await.unwrap();
            let mut revisions = txn.revisions().await.unwrap();
            for sub in 0..KEYS {
                let entry = LogEntry {
                    kv: KeyValue {
                        key: format!("k{sub}").into_bytes(),
                        value: revision.to_string().into_bytes(),
                        create_revision: 2,
                        mod_revision: revision,
                        version: revision - 1,
                        lease: 0,
                    },
                    sub,
                    deleted: false,
                };
                txn.append(&entry).await.unwrap();
            }
            revisions.current = revision;
            txn.set_revisions(revisions).await.unwrap();
            txn.commit().await.unwrap();
        }
        for wal in [false, true] {
            let (_dir, _path, backend) = store_in_mode(wal).await;
            let backend = Arc::new(backend);
            put_all(&backend, 2).await;
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let readers: Vec<_> = (0..4)
                .map(|_| {
                    let (backend, done) = (backend.clone(), done.clone());
                    tokio::spawn(async move {
                        let everything = KeyRange {
                            start: b"k".to_vec(),
                            end: Some(b"l".to_vec()),
                        };
                        let (mut last, mut reads) = (0, 0);
                        while !done.load(std::sync::atomic::Ordering::Acquire) {
                            let mut txn = backend.read().await.unwrap();
                            let rows = txn
                                .range(&everything, ReadAt::Current, 0, false)
                                .await
                                .unwrap();
                            drop(txn);
                            assert_eq!(rows.len() as i64, KEYS, "wal: {wal}");
                            let revision = rows[0].mod_revision;
                            for kv in &rows {
                                assert_eq!(kv.mod_revision, revision, "wal: {wal}");
                                assert_eq!(kv.value, revision.to_string().into_bytes());
                            }
                            assert!(revision >= last, "{revision} after {last}, wal: {wal}");
                            last = revision;
                            reads += 1;
                            tokio::task::yield_now().await;
                        }
                        (last, reads)
                    })
                })
                .collect();
            for revision in 3..=REVISIONS {
                put_all(&backend, revision).await;
                if revision % 5 == 0 {
                    apply_now(&backend).await;
                }
                tokio::task::yield_now().await;
            }
            done.store(true, std::sync::atomic::Ordering::Release);
            for reader in readers {
                let (last, reads) = reader.await.unwrap();
                assert!(reads > 0 && last <= REVISIONS, "wal: {wal}");
            }
            assert!(!backend.journal.as_ref().unwrap().stalled(), "wal: {wal}");
        }
    }

    /// Readers let a batch commit through (in rollback journal mode it
    /// needs the database to itself): a stream lets go of its snapshot while
    /// it waits for its client, and a long read, with a commit waiting, at
    /// each page; either still reads every row at its revision.
    #[tokio::test]
    async fn readers_let_a_batch_commit_through() {
        let (_dir, path, backend) = new_store(Sqlite::open);
        let keys = 1000;
        for i in 0..keys {
            put(&backend, i + 2, &format!("k{i:04}"), b"v").await;
        }
        apply_now(&backend).await;
        let everything = KeyRange {
            start: b"k".to_vec(),
            end: Some(b"l".to_vec()),
        };
        let mut reader = backend.read().await.unwrap();
        assert_eq!(reader.revisions().await.unwrap().current, keys + 1);
        assert_eq!(
            read_values(&mut reader, &["k0000"]).await,
            [Some(b"v".to_vec())]
        );
        put(&backend, keys + 2, "k9999", b"later").await;
        // Without it, the commit would wait out the writer's 30 s busy
        // timeout, fail, and leave the batch stalled.
        reader.let_go().unwrap();
        apply_now(&backend).await;
        assert!(!backend.journal.as_ref().unwrap().stalled());
        assert_eq!(rows_in_file(&path), keys + 1);

        let waiting = backend.readers.commit_waiting();
        waiting.store(true, std::sync::atomic::Ordering::Release);
        let rows = reader
            .range(&everything, ReadAt::Current, 0, false)
            .await
            .unwrap();
        assert_eq!(
            rows.len(),
            keys as usize,
            "the later put is above the revision"
        );
        let log = reader.log_entries(1, keys + 1).await.unwrap();
        assert_eq!(log.len(), keys as usize);
        waiting.store(false, std::sync::atomic::Ordering::Release);
    }

    /// A read of the log that compaction overtook while it had let go of
    /// its snapshot is told the revisions are compacted rather than given a
    /// log with holes; one that compaction did not reach is whole.
    #[tokio::test]
    async fn a_log_read_overtaken_by_compaction_is_compacted() {
        let (_dir, path, backend) = new_store(Sqlite::open);
        put(&backend, 2, "a", b"one").await;
        put(&backend, 3, "a", b"two").await;
        put(&backend, 4, "b", b"one").await;
        apply_now(&backend).await;
        let mut reader = backend.read().await.unwrap();
        assert_eq!(reader.log_entries(0, 4).await.unwrap().len(), 3);
        reader.let_go().unwrap();

        let mut txn = backend.write().await.unwrap();
        let mut revisions = txn.revisions().await.unwrap();
        let newest = txn.log_entries(2, 3).await.unwrap();
        txn.remove_history_before(&newest[0]).await.unwrap();
        revisions.compact = 3;
        revisions.compacted_through = 3;
        txn.set_revisions(revisions).await.unwrap();
        txn.commit().await.unwrap();
        apply_now(&backend).await;
        assert_eq!(rows_in_file(&path), 2, "a@2 removed");

        let error = reader.log_entries(0, 4).await.unwrap_err();
        assert!(Compacted::is(&error), "{error:#}");
        assert_eq!(reader.log_entries(2, 4).await.unwrap().len(), 2);
        let mut fresh = backend.read().await.unwrap();
        assert_eq!(fresh.log_entries(0, 4).await.unwrap().len(), 2);
    }

    /// The checkpoint thread copies the WAL into the database file once it
    /// passes `CHECKPOINT_PAGES`, without the writer doing it (WAL mode: a
    /// member of a cluster).
    #[tokio::test]
    async fn checkpoint_thread_moves_the_wal_into_the_database() {
        let (_dir, path, backend) = new_store(Sqlite::open_replica);
        backend.defer_durability().await.unwrap();
        let size = || std::fs::metadata(&path).unwrap().len();
        let before = size();
        // A 64 KiB value takes 32 pages of the log: this writes about 1.5
        // times the checkpoint threshold.
        let value_bytes = 64 * 1024;
        let puts =
            checkpointer::CHECKPOINT_PAGES as usize * PAGE_SIZE as usize * 3 / 2 / value_bytes;
        for i in 0..puts {
            put(
                &backend,
                i as i64 + 2,
                &format!("key{i:05}"),
                &vec![7; value_bytes],
            )
            .await;
        }
        // The first checkpoint copies two thirds of what was written.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while size() < before + (puts * value_bytes / 2) as u64 {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint: the database file stayed at {} bytes",
                size()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An upgrade: a database of schema 5 (a live-key table beside a log
    /// keyed by (revision, sub), as cetera wrote it before the key index)
    /// opens with its history, live keys and leases, and its Snapshot-file
    /// form reads the same.
    #[tokio::test]
    async fn a_database_from_before_the_key_index_opens_with_its_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let mut conn = open_connection(&path, false).unwrap();
            migrations::migrations::runner()
                .set_target(refinery::Target::Version(5))
                .run(&mut conn)
                .unwrap();
            // a@2 put, a@3 put (lease 7), b@3 put (sub 1), b@4 deleted, c@5 put;
            // keys and values are blobs, as cetera stores them.
            conn.execute_batch(
                "INSERT INTO log VALUES (2, 0, x'61', x'6f6e65', 2, 1, 0, 0);
                 INSERT INTO log VALUES (3, 0, x'61', x'74776f', 2, 2, 7, 0);
                 INSERT INTO log VALUES (3, 1, x'62', x'626565', 3, 1, 0, 0);
                 INSERT INTO log VALUES (4, 0, x'62', x'', 0, 0, 0, 1);
                 INSERT INTO log VALUES (5, 0, x'63', x'736561', 5, 1, 0, 0);
                 INSERT INTO kv VALUES (x'61', x'74776f', 2, 3, 2, 7);
                 INSERT INTO kv VALUES (x'63', x'736561', 5, 5, 1, 0);
                 INSERT INTO lease VALUES (7, 60, 4102444800000);
                 UPDATE meta SET revision = 5;",
            )
            .unwrap();
        }
        let snapshot = dir.path().join("old.snapshot");
        std::fs::copy(&path, &snapshot).unwrap();

        let everything = KeyRange {
            start: Vec::new(),
            end: None,
        };
        let kv = |key: &str, value: &str, create: i64, modified: i64, version: i64, lease: i64| {
            KeyValue {
                key: key.into(),
                value: value.into(),
                create_revision: create,
                mod_revision: modified,
                version,
                lease,
            }
        };
        let backend = Sqlite::open(&path).unwrap();
        let mut txn = backend.read().await.unwrap();
        assert_eq!(txn.revisions().await.unwrap().current, 5);
        let now = txn
            .range(&everything, ReadAt::Current, 0, false)
            .await
            .unwrap();
        assert_eq!(
            now,
            vec![kv("a", "two", 2, 3, 2, 7), kv("c", "sea", 5, 5, 1, 0)]
        );
        let then = txn
            .range(&everything, ReadAt::Revision(3), 0, false)
            .await
            .unwrap();
        assert_eq!(
            then,
            vec![kv("a", "two", 2, 3, 2, 7), kv("b", "bee", 3, 3, 1, 0)]
        );
        assert_eq!(
            txn.count(&everything, ReadAt::Revision(2)).await.unwrap(),
            1
        );
        assert_eq!(
            txn.lease_keys(7).await.unwrap(),
            vec![kv("a", "two", 2, 3, 2, 7)]
        );
        let log = txn.log_entries(3, 4).await.unwrap();
        assert_eq!(log.len(), 1);
        assert!(log[0].deleted);
        drop(txn);
        drop(backend);

        let mut old = Sqlite::read_snapshot_file(&snapshot).unwrap();
        assert_eq!(old.revisions().await.unwrap().current, 5);
        assert_eq!(old.log_entries(0, 5).await.unwrap().len(), 5);
        let now = old
            .range(&everything, ReadAt::Current, 0, false)
            .await
            .unwrap();
        assert_eq!(
            now,
            vec![kv("a", "two", 2, 3, 2, 7), kv("c", "sea", 5, 5, 1, 0)]
        );
    }
}
