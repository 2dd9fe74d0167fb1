//! The Raft log of cetera before the segment files: an SQLite file beside
//! the store (`<db>.raft-log`), with a row per entry (postcard) and the
//! vote and purge in a `state` table. A member that finds one and no
//! segment directory carries it over once: the vote, the purge and the
//! entries are written to a new directory, which takes its name only when
//! they are synced; the SQLite file is removed after.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::{Entry, LogId, Record, SEGMENT_BYTES, Vote};
use crate::frame_file::sync_directory;

/// Entries carried over per write.
const ENTRIES_PER_WRITE: usize = 1000;

/// Carries the SQLite log at `legacy` over into the directory `dir`, if
/// there is one and `dir` does not exist yet.
pub(super) fn carry_over(legacy: &Path, dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        // Carried over, but the power went before the old file was removed.
        remove(legacy);
        return Ok(());
    }
    if !legacy.exists() {
        return Ok(());
    }
    let staging = with_suffix(dir, ".new");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    let OldLog {
        vote,
        purged,
        entries,
    } = read(legacy).with_context(|| format!("cannot read the Raft log {}", legacy.display()))?;
    let mut log = super::Log::open(&staging, SEGMENT_BYTES)?;
    let mut state = Vec::new();
    if let Some(vote) = &vote {
        state.push(Record::Vote(vote));
    }
    if let Some(purged) = &purged {
        state.push(Record::Purged(purged));
    }
    log.write(&state)?;
    for chunk in entries.chunks(ENTRIES_PER_WRITE) {
        let records: Vec<Record> = chunk.iter().map(Record::Entry).collect();
        log.write(&records)?;
    }
    drop(log);
    std::fs::rename(&staging, dir)?;
    if let Some(parent) = dir.parent() {
        sync_directory(parent)?;
    }
    tracing::info!(
        "carried the Raft log {} ({} entries) over to {}",
        legacy.display(),
        entries.len(),
        dir.display()
    );
    remove(legacy);
    Ok(())
}

/// What an SQLite log holds.
struct OldLog {
    vote: Option<Vote<u64>>,
    purged: Option<LogId>,
    entries: Vec<Entry>,
}

fn read(legacy: &Path) -> anyhow::Result<OldLog> {
    // Read-write: a WAL left by a kill is replayed into the view.
    let db = Connection::open_with_flags(legacy, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    let state = |name: &str| -> anyhow::Result<Option<Vec<u8>>> {
        Ok(db
            .query_row("SELECT data FROM state WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .optional()?)
    };
    let vote = state("vote")?
        .map(|data| postcard::from_bytes(&data))
        .transpose()?;
    let purged = state("purged")?
        .map(|data| postcard::from_bytes(&data))
        .transpose()?;
    let mut statement = db.prepare("SELECT data FROM entry ORDER BY idx")?;
    let mut entries = Vec::new();
    for data in statement.query_map([], |r| r.get::<_, Vec<u8>>(0))? {
        entries.push(postcard::from_bytes(&data?)?);
    }
    Ok(OldLog {
        vote,
        purged,
        entries,
    })
}

/// Removes the SQLite file and its WAL and shared-memory files.
fn remove(legacy: &Path) {
    for path in [
        legacy.to_owned(),
        with_suffix(legacy, "-wal"),
        with_suffix(legacy, "-shm"),
    ] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!("cannot remove {}: {error}", path.display()),
        }
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::log_store::tests::{entries_of, entry};

    /// The schema of the SQLite log.
    const SCHEMA: &str = "
        CREATE TABLE entry (idx INTEGER PRIMARY KEY, data BLOB NOT NULL);
        CREATE TABLE state (name TEXT PRIMARY KEY, data BLOB NOT NULL);
    ";

    /// An SQLite log's vote, purge and entries come over; the SQLite file
    /// goes; a second open finds the directory and leaves it as it is.
    #[test]
    fn an_sqlite_log_is_carried_over() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join("state.db.raft-log");
        let vote = Vote::new(3, 2);
        let purged = openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), 4);
        {
            let db = Connection::open(&legacy).unwrap();
            db.pragma_update(None, "journal_mode", "WAL").unwrap();
            db.execute_batch(SCHEMA).unwrap();
            for (name, data) in [
                ("vote", postcard::to_stdvec(&vote).unwrap()),
                ("purged", postcard::to_stdvec(&purged).unwrap()),
            ] {
                db.execute(
                    "INSERT INTO state VALUES (?1, ?2)",
                    rusqlite::params![name, data],
                )
                .unwrap();
            }
            for index in 5..=9 {
                let data = postcard::to_stdvec(&entry(2, index)).unwrap();
                db.execute(
                    "INSERT INTO entry VALUES (?1, ?2)",
                    rusqlite::params![index as i64, data],
                )
                .unwrap();
            }
        }
        let wal = dir.path().join("state.db.raft-wal");
        let log = super::super::LogStore::open(&wal, &legacy).unwrap();
        assert!(!legacy.exists());
        {
            let log = log.lock();
            assert_eq!(log.vote, Some(vote));
            assert_eq!(log.purged, Some(purged));
            assert_eq!(
                entries_of(&log),
                (5..=9).map(|i| (2, i)).collect::<Vec<_>>()
            );
        }
        drop(log);
        let log = super::super::LogStore::open(&wal, &legacy).unwrap();
        assert_eq!(entries_of(&log.lock()).len(), 5);
    }
}
