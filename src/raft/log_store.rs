//! The replicated log of this member, in the shape of etcd's WAL: a
//! directory of segment files (`FrameFile`s), where each write (an append's
//! entries, a vote, a truncation, a purge) is one or a few frames of
//! records, made durable by one fdatasync before openraft hears it is done,
//! so a member never acknowledges an entry it could lose. An entry is
//! written once, as its own bytes: an SQLite log wrote each append's pages
//! whole to its WAL and again at the checkpoint.
//!
//! Segments are named by a slot number (`00000003.wal`) and preallocated to
//! `SEGMENT_BYTES`. Frames go to the current segment; when it is full, a
//! segment whose entries are all purged starts over in a new generation
//! (reused, not removed and created, so that its syncs have no file
//! metadata to journal), or a new one is created; the other free segments
//! but one are removed, so after a burst the log is two files again. Every segment starts
//! with a frame of the vote and the purge, so no older segment is needed
//! for them. At open, the segments' frames are replayed in generation
//! order; memory keeps where each entry is, and reads come from the files.
//!
//! The commit index is not kept: the store records what it applied (see
//! `state_machine`), and the leader tells the rest. A log of an older
//! cetera, an SQLite file, is carried over at the first open (`legacy`).

mod legacy;

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};

use super::openraft_types::{LogId, StorageError, TypeConfig, any_error};
use crate::frame_file::{BLOCK_BYTES, FRAME_HEADER_BYTES, FrameFile, HEADER_BYTES, sync_directory};
use crate::metrics::metrics;

type Entry = openraft::Entry<TypeConfig>;

/// The first bytes of a segment's header.
const MAGIC: &[u8; 8] = b"cetera-l";

/// Size a segment is preallocated to, as etcd's WAL files. A segment holds
/// what was appended since the one before it filled; openraft purges the
/// log after each snapshot (every 10,000 entries), so two segments are
/// usually enough.
const SEGMENT_BYTES: u64 = 64 << 20;

/// Records are packed into frames of about this size at most: a large
/// append is several frames, each of which fits in a segment.
const FRAME_BYTES: usize = 1 << 20;

/// The tags of a frame's records; each is `tag | length (u32) | bytes`.
const ENTRY: u8 = 0;
const VOTE: u8 = 1;
const PURGED: u8 = 2;
const TRUNCATED: u8 = 3;

/// Bytes of a record's tag and length.
const RECORD_HEADER_BYTES: usize = 5;

/// The log, shared by openraft's writer and readers.
#[derive(Clone)]
pub struct LogStore {
    log: Arc<Mutex<Log>>,
}

impl LogStore {
    /// Opens (creating if needed) the log in the directory `dir`, first
    /// carrying over the SQLite log of an older cetera at `legacy`, if any.
    pub fn open(dir: &Path, legacy: &Path) -> anyhow::Result<LogStore> {
        legacy::carry_over(legacy, dir)?;
        Ok(LogStore {
            log: Arc::new(Mutex::new(Log::open(dir, SEGMENT_BYTES)?)),
        })
    }

    /// Whether the log holds anything: a vote, an entry or a purge.
    pub fn is_empty(&self) -> bool {
        let log = self.lock();
        log.vote.is_none() && log.purged.is_none() && log.entries.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A record of the log, as written.
enum Record<'a> {
    Entry(&'a Entry),
    Vote(&'a Vote<u64>),
    Purged(&'a LogId),
    /// The entries from this index on are removed.
    Truncated(u64),
}

/// A record of the log, as replayed: an entry is where its bytes are.
enum Replayed {
    Entry(Located),
    Vote(Vote<u64>),
    Purged(LogId),
    Truncated(u64),
}

/// Where an entry's bytes are.
#[derive(Clone, Copy)]
struct Located {
    log_id: LogId,
    slot: u32,
    offset: u64,
    length: u32,
}

/// A segment file.
struct Segment {
    file: FrameFile,
    /// The highest index of an entry written to it in its generation: once
    /// the log is purged through it, the segment can be reused.
    last_index: Option<u64>,
    /// Whether frames were written to it since its last sync.
    unsynced: bool,
}

/// The log's files and what memory keeps of them.
struct Log {
    dir: PathBuf,
    segment_bytes: u64,
    /// The segment files, by slot number.
    segments: BTreeMap<u32, Segment>,
    /// The slot frames are written to.
    current: u32,
    /// The entries after the purge, in index order, without gaps.
    entries: VecDeque<Located>,
    vote: Option<Vote<u64>>,
    purged: Option<LogId>,
}

impl Log {
    /// Opens the log in `dir`, creating the directory and a first segment
    /// if needed, and replays its frames.
    fn open(dir: &Path, segment_bytes: u64) -> anyhow::Result<Log> {
        if !dir.exists() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            if let Some(parent) = dir.parent() {
                sync_directory(parent)?;
            }
        }
        let mut log = Log {
            dir: dir.to_owned(),
            segment_bytes,
            segments: BTreeMap::new(),
            current: 0,
            entries: VecDeque::new(),
            vote: None,
            purged: None,
        };
        let mut frames = Vec::new();
        for item in std::fs::read_dir(dir)? {
            let path = item?.path();
            let Some(slot) = slot_of(&path) else {
                continue;
            };
            if std::fs::metadata(&path)?.len() < HEADER_BYTES {
                // Created, but the power went before it was preallocated.
                std::fs::remove_file(&path)?;
                continue;
            }
            let (file, payloads) = FrameFile::open(&path, MAGIC)?;
            frames.push((file.generation(), slot, payloads));
            log.segments.insert(
                slot,
                Segment {
                    file,
                    last_index: None,
                    unsynced: false,
                },
            );
        }
        frames.sort_by_key(|(generation, slot, _)| (*generation, *slot));
        for (_, slot, payloads) in &frames {
            log.current = *slot;
            for frame in payloads {
                let records = decode(&frame.payload, *slot, frame.payload_at);
                for record in records.with_context(|| {
                    format!(
                        "the Raft log segment {} has a damaged frame at {}",
                        log.path_of(*slot).display(),
                        frame.payload_at
                    )
                })? {
                    log.apply(record)?;
                }
            }
        }
        if log.segments.is_empty() {
            log.create_segment(0, 1, segment_bytes)?;
            sync_directory(dir)?;
        }
        Ok(log)
    }

    fn path_of(&self, slot: u32) -> PathBuf {
        self.dir.join(format!("{slot:08}.wal"))
    }

    fn create_segment(&mut self, slot: u32, generation: u64, capacity: u64) -> anyhow::Result<()> {
        let file = FrameFile::create(&self.path_of(slot), MAGIC, capacity, generation)?;
        self.segments.insert(
            slot,
            Segment {
                file,
                last_index: None,
                unsynced: false,
            },
        );
        self.current = slot;
        Ok(())
    }

    /// Brings memory up to `record`, one written or replayed.
    fn apply(&mut self, record: Replayed) -> anyhow::Result<()> {
        match record {
            Replayed::Entry(located) => {
                let index = located.log_id.index;
                let segment = self.segments.get_mut(&located.slot).expect("its segment");
                segment.last_index = segment.last_index.max(Some(index));
                if self.purged.is_some_and(|purged| index <= purged.index) {
                    return Ok(());
                }
                self.truncate_from(index);
                if let Some(last) = self.entries.back() {
                    anyhow::ensure!(
                        last.log_id.index + 1 == index,
                        "the Raft log has a gap: entry {index} after {}",
                        last.log_id.index
                    );
                }
                self.entries.push_back(located);
            }
            Replayed::Vote(vote) => self.vote = Some(vote),
            Replayed::Purged(log_id) => {
                if self.purged.is_none_or(|purged| purged.index < log_id.index) {
                    self.purged = Some(log_id);
                }
                while self
                    .entries
                    .front()
                    .is_some_and(|first| first.log_id.index <= log_id.index)
                {
                    self.entries.pop_front();
                }
            }
            Replayed::Truncated(index) => self.truncate_from(index),
        }
        Ok(())
    }

    fn truncate_from(&mut self, index: u64) {
        while self
            .entries
            .back()
            .is_some_and(|last| last.log_id.index >= index)
        {
            self.entries.pop_back();
        }
    }

    /// Writes `records` in frames of up to `FRAME_BYTES`, syncs them and
    /// applies them.
    fn write(&mut self, records: &[Record]) -> anyhow::Result<()> {
        let mut frame = FrameFile::frame_buffer();
        let mut written = Vec::new();
        for record in records {
            if !written.is_empty() && frame.len() >= FRAME_BYTES {
                self.write_frame(&mut frame, std::mem::take(&mut written))?;
                frame = FrameFile::frame_buffer();
            }
            written.push(encode(record, &mut frame)?);
        }
        if !written.is_empty() {
            self.write_frame(&mut frame, written)?;
        }
        for segment in self.segments.values_mut().filter(|s| s.unsynced) {
            metrics()
                .wal_fsync_seconds
                .observe_closure_duration(|| segment.file.sync())?;
            segment.unsynced = false;
        }
        Ok(())
    }

    /// Writes one frame (to a new segment if the current one is full) and
    /// applies its `records`, whose entries' offsets are from the start of
    /// its payload.
    fn write_frame(&mut self, frame: &mut [u8], records: Vec<Replayed>) -> anyhow::Result<()> {
        let payload_at = match self.current_segment().file.append(frame)? {
            Some(offset) => offset,
            None => {
                self.next_segment(frame.len() as u64)?;
                self.current_segment()
                    .file
                    .append(frame)?
                    .context("a Raft log frame does not fit in a new segment")?
            }
        };
        self.current_segment().unsynced = true;
        for mut record in records {
            if let Replayed::Entry(located) = &mut record {
                located.slot = self.current;
                located.offset += payload_at;
            }
            self.apply(record)?;
        }
        Ok(())
    }

    fn current_segment(&mut self) -> &mut Segment {
        self.segments
            .get_mut(&self.current)
            .expect("the current segment")
    }

    /// Moves to a segment with room for a frame of `frame_bytes`: one whose
    /// entries are all purged, started over, or a new one. It begins with
    /// the vote and the purge. The segment left is synced first, so that
    /// frames reach the files in order.
    fn next_segment(&mut self, frame_bytes: u64) -> anyhow::Result<()> {
        let segment = self.current_segment();
        if segment.unsynced {
            segment.file.sync()?;
            segment.unsynced = false;
        }
        let purged = self.purged.map(|purged| purged.index);
        let needed = HEADER_BYTES + frame_bytes.next_multiple_of(BLOCK_BYTES) + BLOCK_BYTES;
        let generation = 1 + self
            .segments
            .values()
            .map(|s| s.file.generation())
            .max()
            .unwrap_or(0);
        let reusable = self.segments.iter().find_map(|(slot, segment)| {
            (*slot != self.current
                && segment.last_index.is_none_or(|last| Some(last) <= purged)
                && segment.file.capacity() >= needed)
                .then_some(*slot)
        });
        match reusable {
            Some(slot) => {
                let segment = self.segments.get_mut(&slot).expect("a segment");
                segment.file.start_over(generation)?;
                segment.last_index = None;
                self.current = slot;
            }
            None => {
                let slot = self.segments.keys().last().map_or(0, |last| last + 1);
                self.create_segment(slot, generation, needed.max(self.segment_bytes))?;
                sync_directory(&self.dir)?;
            }
        }
        self.remove_spares(purged)?;
        let mut state = FrameFile::frame_buffer();
        if let Some(vote) = &self.vote {
            encode(&Record::Vote(vote), &mut state)?;
        }
        if let Some(purged) = &self.purged {
            encode(&Record::Purged(purged), &mut state)?;
        }
        if state.len() > FRAME_HEADER_BYTES {
            self.current_segment()
                .file
                .append(&mut state)?
                .context("the vote does not fit in a new Raft log segment")?;
            self.current_segment().unsynced = true;
        }
        Ok(())
    }

    /// Removes the segments whose entries are all purged but one, which the
    /// next handover reuses: after a burst of appends that filled several,
    /// the log goes back to two files. A removal the power undoes leaves a
    /// segment whose entries are purged, which replay passes over.
    fn remove_spares(&mut self, purged: Option<u64>) -> anyhow::Result<()> {
        let spares: Vec<u32> = self
            .segments
            .iter()
            .filter(|(slot, segment)| {
                **slot != self.current && segment.last_index.is_none_or(|last| Some(last) <= purged)
            })
            .map(|(slot, _)| *slot)
            .skip(1)
            .collect();
        for slot in &spares {
            self.segments.remove(slot);
            std::fs::remove_file(self.path_of(*slot))?;
        }
        if !spares.is_empty() {
            sync_directory(&self.dir)?;
        }
        Ok(())
    }

    /// The entries with indexes in `start..end` that the log holds.
    fn read(&self, start: u64, end: Option<u64>) -> anyhow::Result<Vec<Entry>> {
        let Some(first) = self.entries.front().map(|e| e.log_id.index) else {
            return Ok(Vec::new());
        };
        let from = start.saturating_sub(first) as usize;
        let to = end.map_or(self.entries.len(), |end| {
            (end.saturating_sub(first) as usize).min(self.entries.len())
        });
        let mut entries = Vec::with_capacity(to.saturating_sub(from));
        for located in self.entries.range(from.min(to)..to) {
            let segment = &self.segments[&located.slot];
            let bytes = segment
                .file
                .read_at(located.offset, located.length as usize)?;
            entries.push(postcard::from_bytes(&bytes)?);
        }
        Ok(entries)
    }
}

/// The slot number of a segment file's path, if it is one.
fn slot_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let number = name.strip_suffix(".wal")?;
    (number.len() == 8).then(|| number.parse().ok()).flatten()
}

/// Appends `record` to `frame` and returns it as replayed, an entry's
/// offset counted from the start of the frame's payload (its slot unset).
fn encode(record: &Record, frame: &mut Vec<u8>) -> anyhow::Result<Replayed> {
    // The record's bytes go straight into the frame (no copy of an entry
    // on the write path), after its tag and a length filled in after.
    frame.push(match record {
        Record::Entry(_) => ENTRY,
        Record::Vote(_) => VOTE,
        Record::Purged(_) => PURGED,
        Record::Truncated(_) => TRUNCATED,
    });
    let length_at = frame.len();
    frame.extend_from_slice(&[0; RECORD_HEADER_BYTES - 1]);
    let start = frame.len();
    let mut bytes = std::mem::take(frame);
    bytes = match record {
        Record::Entry(entry) => postcard::to_extend(entry, bytes)?,
        Record::Vote(vote) => postcard::to_extend(vote, bytes)?,
        Record::Purged(log_id) => postcard::to_extend(log_id, bytes)?,
        Record::Truncated(index) => {
            bytes.extend_from_slice(&index.to_le_bytes());
            bytes
        }
    };
    *frame = bytes;
    let length = u32::try_from(frame.len() - start)?;
    frame[length_at..start].copy_from_slice(&length.to_le_bytes());
    Ok(match record {
        Record::Entry(entry) => Replayed::Entry(Located {
            log_id: entry.log_id,
            slot: 0,
            offset: (start - FRAME_HEADER_BYTES) as u64,
            length,
        }),
        Record::Vote(vote) => Replayed::Vote(**vote),
        Record::Purged(log_id) => Replayed::Purged(**log_id),
        Record::Truncated(index) => Replayed::Truncated(*index),
    })
}

/// The records of the frame whose payload, at `offset` in segment `slot`,
/// is `payload`.
fn decode(payload: &[u8], slot: u32, offset: u64) -> anyhow::Result<Vec<Replayed>> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        anyhow::ensure!(
            at + RECORD_HEADER_BYTES <= payload.len(),
            "a record runs past its frame"
        );
        let tag = payload[at];
        let length =
            u32::from_le_bytes(payload[at + 1..at + 5].try_into().expect("4 bytes")) as usize;
        let start = at + RECORD_HEADER_BYTES;
        let bytes = payload
            .get(start..start + length)
            .context("a record runs past its frame")?;
        records.push(match tag {
            ENTRY => {
                let entry: Entry = postcard::from_bytes(bytes)?;
                Replayed::Entry(Located {
                    log_id: entry.log_id,
                    slot,
                    offset: offset + start as u64,
                    length: length as u32,
                })
            }
            VOTE => Replayed::Vote(postcard::from_bytes(bytes)?),
            PURGED => Replayed::Purged(postcard::from_bytes(bytes)?),
            TRUNCATED => Replayed::Truncated(u64::from_le_bytes(bytes.try_into()?)),
            tag => anyhow::bail!("unknown record {tag}"),
        });
        at = start + length;
    }
    Ok(records)
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
        self.lock()
            .read(first_index(&range), end_index(&range))
            .map_err(read_error)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let log = self.lock();
        Ok(LogState {
            last_purged_log_id: log.purged,
            last_log_id: log.entries.back().map(|e| e.log_id).or(log.purged),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        self.lock()
            .write(&[Record::Vote(vote)])
            .map_err(|e| StorageIOError::write_vote(any_error(format!("{e:#}"))).into())
    }

    /// The vote as saved, but never committed: openraft reads it once, at
    /// start, and a member whose saved vote was its own committed one would
    /// take up leading at once, with a read index of the first entry of its
    /// term, while its store (synced only at snapshots) may have lost
    /// entries applied since. So a member starts as a follower, as etcd's
    /// do, and a leader serves reads only after an entry of a new term.
    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        Ok(self.lock().vote.map(|vote| Vote {
            committed: false,
            ..vote
        }))
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
        let entries: Vec<Entry> = entries.into_iter().collect();
        let records: Vec<Record> = entries.iter().map(Record::Entry).collect();
        let result = self.lock().write(&records);
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(format!("{error:#}"))))
            }
        }
        result.map_err(write_error)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.lock()
            .write(&[Record::Truncated(log_id.index)])
            .map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.lock()
            .write(&[Record::Purged(&log_id)])
            .map_err(write_error)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::os::unix::fs::FileExt;

    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::proto::etcdserverpb::PutRequest;
    use crate::raft::proposal::{Proposal, Proposals};
    use crate::store::request::WriteRequest;

    /// An entry of `term` at `index`: a put of a 2 KiB value.
    pub(super) fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: openraft::LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Proposals(vec![Proposal {
                origin: 1,
                seq: index,
                at_ms: 0,
                request: WriteRequest::Put(PutRequest {
                    key: format!("key{index}").into_bytes(),
                    value: vec![b'v'; 2048],
                    ..Default::default()
                }),
            }])),
        }
    }

    /// The (term, index) of every entry `log` holds, read from its files.
    pub(super) fn entries_of(log: &Log) -> Vec<(u64, u64)> {
        log.read(0, None)
            .unwrap()
            .iter()
            .map(|e| (e.log_id.leader_id.term, e.log_id.index))
            .collect()
    }

    fn append(log: &mut Log, term: u64, indexes: std::ops::RangeInclusive<u64>) {
        let entries: Vec<Entry> = indexes.map(|i| entry(term, i)).collect();
        let records: Vec<Record> = entries.iter().map(Record::Entry).collect();
        log.write(&records).unwrap();
    }

    /// An entry's bytes, to compare entries (a proposal has no `==`).
    fn bytes(entry: &Entry) -> Vec<u8> {
        postcard::to_stdvec(entry).unwrap()
    }

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// Entries, a vote, a truncation and a purge come back after a reopen,
    /// as they were before it; reads take ranges of what is held.
    #[test]
    fn the_log_comes_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = Log::open(&path, SEGMENT_BYTES).unwrap();
        append(&mut log, 1, 1..=10);
        log.write(&[Record::Vote(&Vote::new(2, 3))]).unwrap();
        log.write(&[Record::Truncated(8)]).unwrap();
        append(&mut log, 2, 8..=12);
        log.write(&[Record::Purged(&log_id(1, 3))]).unwrap();
        let expected: Vec<(u64, u64)> = (4..=7)
            .map(|i| (1, i))
            .chain((8..=12).map(|i| (2, i)))
            .collect();
        assert_eq!(entries_of(&log), expected);
        drop(log);

        let log = Log::open(&path, SEGMENT_BYTES).unwrap();
        assert_eq!(entries_of(&log), expected);
        assert_eq!(log.vote, Some(Vote::new(2, 3)));
        assert_eq!(log.purged, Some(log_id(1, 3)));
        let indexes =
            |entries: Vec<Entry>| entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
        assert_eq!(indexes(log.read(6, Some(9)).unwrap()), [6, 7, 8]);
        assert_eq!(indexes(log.read(0, Some(5)).unwrap()), [4]);
        assert_eq!(indexes(log.read(12, None).unwrap()), [12]);
        assert!(log.read(13, None).unwrap().is_empty());
        assert_eq!(
            bytes(&log.read(9, Some(10)).unwrap()[0]),
            bytes(&entry(2, 9))
        );
    }

    /// Appends fill segments in turn; a segment whose entries are all
    /// purged is reused in a new generation (no new file while one is
    /// free), and after a reopen the log is what it was, the vote too,
    /// though the segment that first held it was reused.
    #[test]
    fn full_segments_are_reused_once_purged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        // About 25 entries of 2 KiB per segment.
        let segment_bytes = 64 << 10;
        let mut log = Log::open(&path, segment_bytes).unwrap();
        log.write(&[Record::Vote(&Vote::new(1, 1))]).unwrap();
        let files = || std::fs::read_dir(&path).unwrap().count();
        for round in 0..10u64 {
            let first = round * 20 + 1;
            append(&mut log, 1, first..=first + 19);
            // Keep the last five, as openraft keeps some after a snapshot.
            log.write(&[Record::Purged(&log_id(1, first + 14))])
                .unwrap();
        }
        // 200 entries of 2 KiB went through segments of 64 KiB, and the log
        // never held more than about two segments' worth.
        assert!(files() <= 3, "{} segment files", files());
        let generations: Vec<u64> = log.segments.values().map(|s| s.file.generation()).collect();
        assert!(generations.iter().max().unwrap() > &5, "{generations:?}");
        assert_eq!(
            entries_of(&log),
            (196..=200).map(|i| (1, i)).collect::<Vec<_>>()
        );
        drop(log);

        let log = Log::open(&path, segment_bytes).unwrap();
        assert_eq!(
            entries_of(&log),
            (196..=200).map(|i| (1, i)).collect::<Vec<_>>()
        );
        assert_eq!(log.vote, Some(Vote::new(1, 1)));
        assert_eq!(log.purged, Some(log_id(1, 195)));
    }

    /// A burst of appends with nothing purged fills several segments; once
    /// the log is purged as it goes again, the handovers remove all but one
    /// of the segments left free, and the log reads back whole.
    #[test]
    fn segments_beyond_one_spare_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        // Three appends of ten 2 KiB entries per segment.
        let segment_bytes = 64 << 10;
        let mut log = Log::open(&path, segment_bytes).unwrap();
        let files = || std::fs::read_dir(&path).unwrap().count();
        for first in (1..=120).step_by(10) {
            append(&mut log, 1, first..=first + 9);
        }
        let burst = files();
        assert!(burst >= 4, "{burst} segment files");
        for first in (121..=240).step_by(10) {
            append(&mut log, 1, first..=first + 9);
            log.write(&[Record::Purged(&log_id(1, first + 4))]).unwrap();
        }
        assert!(files() <= 3, "{} segment files after {burst}", files());
        drop(log);
        let log = Log::open(&path, segment_bytes).unwrap();
        assert_eq!(
            entries_of(&log),
            (236..=240).map(|i| (1, i)).collect::<Vec<_>>()
        );
    }

    /// A leader's committed vote comes back uncommitted after a restart,
    /// with its term and candidate: the member starts as a follower.
    #[tokio::test]
    async fn a_restarted_leader_reads_its_vote_uncommitted() {
        let dir = tempfile::tempdir().unwrap();
        let (path, old) = (dir.path().join("log"), dir.path().join("old"));
        let mut vote = Vote::new(4, 1);
        vote.commit();
        let mut store = LogStore::open(&path, &old).unwrap();
        store.save_vote(&vote).await.unwrap();
        drop(store);
        let mut store = LogStore::open(&path, &old).unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(4, 1)));
        assert!(store.lock().vote.unwrap().is_committed());
    }

    /// An entry larger than a segment gets a segment of its own size.
    #[test]
    fn an_entry_larger_than_a_segment_fits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = Log::open(&path, 16 << 10).unwrap();
        append(&mut log, 1, 1..=3);
        let mut large = entry(1, 4);
        if let EntryPayload::Normal(Proposals(proposals)) = &mut large.payload
            && let WriteRequest::Put(put) = &mut proposals[0].request
        {
            put.value = vec![b'x'; 100 << 10];
        }
        log.write(&[Record::Entry(&large)]).unwrap();
        append(&mut log, 1, 5..=5);
        drop(log);
        let log = Log::open(&path, 16 << 10).unwrap();
        assert_eq!(
            entries_of(&log),
            (1..=5).map(|i| (1, i)).collect::<Vec<_>>()
        );
        assert_eq!(bytes(&log.read(4, Some(5)).unwrap()[0]), bytes(&large));
    }

    /// A frame whose bytes did not all reach the disk (the power went
    /// between write and sync) ends the log: its entries are gone, the ones
    /// before it are there, and the next append goes where it was.
    #[test]
    fn a_torn_append_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = Log::open(&path, SEGMENT_BYTES).unwrap();
        append(&mut log, 1, 1..=3);
        append(&mut log, 1, 4..=6);
        let torn = log.entries[4];
        drop(log);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path.join(format!("{:08}.wal", torn.slot)))
            .unwrap();
        file.write_all_at(b"X", torn.offset + 100).unwrap();

        let mut log = Log::open(&path, SEGMENT_BYTES).unwrap();
        assert_eq!(
            entries_of(&log),
            (1..=3).map(|i| (1, i)).collect::<Vec<_>>()
        );
        append(&mut log, 2, 4..=4);
        drop(log);
        let log = Log::open(&path, SEGMENT_BYTES).unwrap();
        assert_eq!(entries_of(&log), [(1, 1), (1, 2), (1, 3), (2, 4)]);
    }
}
