//! The read connections: a pool whose connections keep their SQLite read
//! transaction from one read to the next, until the writer commits.
//!
//! Beginning a read transaction costs SQLite system calls: in rollback
//! journal mode it takes the file's shared lock (fcntl, unless another
//! connection of the process holds it), looks for a hot journal (a stat of
//! the journal file, which PERSIST keeps, and of the database) and reads the
//! file's change counter to know whether its page cache still holds (a
//! pread): three stats and a read for each single-key Range, 16 % of the
//! server's CPU under a load of them (issue 51). A transaction kept open
//! sees what a new one would as long as nothing was committed since it
//! began: the writer connection is the only one that writes (the lock file
//! keeps other processes off), and each of its commits goes through
//! `Readers::committing`, which counts them. A connection whose transaction
//! began before the last commit ends it and begins another; one whose
//! transaction began after keeps it, and its reads make no system call.
//!
//! A reader also reads the changes committed since the last batch
//! (`journal`'s unapplied view), which it takes before its connection. A
//! batch commit is counted before the journal forgets the changes it
//! applied: a reader whose view no longer holds them sees the count moved
//! and begins a new transaction, and one that keeps a snapshot without them
//! (the count not moved yet) still has them in its view.
//!
//! Rollback journal mode needs more: a commit waits until no connection
//! holds the database. `committing` raises the flag that a commit waits
//! (which reads still going watch, see `queries::yield_to_commit`) and ends
//! the idle connections' transactions, and a connection handed back while
//! the flag is up ends its own. In WAL mode an idle connection's old
//! snapshot would keep SQLite from starting the WAL over: ended the same way.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

/// Read connections kept open for reuse; more are opened on demand.
const MAX_IDLE_READERS: usize = 16;

/// The pool of read connections of one database, and the count of the
/// writer's commits.
pub(super) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Reader>>,
    /// The writer's commits so far (see `committing`).
    commits: AtomicU64,
    /// Up while a commit waits, or is about to wait, for the readers to let
    /// go of the database.
    commit_waiting: Arc<AtomicBool>,
}

/// A read connection, in a read transaction while it serves a read.
pub(super) struct Reader {
    pub(super) conn: Connection,
    /// The count of commits when its transaction began: the transaction's
    /// snapshot holds all of them (it starts at the first read after).
    pub(super) began_after: u64,
}

impl Readers {
    /// An empty pool of connections to the database at `path`.
    pub(super) fn new(path: PathBuf) -> Readers {
        Readers {
            path,
            idle: Mutex::default(),
            commits: AtomicU64::new(0),
            commit_waiting: Arc::default(),
        }
    }

    /// A connection in a read transaction that sees every commit made
    /// before this call: the transaction it kept if nothing was committed
    /// since that began, else a new one.
    pub(super) fn take(&self) -> rusqlite::Result<Reader> {
        // Read first: a commit counted after this may or may not be seen,
        // as for any transaction that begins while a commit is made.
        let commits = self.commits.load(Ordering::Acquire);
        let idle = self.idle.lock().expect("reader pool poisoned").pop();
        let mut reader = match idle {
            Some(reader) => reader,
            None => Reader {
                conn: super::open_connection(&self.path, true)?,
                began_after: commits,
            },
        };
        if !reader.conn.is_autocommit() && reader.began_after != commits {
            end_transaction(&reader.conn)?;
        }
        if reader.conn.is_autocommit() {
            // Cached, as parsing BEGIN each time is a visible part of a
            // single-key read.
            reader.conn.prepare_cached("BEGIN")?.execute([])?;
            reader.began_after = commits;
        }
        Ok(reader)
    }

    /// Takes back a connection. It keeps its transaction, unless a commit
    /// has been made since that began or is waiting. A connection whose
    /// transaction cannot be ended is closed.
    pub(super) fn give_back(&self, reader: Reader) {
        // Under the pool's lock, which `committing` takes after raising the
        // flag: either this sees the flag, or `committing` sees the
        // connection in the pool.
        let mut idle = self.idle.lock().expect("reader pool poisoned");
        let stale = self.commit_waiting.load(Ordering::Acquire)
            || reader.began_after != self.commits.load(Ordering::Acquire);
        if stale && end_transaction(&reader.conn).is_err() {
            return;
        }
        if idle.len() < MAX_IDLE_READERS {
            idle.push(reader);
        }
    }

    /// Runs `commit`, a commit of the writer (or a change of the file's
    /// journal mode, which also needs the database to itself). Every one
    /// goes through here: the count it keeps is what tells a kept
    /// transaction whether it may serve another read.
    pub(super) fn committing<T>(&self, commit: impl FnOnce() -> T) -> T {
        self.commit_waiting.store(true, Ordering::Release);
        self.end_idle();
        let committed = commit();
        // After the commit, so that a transaction counted as beginning
        // after it holds it; counted whether or not it succeeded.
        self.commits.fetch_add(1, Ordering::AcqRel);
        self.commit_waiting.store(false, Ordering::Release);
        committed
    }

    /// The flag of a commit waiting for readers, for a read to watch.
    pub(super) fn commit_waiting(&self) -> Arc<AtomicBool> {
        self.commit_waiting.clone()
    }

    /// Ends the idle connections' transactions; closes one that fails to.
    fn end_idle(&self) {
        self.idle
            .lock()
            .expect("reader pool poisoned")
            .retain(|reader| end_transaction(&reader.conn).is_ok());
    }

    /// Closes the idle connections.
    pub(super) fn close_idle(&self) {
        self.idle.lock().expect("reader pool poisoned").clear();
    }

    /// How many idle connections are in a transaction (for tests).
    #[cfg(test)]
    pub(super) fn idle_in_transaction(&self) -> usize {
        let idle = self.idle.lock().expect("reader pool poisoned");
        idle.iter().filter(|r| !r.conn.is_autocommit()).count()
    }
}

/// Ends the read transaction on `conn`, if any.
fn end_transaction(conn: &Connection) -> rusqlite::Result<()> {
    if !conn.is_autocommit() {
        conn.prepare_cached("ROLLBACK")?.execute([])?;
    }
    Ok(())
}
