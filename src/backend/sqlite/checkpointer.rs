//! WAL checkpoints on a thread of their own.
//!
//! SQLite normally checkpoints inside the COMMIT that pushes the WAL past
//! 1000 pages, so one unlucky write batch pays for copying the whole WAL into
//! the database file and for two extra fsyncs. Here the writer connection only
//! notes how long the WAL has grown (a WAL hook, which also turns SQLite's own
//! automatic checkpoint off) and wakes this thread, which runs a PASSIVE
//! checkpoint on its own connection while the writer goes on committing.
//! Nothing is written while nothing is committed, so an idle store does no I/O.

use std::cell::Cell;
use std::path::Path;
use std::sync::mpsc::{self, SyncSender, TrySendError};

use rusqlite::Connection;

/// WAL length, in pages, that triggers a checkpoint: 32 MiB at 4 KiB pages,
/// eight times SQLite's default. A checkpoint copies the newest version of
/// each page once, however often it changed, and puts to random keys keep
/// changing the same few thousand pages: a longer WAL means fewer copies of
/// each (less CPU, fewer bytes written) for a WAL file of about this size
/// (readers find pages in it through a hash index).
pub const CHECKPOINT_PAGES: i32 = 8192;

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
    wake: SyncSender<()>,
}

impl Checkpointer {
    /// Starts the checkpoint thread for the database at `path`. Its
    /// connection is opened at the first checkpoint: a scratch file that is
    /// built without a WAL and then switched to another journal mode (a
    /// snapshot) must have no other connection open.
    pub fn start(path: &Path) -> anyhow::Result<Self> {
        let path = path.to_path_buf();
        // One pending wake-up is enough: a checkpoint copies everything committed before it.
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                let mut conn = None;
                while woken.recv().is_ok() {
                    if let Err(error) = checkpoint(&mut conn, &path) {
                        tracing::warn!("WAL checkpoint failed: {error}");
                    }
                }
            })?;
        Ok(Checkpointer { wake })
    }

    /// Asks for a checkpoint if the WAL has grown long enough.
    pub fn after_commit(&self, wal_pages: i32) {
        if wal_pages >= CHECKPOINT_PAGES {
            match self.wake.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    tracing::warn!("the WAL checkpoint thread has stopped")
                }
            }
        }
    }
}

/// One PASSIVE checkpoint: it never waits for readers or the writer; what a
/// reader still needs is copied by a later checkpoint.
fn checkpoint(conn: &mut Option<Connection>, path: &Path) -> rusqlite::Result<()> {
    let conn = match conn {
        Some(conn) => conn,
        None => conn.insert(super::open_connection(path, false)?),
    };
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}
