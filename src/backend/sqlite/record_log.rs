//! The record log: the embedded store's redo log, in the shape of etcd's WAL.
//!
//! A commit whose changes are log rows, leases, settings and the counters
//! (a put, a delete, a Txn, a lease grant or revoke, stored keep-alive
//! deadlines, a Compact, a compaction step's removals) is made durable by
//! one frame here and one fdatasync, not by an SQLite commit: SQLite
//! logs whole pages, five or so of 2 KiB for one 1 KiB row, where this file
//! takes the row's own bytes. The rows reach SQLite in batches (see
//! `journal`), after which the log is cut: the file starts over in a new
//! generation. At open, the frames of the current generation that SQLite
//! does not hold yet are read back and applied.
//!
//! The file is a `FrameFile` (checksummed frames in a preallocated file,
//! reused from its start after every cut); a frame is one commit's changes.

use std::io;
use std::path::{Path, PathBuf};

use crate::backend::{LeaseRow, LogEntry, Revisions};
use crate::frame_file::FrameFile;
use crate::metrics::metrics;
use crate::proto::mvccpb::KeyValue;

/// The header's first bytes.
const MAGIC: &[u8; 8] = b"cetera-r";

/// Size the file is preallocated to. A batch is applied before its records
/// reach it (`journal::APPLY_BYTES`); a commit that would not fit takes the
/// direct path instead.
pub(super) const PREALLOCATED_BYTES: u64 = 64 << 20;

/// Bytes of a row's fixed fields: id, create_revision, version, lease
/// (i64 each), deleted (u8), key and value lengths (u32 each).
const ROW_FIXED_BYTES: usize = 8 * 4 + 1 + 4 + 4;

/// One change a commit recorded: the log row or lease or setting it wrote,
/// a log row compaction removed, or the store's counters.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Change {
    Row(LogEntry),
    Lease(LeaseRow),
    LeaseRemoved(i64),
    Setting(String, i64),
    /// The id of a log row compaction removed.
    RowRemoved(i64),
    /// The `meta` row: a Compact or a compaction step moved its counters.
    Revisions(Revisions),
}

impl Change {
    /// The bytes it takes in the log, about.
    pub(super) fn size(&self) -> usize {
        match self {
            Change::Row(row) => ROW_FIXED_BYTES + row.kv.key.len() + row.kv.value.len(),
            Change::Lease(_) => 24,
            Change::LeaseRemoved(_) => 8,
            Change::Setting(name, _) => 12 + name.len(),
            Change::RowRemoved(_) => 8,
            Change::Revisions(_) => 24,
        }
    }
}

/// The tags of `Change`'s kinds in a frame.
const ROW: u8 = 0;
const LEASE: u8 = 1;
const LEASE_REMOVED: u8 = 2;
const SETTING: u8 = 3;
const ROW_REMOVED: u8 = 4;
const REVISIONS: u8 = 5;

/// The open record log.
pub(super) struct RecordLog {
    file: FrameFile,
}

impl RecordLog {
    /// The record log of the database at `database`, in `<database>-records`.
    pub(super) fn path_of(database: &Path) -> PathBuf {
        let mut name = database.as_os_str().to_owned();
        name.push("-records");
        PathBuf::from(name)
    }

    /// Opens (creating and preallocating if needed) the record log of the
    /// database at `database`, and returns it with the rows of its current
    /// generation, in the order written.
    pub(super) fn open(database: &Path) -> anyhow::Result<(RecordLog, Vec<Change>)> {
        let path = Self::path_of(database);
        let created = match std::fs::metadata(&path) {
            Ok(metadata) if metadata.len() >= crate::frame_file::HEADER_BYTES => false,
            Ok(_) => {
                // Created, but the power went before it was preallocated.
                std::fs::remove_file(&path)?;
                true
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => true,
            Err(error) => return Err(error.into()),
        };
        if created {
            let file = FrameFile::create(&path, MAGIC, PREALLOCATED_BYTES, 1)
                .map_err(|error| error.context("cannot create the record log"))?;
            if let Some(dir) = database.parent() {
                crate::frame_file::sync_directory(dir)?;
            }
            return Ok((RecordLog { file }, Vec::new()));
        }
        let (file, payloads) = FrameFile::open(&path, MAGIC)
            .map_err(|error| error.context("cannot open the record log"))?;
        let mut changes = Vec::new();
        for frame in payloads {
            decode(&frame.payload, &mut changes).map_err(|error| {
                error.context(format!(
                    "the record log {} has a damaged frame",
                    path.display()
                ))
            })?;
        }
        Ok((RecordLog { file }, changes))
    }

    /// The current generation: only its frames are read back.
    pub(super) fn generation(&self) -> u64 {
        self.file.generation()
    }

    /// True if a frame was written since the last cut.
    pub(super) fn has_frames(&self) -> bool {
        self.file.has_frames()
    }

    /// Appends `changes` as one frame and syncs it. False, with nothing
    /// written, if the frame does not fit in the file.
    pub(super) fn append(&mut self, changes: &[Change]) -> io::Result<bool> {
        let mut frame = FrameFile::frame_buffer();
        encode(changes, &mut frame);
        if self.file.append(&mut frame)?.is_none() {
            return Ok(false);
        }
        metrics()
            .wal_fsync_seconds
            .observe_closure_duration(|| self.file.sync())?;
        Ok(true)
    }

    /// Removes the file (the log must be empty: everything applied).
    pub(super) fn remove(&self) {
        if let Err(error) = std::fs::remove_file(self.file.path()) {
            tracing::warn!(
                "cannot remove the record log {}: {error}",
                self.file.path().display()
            );
        }
    }

    /// Starts the log over, once SQLite holds (durably) every row in it: a
    /// new generation, so that the old frames are not read back. Nothing to
    /// do if no frame was written since the last cut.
    pub(super) fn cut(&mut self) -> io::Result<()> {
        if !self.file.has_frames() && self.file.generation() != 0 {
            return Ok(());
        }
        self.file.start_over(self.file.generation() + 1)
    }
}

fn encode(changes: &[Change], out: &mut Vec<u8>) {
    fn bytes(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&(changes.len() as u32).to_le_bytes());
    for change in changes {
        match change {
            Change::Row(row) => {
                let kv = &row.kv;
                out.push(ROW);
                let id = super::key_index::row_id(kv.mod_revision, row.sub);
                for int in [id, kv.create_revision, kv.version, kv.lease] {
                    out.extend_from_slice(&int.to_le_bytes());
                }
                out.push(u8::from(row.deleted));
                bytes(out, &kv.key);
                bytes(out, &kv.value);
            }
            Change::Lease(lease) => {
                out.push(LEASE);
                for int in [lease.id, lease.ttl, lease.expires_at] {
                    out.extend_from_slice(&int.to_le_bytes());
                }
            }
            Change::LeaseRemoved(id) => {
                out.push(LEASE_REMOVED);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Change::Setting(name, value) => {
                out.push(SETTING);
                bytes(out, name.as_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            Change::RowRemoved(id) => {
                out.push(ROW_REMOVED);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Change::Revisions(revisions) => {
                out.push(REVISIONS);
                for int in [
                    revisions.current,
                    revisions.compact,
                    revisions.compacted_through,
                ] {
                    out.extend_from_slice(&int.to_le_bytes());
                }
            }
        }
    }
}

fn decode(mut payload: &[u8], changes: &mut Vec<Change>) -> anyhow::Result<()> {
    fn take<'a>(payload: &mut &'a [u8], n: usize) -> anyhow::Result<&'a [u8]> {
        anyhow::ensure!(payload.len() >= n, "a change runs past its frame");
        let (taken, rest) = payload.split_at(n);
        *payload = rest;
        Ok(taken)
    }
    fn int(payload: &mut &[u8]) -> anyhow::Result<i64> {
        Ok(i64::from_le_bytes(take(payload, 8)?.try_into()?))
    }
    fn bytes(payload: &mut &[u8]) -> anyhow::Result<Vec<u8>> {
        let length = u32::from_le_bytes(take(payload, 4)?.try_into()?) as usize;
        Ok(take(payload, length)?.to_vec())
    }
    let count = u32::from_le_bytes(take(&mut payload, 4)?.try_into()?) as usize;
    changes.reserve(count.min(payload.len() / 9));
    for _ in 0..count {
        let change = match take(&mut payload, 1)?[0] {
            ROW => {
                let id = int(&mut payload)?;
                let create_revision = int(&mut payload)?;
                let version = int(&mut payload)?;
                let lease = int(&mut payload)?;
                let deleted = take(&mut payload, 1)?[0] != 0;
                let key = bytes(&mut payload)?;
                let value = bytes(&mut payload)?;
                Change::Row(LogEntry {
                    kv: KeyValue {
                        key,
                        value,
                        create_revision,
                        mod_revision: super::key_index::revision_of(id),
                        version,
                        lease,
                    },
                    sub: id & (super::key_index::MAX_CHANGES_PER_REVISION - 1),
                    deleted,
                })
            }
            LEASE => Change::Lease(LeaseRow {
                id: int(&mut payload)?,
                ttl: int(&mut payload)?,
                expires_at: int(&mut payload)?,
            }),
            LEASE_REMOVED => Change::LeaseRemoved(int(&mut payload)?),
            SETTING => {
                let name = String::from_utf8(bytes(&mut payload)?)?;
                Change::Setting(name, int(&mut payload)?)
            }
            ROW_REMOVED => Change::RowRemoved(int(&mut payload)?),
            REVISIONS => Change::Revisions(Revisions {
                current: int(&mut payload)?,
                compact: int(&mut payload)?,
                compacted_through: int(&mut payload)?,
            }),
            tag => anyhow::bail!("unknown change {tag}"),
        };
        changes.push(change);
    }
    anyhow::ensure!(payload.is_empty(), "bytes after a frame's last change");
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::frame_file::{FRAME_HEADER_BYTES, HEADER_BYTES};

    /// A put of `key` at `revision` (change `sub` of it), as a change.
    pub(crate) fn row(revision: i64, sub: i64, key: &str, value: &str) -> Change {
        Change::Row(LogEntry {
            kv: KeyValue {
                key: key.into(),
                value: value.into(),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
                lease: 7,
            },
            sub,
            deleted: false,
        })
    }

    /// Frames read back in order until the cut; after it, none until new
    /// ones are written, though the old bytes are still in the file.
    #[test]
    fn frames_come_back_until_the_log_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let (mut log, rows) = RecordLog::open(&db).unwrap();
        assert!(rows.is_empty());
        let first = vec![
            row(2, 0, "a", "one"),
            row(2, 1, "b", "two"),
            Change::Lease(LeaseRow {
                id: 7,
                ttl: 60,
                expires_at: 1_000_000,
            }),
            Change::LeaseRemoved(8),
            Change::Setting("a_setting".into(), 3),
            Change::RowRemoved(5 << 20),
            Change::Revisions(Revisions {
                current: 9,
                compact: 4,
                compacted_through: 3,
            }),
        ];
        let second = vec![row(3, 0, "a", "three")];
        assert!(log.append(&first).unwrap());
        assert!(log.append(&second).unwrap());
        drop(log);

        let (mut log, rows) = RecordLog::open(&db).unwrap();
        assert_eq!(rows, [first.clone(), second].concat());
        log.cut().unwrap();
        drop(log);

        let (mut log, rows) = RecordLog::open(&db).unwrap();
        assert!(rows.is_empty());
        let third = vec![row(4, 0, "c", "four")];
        assert!(log.append(&third).unwrap());
        drop(log);
        assert_eq!(RecordLog::open(&db).unwrap().1, third);
    }

    /// Small frames that do not fit in what is left of a block start at the
    /// next one, over stale bytes of an older generation, and still come
    /// back in order; a large one spans blocks.
    #[test]
    fn frames_skip_to_the_next_block_and_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let (mut log, _) = RecordLog::open(&db).unwrap();
        let rows: Vec<Change> = (0..12)
            .map(|i| {
                row(
                    i + 2,
                    0,
                    "key",
                    &"v".repeat(if i == 7 { 9000 } else { 1500 }),
                )
            })
            .collect();
        for row in &rows {
            assert!(log.append(std::slice::from_ref(row)).unwrap());
        }
        log.cut().unwrap();
        let newer: Vec<Change> = (0..12)
            .map(|i| row(i + 20, 0, "key", &"w".repeat(1100 + 300 * (i as usize % 3))))
            .collect();
        for row in &newer {
            assert!(log.append(std::slice::from_ref(row)).unwrap());
        }
        drop(log);
        assert_eq!(RecordLog::open(&db).unwrap().1, newer);
    }

    /// A frame whose bytes were not all written (the power went between
    /// write and sync) ends the log; the frames before it come back.
    #[test]
    fn a_torn_frame_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let (mut log, _) = RecordLog::open(&db).unwrap();
        let first = vec![row(2, 0, "a", "one")];
        assert!(log.append(&first).unwrap());
        let torn_at = log.file.end();
        assert!(log.append(&[row(3, 0, "b", "two")]).unwrap());
        drop(log);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(RecordLog::path_of(&db))
            .unwrap();
        file.write_all_at(b"X", torn_at + FRAME_HEADER_BYTES as u64 + 10)
            .unwrap();
        assert_eq!(RecordLog::open(&db).unwrap().1, first);
    }

    /// A commit larger than the file is refused, not written in part.
    #[test]
    fn a_frame_larger_than_the_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let (mut log, _) = RecordLog::open(&db).unwrap();
        let huge = "x".repeat(PREALLOCATED_BYTES as usize);
        assert!(!log.append(&[row(2, 0, "a", &huge)]).unwrap());
        assert_eq!(log.file.end(), HEADER_BYTES);
    }
}
