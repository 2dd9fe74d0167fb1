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
//! Layout: a header block (magic, generation, checksum), then frames from
//! `HEADER_BYTES` on, each `length | generation | crc32c | payload`, the
//! checksum covering generation and payload. A frame that fits in a block
//! but not in what is left of the current one starts at the next block, so
//! that a small commit's sync writes one block, not two; a reader that finds
//! no frame where the last ended looks at the next block. A frame of an
//! older generation, a torn one or the zeros after the last mark the end. The file is
//! preallocated (fallocate, as etcd does) and reused from its start after
//! every cut, so an fdatasync hardly ever has file metadata to journal.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::backend::{LeaseRow, LogEntry, Revisions};
use crate::metrics::metrics;
use crate::proto::mvccpb::KeyValue;

/// The page cache's page, and the file system's block: what an fdatasync
/// writes for a frame is every block the frame touches.
const BLOCK_BYTES: u64 = 4096;

/// Bytes before the first frame: one block, so that the header's rewrite at
/// a cut never shares a block with a frame.
const HEADER_BYTES: u64 = BLOCK_BYTES;

/// The header's first bytes.
const MAGIC: &[u8; 8] = b"cetera-r";

/// Bytes of a frame's header: length (u32), generation (u64), crc32c (u32).
const FRAME_HEADER_BYTES: usize = 16;

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
    file: File,
    path: PathBuf,
    /// The current generation: only its frames are read back.
    pub(super) generation: u64,
    /// Where the next frame goes.
    end: u64,
    /// The file's length: a frame must end within it.
    capacity: u64,
    /// Frames written since the last cut.
    frames: u64,
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
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open the record log {}", path.display()))?;
        let mut log = RecordLog {
            file,
            path,
            generation: 0,
            end: HEADER_BYTES,
            capacity: 0,
            frames: 0,
        };
        if !existed || log.file.metadata()?.len() < HEADER_BYTES {
            if let Err(error) = log.create(database) {
                // Tried again at the next start.
                let _ = std::fs::remove_file(&log.path);
                return Err(error);
            }
            return Ok((log, Vec::new()));
        }
        log.capacity = log.file.metadata()?.len();
        log.generation = log.read_header()?;
        let rows = log.read_frames()?;
        // Readahead filled the page cache with large folios, which later
        // small frames would dirty whole (see `append`): drop them.
        drop_cached(&log.file);
        Ok((log, rows))
    }

    /// Preallocates a new file and writes its first header, durably: the
    /// directory entry too.
    fn create(&mut self, database: &Path) -> anyhow::Result<()> {
        preallocate(&self.file, PREALLOCATED_BYTES)
            .with_context(|| format!("cannot preallocate {}", self.path.display()))?;
        self.capacity = self.file.metadata()?.len();
        self.generation = 1;
        self.write_header()?;
        if let Some(dir) = database.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    fn read_header(&self) -> anyhow::Result<u64> {
        let mut header = [0u8; 20];
        self.file.read_exact_at(&mut header, 0)?;
        if header.iter().all(|b| *b == 0) {
            // Created, but the power went before its header was synced.
            return Ok(0);
        }
        let generation = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes"));
        if &header[..8] != MAGIC || crc32c::crc32c(&header[..16]) != crc {
            anyhow::bail!(
                "{} is not a cetera record log, or its header is damaged",
                self.path.display()
            );
        }
        Ok(generation)
    }

    fn write_header(&mut self) -> io::Result<()> {
        let mut header = Vec::with_capacity(20);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&self.generation.to_le_bytes());
        header.extend_from_slice(&crc32c::crc32c(&header).to_le_bytes());
        self.file.write_all_at(&header, 0)?;
        self.file.sync_data()
    }

    /// Reads the current generation's frames from the start, up to the first
    /// that is not one of them (or is torn), and leaves `end` after them.
    fn read_frames(&mut self) -> anyhow::Result<Vec<Change>> {
        let mut rows = Vec::new();
        let mut offset = HEADER_BYTES;
        let mut header = [0u8; FRAME_HEADER_BYTES];
        loop {
            // Where the last frame ended, or at the next block (see above).
            let next_block = offset.next_multiple_of(BLOCK_BYTES);
            let payload = match self.read_frame(offset, &mut header)? {
                Some(payload) => payload,
                None if next_block == offset => break,
                None => match self.read_frame(next_block, &mut header)? {
                    Some(payload) => {
                        offset = next_block;
                        payload
                    }
                    None => break,
                },
            };
            let next = offset + (FRAME_HEADER_BYTES + payload.len()) as u64;
            decode(&payload, &mut rows).with_context(|| {
                format!(
                    "the record log {} has a damaged frame at {offset}",
                    self.path.display()
                )
            })?;
            offset = next;
            self.frames += 1;
        }
        self.end = offset;
        Ok(rows)
    }

    /// The payload of the current generation's frame at `offset`, if one is
    /// there whole.
    fn read_frame(
        &self,
        offset: u64,
        header: &mut [u8; FRAME_HEADER_BYTES],
    ) -> io::Result<Option<Vec<u8>>> {
        if offset + FRAME_HEADER_BYTES as u64 > self.capacity {
            return Ok(None);
        }
        self.file.read_exact_at(header, offset)?;
        let length = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as u64;
        let generation = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
        let end = offset + FRAME_HEADER_BYTES as u64 + length;
        if length == 0 || generation != self.generation || end > self.capacity {
            return Ok(None);
        }
        let mut payload = vec![0u8; length as usize];
        self.file
            .read_exact_at(&mut payload, offset + FRAME_HEADER_BYTES as u64)?;
        if crc32c::crc32c_append(crc32c::crc32c(&header[4..12]), &payload) != crc {
            return Ok(None); // torn: written, but not synced whole
        }
        Ok(Some(payload))
    }

    /// True if a frame was written since the last cut.
    pub(super) fn has_frames(&self) -> bool {
        self.frames > 0
    }

    /// Appends `changes` as one frame and syncs it. False, with nothing
    /// written, if the frame does not fit in the file.
    pub(super) fn append(&mut self, changes: &[Change]) -> io::Result<bool> {
        let mut frame = vec![0u8; FRAME_HEADER_BYTES];
        encode(changes, &mut frame);
        let length = (frame.len() - FRAME_HEADER_BYTES) as u64;
        let mut at = self.end;
        let left_in_block = BLOCK_BYTES - at % BLOCK_BYTES;
        if frame.len() as u64 <= BLOCK_BYTES && frame.len() as u64 > left_in_block {
            at += left_in_block;
        }
        if at + frame.len() as u64 > self.capacity || length > u64::from(u32::MAX) {
            return Ok(false);
        }
        frame[0..4].copy_from_slice(&(length as u32).to_le_bytes());
        frame[4..12].copy_from_slice(&self.generation.to_le_bytes());
        let crc =
            crc32c::crc32c_append(crc32c::crc32c(&frame[4..12]), &frame[FRAME_HEADER_BYTES..]);
        frame[12..16].copy_from_slice(&crc.to_le_bytes());
        // A block at a time: the page cache sizes a folio by the write that
        // creates it, and a frame written whole in one call of 64 KiB left a
        // 64 KiB folio that every later small frame in it dirtied whole
        // (64 KiB written per commit, measured with write_bytes).
        let mut written = 0;
        while written < frame.len() {
            let offset = at + written as u64;
            let piece = (BLOCK_BYTES - offset % BLOCK_BYTES).min((frame.len() - written) as u64);
            self.file
                .write_all_at(&frame[written..written + piece as usize], offset)?;
            written += piece as usize;
        }
        metrics()
            .wal_fsync_seconds
            .observe_closure_duration(|| self.file.sync_data())?;
        self.end = at + frame.len() as u64;
        self.frames += 1;
        Ok(true)
    }

    /// Removes the file (the log must be empty: everything applied).
    pub(super) fn remove(&self) {
        if let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(
                "cannot remove the record log {}: {error}",
                self.path.display()
            );
        }
    }

    /// Starts the log over, once SQLite holds (durably) every row in it: a
    /// new generation, so that the old frames are not read back. Nothing to
    /// do if no frame was written since the last cut.
    pub(super) fn cut(&mut self) -> io::Result<()> {
        if self.frames == 0 && self.generation != 0 {
            return Ok(());
        }
        self.generation += 1;
        self.write_header()?;
        self.end = HEADER_BYTES;
        self.frames = 0;
        Ok(())
    }
}

/// Drops the file's (clean) pages from the page cache.
fn drop_cached(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fadvise on a descriptor we own, with no pointers passed.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// Reserves `bytes` for the file. Where the file system cannot (a FUSE
/// layer without fallocate), the file just grows as frames are written.
fn preallocate(file: &File, bytes: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a descriptor we own, with no pointers passed.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if result == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(bytes),
        _ => Err(error),
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
    use super::*;

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
        let torn_at = log.end;
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
        assert_eq!(log.end, HEADER_BYTES);
    }
}
