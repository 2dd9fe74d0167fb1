//! Hash and HashKV: a digest of the store's data over one canonical encoding,
//! so that equal data gives equal hashes on every backend (the values cannot
//! match etcd's, which hashes bbolt's bytes).
//!
//! HashKV(rev) covers what etcd's covers: every log row with a revision in
//! `(compact, rev]`, plus, for each key alive at `rev` whose latest change is
//! at or below `compact`, that surviving row. Rows are read page by page, so
//! a large store is never held in memory.

use sha2::{Digest, Sha256};

use super::error::{StoreError, StoreResult};
use crate::backend::LOG_PAGE_REVISIONS;
use crate::backend::{KeyRange, LogEntry, ReadAt, ReadTxn};
use crate::proto::mvccpb::KeyValue;

/// Keys read per range query.
const KEY_PAGE: usize = 1000;

/// A digest being built over the canonical encoding.
struct CanonicalHasher(Sha256);

impl CanonicalHasher {
    fn new(domain: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        Self::bytes(&mut hasher, domain);
        CanonicalHasher(hasher)
    }

    /// Length-prefixed, so no two different sequences encode the same.
    fn bytes(hasher: &mut Sha256, bytes: &[u8]) {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    }

    fn int(&mut self, value: i64) {
        self.0.update(value.to_be_bytes());
    }

    /// One key state: a tag saying which part of the hash it belongs to,
    /// then every field of the row.
    fn row(&mut self, tag: u8, kv: &KeyValue, sub: i64, deleted: bool) {
        self.0.update([tag, u8::from(deleted)]);
        Self::bytes(&mut self.0, &kv.key);
        Self::bytes(&mut self.0, &kv.value);
        self.int(kv.create_revision);
        self.int(kv.mod_revision);
        self.int(kv.version);
        self.int(kv.lease);
        self.int(sub);
    }

    fn entry(&mut self, entry: &LogEntry) {
        self.row(b'L', &entry.kv, entry.sub, entry.deleted);
    }

    /// The first four bytes of the SHA-256, as the protocol's hash is 32 bits.
    fn finish(self) -> u32 {
        let digest = self.0.finalize();
        u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
    }
}

/// Feeds every log row with `after < revision <= through` to `each`, in
/// (revision, sub) order, one page of revisions at a time.
pub(crate) async fn for_each_log_entry<T: ReadTxn>(
    txn: &mut T,
    after: i64,
    through: i64,
    mut each: impl FnMut(LogEntry),
) -> StoreResult<()> {
    let mut from = after.max(0);
    while from < through {
        let to = (from + LOG_PAGE_REVISIONS).min(through);
        for entry in txn.log_entries(from, to).await? {
            each(entry);
        }
        from = to;
    }
    Ok(())
}

/// The result of HashKV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    /// The digest.
    pub hash: u32,
    /// The store's current revision when it was taken.
    pub current: i64,
    /// The compact revision then.
    pub compact: i64,
}

/// etcd HashKV on one consistent view. `revision` 0 means current; a
/// revision at or below the compact revision, or above the current one, is
/// refused as etcd refuses it (note: at the compact revision too, unlike Range).
pub async fn hash_kv<T: ReadTxn>(txn: &mut T, revision: i64) -> StoreResult<KvHash> {
    let revs = txn.revisions().await?;
    if revision > 0 && revision <= revs.compact {
        return Err(StoreError::Compacted);
    }
    if revision > revs.current {
        return Err(StoreError::FutureRevision);
    }
    let revision = if revision == 0 {
        revs.current
    } else {
        revision
    };
    let mut hasher = CanonicalHasher::new(b"cetera-hashkv-1");
    // A negative revision hashes nothing, as in etcd.
    if revision > 0 {
        if revs.compact > 0 {
            let at = if revision == revs.current {
                ReadAt::Current
            } else {
                ReadAt::Revision(revision)
            };
            hash_surviving_rows(txn, at, revs.compact, &mut hasher).await?;
        }
        for_each_log_entry(txn, revs.compact, revision, |entry| hasher.entry(&entry)).await?;
    }
    Ok(KvHash {
        hash: hasher.finish(),
        current: revs.current,
        compact: revs.compact,
    })
}

/// Feeds the key states alive at `at` whose latest change is at or below
/// `compact` to `hasher`, one page of keys at a time.
async fn hash_surviving_rows<T: ReadTxn>(
    txn: &mut T,
    at: ReadAt,
    compact: i64,
    hasher: &mut CanonicalHasher,
) -> StoreResult<()> {
    let mut keys = KeyRange {
        start: Vec::new(),
        end: None,
    };
    loop {
        let page = txn.range(&keys, at, KEY_PAGE, false).await?;
        for kv in page.iter().filter(|kv| kv.mod_revision <= compact) {
            hasher.row(b'S', kv, 0, false);
        }
        match page.last() {
            Some(last) if page.len() == KEY_PAGE => {
                keys.start = last.key.clone();
                keys.start.push(0);
            }
            _ => return Ok(()),
        }
    }
}

/// The HashKV that the store would have if it were compacted at its current
/// revision: a digest of the live keys alone. `cetera migrate` without
/// history compares it with the target's HashKV.
pub async fn hash_kv_if_compacted<T: ReadTxn>(txn: &mut T) -> StoreResult<u32> {
    let revs = txn.revisions().await?;
    let mut hasher = CanonicalHasher::new(b"cetera-hashkv-1");
    if revs.current > 0 {
        hash_surviving_rows(txn, ReadAt::Current, revs.current, &mut hasher).await?;
    }
    Ok(hasher.finish())
}

/// Builds, from live keys fed in key order, the HashKV that a store holding
/// exactly those keys, compacted at its current revision, has: how an import
/// from etcd checks what it wrote without reading it twice.
pub struct LiveKeysHasher(CanonicalHasher);

impl Default for LiveKeysHasher {
    fn default() -> Self {
        LiveKeysHasher(CanonicalHasher::new(b"cetera-hashkv-1"))
    }
}

impl LiveKeysHasher {
    /// Adds the next key (keys must come in key order).
    pub fn add(&mut self, kv: &KeyValue) {
        self.0.row(b'S', kv, 0, false);
    }

    /// Adds the next log row after the compact revision (after every live
    /// key, in (revision, sub) order): the HashKV of a store with history,
    /// for an import from an etcd snapshot file.
    pub fn add_log_entry(&mut self, entry: &LogEntry) {
        self.0.entry(entry);
    }

    /// The digest.
    pub fn finish(self) -> u32 {
        self.0.finish()
    }
}

/// etcd Hash: a digest of the whole store — counters, every log row and
/// every lease (id and granted TTL; deadlines are wall-clock times that
/// differ between equal stores). Settings such as the cluster id are left out.
/// Returns the digest and the current revision.
pub async fn hash_all<T: ReadTxn>(txn: &mut T) -> StoreResult<(u32, i64)> {
    let revs = txn.revisions().await?;
    let mut hasher = CanonicalHasher::new(b"cetera-hash-1");
    hasher.int(revs.current);
    hasher.int(revs.compact);
    for_each_log_entry(txn, 0, revs.current, |entry| hasher.entry(&entry)).await?;
    let mut leases = txn.leases().await?;
    leases.sort_by_key(|lease| lease.id);
    for lease in leases {
        hasher.0.update(b"E");
        hasher.int(lease.id);
        hasher.int(lease.ttl);
    }
    Ok((hasher.finish(), revs.current))
}
