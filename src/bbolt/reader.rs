//! A small read-only reader of bbolt database files (the format of etcd's
//! backend and of `etcdctl snapshot save`), enough to list the key/value
//! pairs of a top-level bucket in key order. No maintained bbolt crate
//! exists for Rust; the format is little-endian pages:
//!
//! - pages 0 and 1 are meta pages (magic 0xED0CDAED, FNV-64a checksum); the
//!   valid one with the higher transaction id names the root bucket's page;
//! - every page starts with a 16-byte header: id u64, flags u16 (branch 0x01,
//!   leaf 0x02, meta 0x04, freelist 0x10), count u16, overflow u32 (a page
//!   and its overflow pages are contiguous);
//! - branch elements (pos u32, ksize u32, pgid u64) and leaf elements
//!   (flags u32, pos u32, ksize u32, vsize u32) follow it, `pos` counting
//!   from the element itself;
//! - a leaf element with flag 0x01 is a nested bucket whose value is a
//!   header (root pgid u64, sequence u64); root 0 means an inline bucket,
//!   whose page follows the header in the value.

use std::collections::HashSet;

use anyhow::{Context, bail};

pub(super) const MAGIC: u32 = 0xED0C_DAED;
pub(super) const PAGE_HEADER: usize = 16;
pub(super) const ELEMENT: usize = 16;
const BUCKET_HEADER: usize = 16;
pub(super) const BRANCH_PAGE: u16 = 0x01;
pub(super) const LEAF_PAGE: u16 = 0x02;
pub(super) const BUCKET_LEAF: u32 = 0x01;
/// Offset of the checksum in a meta page's body (the fields before it are summed).
pub(super) const META_CHECKSUM_AT: usize = 56;

/// True if `start` (a file's first bytes) is a bbolt meta page, as etcd's
/// snapshots and data files begin.
pub fn is_bbolt(start: &[u8]) -> bool {
    start.get(16..20) == Some(&MAGIC.to_le_bytes()[..])
}

/// An opened bbolt file, borrowed from its bytes.
pub struct Db<'a> {
    data: &'a [u8],
    page_size: usize,
    root: Bucket<'a>,
}

/// Where a bucket's B+tree is: a page of the file, or inline in its parent.
#[derive(Clone, Copy)]
pub struct Bucket<'a> {
    root: u64,
    inline: Option<&'a [u8]>,
}

fn u16_at(bytes: &[u8], at: usize) -> anyhow::Result<u16> {
    let slice = bytes.get(at..at + 2).context("bbolt file truncated")?;
    Ok(u16::from_le_bytes([slice[0], slice[1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> anyhow::Result<u32> {
    let slice = bytes.get(at..at + 4).context("bbolt file truncated")?;
    Ok(u32::from_le_bytes(slice.try_into()?))
}

fn u64_at(bytes: &[u8], at: usize) -> anyhow::Result<u64> {
    let slice = bytes.get(at..at + 8).context("bbolt file truncated")?;
    Ok(u64::from_le_bytes(slice.try_into()?))
}

/// FNV-1a, 64 bits (bbolt's meta checksum).
pub(super) fn fnv64a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A valid meta page's (txid, root bucket page), or None.
fn meta(page: &[u8]) -> Option<(u64, u64, usize)> {
    let body = page.get(PAGE_HEADER..PAGE_HEADER + META_CHECKSUM_AT + 8)?;
    let magic = u32_at(body, 0).ok()?;
    let checksum = u64_at(body, META_CHECKSUM_AT).ok()?;
    if magic != MAGIC || fnv64a(&body[..META_CHECKSUM_AT]) != checksum {
        return None;
    }
    let page_size = u32_at(body, 8).ok()? as usize;
    let root = u64_at(body, 16).ok()?;
    let txid = u64_at(body, 48).ok()?;
    Some((txid, root, page_size))
}

impl<'a> Db<'a> {
    /// Reads the meta pages of the file `data`.
    pub fn open(data: &'a [u8]) -> anyhow::Result<Db<'a>> {
        let first = meta(data);
        // The second meta page is at one page size, read from the first (or,
        // if the first is damaged, the usual sizes are tried).
        let sizes = match first {
            Some((_, _, size)) => vec![size],
            None => vec![4096, 8192, 16384, 65536],
        };
        let second = sizes
            .iter()
            .find_map(|size| data.get(*size..).and_then(meta));
        let (_, root, page_size) = match (first, second) {
            (Some(a), Some(b)) => {
                if a.0 >= b.0 {
                    a
                } else {
                    b
                }
            }
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => bail!("not a bbolt database (no valid meta page)"),
        };
        if page_size < 512 {
            bail!("bbolt page size {page_size} is implausible");
        }
        Ok(Db {
            data,
            page_size,
            root: Bucket { root, inline: None },
        })
    }

    /// The bytes of page `id` with its overflow pages. Offsets are checked,
    /// so a corrupt id or overflow count is an error, never an overflow.
    fn page(&self, id: u64) -> anyhow::Result<&'a [u8]> {
        let past_end = || format!("bbolt page {id} is past the end of the file");
        let start = usize::try_from(id)
            .ok()
            .and_then(|id| id.checked_mul(self.page_size))
            .with_context(past_end)?;
        let head = self
            .data
            .get(start..start.saturating_add(PAGE_HEADER))
            .with_context(past_end)?;
        let overflow = u32_at(head, 12)? as usize;
        let end = overflow
            .checked_add(1)
            .and_then(|pages| pages.checked_mul(self.page_size))
            .and_then(|len| len.checked_add(start))
            .with_context(past_end)?;
        self.data
            .get(start..end.min(self.data.len()))
            .with_context(past_end)
    }

    /// The root bucket, whose elements are the top-level buckets.
    pub fn bucket_root(&self) -> Bucket<'a> {
        self.root
    }

    /// The top-level bucket `name`, if there is one.
    pub fn bucket(&self, name: &[u8]) -> anyhow::Result<Option<Bucket<'a>>> {
        let mut found = None;
        self.for_each(self.root, &mut |key, value, flags| {
            if flags & BUCKET_LEAF != 0 && key == name {
                let root = u64_at(value, 0)?;
                let inline = if root == 0 {
                    Some(
                        value
                            .get(BUCKET_HEADER..)
                            .context("inline bucket truncated")?,
                    )
                } else {
                    None
                };
                found = Some(Bucket { root, inline });
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Calls `each(key, value, flags)` for every element of `bucket`, in key order.
    pub fn for_each(
        &self,
        bucket: Bucket<'a>,
        each: &mut dyn FnMut(&'a [u8], &'a [u8], u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut visited = HashSet::new();
        match bucket.inline {
            Some(page) => self.walk(page, each, 0, &mut visited),
            None => {
                visited.insert(bucket.root);
                self.walk(self.page(bucket.root)?, each, 0, &mut visited)
            }
        }
    }

    fn walk(
        &self,
        page: &'a [u8],
        each: &mut dyn FnMut(&'a [u8], &'a [u8], u32) -> anyhow::Result<()>,
        depth: usize,
        visited: &mut HashSet<u64>,
    ) -> anyhow::Result<()> {
        // A well-formed tree is shallow; a deep one is a loop in a corrupt file.
        if depth > 64 {
            bail!("bbolt tree too deep; the file is corrupt");
        }
        let flags = u16_at(page, 8)?;
        let count = u16_at(page, 10)? as usize;
        for index in 0..count {
            let at = PAGE_HEADER + index * ELEMENT;
            if flags & BRANCH_PAGE != 0 {
                let child = u64_at(page, at + 8)?;
                // In a tree every page has one parent: a page met twice is
                // a corrupt file, and walking it again could take forever.
                if !visited.insert(child) {
                    bail!("bbolt page {child} is referenced twice; the file is corrupt");
                }
                self.walk(self.page(child)?, each, depth + 1, visited)?;
            } else if flags & LEAF_PAGE != 0 {
                let element_flags = u32_at(page, at)?;
                let pos = at + u32_at(page, at + 4)? as usize;
                let key_len = u32_at(page, at + 8)? as usize;
                let value_len = u32_at(page, at + 12)? as usize;
                let key = page
                    .get(pos..pos + key_len)
                    .context("bbolt key past its page")?;
                let value = page
                    .get(pos + key_len..pos + key_len + value_len)
                    .context("bbolt value past its page")?;
                each(key, value, element_flags)?;
            } else {
                bail!("bbolt page with flags {flags:#x} where a branch or leaf was expected");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page: header, then `elements`, then the packed key/value bytes.
    fn leaf_page(id: u64, items: &[(&[u8], &[u8], u32)], size: usize) -> Vec<u8> {
        let mut page = vec![0u8; size];
        page[..8].copy_from_slice(&id.to_le_bytes());
        page[8..10].copy_from_slice(&LEAF_PAGE.to_le_bytes());
        page[10..12].copy_from_slice(&(items.len() as u16).to_le_bytes());
        let mut data = PAGE_HEADER + items.len() * ELEMENT;
        for (index, (key, value, flags)) in items.iter().enumerate() {
            let at = PAGE_HEADER + index * ELEMENT;
            page[at..at + 4].copy_from_slice(&flags.to_le_bytes());
            page[at + 4..at + 8].copy_from_slice(&((data - at) as u32).to_le_bytes());
            page[at + 8..at + 12].copy_from_slice(&(key.len() as u32).to_le_bytes());
            page[at + 12..at + 16].copy_from_slice(&(value.len() as u32).to_le_bytes());
            page[data..data + key.len()].copy_from_slice(key);
            page[data + key.len()..data + key.len() + value.len()].copy_from_slice(value);
            data += key.len() + value.len();
        }
        page.truncate(size.max(data));
        page
    }

    fn meta_page(id: u64, root: u64, txid: u64, size: usize) -> Vec<u8> {
        let mut page = vec![0u8; size];
        page[..8].copy_from_slice(&id.to_le_bytes());
        page[8..10].copy_from_slice(&0x04u16.to_le_bytes());
        let body = &mut page[PAGE_HEADER..];
        body[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        body[4..8].copy_from_slice(&2u32.to_le_bytes());
        body[8..12].copy_from_slice(&(size as u32).to_le_bytes());
        body[16..24].copy_from_slice(&root.to_le_bytes());
        body[48..56].copy_from_slice(&txid.to_le_bytes());
        let sum = fnv64a(&body[..META_CHECKSUM_AT]);
        body[56..64].copy_from_slice(&sum.to_le_bytes());
        page
    }

    /// A file with a root leaf at page 3 (meta 1 newer and valid), an older
    /// meta 0 naming a bogus root, a branch at page 4 over leaves 5 and 6
    /// for bucket "big", and an inline bucket "small".
    #[test]
    fn reads_buckets_through_branches_and_inline_pages() {
        const SIZE: usize = 512;
        let mut inline = Vec::new();
        inline.extend_from_slice(&0u64.to_le_bytes());
        inline.extend_from_slice(&0u64.to_le_bytes());
        inline.extend(leaf_page(0, &[(b"x", b"1", 0)], 64));
        let mut big = Vec::new();
        big.extend_from_slice(&4u64.to_le_bytes());
        big.extend_from_slice(&0u64.to_le_bytes());
        let mut file = meta_page(0, 99, 1, SIZE);
        file.extend(meta_page(1, 3, 2, SIZE));
        file.extend(vec![0u8; SIZE]);
        file.extend(leaf_page(
            3,
            &[
                (b"big", &big, BUCKET_LEAF),
                (b"small", &inline, BUCKET_LEAF),
            ],
            SIZE,
        ));
        let mut branch = vec![0u8; SIZE];
        branch[8..10].copy_from_slice(&BRANCH_PAGE.to_le_bytes());
        branch[10..12].copy_from_slice(&2u16.to_le_bytes());
        for (index, child) in [5u64, 6].iter().enumerate() {
            let at = PAGE_HEADER + index * ELEMENT;
            branch[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
        }
        file.extend(branch);
        file.extend(leaf_page(5, &[(b"a", b"va", 0), (b"b", b"vb", 0)], SIZE));
        file.extend(leaf_page(6, &[(b"c", b"vc", 0)], SIZE));

        let db = Db::open(&file).unwrap();
        let mut seen = Vec::new();
        let bucket = db.bucket(b"big").unwrap().unwrap();
        db.for_each(bucket, &mut |k, v, _| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = [("a", "va"), ("b", "vb"), ("c", "vc")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(seen, expected);
        let small = db.bucket(b"small").unwrap().unwrap();
        let mut seen = Vec::new();
        db.for_each(small, &mut |k, v, _| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(b"x".to_vec(), b"1".to_vec())]);
        assert!(db.bucket(b"none").unwrap().is_none());
    }

    /// A branch page that names itself is refused, not walked forever.
    #[test]
    fn refuses_a_page_met_twice() {
        const SIZE: usize = 512;
        let mut file = meta_page(0, 2, 1, SIZE);
        file.extend(meta_page(1, 2, 1, SIZE));
        let mut branch = vec![0u8; SIZE];
        branch[..8].copy_from_slice(&2u64.to_le_bytes());
        branch[8..10].copy_from_slice(&BRANCH_PAGE.to_le_bytes());
        branch[10..12].copy_from_slice(&2u16.to_le_bytes());
        for index in 0..2 {
            let at = PAGE_HEADER + index * ELEMENT;
            branch[at + 8..at + 16].copy_from_slice(&2u64.to_le_bytes());
        }
        file.extend(branch);
        let db = Db::open(&file).unwrap();
        let error = db
            .for_each(db.bucket_root(), &mut |_, _, _| Ok(()))
            .unwrap_err();
        assert!(error.to_string().contains("referenced twice"), "{error}");
    }

    #[test]
    fn refuses_files_without_a_valid_meta_page() {
        assert!(Db::open(b"SQLite format 3\0 and more").is_err());
        let mut damaged = meta_page(0, 3, 1, 4096);
        damaged[PAGE_HEADER + 20] ^= 1;
        assert!(Db::open(&damaged).is_err());
    }
}
