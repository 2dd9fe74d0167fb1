//! The journal: how a single server on SQLite makes a write durable with one
//! small sequential append instead of syncing the database.
//!
//! The writer appends each batch's requests (`Command`s, with the time each
//! was made) as one record and fdatasyncs it while it applies the batch;
//! the database commit that follows needs no sync of its own. The database
//! stores the sequence number of the last record it holds in the same
//! commit, so after a power loss the server applies again exactly the records
//! the database lost (see `Store::open_with`). That is etcd's own design: a
//! write-ahead log synced per request, the key-ordered pages written later.
//!
//! Records go to two segment files in turn. When the active one has grown
//! past `SEGMENT_BYTES`, the journal moves to the other one (from its start)
//! and the database is synced in the background; a segment is written again
//! only after the sync that covers all its records has finished.
//!
//! A record on disk: payload length (u32), CRC-32 of the rest (u32), epoch
//! (u64), sequence number (u64), payload; integers little-endian. The epoch
//! is chosen anew at every start, so that records of an earlier run never
//! apply to a database that did not come from that run (a restored one).
//! Reading a segment stops at the first record that is torn, damaged, of
//! another epoch or not the next number.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Size past which the journal moves to its other segment.
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// A segment grows in steps of this many bytes written as zeros, so that
/// syncing an append flushes its data alone, not also the file's size.
const GROWTH_BYTES: u64 = 1 << 20;
/// The zeros go in writes of one memory page each: the page cache then
/// keeps the file in single pages, and an append dirties (and a sync
/// writes) one page, not a large folio of the size of one big write.
const ZEROS_WRITE_BYTES: usize = 4096;
const HEADER_BYTES: usize = 4 + 4 + 8 + 8;

/// One record: a batch of write requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The run of the server that wrote it.
    pub epoch: u64,
    /// Its number in that run, from 1.
    pub seq: u64,
    /// The encoded requests.
    pub payload: Vec<u8>,
}

/// The journal's two segment files, written one at a time.
pub struct Journal {
    segments: [Segment; 2],
    active: usize,
    epoch: u64,
    /// Number of the last record appended.
    seq: u64,
    /// Whether every record of the inactive segment is durable in the
    /// database, so that it may be written over.
    inactive_free: bool,
    segment_bytes: u64,
    /// Set by a failed append: nothing is appended after it, since what
    /// reached the disk is no longer known.
    failed: Option<String>,
    /// The segment and offset of the last record reserved, for `withdraw`.
    last: Option<(usize, u64)>,
}

struct Segment {
    file: Arc<File>,
    /// Where the next record goes.
    end: u64,
    /// Bytes of the file already written (records or zeros).
    allocated: u64,
}

/// A record reserved in the journal, to be written and synced on another
/// thread while the batch it holds is applied.
pub struct Append {
    file: Arc<File>,
    offset: u64,
    /// Zeros first written from `allocated` when the record passes it.
    zeros: Option<(u64, usize)>,
    bytes: Vec<u8>,
}

impl Append {
    /// Writes the record and fdatasyncs it: from then on it is durable.
    pub fn write(self) -> io::Result<()> {
        if let Some((from, len)) = self.zeros {
            let zeros = [0; ZEROS_WRITE_BYTES];
            for offset in (0..len).step_by(ZEROS_WRITE_BYTES) {
                let chunk = &zeros[..ZEROS_WRITE_BYTES.min(len - offset)];
                self.file.write_all_at(chunk, from + offset as u64)?;
            }
        }
        self.file.write_all_at(&self.bytes, self.offset)?;
        self.file.sync_data()
    }
}

/// The journal files kept beside `base`.
pub fn segment_paths(base: &Path) -> [PathBuf; 2] {
    [0, 1].map(|i| {
        let mut path = base.as_os_str().to_owned();
        path.push(format!(".{i}"));
        PathBuf::from(path)
    })
}

/// Every record found in the segments at `base`, each segment read up to its
/// first record that is torn, damaged, of another epoch or out of sequence.
pub fn read(base: &Path) -> io::Result<Vec<Record>> {
    let mut records = Vec::new();
    for path in segment_paths(base) {
        match std::fs::read(&path) {
            Ok(bytes) => records.extend(parse_segment(&bytes)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(records)
}

fn parse_segment(bytes: &[u8]) -> Vec<Record> {
    let mut records: Vec<Record> = Vec::new();
    let mut rest = bytes;
    while rest.len() >= HEADER_BYTES {
        let len = u32::from_le_bytes(rest[0..4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().unwrap());
        let Some(body) = rest.get(8..HEADER_BYTES + len) else {
            break;
        };
        if crc32fast::hash(body) != crc {
            break;
        }
        let epoch = u64::from_le_bytes(body[0..8].try_into().unwrap());
        let seq = u64::from_le_bytes(body[8..16].try_into().unwrap());
        if let Some(last) = records.last()
            && (epoch != last.epoch || seq != last.seq + 1)
        {
            break;
        }
        records.push(Record {
            epoch,
            seq,
            payload: body[16..].to_vec(),
        });
        rest = &rest[HEADER_BYTES + len..];
    }
    records
}

impl Journal {
    /// Opens the segments at `base` (creating them) for a new run, `epoch`,
    /// whose first record is number 1. Every record already there must be
    /// durable in the database: the segments start empty.
    pub fn start(base: &Path, epoch: u64) -> io::Result<Journal> {
        Self::start_with(base, epoch, SEGMENT_BYTES)
    }

    /// As `start`, with segments of `segment_bytes` (small in tests).
    pub fn start_with(base: &Path, epoch: u64, segment_bytes: u64) -> io::Result<Journal> {
        let open = |path: &PathBuf| -> io::Result<Segment> {
            // Truncated, which also drops what reading them cached (see
            // ZEROS_WRITE_BYTES); if that is lost, the old records are of
            // another epoch.
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)?;
            Ok(Segment {
                file: Arc::new(file),
                end: 0,
                allocated: 0,
            })
        };
        let [first, second] = segment_paths(base);
        Ok(Journal {
            segments: [open(&first)?, open(&second)?],
            active: 0,
            epoch,
            seq: 0,
            inactive_free: true,
            segment_bytes,
            failed: None,
            last: None,
        })
    }

    /// The run this journal writes for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Reserves the next record for `payload`: its number, and the write to
    /// run before the batch may commit. After an append failed, refuses.
    pub fn append(&mut self, payload: &[u8]) -> anyhow::Result<(u64, Append)> {
        if let Some(failed) = &self.failed {
            anyhow::bail!("the journal failed earlier ({failed}); restart the server");
        }
        let seq = self.seq + 1;
        let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&self.epoch.to_le_bytes());
        bytes.extend_from_slice(&seq.to_le_bytes());
        bytes.extend_from_slice(payload);
        let crc = crc32fast::hash(&bytes[8..]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());

        let segment = &mut self.segments[self.active];
        let offset = segment.end;
        segment.end += bytes.len() as u64;
        let zeros = (segment.end > segment.allocated).then(|| {
            let from = segment.allocated;
            segment.allocated = segment.end.div_ceil(GROWTH_BYTES) * GROWTH_BYTES;
            (from, (segment.allocated - from) as usize)
        });
        self.seq = seq;
        self.last = Some((self.active, offset));
        let append = Append {
            file: segment.file.clone(),
            offset,
            zeros,
            bytes,
        };
        Ok((seq, append))
    }

    /// Takes back the last record reserved, whose batch did not commit: the
    /// next record gets its number and place. Until then, a restart would
    /// apply it, as it may any write whose client saw an error.
    pub fn withdraw(&mut self) {
        if let Some((segment, offset)) = self.last.take() {
            self.segments[segment].end = offset;
            self.seq -= 1;
        }
    }

    /// Records that an append failed: the journal takes no more.
    pub fn fail(&mut self, error: &anyhow::Error) {
        self.failed = Some(format!("{error:#}"));
    }

    /// Whether the active segment is full, so that the journal should move
    /// on once the other segment is free.
    pub fn full(&self) -> bool {
        self.segments[self.active].end >= self.segment_bytes
    }

    /// Moves to the other segment, if it is free; its old records are
    /// written over from its start. The caller then syncs the database, so
    /// that the segment left becomes free (`inactive_durable`).
    pub fn switch(&mut self) -> bool {
        if !self.inactive_free {
            return false;
        }
        self.active = 1 - self.active;
        self.segments[self.active].end = 0;
        self.last = None;
        self.inactive_free = false;
        true
    }

    /// Says that the database holds every record of the inactive segment
    /// durably: a sync that began after the last of them was committed has
    /// finished.
    pub fn inactive_durable(&mut self) {
        self.inactive_free = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(journal: &mut Journal, payload: &[u8]) -> u64 {
        let (seq, write) = journal.append(payload).unwrap();
        write.write().unwrap();
        seq
    }

    #[test]
    fn records_read_back_in_order_from_both_segments() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("db.journal");
        let mut journal = Journal::start_with(&base, 7, 100).unwrap();
        for i in 0..10u8 {
            append(&mut journal, &[i; 30]);
            if journal.full() {
                assert!(journal.switch());
                journal.inactive_durable();
            }
        }
        let mut records = read(&base).unwrap();
        records.sort_by_key(|r| r.seq);
        // Segments of 100 bytes hold two 54-byte records; the last switch
        // left records 9 and 10 in one segment and 7 and 8 in the other.
        let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [7, 8, 9, 10]);
        assert!(records.iter().all(|r| r.epoch == 7));
        assert_eq!(records[3].payload, vec![9u8; 30]);
    }

    #[test]
    fn reading_stops_at_a_torn_record_and_at_an_older_run() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("db.journal");
        let mut journal = Journal::start(&base, 2).unwrap();
        append(&mut journal, b"first");
        append(&mut journal, b"second");
        // Whole records of an older run right after them (as a truncation
        // lost in a power failure could leave them) are not part of the run.
        let older_base = dir.path().join("older.journal");
        let mut older = Journal::start(&older_base, 1).unwrap();
        let (_, write) = older.append(b"an older run's record").unwrap();
        let end = journal.segments[0].end;
        journal.segments[0]
            .file
            .write_all_at(&write.bytes, end)
            .unwrap();
        let records = read(&base).unwrap();
        assert_eq!(
            records.iter().map(|r| (r.epoch, r.seq)).collect::<Vec<_>>(),
            [(2, 1), (2, 2)]
        );

        // A torn third record: its last bytes never reached the disk.
        let (_, write) = journal.append(b"third, torn").unwrap();
        let mut bytes = write.bytes.clone();
        bytes.truncate(bytes.len() - 3);
        write.file.write_all_at(&bytes, write.offset).unwrap();
        assert_eq!(read(&base).unwrap().len(), 2);

        // A damaged byte inside the second record ends the chain before it.
        let path = &segment_paths(&base)[0];
        let mut file = std::fs::read(path).unwrap();
        file[HEADER_BYTES + 5 + HEADER_BYTES + 2] ^= 0xff;
        std::fs::write(path, file).unwrap();
        assert_eq!(read(&base).unwrap().len(), 1);
    }

    #[test]
    fn a_full_segment_waits_until_the_other_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("db.journal");
        let mut journal = Journal::start_with(&base, 3, 10).unwrap();
        append(&mut journal, b"fills segment 0");
        assert!(journal.full());
        assert!(journal.switch());
        append(&mut journal, b"fills segment 1");
        // Segment 0 is not known to be durable yet: the journal stays.
        assert!(!journal.switch());
        append(&mut journal, b"grows segment 1");
        journal.inactive_durable();
        assert!(journal.switch());
        append(&mut journal, b"over segment 0");
        let mut seqs: Vec<u64> = read(&base).unwrap().iter().map(|r| r.seq).collect();
        seqs.sort();
        assert_eq!(seqs, [2, 3, 4]);
    }

    #[test]
    fn a_failed_append_stops_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::start(&dir.path().join("j"), 1).unwrap();
        journal.fail(&anyhow::anyhow!("disk gone"));
        let refused = journal.append(b"x").err().unwrap().to_string();
        assert!(refused.contains("disk gone"), "{refused}");
    }
}
