//! The replicated log of this member, in an SQLite file of its own beside the
//! store: entries, the vote and how far the log was purged. Every append is
//! fsynced before openraft hears it is done, so a member never acknowledges
//! an entry it could lose. The commit index is not kept: the store records
//! what it applied (see `state_machine`), and the leader tells the rest.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{LogId, StorageError, TypeConfig, any_error};
use crate::metrics::metrics;

type Entry = openraft::Entry<TypeConfig>;

/// The log, shared by openraft's writer and readers.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Mutex<Connection>>,
}

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS entry (
        idx  INTEGER PRIMARY KEY,
        data BLOB NOT NULL
    );
    CREATE TABLE IF NOT EXISTS state (
        name TEXT PRIMARY KEY,
        data BLOB NOT NULL
    );
";

/// Page size of a new log file, in bytes. Each append is one commit,
/// which writes the pages it changed whole to the WAL, and the checkpoint
/// writes them again: with pages of 1 KiB an append of a few entries
/// writes about what they hold, where one of 4 KiB (SQLite's default)
/// wrote a whole 4 KiB leaf. Measured on 3 members (BENCHMARKS.md, issue
/// 28, replicated mode): a quarter less written per put, throughput the
/// same.
const LOG_PAGE_SIZE: i64 = 1024;

/// Names of the `state` rows.
const VOTE: &str = "vote";
const PURGED: &str = "purged";

impl LogStore {
    /// Opens (creating if needed) the log at `path`.
    pub fn open(path: &Path) -> anyhow::Result<LogStore> {
        let conn = Connection::open(path)?;
        // Before WAL mode, so that a new file takes it (an existing one
        // keeps its own).
        conn.pragma_update(None, "page_size", LOG_PAGE_SIZE)?;
        // WAL with FULL sync: each commit is fsynced.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        Ok(LogStore {
            db: Arc::new(Mutex::new(conn)),
        })
    }

    /// Whether the log holds anything: a vote, an entry or a purge.
    pub fn is_empty(&self) -> anyhow::Result<bool> {
        let db = self.lock();
        let rows: i64 = db.query_row(
            "SELECT (SELECT COUNT(*) FROM entry) + (SELECT COUNT(*) FROM state)",
            [],
            |r| r.get(0),
        )?;
        Ok(rows == 0)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_state<T: DeserializeOwned>(&self, name: &str) -> anyhow::Result<Option<T>> {
        let db = self.lock();
        let data: Option<Vec<u8>> = db
            .prepare_cached("SELECT data FROM state WHERE name = ?1")?
            .query_row([name], |r| r.get(0))
            .optional()?;
        Ok(match data {
            Some(data) => Some(postcard::from_bytes(&data)?),
            None => None,
        })
    }

    fn write_state<T: Serialize>(&self, name: &str, value: &T) -> anyhow::Result<()> {
        let data = postcard::to_stdvec(value)?;
        let db = self.lock();
        db.prepare_cached("INSERT OR REPLACE INTO state (name, data) VALUES (?1, ?2)")?
            .execute(params![name, data])?;
        Ok(())
    }

    fn last_entry(&self) -> anyhow::Result<Option<Entry>> {
        let db = self.lock();
        let data: Option<Vec<u8>> = db
            .prepare_cached("SELECT data FROM entry ORDER BY idx DESC LIMIT 1")?
            .query_row([], |r| r.get(0))
            .optional()?;
        Ok(match data {
            Some(data) => Some(postcard::from_bytes(&data)?),
            None => None,
        })
    }

    fn entries(&self, start: u64, end: Option<u64>) -> anyhow::Result<Vec<Entry>> {
        let db = self.lock();
        let end = end.map_or(i64::MAX, |end| end.min(i64::MAX as u64) as i64);
        let mut statement =
            db.prepare_cached("SELECT data FROM entry WHERE idx >= ?1 AND idx < ?2 ORDER BY idx")?;
        let rows = statement.query_map(params![start as i64, end], |r| r.get::<_, Vec<u8>>(0))?;
        let mut entries = Vec::new();
        for data in rows {
            entries.push(postcard::from_bytes(&data?)?);
        }
        Ok(entries)
    }

    fn append_entries(&self, entries: impl IntoIterator<Item = Entry>) -> anyhow::Result<()> {
        let mut db = self.lock();
        let txn = db.transaction()?;
        {
            let mut insert =
                txn.prepare_cached("INSERT OR REPLACE INTO entry (idx, data) VALUES (?1, ?2)")?;
            for entry in entries {
                let data = postcard::to_stdvec(&entry)?;
                insert.execute(params![entry.log_id.index as i64, data])?;
            }
        }
        // The Raft log is this mode's WAL: its commit, the write and the
        // fsync, is what etcd's WAL fsync histogram shows.
        metrics()
            .wal_fsync_seconds
            .observe_closure_duration(|| txn.commit())?;
        Ok(())
    }

    fn remove_from(&self, index: u64) -> anyhow::Result<()> {
        self.lock()
            .execute("DELETE FROM entry WHERE idx >= ?1", [index as i64])?;
        Ok(())
    }

    fn purge_through(&self, log_id: &LogId) -> anyhow::Result<()> {
        self.write_state(PURGED, log_id)?;
        self.lock()
            .execute("DELETE FROM entry WHERE idx <= ?1", [log_id.index as i64])?;
        Ok(())
    }
}

fn first_index<RB: RangeBounds<u64>>(range: &RB) -> u64 {
    match range.start_bound() {
        Bound::Included(i) => *i,
        Bound::Excluded(i) => i + 1,
        Bound::Unbounded => 0,
    }
}

fn end_index<RB: RangeBounds<u64>>(range: &RB) -> Option<u64> {
    match range.end_bound() {
        Bound::Included(i) => Some(i + 1),
        Bound::Excluded(i) => Some(*i),
        Bound::Unbounded => None,
    }
}

fn read_error(error: anyhow::Error) -> StorageError {
    StorageIOError::read_logs(any_error(format!("{error:#}"))).into()
}

fn write_error(error: anyhow::Error) -> StorageError {
    StorageIOError::write_logs(any_error(format!("{error:#}"))).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.entries(first_index(&range), end_index(&range))
            .map_err(read_error)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_state(PURGED).map_err(read_error)?;
        let last = self.last_entry().map_err(read_error)?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.map(|e| e.log_id).or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        self.write_state(VOTE, vote)
            .map_err(|e| StorageIOError::write_vote(any_error(format!("{e:#}"))).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        self.read_state(VOTE)
            .map_err(|e| StorageIOError::read_vote(any_error(format!("{e:#}"))).into())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let result = self.append_entries(entries);
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(format!("{error:#}"))))
            }
        }
        result.map_err(write_error)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.remove_from(log_id.index).map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.purge_through(&log_id).map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new log file takes `LOG_PAGE_SIZE`; one created with SQLite's
    /// default keeps its 4 KiB, with its entries.
    #[test]
    fn a_new_log_gets_small_pages() {
        let dir = tempfile::tempdir().unwrap();
        let page_size = |path: &Path| -> i64 {
            let conn = Connection::open(path).unwrap();
            conn.query_row("PRAGMA page_size", [], |r| r.get(0))
                .unwrap()
        };
        let new = dir.path().join("new.raft-log");
        drop(LogStore::open(&new).unwrap());
        assert_eq!(page_size(&new), LOG_PAGE_SIZE);

        let old = dir.path().join("old.raft-log");
        {
            let conn = Connection::open(&old).unwrap();
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            conn.execute_batch(SCHEMA).unwrap();
            conn.execute("INSERT INTO entry (idx, data) VALUES (1, x'00')", [])
                .unwrap();
        }
        let log = LogStore::open(&old).unwrap();
        assert!(!log.is_empty().unwrap());
        drop(log);
        assert_eq!(page_size(&old), 4096);
    }
}
