//! Commits made durable by the record log, and applied to SQLite in batches.
//!
//! The writer connection keeps one SQLite transaction open across commits,
//! the batch; each write transaction is a savepoint in it. A commit that
//! only appends log rows writes them to the record log (one frame, one
//! fdatasync) and leaves them in the batch; the batch is committed to SQLite,
//! synced, and the record log cut, once it is `APPLY_INTERVAL` old or holds
//! `APPLY_BYTES` (by the writer after a commit, or by the applier thread when
//! the writer is idle). A commit that writes anything else (leases, settings,
//! compaction, ...) commits the batch with it at once, as every commit did
//! before the record log.
//!
//! Readers use their own connections, which see only committed batches: the
//! rows committed since, the unapplied rows, are kept in memory here until
//! their batch is committed, with the revision they reach. A reader takes
//! both (`UnappliedView`) before its SQLite snapshot starts, so every row
//! up to that revision is in one or the other.
//!
//! The batch's content is always the unapplied rows plus the open savepoint.
//! Should SQLite lose the batch (a failed commit rolls it back), it is
//! rebuilt from the unapplied rows when the next write begins.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::checkpointer::{self, Checkpointer};
use super::key_index::row_id;
use super::queries::query_revisions;
use super::record_log::RecordLog;
use super::txn::insert_row;
use crate::backend::LogEntry;
use crate::proto::mvccpb::KeyValue;

/// Age at which a batch is applied. The prototype measured 100 ms and 1 s:
/// longer batches write each hot page of the log once for more rows
/// (BENCHMARKS.md, issue 28).
pub(super) const APPLY_INTERVAL: Duration = Duration::from_secs(1);

/// Record bytes at which a batch is applied however young: bounds the memory
/// the unapplied rows take and keeps the record log far from full.
pub(super) const APPLY_BYTES: usize = 16 << 20;

/// Rows committed to the record log and not yet to SQLite.
type Rows = RwLock<BTreeMap<i64, LogEntry>>;

/// The record log, the unapplied rows and the batch's age.
pub(super) struct Journal {
    log: Mutex<RecordLog>,
    unapplied: RwLock<Unapplied>,
    batch: Mutex<Batch>,
    /// False once the store stopped syncing its commits (replicated mode,
    /// where the Raft log is the durable record): commits then go straight
    /// to SQLite.
    enabled: AtomicBool,
}

struct Unapplied {
    /// Shared with the readers that started while they were unapplied.
    rows: Arc<Rows>,
    /// The revision the last commit reached.
    revision: i64,
}

#[derive(Default)]
struct Batch {
    /// When the batch's first row was committed.
    started: Option<Instant>,
    /// Record bytes in the batch.
    bytes: usize,
}

/// What a reader sees beyond the batches SQLite holds.
pub(crate) struct UnappliedView {
    rows: Arc<Rows>,
    revision: i64,
}

impl Journal {
    /// Opens the record log of the database at `path` and applies what it
    /// holds beyond the database's current revision (the commits of a batch
    /// the process died in), then cuts it.
    pub(super) fn open(path: &Path, conn: &Connection) -> anyhow::Result<Journal> {
        let (mut log, rows) = RecordLog::open(path)?;
        if !rows.is_empty() {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let current = query_revisions(conn)?.0.current;
            let newer: Vec<&LogEntry> = rows
                .iter()
                .filter(|row| row.kv.mod_revision > current)
                .collect();
            for row in &newer {
                insert_row(conn, row)?;
            }
            conn.execute_batch("COMMIT")?;
            if !newer.is_empty() {
                tracing::info!(
                    rows = newer.len(),
                    "applied the record log's commits the database did not hold yet"
                );
            }
        }
        log.cut()?;
        Ok(Journal {
            log: Mutex::new(log),
            unapplied: RwLock::new(Unapplied {
                rows: Arc::default(),
                revision: 0,
            }),
            batch: Mutex::default(),
            enabled: AtomicBool::new(true),
        })
    }

    /// True while commits go through the record log.
    pub(super) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Applies the batch and sends later commits straight to SQLite. The
    /// record log's file goes (its 64 MiB are not kept for nothing); a
    /// restart creates it again, empty, until this runs again.
    pub(super) fn disable(&self, conn: &Connection, checkpointer: &Checkpointer) {
        self.apply(conn, checkpointer);
        self.enabled.store(false, Ordering::Release);
        if self.all_applied() {
            self.log.lock().expect("record log poisoned").remove();
        }
    }

    /// The unapplied rows and their revision, for a reader about to start.
    pub(super) fn view(&self) -> UnappliedView {
        let unapplied = self.unapplied.read().expect("unapplied rows poisoned");
        UnappliedView {
            rows: unapplied.rows.clone(),
            revision: unapplied.revision,
        }
    }

    /// True if no committed row waits for its batch.
    pub(super) fn all_applied(&self) -> bool {
        self.batch.lock().expect("batch poisoned").started.is_none()
    }

    /// Starts a write on `conn`: opens a batch if none is open (rebuilding it
    /// from the unapplied rows if SQLite lost it) and a savepoint in it.
    pub(super) fn begin(&self, conn: &Connection) -> rusqlite::Result<()> {
        if conn.is_autocommit() {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let rows = self.view().rows;
            let rows = rows.read().expect("unapplied rows poisoned");
            for row in rows.values() {
                insert_row(conn, row)?;
            }
        }
        conn.prepare_cached("SAVEPOINT write")?.execute([])?;
        Ok(())
    }

    /// Takes back the savepoint of a write that did not commit. With nothing
    /// unapplied the whole batch goes, so that no idle transaction holds the
    /// database's snapshot.
    pub(super) fn roll_back(&self, conn: &Connection) {
        if conn.is_autocommit() {
            return;
        }
        let rolled_back = if self.all_applied() {
            conn.execute_batch("ROLLBACK")
        } else {
            conn.execute_batch("ROLLBACK TO write; RELEASE write")
        };
        if rolled_back.is_err() {
            // Rebuilt by the next write.
            let _ = conn.execute_batch("ROLLBACK");
        }
    }

    /// Commits a write whose only changes are `rows`, reaching `revision`:
    /// records them, then leaves them in the batch. False, with nothing
    /// done, if the record log cannot take them: the write then commits
    /// directly.
    pub(super) fn commit_rows(
        &self,
        conn: &Connection,
        rows: Vec<LogEntry>,
        bytes: usize,
        revision: i64,
    ) -> std::io::Result<bool> {
        if !self
            .log
            .lock()
            .expect("record log poisoned")
            .append(&rows)?
        {
            return Ok(false);
        }
        {
            let mut unapplied = self.unapplied.write().expect("unapplied rows poisoned");
            let mut stored = unapplied.rows.write().expect("unapplied rows poisoned");
            for row in rows {
                stored.insert(row_id(row.kv.mod_revision, row.sub), row);
            }
            drop(stored);
            unapplied.revision = unapplied.revision.max(revision);
        }
        {
            let mut batch = self.batch.lock().expect("batch poisoned");
            batch.started.get_or_insert_with(Instant::now);
            batch.bytes += bytes;
        }
        if conn
            .prepare_cached("RELEASE write")
            .and_then(|mut s| s.execute([]))
            .is_err()
        {
            // The commit is recorded; the batch is rebuilt by the next write.
            let _ = conn.execute_batch("ROLLBACK");
        }
        Ok(true)
    }

    /// Commits a write directly: the batch with it, synced by SQLite. On an
    /// error the batch is rolled back (to be rebuilt without this write).
    pub(super) fn commit_direct(
        &self,
        conn: &Connection,
        checkpointer: &Checkpointer,
    ) -> anyhow::Result<()> {
        let committed = conn.execute_batch("RELEASE write; COMMIT");
        if let Err(error) = committed {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            return Err(error.into());
        }
        checkpointer.after_commit(conn, checkpointer::wal_pages_after_commit());
        self.applied()?;
        Ok(())
    }

    /// True if the batch is old or large enough to be applied.
    pub(super) fn apply_due(&self) -> bool {
        let batch = self.batch.lock().expect("batch poisoned");
        batch
            .started
            .is_some_and(|started| started.elapsed() >= APPLY_INTERVAL)
            || batch.bytes >= APPLY_BYTES
    }

    /// Commits the batch to SQLite (synced) and cuts the record log. A
    /// failure is logged: the commits are in the record log, and the batch
    /// is rebuilt and tried again by the next write.
    pub(super) fn apply(&self, conn: &Connection, checkpointer: &Checkpointer) {
        if conn.is_autocommit() {
            if self.all_applied() {
                return;
            }
            // SQLite lost the batch: rebuild it.
            if let Err(error) = self
                .begin(conn)
                .and_then(|()| conn.execute_batch("RELEASE write"))
            {
                tracing::warn!("cannot apply the record log's commits: {error}");
                return;
            }
        }
        if let Err(error) = conn.execute_batch("COMMIT") {
            tracing::warn!("cannot apply the record log's commits: {error}");
            let _ = conn.execute_batch("ROLLBACK");
            return;
        }
        checkpointer.after_commit(conn, checkpointer::wal_pages_after_commit());
        if let Err(error) = self.applied() {
            tracing::warn!("cannot cut the record log: {error}");
        }
    }

    /// After SQLite committed every unapplied row: forgets them (readers
    /// that started before keep theirs) and cuts the record log.
    fn applied(&self) -> std::io::Result<()> {
        {
            let mut unapplied = self.unapplied.write().expect("unapplied rows poisoned");
            if !unapplied
                .rows
                .read()
                .expect("unapplied rows poisoned")
                .is_empty()
            {
                unapplied.rows = Arc::default();
            }
            // Readers from now on start their snapshots after the commit,
            // which holds the current revision (lower, after a `clear`).
            unapplied.revision = 0;
        }
        *self.batch.lock().expect("batch poisoned") = Batch::default();
        self.log.lock().expect("record log poisoned").cut()
    }
}

impl UnappliedView {
    /// The current revision, given the one the reader's snapshot holds.
    pub(crate) fn current(&self, in_snapshot: i64) -> i64 {
        in_snapshot.max(self.revision)
    }

    /// Row `id` as a key, if it is unapplied.
    pub(super) fn row(&self, id: i64, keys_only: bool) -> Option<KeyValue> {
        let rows = self.rows.read().expect("unapplied rows poisoned");
        let kv = &rows.get(&id)?.kv;
        Some(KeyValue {
            key: kv.key.clone(),
            value: if keys_only {
                Vec::new()
            } else {
                kv.value.clone()
            },
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        })
    }

    /// Adds the unapplied rows of revisions `after + 1 ..= through` to
    /// `entries` (the snapshot's rows, ascending), keeping the order and
    /// each row once (a batch committed after the view was taken may be in
    /// both).
    pub(super) fn add_log(&self, after: i64, through: i64, entries: &mut Vec<LogEntry>) {
        let rows = self.rows.read().expect("unapplied rows poisoned");
        let before = entries.len();
        entries.extend(
            rows.range(row_id(after + 1, 0)..row_id(through + 1, 0))
                .map(|(_, row)| row.clone()),
        );
        if entries.len() > before {
            entries.sort_by_key(|e| row_id(e.kv.mod_revision, e.sub));
            entries.dedup_by_key(|e| row_id(e.kv.mod_revision, e.sub));
        }
    }
}
