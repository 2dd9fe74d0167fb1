//! A small writer of bbolt database files, beside the reader in `reader`:
//! enough to build, in one pass, a file whose buckets are written in key
//! order, as an etcd snapshot is. It writes what bbolt 1.3 reads (and what
//! `bbolt check`, which `etcdutl snapshot status` runs, accepts): full leaf
//! pages in key order, branch levels above them, one non-inline tree per
//! bucket, the root bucket's leaf last, an empty freelist page and the two
//! meta pages. Pages go to the file as they fill, so only one page and one
//! (first key, page id) per page of the level above are held in memory.
//!
//! We write our own rather than use the `bbolt-rs` crate: that crate (MIT,
//! one author, one release) is a full transactional port built on mmap and
//! unsafe code, while a snapshot needs only this write-once bulk build of
//! the format the reader here already parses.

use std::io::{Seek, SeekFrom, Write};

use anyhow::{Context, bail};

use super::reader::{
    BRANCH_PAGE, BUCKET_LEAF, ELEMENT, LEAF_PAGE, MAGIC, META_CHECKSUM_AT, PAGE_HEADER, fnv64a,
};

/// The page size written (the common OS page size, which bbolt uses).
pub const PAGE_SIZE: usize = 4096;
const META_PAGE: u16 = 0x04;
const FREELIST_PAGE: u16 = 0x10;

/// A bbolt file being written.
pub struct BboltWriter<W: Write + Seek> {
    file: W,
    next_page: u64,
}

/// One level of a bucket's tree being filled: its elements so far, the
/// bytes they take, and the first key and page id of each page written.
#[derive(Default)]
struct Level {
    elements: Vec<(Vec<u8>, Vec<u8>, u32, u64)>,
    bytes: usize,
    pages: Vec<(Vec<u8>, u64)>,
}

/// A bucket being written: keys must come in ascending order.
pub struct BucketWriter {
    leaves: Level,
    last_key: Option<Vec<u8>>,
}

impl<W: Write + Seek> BboltWriter<W> {
    /// Starts a file on `file`: the meta pages are written by `finish`.
    pub fn new(mut file: W) -> anyhow::Result<Self> {
        file.write_all(&[0u8; 2 * PAGE_SIZE])?;
        Ok(BboltWriter { file, next_page: 2 })
    }

    /// Starts a bucket (written with `put` and `finish_bucket`).
    pub fn bucket(&self) -> BucketWriter {
        BucketWriter {
            leaves: Level::default(),
            last_key: None,
        }
    }

    /// Adds `key` = `value` to `bucket`, writing its leaf page when full.
    pub fn put(
        &mut self,
        bucket: &mut BucketWriter,
        key: &[u8],
        value: &[u8],
    ) -> anyhow::Result<()> {
        if bucket.last_key.as_deref().is_some_and(|last| last >= key) {
            bail!("bbolt keys must be written in ascending order");
        }
        bucket.last_key = Some(key.to_vec());
        self.push(
            &mut bucket.leaves,
            key.to_vec(),
            value.to_vec(),
            0,
            LEAF_PAGE,
        )
    }

    /// Adds an element to `level`, first writing the level's page if the
    /// element would not fit in it.
    fn push(
        &mut self,
        level: &mut Level,
        key: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
        kind: u16,
    ) -> anyhow::Result<()> {
        let size = ELEMENT + key.len() + value.len();
        if !level.elements.is_empty() && PAGE_HEADER + level.bytes + size > PAGE_SIZE {
            self.flush(level, kind)?;
        }
        level.bytes += size;
        level.elements.push((key, value, flags, 0));
        Ok(())
    }

    /// Writes `level`'s pending elements as one page (with overflow pages
    /// if one element is larger than a page).
    fn flush(&mut self, level: &mut Level, kind: u16) -> anyhow::Result<()> {
        let count = level.elements.len();
        let used = PAGE_HEADER + level.bytes;
        let pages = used.div_ceil(PAGE_SIZE).max(1);
        let id = self.next_page;
        let mut page = vec![0u8; pages * PAGE_SIZE];
        page[..8].copy_from_slice(&id.to_le_bytes());
        page[8..10].copy_from_slice(&kind.to_le_bytes());
        let count16 = u16::try_from(count).context("too many elements for a bbolt page")?;
        page[10..12].copy_from_slice(&count16.to_le_bytes());
        page[12..16].copy_from_slice(&((pages - 1) as u32).to_le_bytes());
        let mut data = PAGE_HEADER + count * ELEMENT;
        for (index, (key, value, flags, child)) in level.elements.iter().enumerate() {
            let at = PAGE_HEADER + index * ELEMENT;
            let pos = ((data - at) as u32).to_le_bytes();
            let ksize = (key.len() as u32).to_le_bytes();
            if kind == LEAF_PAGE {
                page[at..at + 4].copy_from_slice(&flags.to_le_bytes());
                page[at + 4..at + 8].copy_from_slice(&pos);
                page[at + 8..at + 12].copy_from_slice(&ksize);
                page[at + 12..at + 16].copy_from_slice(&(value.len() as u32).to_le_bytes());
            } else {
                page[at..at + 4].copy_from_slice(&pos);
                page[at + 4..at + 8].copy_from_slice(&ksize);
                page[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
            }
            page[data..data + key.len()].copy_from_slice(key);
            data += key.len();
            page[data..data + value.len()].copy_from_slice(value);
            data += value.len();
        }
        self.file.write_all(&page)?;
        self.next_page += pages as u64;
        let first = level
            .elements
            .first()
            .map(|e| e.0.clone())
            .unwrap_or_default();
        level.pages.push((first, id));
        level.elements.clear();
        level.bytes = 0;
        Ok(())
    }

    /// Writes the rest of `bucket` and the branch pages above its leaves;
    /// returns the bucket's root page.
    pub fn finish_bucket(&mut self, mut bucket: BucketWriter) -> anyhow::Result<u64> {
        if !bucket.leaves.elements.is_empty() || bucket.leaves.pages.is_empty() {
            self.flush(&mut bucket.leaves, LEAF_PAGE)?;
        }
        let mut pages = bucket.leaves.pages;
        while pages.len() > 1 {
            let mut branches = Level::default();
            for (first, child) in pages {
                let size = ELEMENT + first.len();
                if !branches.elements.is_empty() && PAGE_HEADER + branches.bytes + size > PAGE_SIZE
                {
                    self.flush(&mut branches, BRANCH_PAGE)?;
                }
                branches.bytes += size;
                branches.elements.push((first, Vec::new(), 0, child));
            }
            self.flush(&mut branches, BRANCH_PAGE)?;
            pages = branches.pages;
        }
        Ok(pages[0].1)
    }

    /// Writes the root bucket (the top-level buckets, in ascending name
    /// order, with their root pages), the freelist and the meta pages.
    pub fn finish(mut self, buckets: &[(&[u8], u64)]) -> anyhow::Result<W> {
        let mut root = self.bucket();
        for (name, page) in buckets {
            if root.last_key.as_deref().is_some_and(|last| last >= *name) {
                bail!("bbolt buckets must be written in ascending order");
            }
            root.last_key = Some(name.to_vec());
            // A bucket's value is its header: root page and sequence.
            let mut header = page.to_le_bytes().to_vec();
            header.extend_from_slice(&0u64.to_le_bytes());
            self.push(
                &mut root.leaves,
                name.to_vec(),
                header,
                BUCKET_LEAF,
                LEAF_PAGE,
            )?;
        }
        let root_page = self.finish_bucket(root)?;
        let freelist = self.next_page;
        let mut page = vec![0u8; PAGE_SIZE];
        page[..8].copy_from_slice(&freelist.to_le_bytes());
        page[8..10].copy_from_slice(&FREELIST_PAGE.to_le_bytes());
        self.file.write_all(&page)?;
        self.next_page += 1;
        for id in 0..2u64 {
            let mut page = vec![0u8; PAGE_SIZE];
            page[..8].copy_from_slice(&id.to_le_bytes());
            page[8..10].copy_from_slice(&META_PAGE.to_le_bytes());
            let body = &mut page[PAGE_HEADER..];
            body[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            body[4..8].copy_from_slice(&2u32.to_le_bytes());
            body[8..12].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
            body[16..24].copy_from_slice(&root_page.to_le_bytes());
            body[32..40].copy_from_slice(&freelist.to_le_bytes());
            body[40..48].copy_from_slice(&self.next_page.to_le_bytes());
            body[48..56].copy_from_slice(&id.to_le_bytes());
            let sum = fnv64a(&body[..META_CHECKSUM_AT]);
            body[META_CHECKSUM_AT..META_CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
            self.file.seek(SeekFrom::Start(id * PAGE_SIZE as u64))?;
            self.file.write_all(&page)?;
        }
        self.file.seek(SeekFrom::End(0))?;
        self.file.flush()?;
        Ok(self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::super::reader::Db;
    use super::*;

    /// Writes buckets large enough for branch pages and an overflowing
    /// value, and reads them back with the reader.
    #[test]
    fn the_reader_reads_what_the_writer_wrote() {
        let mut writer = BboltWriter::new(std::io::Cursor::new(Vec::new())).unwrap();
        let mut big = writer.bucket();
        let items: Vec<(Vec<u8>, Vec<u8>)> = (0..20_000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![i as u8; (i % 50) as usize]))
            .collect();
        for (key, value) in &items {
            writer.put(&mut big, key, value).unwrap();
        }
        writer
            .put(&mut big, &[0xff; 5], &vec![7u8; 3 * PAGE_SIZE])
            .unwrap();
        assert!(writer.put(&mut big, b"\x00", b"").is_err());
        let big = writer.finish_bucket(big).unwrap();
        let empty = writer.bucket();
        let empty = writer.finish_bucket(empty).unwrap();
        let file = writer
            .finish(&[(b"big", big), (b"empty", empty)])
            .unwrap()
            .into_inner();
        assert_eq!(file.len() % PAGE_SIZE, 0);
        let db = Db::open(&file).unwrap();
        let mut seen = Vec::new();
        db.for_each(db.bucket(b"big").unwrap().unwrap(), &mut |k, v, _| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), items.len() + 1);
        assert_eq!(seen[..items.len()], items[..]);
        assert_eq!(seen[items.len()].1.len(), 3 * PAGE_SIZE);
        let mut none = 0;
        db.for_each(db.bucket(b"empty").unwrap().unwrap(), &mut |_, _, _| {
            none += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(none, 0);
    }
}
