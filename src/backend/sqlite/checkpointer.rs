//! WAL checkpoints on a thread of their own.
//!
//! SQLite normally checkpoints inside the COMMIT that pushes the WAL past
//! 1000 pages, so one unlucky write batch pays for copying the whole WAL into
//! the database file and for two extra fsyncs. Here the writer connection only
//! notes how long the WAL has grown (a WAL hook, which also turns SQLite's own
//! automatic checkpoint off) and wakes this thread, which runs a PASSIVE
//! checkpoint on its own connection while the writer goes on committing.
//! Nothing is written while nothing is committed, so an idle store does no I/O.
//!
//! SQLite starts the WAL over only when a checkpoint has copied all of it
//! before the next commit. Under steady load commits land while this thread
//! copies, so it never gets there: the WAL grew by hundreds of MB a minute,
//! and the thread copied the same hot pages again round after round. So once
//! the thread has copied nearly everything, the writer copies the last few
//! pages itself, right after a commit, and the next commit starts the WAL over.

use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};

use rusqlite::Connection;

/// WAL length, in pages, that triggers a checkpoint: 32 MiB at cetera's 4 KiB
/// pages (16 MiB in a database created with 2 KiB pages, as before the
/// record log), eight times SQLite's default. A checkpoint copies the newest version of
/// each page once, however often it changed, and puts to random keys keep
/// changing the same few thousand pages: a longer WAL means fewer copies of
/// each (less CPU, fewer bytes written) for a WAL file of about this size
/// (readers find pages in it through a hash index).
pub const CHECKPOINT_PAGES: i32 = 8192;

/// Pages the thread may leave uncopied for the writer to finish: a 512 KiB
/// copy and a sync added to one commit in about a hundred under load.
/// (Measured with 64 to 512: more stalls the writer longer, less leaves the
/// thread more rounds to run.)
const CATCH_UP_PAGES: i32 = 128;

/// WAL length, in thresholds, past which the writer finishes the checkpoint
/// itself however much the thread's last round left: a disk that cannot copy
/// as fast as the writes come slows the writes, instead of letting the WAL
/// grow without end.
const MOST_WAL_THRESHOLDS: i32 = 4;

thread_local! {
    /// Pages in the WAL after the last commit made on this thread. The WAL
    /// hook runs inside COMMIT on the committing thread, so the writer reads
    /// it right after its COMMIT returns.
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

/// Installs the WAL hook on the writer connection. SQLite's automatic
/// checkpoint is itself a WAL hook, so this replaces it.
pub fn watch_wal(writer: &Connection) {
    writer.wal_hook(Some(|_, pages| {
        WAL_PAGES.set(pages);
        Ok(())
    }));
}

/// Pages in the WAL after this thread's last commit (0 if there was none
/// since the last call).
pub fn wal_pages_after_commit() -> i32 {
    WAL_PAGES.take()
}

/// Wakes the checkpoint thread; the thread stops when this is dropped.
pub struct Checkpointer {
    /// WAL length, in pages, that triggers a checkpoint.
    threshold: i32,
    /// Carries the WAL round the writer is in; None once stopped.
    wake: Option<SyncSender<u32>>,
    /// The thread, joined by `stop`.
    thread: Option<std::thread::JoinHandle<()>>,
    /// The thread's last checkpoint: the WAL round it was asked in (high 32
    /// bits) and how many pages of the WAL it had copied by its end (low 32).
    copied: Arc<AtomicU64>,
    /// The writer's WAL round: one more each time SQLite starts the WAL over.
    /// Only the writer (one at a time) touches this and `last_wal_pages`.
    round: AtomicU32,
    /// Pages in the WAL after the writer's last commit.
    last_wal_pages: AtomicU32,
}

impl Checkpointer {
    /// Starts the checkpoint thread for the database at `path`. Its
    /// connection is opened at the first checkpoint: a scratch file that is
    /// built without a WAL and then switched to another journal mode (a
    /// snapshot) must have no other connection open.
    pub fn start(path: &Path) -> anyhow::Result<Self> {
        Self::start_with_threshold(path, CHECKPOINT_PAGES)
    }

    /// As `start`, with a checkpoint every `threshold` pages of WAL.
    fn start_with_threshold(path: &Path, threshold: i32) -> anyhow::Result<Self> {
        let path = path.to_path_buf();
        // Tagged with a round the writer reaches only after 4 billion restarts.
        let copied = Arc::new(AtomicU64::new(u64::from(u32::MAX) << 32));
        let reported = copied.clone();
        // One pending wake-up is enough: a checkpoint copies everything committed before it.
        let (wake, woken) = mpsc::sync_channel::<u32>(1);
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                let mut conn = None;
                while let Ok(round) = woken.recv() {
                    let conn = match &mut conn {
                        Some(conn) => conn,
                        None => match open_connection(&path) {
                            Ok(opened) => conn.insert(opened),
                            Err(error) => {
                                tracing::warn!("cannot open a connection to checkpoint: {error}");
                                continue;
                            }
                        },
                    };
                    match checkpoint(conn) {
                        Ok(pages) => {
                            reported.store(u64::from(round) << 32 | pages, Ordering::Release)
                        }
                        Err(error) => tracing::warn!("WAL checkpoint failed: {error}"),
                    }
                }
            })?;
        Ok(Checkpointer {
            threshold,
            wake: Some(wake),
            thread: Some(thread),
            copied,
            round: AtomicU32::new(0),
            last_wal_pages: AtomicU32::new(0),
        })
    }

    /// Called by the writer after each commit on `writer`, its connection,
    /// with the WAL's length in pages: asks the thread for a checkpoint once
    /// the WAL is long enough, and copies the rest itself once the thread has
    /// copied nearly all of it (or the WAL is far too long).
    pub fn after_commit(&self, writer: &Connection, wal_pages: i32) {
        if wal_pages <= 0 {
            return; // nothing was written to the WAL
        }
        let pages = wal_pages as u32;
        let mut round = self.round.load(Ordering::Relaxed);
        if pages < self.last_wal_pages.swap(pages, Ordering::Relaxed) {
            // SQLite started the WAL over: what the thread copied was of the old one.
            round = round.wrapping_add(1);
            self.round.store(round, Ordering::Relaxed);
        }
        if wal_pages < self.threshold {
            return;
        }
        let copied = self.copied.load(Ordering::Acquire);
        let copied_this_round = (copied >> 32) as u32 == round;
        let left = wal_pages - (copied as u32) as i32;
        // Only after the thread's first round, so that one very large
        // commit (a compaction, say) is still copied beside the writer.
        if copied_this_round
            && (left <= CATCH_UP_PAGES || wal_pages >= self.threshold * MOST_WAL_THRESHOLDS)
        {
            // Busy while the thread is in the middle of a checkpoint: then
            // the next commit tries again.
            if let Err(error) = checkpoint(writer) {
                tracing::warn!("WAL checkpoint failed: {error}");
            }
            return;
        }
        let Some(wake) = &self.wake else { return };
        match wake.try_send(round) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("the WAL checkpoint thread has stopped")
            }
        }
    }

    /// Stops the thread and waits until it has closed its connection, so
    /// that a final checkpoint by the writer neither waits for it nor is
    /// followed by one of its own.
    pub fn stop(&mut self) {
        self.wake = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("the WAL checkpoint thread panicked");
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The checkpoint thread's connection. Not `open_connection`: its pragmas
/// wait for the write lock, which a writer committing back to back hardly
/// ever leaves free (the first checkpoint then came after seconds). The
/// database is in WAL mode already, and `synchronous=FULL` makes each
/// checkpoint sync the database file before SQLite may start the WAL over.
fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// One PASSIVE checkpoint: it never waits for readers or the writer; what a
/// reader still needs is copied by a later checkpoint. Returns how many pages
/// of the WAL have been copied into the database file.
fn checkpoint(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        row.get::<_, i64>(2)
    })
    .map(|pages| pages.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that commits back to back, as under steady load, never
    /// leaves the thread a moment in which it has copied the whole WAL; the
    /// writer's catch-up makes SQLite start the WAL over all the same,
    /// instead of the WAL growing with every commit. (Usually soon after the
    /// threshold; the bound allows for a thread starved of CPU, which the
    /// writer waits for at the most the WAL may hold.)
    #[test]
    fn the_wal_starts_over_under_back_to_back_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut writer = super::super::open_connection(&path, false).unwrap();
        super::super::set_journal_mode(&writer, "WAL").unwrap();
        writer
            .execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
            .unwrap();
        watch_wal(&writer);
        let threshold = 1024;
        let checkpointer = Checkpointer::start_with_threshold(&path, threshold).unwrap();
        let most = (threshold * MOST_WAL_THRESHOLDS) as u64;
        // Ten times the most the WAL may hold, 16 pages per commit on 400 rows.
        let commits = 10 * most / 16;
        let value = vec![7u8; 4000];
        let mut largest = 0;
        for i in 0..commits {
            let tx = writer.transaction().unwrap();
            for j in 0..16 {
                tx.execute(
                    "INSERT OR REPLACE INTO t (k, v) VALUES (?1, ?2)",
                    rusqlite::params![((i * 16 + j) * 7919) % 400, value],
                )
                .unwrap();
            }
            tx.commit().unwrap();
            checkpointer.after_commit(&writer, wal_pages_after_commit());
            let wal = path.with_extension("db-wal");
            largest = largest.max(std::fs::metadata(&wal).unwrap().len());
        }
        // Twice the most, in frames of a page and a 24-byte header.
        let bound = 2 * most * (4096 + 24);
        assert!(
            largest <= bound,
            "the WAL grew to {largest} bytes, more than {bound}, in {commits} commits"
        );
    }
}
