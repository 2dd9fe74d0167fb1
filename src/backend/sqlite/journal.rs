//! Commits made durable by the record log, and applied to SQLite in batches.
//!
//! The writer connection keeps one SQLite transaction open across commits,
//! the batch; each write transaction is a savepoint in it. A commit whose
//! changes are log rows, leases, settings and the counters (a put, a delete,
//! a Txn, a lease grant, revoke or expiry, stored keep-alive deadlines, a
//! Compact and each step of compaction) writes them to the record log (one
//! frame, one fdatasync) and leaves them in the batch; the batch is
//! committed to SQLite, synced, and the record log cut, once it is
//! `APPLY_INTERVAL` old or holds `APPLY_BYTES` or `APPLY_REMOVALS` (by the
//! writer after a commit, or by the applier thread when the writer is idle).
//! A commit that writes anything else (auth, alarms, a restore) commits the
//! batch with it at once, as every commit did before the record log. Each
//! SQLite commit of a batch notes the record log generation it holds, so
//! that a restart between that commit and the cut does not apply the
//! generation's changes twice (a lease granted, then revoked by a direct
//! commit, would come back).
//!
//! Compaction's steps ride in the batch, and the rows they remove are
//! deleted by the batch's commit, in id order: SQLite writes every page a
//! commit changed, freed ones included, so a step per commit wrote the
//! log's pages several times over (docs/benchmarks/compaction.md).
//!
//! Readers use their own connections, which see only committed batches: the
//! changes committed since, the unapplied changes, are kept in memory here
//! until their batch is committed, with the revision they reach. A reader
//! takes both (`UnappliedView`) before its SQLite snapshot starts, so every
//! row up to that revision is in one or the other, and leases and settings
//! are read from the unapplied changes first.
//!
//! In replicated mode (`Sqlite::defer_durability`) the Raft log is the
//! durable record of every commit, so the journal stops recording: a commit
//! only joins the batch, the replication mark with it, and a batch commits
//! to SQLite (WAL mode, not synced) as it would otherwise; `make_durable`
//! commits and syncs it before Raft purges its log, and a restart applies
//! the entries the file does not hold again, from the Raft log.
//!
//! The batch's content is always the unapplied changes plus the open
//! savepoint. Should SQLite lose the batch (a failed commit rolls it back),
//! it is rebuilt from the unapplied changes when the next write begins.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::checkpointer::{self, Checkpointer};
use super::key_index::row_id;
use super::queries::{query_revisions, query_setting};
use super::readers::Readers;
use super::record_log::{Change, RecordLog};
use super::txn::{
    delete_rows, insert_row, write_lease, write_replication_mark, write_revisions, write_setting,
};
use crate::backend::{LeaseRow, LogEntry, Revisions};
use crate::proto::mvccpb::KeyValue;

/// Age at which a batch is applied. The prototype measured 100 ms and 1 s:
/// longer batches write each hot page of the log once for more rows
/// (docs/benchmarks/record-log.md).
pub(super) const APPLY_INTERVAL: Duration = Duration::from_secs(1);

/// Record bytes at which a batch is applied however young: bounds the memory
/// the unapplied changes take and keeps the record log far from full.
pub(super) const APPLY_BYTES: usize = 16 << 20;

/// Rows compaction removed at which a batch is applied however young: a
/// write that waits behind the batch's commit waits for their deletes and
/// the pages they free. Measured on a compaction of 118k rows of 1 KiB
/// (docs/benchmarks/compaction.md): 4,096 kept the longest put beside it to 45 ms
/// and wrote 272 MB; 16,384 wrote 222 MB with puts of up to 200 ms; no cap
/// 157 MB.
pub(super) const APPLY_REMOVALS: usize = 4_096;

/// The setting that holds the record log generation whose changes the
/// database holds (see above).
const APPLIED_GENERATION: &str = "record_log_applied_generation";

/// Changes committed to the record log and not yet to SQLite, each the
/// latest of its row, lease or setting.
#[derive(Default)]
struct Pending {
    rows: BTreeMap<i64, LogEntry>,
    /// Ids of the log rows compaction removed.
    removed: BTreeSet<i64>,
    /// None for a removed lease.
    leases: BTreeMap<i64, Option<LeaseRow>>,
    settings: BTreeMap<String, i64>,
    /// The `meta` row, if a commit changed it.
    revisions: Option<Revisions>,
    /// The replication mark, if a commit set it (replicated mode only).
    mark: Option<Vec<u8>>,
}

impl Pending {
    fn add(&mut self, change: Change) {
        match change {
            Change::Row(row) => {
                self.rows.insert(row_id(row.kv.mod_revision, row.sub), row);
            }
            Change::RowRemoved(id) => {
                self.rows.remove(&id);
                self.removed.insert(id);
            }
            Change::Revisions(revisions) => {
                self.revisions = Some(revisions);
            }
            Change::Lease(lease) => {
                self.leases.insert(lease.id, Some(lease));
            }
            Change::LeaseRemoved(id) => {
                self.leases.insert(id, None);
            }
            Change::Setting(name, value) => {
                self.settings.insert(name, value);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.rows.is_empty()
            && self.removed.is_empty()
            && self.leases.is_empty()
            && self.settings.is_empty()
            && self.revisions.is_none()
            && self.mark.is_none()
    }

    /// Writes them on `conn`, in its open transaction, but for the removed
    /// rows (`delete_removed`).
    fn write(&self, conn: &Connection) -> rusqlite::Result<()> {
        for row in self.rows.values() {
            insert_row(conn, row)?;
        }
        if let Some(revisions) = &self.revisions {
            write_revisions(conn, revisions)?;
        }
        for (id, lease) in &self.leases {
            write_lease(conn, *id, lease.as_ref())?;
        }
        for (name, value) in &self.settings {
            write_setting(conn, name, *value)?;
        }
        if let Some(mark) = &self.mark {
            write_replication_mark(conn, mark)?;
        }
        Ok(())
    }

    /// Deletes the removed rows on `conn`, in its open transaction: done
    /// once, by the commit that takes the batch to SQLite, so that the
    /// deletes of many compaction steps go in id order (see `delete_rows`).
    fn delete_removed(&self, conn: &Connection) -> rusqlite::Result<()> {
        delete_rows(conn, self.removed.iter().copied())
    }
}

/// The record log, the unapplied changes and the batch's age.
pub(super) struct Journal {
    /// None once the store stopped syncing its commits (replicated mode,
    /// where the Raft log is the durable record): commits then only join
    /// the batch, and a batch is committed without a sync of its own
    /// (WAL, synchronous=NORMAL) until `Sqlite::make_durable`.
    log: Mutex<Option<RecordLog>>,
    /// Whether `log` is Some, for readers: the writer holds `log` through
    /// each commit's sync.
    recording: AtomicBool,
    unapplied: RwLock<Unapplied>,
    batch: Mutex<Batch>,
    /// True after the batch failed to commit (a full disk, say): commits go
    /// straight to SQLite, taking the batch with them, until one succeeds,
    /// so that the batch waiting for room does not grow.
    stalled: AtomicBool,
    /// The read connections, which a commit of the batch asks to let go of
    /// the database (rollback journal mode: SQLite commits only once no
    /// reader holds it) and to end the transactions they keep.
    readers: Arc<Readers>,
}

struct Unapplied {
    /// Shared with the readers that started while they were unapplied.
    pending: Arc<RwLock<Pending>>,
    /// The revision the last commit reached.
    revision: i64,
}

#[derive(Default)]
struct Batch {
    /// When the batch's first change was committed.
    started: Option<Instant>,
    /// Record bytes in the batch.
    bytes: usize,
    /// Rows compaction removed in the batch.
    removed: usize,
}

/// What a reader sees beyond the batches SQLite holds.
pub(crate) struct UnappliedView {
    pending: Arc<RwLock<Pending>>,
    revision: i64,
}

impl Journal {
    /// Opens the record log of the database at `path` and applies what it
    /// holds that the database does not (the commits of a batch the process
    /// died in), then cuts it.
    pub(super) fn open(
        path: &Path,
        conn: &Connection,
        readers: Arc<Readers>,
    ) -> anyhow::Result<Journal> {
        let (mut log, changes) = RecordLog::open(path)?;
        let applied = query_setting(conn, APPLIED_GENERATION)?;
        if !changes.is_empty() && applied != Some(log.generation() as i64) {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let current = query_revisions(conn)?.0.current;
            let mut pending = Pending::default();
            for change in changes {
                // Rows at or below the current revision are in already.
                if !matches!(&change, Change::Row(row) if row.kv.mod_revision <= current) {
                    pending.add(change);
                }
            }
            pending.write(conn)?;
            pending.delete_removed(conn)?;
            conn.execute_batch("COMMIT")?;
            tracing::info!(
                rows = pending.rows.len(),
                removed_rows = pending.removed.len(),
                leases = pending.leases.len(),
                "applied the record log's commits the database did not hold yet"
            );
        }
        log.cut()?;
        Ok(Journal {
            log: Mutex::new(Some(log)),
            recording: AtomicBool::new(true),
            unapplied: RwLock::new(Unapplied {
                pending: Arc::default(),
                revision: 0,
            }),
            batch: Mutex::default(),
            stalled: AtomicBool::new(false),
            readers,
        })
    }

    /// Commits the batch (see `Readers::committing`).
    fn commit(&self, conn: &Connection) -> rusqlite::Result<()> {
        self.readers.committing(|| conn.execute_batch("COMMIT"))
    }

    /// True while commits are written to the record log (and the database
    /// is in rollback journal mode, see `Sqlite::open_as`).
    pub(super) fn recording(&self) -> bool {
        self.recording.load(Ordering::Acquire)
    }

    /// Applies the batch and stops writing commits to the record log: they
    /// only join the batch from now on. The record log's file goes (its 64
    /// MiB are not kept for nothing); a restart creates it again, empty,
    /// until this runs again. If the batch cannot be applied the log stays,
    /// and commits are recorded (and synced) as before.
    pub(super) fn stop_recording(&self, conn: &Connection, checkpointer: &Checkpointer) {
        self.apply(conn, checkpointer);
        if self.all_applied()
            && let Some(log) = self.log.lock().expect("record log poisoned").take()
        {
            self.recording.store(false, Ordering::Release);
            log.remove();
        }
    }

    /// True while the batch cannot be committed (see `stalled`).
    pub(super) fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// The unapplied changes and their revision, for a reader about to start.
    pub(super) fn view(&self) -> UnappliedView {
        let unapplied = self.unapplied.read().expect("unapplied changes poisoned");
        UnappliedView {
            pending: unapplied.pending.clone(),
            revision: unapplied.revision,
        }
    }

    /// True if no committed change waits for its batch.
    pub(super) fn all_applied(&self) -> bool {
        self.batch.lock().expect("batch poisoned").started.is_none()
    }

    /// Starts a write on `conn`: opens a batch if none is open (rebuilding it
    /// from the unapplied changes if SQLite lost it) and a savepoint in it.
    pub(super) fn begin(&self, conn: &Connection) -> rusqlite::Result<()> {
        if conn.is_autocommit() {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            self.view().pending().write(conn)?;
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

    /// Commits a write whose only changes are `changes` and `mark`,
    /// reaching `revision`: records them (unless recording stopped), then
    /// leaves them in the batch. False, with nothing done, if the record log
    /// cannot take them: the write then commits directly.
    pub(super) fn commit_changes(
        &self,
        conn: &Connection,
        changes: Vec<Change>,
        mark: Option<Vec<u8>>,
        bytes: usize,
        revision: i64,
    ) -> std::io::Result<bool> {
        if let Some(log) = self.log.lock().expect("record log poisoned").as_mut()
            && (mark.is_some() || !log.append(&changes)?)
        {
            // The record log holds no marks: a recording store commits one
            // directly (`SqliteWrite::set_replication_mark`).
            return Ok(false);
        }
        let removed = changes
            .iter()
            .filter(|change| matches!(change, Change::RowRemoved(_)))
            .count();
        {
            let mut unapplied = self.unapplied.write().expect("unapplied changes poisoned");
            let mut pending = unapplied
                .pending
                .write()
                .expect("unapplied changes poisoned");
            for change in changes {
                pending.add(change);
            }
            if mark.is_some() {
                pending.mark = mark;
            }
            drop(pending);
            unapplied.revision = unapplied.revision.max(revision);
        }
        {
            let mut batch = self.batch.lock().expect("batch poisoned");
            batch.started.get_or_insert_with(Instant::now);
            batch.bytes += bytes;
            batch.removed += removed;
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
        let committed = conn
            .execute_batch("RELEASE write")
            .and_then(|()| self.view().pending().delete_removed(conn))
            .and_then(|()| self.note_applied(conn))
            .and_then(|()| self.commit(conn));
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
            || batch.removed >= APPLY_REMOVALS
    }

    /// Commits the batch to SQLite (synced, while recording) and cuts the
    /// record log. A failure is logged: the commits are in the record log
    /// (or the Raft log), and the batch is rebuilt and tried again by the
    /// next write.
    pub(super) fn apply(&self, conn: &Connection, checkpointer: &Checkpointer) {
        if let Err(error) = self.try_apply(conn, checkpointer) {
            tracing::warn!("cannot commit the batch to SQLite: {error}");
        }
    }

    /// As `apply`, returning the failure.
    pub(super) fn try_apply(
        &self,
        conn: &Connection,
        checkpointer: &Checkpointer,
    ) -> anyhow::Result<()> {
        if conn.is_autocommit() {
            if self.all_applied() {
                return Ok(());
            }
            // SQLite lost the batch: rebuild it.
            self.begin(conn)
                .and_then(|()| conn.execute_batch("RELEASE write"))?;
        }
        let committed = self
            .view()
            .pending()
            .delete_removed(conn)
            .and_then(|()| self.note_applied(conn))
            .and_then(|()| self.commit(conn));
        if let Err(error) = committed {
            let _ = conn.execute_batch("ROLLBACK");
            self.stalled.store(true, Ordering::Release);
            return Err(error.into());
        }
        checkpointer.after_commit(conn, checkpointer::wal_pages_after_commit());
        // The batch's pages stay in the writer's cache (up to twice
        // APPLY_BYTES) once committed: every page the writer ever appended,
        // 30 MB of a server's memory at 100k keys. The next batch reads back
        // the few it touches (the log's last leaf and its parents).
        let _ = conn.execute_batch("PRAGMA shrink_memory");
        if let Err(error) = self.applied() {
            tracing::warn!("cannot cut the record log: {error}");
        }
        Ok(())
    }

    /// Notes in the batch the record log generation it holds.
    fn note_applied(&self, conn: &Connection) -> rusqlite::Result<()> {
        let log = self.log.lock().expect("record log poisoned");
        if let Some(log) = log.as_ref().filter(|log| log.has_frames()) {
            write_setting(conn, APPLIED_GENERATION, log.generation() as i64)?;
        }
        Ok(())
    }

    /// After SQLite committed every unapplied change: forgets them (readers
    /// that started before keep theirs) and cuts the record log.
    fn applied(&self) -> std::io::Result<()> {
        {
            let mut unapplied = self.unapplied.write().expect("unapplied changes poisoned");
            let empty = unapplied
                .pending
                .read()
                .expect("unapplied changes poisoned")
                .is_empty();
            if !empty {
                unapplied.pending = Arc::default();
            }
            // Readers from now on start their snapshots after the commit,
            // which holds the current revision (lower, after a `clear`).
            unapplied.revision = 0;
        }
        *self.batch.lock().expect("batch poisoned") = Batch::default();
        self.stalled.store(false, Ordering::Release);
        match self.log.lock().expect("record log poisoned").as_mut() {
            Some(log) => log.cut(),
            None => Ok(()),
        }
    }
}

impl UnappliedView {
    fn pending(&self) -> RwLockReadGuard<'_, Pending> {
        self.pending.read().expect("unapplied changes poisoned")
    }

    /// The current revision, given the one the reader's snapshot holds.
    pub(super) fn current(&self, in_snapshot: i64) -> i64 {
        in_snapshot.max(self.revision)
    }

    /// The counters, given those the reader's snapshot holds: a Compact or
    /// a compaction step may have moved them since.
    pub(super) fn revisions(&self, in_snapshot: Revisions) -> Revisions {
        let current = self.current(in_snapshot.current);
        match self.pending().revisions {
            Some(meta) => Revisions {
                current: current.max(meta.current),
                ..meta
            },
            None => Revisions {
                current,
                ..in_snapshot
            },
        }
    }

    /// Row `id` as a key, if it is unapplied.
    pub(super) fn row(&self, id: i64, keys_only: bool) -> Option<KeyValue> {
        let pending = self.pending();
        let kv = &pending.rows.get(&id)?.kv;
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
        let pending = self.pending();
        let before = entries.len();
        entries.extend(
            pending
                .rows
                .range(row_id(after + 1, 0)..row_id(through + 1, 0))
                .map(|(_, row)| row.clone()),
        );
        if entries.len() > before {
            entries.sort_by_key(|e| row_id(e.kv.mod_revision, e.sub));
            entries.dedup_by_key(|e| row_id(e.kv.mod_revision, e.sub));
        }
    }

    /// Lease `id` as the unapplied changes left it: Some(None) if they
    /// removed it, None if they did not touch it.
    pub(super) fn lease(&self, id: i64) -> Option<Option<LeaseRow>> {
        self.pending().leases.get(&id).copied()
    }

    /// How many leases the unapplied changes touch.
    pub(super) fn leases_touched(&self) -> usize {
        self.pending().leases.len()
    }

    /// `leases` (the snapshot's, by deadline) with the unapplied changes.
    pub(super) fn merge_leases(&self, leases: &mut Vec<LeaseRow>) {
        let pending = self.pending();
        if pending.leases.is_empty() {
            return;
        }
        leases.retain(|lease| !pending.leases.contains_key(&lease.id));
        leases.extend(pending.leases.values().flatten().copied());
        leases.sort_by_key(|lease| (lease.expires_at, lease.id));
    }

    /// The ids of the first `limit` leases expired at `now_ms`, by deadline,
    /// from `expired` (the snapshot's, with their deadlines) and the
    /// unapplied changes.
    pub(super) fn merge_expired(
        &self,
        mut expired: Vec<(i64, i64)>,
        now_ms: i64,
        limit: usize,
    ) -> Vec<i64> {
        let pending = self.pending();
        expired.retain(|(id, _)| !pending.leases.contains_key(id));
        expired.extend(
            pending
                .leases
                .values()
                .flatten()
                .filter(|lease| lease.expires_at <= now_ms)
                .map(|lease| (lease.id, lease.expires_at)),
        );
        expired.sort_by_key(|&(id, expires_at)| (expires_at, id));
        expired.truncate(limit);
        expired.into_iter().map(|(id, _)| id).collect()
    }

    /// Setting `name`, if the unapplied changes set it.
    pub(super) fn setting(&self, name: &str) -> Option<i64> {
        self.pending().settings.get(name).copied()
    }
}
