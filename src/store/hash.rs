//! Hash and HashKV.
//!
//! HashKV is etcd's: a CRC-32C (Castagnoli) of the bucket name `key`, then
//! the bbolt key and value (`crate::bbolt::records`) of every record etcd's HashByRev
//! (3.5, server/mvcc/kvstore.go) takes, in (revision, sub) order: each row
//! with a revision in `(compact, rev]`, tombstones included, and below that
//! the rows compaction keeps that are still each key's latest change at
//! `rev` (etcd's `kvindex.Keep(rev)`). When no key at all is alive at `rev`
//! that keep set is empty and etcd skips the filter, hashing every row its
//! compaction kept (each key's state at the compact revision): so does this.
//! (From 3.5.16 on that compaction also keeps a tombstone at the compact
//! revision, which the hasher skips, `kvHasher.WriteKeyValue` in
//! server/storage/mvcc/hash.go; the digest a 3.6+ compaction keeps differs,
//! see [`hash_kv_before_compaction`].)
//! The same history therefore gives the same value on etcd and on cetera,
//! whatever the backend.
//!
//! Hash is cetera's own: etcd's hashes every bbolt bucket, members and
//! cluster ids included, so two etcd clusters disagree on it anyway; cetera
//! hashes its counters, log and leases in one canonical encoding.
//!
//! Rows are read page by page. Only the (mod revision, key) of the keys
//! unchanged since the compact revision are held, as etcd holds its keep map.

use sha2::{Digest, Sha256};

use super::error::{StoreError, StoreResult};
use crate::backend::{LogEntry, ReadAt, ReadTxn};
use crate::bbolt::records::{entry_key, entry_value, for_each_log_entry, unchanged_keys};

/// etcd's HashKV digest being built.
struct EtcdHasher(u32);

impl EtcdHasher {
    /// etcd writes the bucket name first.
    fn new() -> Self {
        EtcdHasher(crc32c::crc32c(b"key"))
    }

    fn entry(&mut self, entry: &LogEntry) {
        self.0 = crc32c::crc32c_append(self.0, &entry_key(entry));
        self.0 = crc32c::crc32c_append(self.0, &entry_value(entry));
    }
}

/// A digest being built over cetera's canonical encoding (for Hash).
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

    fn entry(&mut self, entry: &LogEntry) {
        let kv = &entry.kv;
        self.0.update([b'L', u8::from(entry.deleted)]);
        Self::bytes(&mut self.0, &kv.key);
        Self::bytes(&mut self.0, &kv.value);
        self.int(kv.create_revision);
        self.int(kv.mod_revision);
        self.int(kv.version);
        self.int(kv.lease);
        self.int(entry.sub);
    }

    /// The first four bytes of the SHA-256, as the protocol's hash is 32 bits.
    fn finish(self) -> u32 {
        let digest = self.0.finalize();
        u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
    }
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
    /// The revision hashed up to (etcd 3.6's `hash_revision`).
    pub revision: i64,
}

/// etcd HashKV on one consistent view. `revision` 0 means current; a
/// revision at or below the compact revision, or above the current one, is
/// refused as etcd 3.5 refuses it (note: at the compact revision too, unlike
/// Range); with `at_compact`, the compact revision itself is hashed, as etcd
/// 3.6 and later do.
pub async fn hash_kv<T: ReadTxn>(
    txn: &mut T,
    revision: i64,
    at_compact: bool,
) -> StoreResult<KvHash> {
    let revs = txn.revisions().await?;
    if revision > 0 && (revision < revs.compact || (revision == revs.compact && !at_compact)) {
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
    hash_kv_over(txn, revision, revs.current, revs.compact, KeepSet::Live).await
}

/// The digest etcd 3.6 and later keep for a compaction at `revision`,
/// taken before its history is removed, over the history since `previous`,
/// the compaction before it (the compact revision the digest names). Its
/// hasher (`scheduleCompaction` in server/storage/mvcc/kvstore_compaction.go)
/// filters on the revisions the index compaction keeps (`keyIndex.compact`),
/// which from 3.5.16 on include a tombstone at `revision`; HashKV's own keep
/// set (`keyIndex.keep`) drops it. So with no key alive at `revision` but
/// one deleted there the filter stays on and no row at or below `previous`
/// is hashed. The compaction may already be recorded (`revision` the compact
/// revision): what counts is that no row above `previous` is removed yet.
pub async fn hash_kv_before_compaction<T: ReadTxn>(
    txn: &mut T,
    revision: i64,
    previous: i64,
) -> StoreResult<KvHash> {
    let revs = txn.revisions().await?;
    if revision > revs.current {
        return Err(StoreError::FutureRevision);
    }
    hash_kv_over(txn, revision, revs.current, previous, KeepSet::Compaction).await
}

/// Which keep set filters the rows at or below the compact revision.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeepSet {
    /// HashKV's (`treeIndex.Keep`): each live key's latest change.
    Live,
    /// A compaction's (`treeIndex.Compact`): those, and the tombstones at
    /// the compaction's revision.
    Compaction,
}

/// The digest at `revision` (> 0 hashes rows) of a store at `current`
/// whose history at or below `compact` is compacted.
async fn hash_kv_over<T: ReadTxn>(
    txn: &mut T,
    revision: i64,
    current: i64,
    compact: i64,
    keep_set: KeepSet,
) -> StoreResult<KvHash> {
    let mut hasher = EtcdHasher::new();
    // A negative revision hashes nothing but the bucket name, as in etcd.
    if revision > 0 {
        hash_kept_rows(txn, revision, current, compact, keep_set, &mut hasher).await?;
        for_each_log_entry(txn, compact, revision, |entry| hasher.entry(&entry)).await?;
    }
    Ok(KvHash {
        hash: hasher.0,
        current,
        compact,
        revision,
    })
}

/// How a read names revision `revision` of a store at `current`.
fn read_at(revision: i64, current: i64) -> ReadAt {
    if revision >= current {
        ReadAt::Current
    } else {
        ReadAt::Revision(revision)
    }
}

/// Hashes the rows at or below `compact` that etcd's HashKV at `revision`
/// takes: those compaction kept that are still their key's latest change at
/// `revision`, or, when the keep set is empty (no key alive at `revision`,
/// and for [`KeepSet::Compaction`] none deleted there), all that compaction kept.
async fn hash_kept_rows<T: ReadTxn>(
    txn: &mut T,
    revision: i64,
    current: i64,
    compact: i64,
    keep_set: KeepSet,
    hasher: &mut EtcdHasher,
) -> StoreResult<()> {
    if compact <= 0 {
        return Ok(());
    }
    let (mut kept, any_alive) = unchanged_keys(txn, read_at(revision, current), compact).await?;
    let keep_set_empty = !any_alive
        && match keep_set {
            KeepSet::Live => true,
            KeepSet::Compaction => !deletes_at(txn, revision).await?,
        };
    if keep_set_empty {
        kept = unchanged_keys(txn, read_at(compact, current), compact)
            .await?
            .0;
    }
    if kept.is_empty() {
        return Ok(());
    }
    // Physical compaction may not have reached `compact` yet: rows it will
    // remove are not the key's state in `kept`, so they are skipped too.
    for_each_log_entry(txn, 0, compact, |mut entry| {
        if entry.deleted {
            return;
        }
        let probe = (entry.kv.mod_revision, std::mem::take(&mut entry.kv.key));
        if kept.contains(&probe) {
            entry.kv.key = probe.1;
            hasher.entry(&entry);
        }
    })
    .await?;
    Ok(())
}

/// Whether revision `revision` deleted a key.
async fn deletes_at<T: ReadTxn>(txn: &mut T, revision: i64) -> StoreResult<bool> {
    let mut deletes = false;
    for_each_log_entry(txn, revision - 1, revision, |entry| {
        deletes |= entry.deleted
    })
    .await?;
    Ok(deletes)
}

/// The HashKV that the store would have if it were compacted at its current
/// revision: `cetera migrate` without history compares it with the target's.
pub async fn hash_kv_if_compacted<T: ReadTxn>(txn: &mut T) -> StoreResult<u32> {
    let revs = txn.revisions().await?;
    let mut hasher = EtcdHasher::new();
    if revs.current > 0 {
        let (kept, _) = unchanged_keys(txn, ReadAt::Current, revs.current).await?;
        if !kept.is_empty() {
            for_each_log_entry(txn, 0, revs.current, |mut entry| {
                let probe = (entry.kv.mod_revision, std::mem::take(&mut entry.kv.key));
                if !entry.deleted && kept.contains(&probe) {
                    entry.kv.key = probe.1;
                    hasher.entry(&entry);
                }
            })
            .await?;
        }
    }
    Ok(hasher.0)
}

/// etcd's HashKV of rows fed in any order: each row's CRC is kept with its
/// revision and length, and the CRCs are combined in (revision, sub) order
/// at the end (CRC-32C is linear), 32 bytes a row. How an import checks what
/// it wrote without reading it twice.
#[derive(Default)]
pub struct LiveKeysHasher(Vec<(i64, i64, u32, u64)>);

impl LiveKeysHasher {
    /// Adds a row that HashKV of the target hashes.
    pub fn add(&mut self, entry: &LogEntry) {
        let key = entry_key(entry);
        let value = entry_value(entry);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&key), &value);
        let len = (key.len() + value.len()) as u64;
        self.0.push((entry.kv.mod_revision, entry.sub, crc, len));
    }

    /// The digest.
    pub fn finish(mut self) -> u32 {
        self.0
            .sort_unstable_by_key(|&(main, sub, _, _)| (main, sub));
        self.0
            .iter()
            .fold(crc32c::crc32c(b"key"), |crc, &(_, _, row, len)| {
                crc32c::crc32c_combine(crc, row, len as usize)
            })
    }
}

/// etcd Hash: a digest of the whole store — counters, every log row and
/// every lease (id and granted TTL; deadlines are wall-clock times that
/// differ between equal stores). Settings such as the cluster id are left out.
/// Returns the digest and the current revision.
pub async fn hash_all<T: ReadTxn>(txn: &mut T) -> StoreResult<(u32, i64)> {
    let revs = txn.revisions().await?;
    // Before the log, with the revisions (see `ReadTxn`).
    let mut leases = txn.leases().await?;
    let mut hasher = CanonicalHasher::new(b"cetera-hash-1");
    hasher.int(revs.current);
    hasher.int(revs.compact);
    for_each_log_entry(txn, 0, revs.current, |entry| hasher.entry(&entry)).await?;
    leases.sort_by_key(|lease| lease.id);
    for lease in leases {
        hasher.0.update(b"E");
        hasher.int(lease.id);
        hasher.int(lease.ttl);
    }
    Ok((hasher.finish(), revs.current))
}
