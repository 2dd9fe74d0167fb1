//! A preallocated file of checksummed frames, in generations: the shape of
//! etcd's WAL, under both of cetera's redo logs (the embedded store's record
//! log, `backend::sqlite::record_log`, and a member's Raft log,
//! `raft::log_store`).
//!
//! Layout: a header block (magic, generation, checksum), then frames from
//! `HEADER_BYTES` on, each `length | generation | crc32c | payload`, the
//! checksum covering generation and payload. A frame that fits in a block
//! but not in what is left of the current one starts at the next block, so
//! that a small commit's sync writes one block, not two; a reader that finds
//! no frame where the last ended looks at the next block. A frame of an
//! older generation, a torn one or the zeros after the last mark the end.
//! The file is preallocated (fallocate, as etcd does) and reused from its
//! start in a new generation once its frames are no longer needed, so an
//! fdatasync hardly ever has file metadata to journal.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The page cache's page, and the file system's block: what an fdatasync
/// writes for a frame is every block the frame touches.
pub(crate) const BLOCK_BYTES: u64 = 4096;

/// Bytes before the first frame: one block, so that the header's rewrite at
/// a new generation never shares a block with a frame.
pub(crate) const HEADER_BYTES: u64 = BLOCK_BYTES;

/// Bytes of a frame's header: length (u32), generation (u64), crc32c (u32).
pub(crate) const FRAME_HEADER_BYTES: usize = 16;

/// A frame read back.
pub(crate) struct Frame {
    /// Where its payload starts in the file.
    pub(crate) payload_at: u64,
    /// What the frame holds.
    pub(crate) payload: Vec<u8>,
}

/// An open frame file.
pub(crate) struct FrameFile {
    file: File,
    path: PathBuf,
    magic: &'static [u8; 8],
    /// The current generation: only its frames are read back.
    generation: u64,
    /// Where the next frame goes.
    end: u64,
    /// The file's length: a frame must end within it.
    capacity: u64,
    /// Frames written in this generation.
    frames: u64,
}

impl FrameFile {
    /// Creates the file at `path` (which must not exist), preallocated to
    /// `capacity` bytes, with a header of `generation`, synced. The caller
    /// syncs the directory. Nothing is left behind if this fails.
    pub(crate) fn create(
        path: &Path,
        magic: &'static [u8; 8],
        capacity: u64,
        generation: u64,
    ) -> anyhow::Result<FrameFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut frame_file = FrameFile {
            file,
            path: path.to_owned(),
            magic,
            generation,
            end: HEADER_BYTES,
            capacity: 0,
            frames: 0,
        };
        let mut fill = || -> anyhow::Result<()> {
            preallocate(&frame_file.file, capacity)
                .with_context(|| format!("cannot preallocate {}", path.display()))?;
            frame_file.capacity = frame_file.file.metadata()?.len();
            Ok(frame_file.write_header()?)
        };
        if let Err(error) = fill() {
            let _ = std::fs::remove_file(path);
            return Err(error);
        }
        Ok(frame_file)
    }

    /// Opens the file at `path` and returns it with its current
    /// generation's frames, in the order written; the next frame goes after
    /// the last of them. A file whose header is all zeros (the
    /// power went before it was synced) is of generation 0.
    pub(crate) fn open(
        path: &Path,
        magic: &'static [u8; 8],
    ) -> anyhow::Result<(FrameFile, Vec<Frame>)> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let capacity = file.metadata()?.len();
        let mut frame_file = FrameFile {
            file,
            path: path.to_owned(),
            magic,
            generation: 0,
            end: HEADER_BYTES,
            capacity,
            frames: 0,
        };
        frame_file.generation = frame_file.read_header()?;
        let payloads = frame_file.read_frames()?;
        // Readahead filled the page cache with large folios, which later
        // small frames would dirty whole (see `append`): drop them.
        drop_cached(&frame_file.file);
        Ok((frame_file, payloads))
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The current generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The file's length.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// True if a frame was written in this generation.
    pub(crate) fn has_frames(&self) -> bool {
        self.frames > 0
    }

    /// Where the next frame would start, for tests.
    #[cfg(test)]
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    fn read_header(&self) -> anyhow::Result<u64> {
        let mut header = [0u8; 20];
        if self.capacity < HEADER_BYTES {
            anyhow::bail!("{} is shorter than its header", self.path.display());
        }
        self.file.read_exact_at(&mut header, 0)?;
        if header.iter().all(|b| *b == 0) {
            return Ok(0);
        }
        let generation = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes"));
        if &header[..8] != self.magic || crc32c::crc32c(&header[..16]) != crc {
            anyhow::bail!(
                "{} is not a cetera log file, or its header is damaged",
                self.path.display()
            );
        }
        Ok(generation)
    }

    fn write_header(&mut self) -> io::Result<()> {
        let mut header = Vec::with_capacity(20);
        header.extend_from_slice(self.magic);
        header.extend_from_slice(&self.generation.to_le_bytes());
        header.extend_from_slice(&crc32c::crc32c(&header).to_le_bytes());
        self.file.write_all_at(&header, 0)?;
        self.file.sync_data()
    }

    /// Reads the current generation's frames from the start, up to the first
    /// that is not one of them (or is torn), and leaves `end` after them.
    fn read_frames(&mut self) -> anyhow::Result<Vec<Frame>> {
        let mut payloads = Vec::new();
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
            let payload_at = offset + FRAME_HEADER_BYTES as u64;
            offset = payload_at + payload.len() as u64;
            payloads.push(Frame {
                payload_at,
                payload,
            });
            self.frames += 1;
        }
        self.end = offset;
        Ok(payloads)
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

    /// A buffer to encode a frame's payload into, after the room its header
    /// takes, for `append`.
    pub(crate) fn frame_buffer() -> Vec<u8> {
        vec![0u8; FRAME_HEADER_BYTES]
    }

    /// Writes `frame` (from `frame_buffer`, its payload encoded after the
    /// header's room) as the next frame, not synced, and returns the offset
    /// its payload starts at; None, with nothing written, if it does not fit
    /// in the file (or its payload is empty).
    pub(crate) fn append(&mut self, frame: &mut [u8]) -> io::Result<Option<u64>> {
        let frame_bytes = frame.len() as u64;
        let length = frame_bytes.saturating_sub(FRAME_HEADER_BYTES as u64);
        let mut at = self.end;
        let left_in_block = BLOCK_BYTES - at % BLOCK_BYTES;
        if frame_bytes <= BLOCK_BYTES && frame_bytes > left_in_block {
            at += left_in_block;
        }
        if length == 0 || at + frame_bytes > self.capacity || length > u64::from(u32::MAX) {
            return Ok(None);
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
        self.end = at + frame_bytes;
        self.frames += 1;
        Ok(Some(at + FRAME_HEADER_BYTES as u64))
    }

    /// Makes every frame written so far durable (fdatasync).
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Reads `length` bytes at `offset`: a part of a frame `append` wrote.
    pub(crate) fn read_at(&self, offset: u64, length: usize) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; length];
        self.file.read_exact_at(&mut bytes, offset)?;
        Ok(bytes)
    }

    /// Starts the file over in `generation` (durably), so that its old frames
    /// are not read back.
    pub(crate) fn start_over(&mut self, generation: u64) -> io::Result<()> {
        self.generation = generation;
        self.write_header()?;
        self.end = HEADER_BYTES;
        self.frames = 0;
        Ok(())
    }
}

/// Syncs the directory `dir`, so that a file created or removed in it stays
/// so after a power loss.
pub(crate) fn sync_directory(dir: &Path) -> io::Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(dir)?.sync_all()
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
