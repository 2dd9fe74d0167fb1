//! etcd's bucket records, byte for byte as etcd 3.5 writes them.
//!
//! The `key` bucket: the key is the revision (8-byte big-endian main, `_`,
//! 8-byte big-endian sub, and a trailing `t` for a deletion), the value a
//! marshaled mvccpb.KeyValue (a deletion's carries only the key). HashKV
//! (`crate::store::hash`) hashes these bytes and the etcd snapshot writes
//! them, so both are the same as etcd's; both walk the log in that key
//! order (`for_each_log_entry`) and keep, below the compact revision, what
//! etcd's compaction keeps (`unchanged_keys`).
//!
//! The `lease` bucket: 8-byte big-endian id -> leasepb.Lease (`LeaseRecord`).

use std::collections::HashSet;

use prost::Message;

use crate::backend::{KeyRange, LOG_PAGE_REVISIONS, LogEntry, ReadAt, ReadTxn};
use crate::proto::mvccpb::KeyValue;

/// Keys read per page when looking for the keys compaction keeps.
const KEY_PAGE: usize = 1000;

/// Length of a revision key without the tombstone mark.
pub const REVISION_KEY_BYTES: usize = 17;

/// The bbolt key of a change: main and sub revision, and `t` for a deletion.
pub fn revision_key(main: i64, sub: i64, deleted: bool) -> Vec<u8> {
    let mut key = Vec::with_capacity(REVISION_KEY_BYTES + 1);
    key.extend_from_slice(&main.to_be_bytes());
    key.push(b'_');
    key.extend_from_slice(&sub.to_be_bytes());
    if deleted {
        key.push(b't');
    }
    key
}

/// The bbolt key of a log row.
pub fn entry_key(entry: &LogEntry) -> Vec<u8> {
    revision_key(entry.kv.mod_revision, entry.sub, entry.deleted)
}

/// The bbolt value of a log row: the KeyValue as gogo-protobuf marshals it
/// (fields in number order, zero values left out, which prost does alike);
/// a deletion keeps only the key, as etcd's delete writes it.
pub fn entry_value(entry: &LogEntry) -> Vec<u8> {
    if entry.deleted {
        KeyValue {
            key: entry.kv.key.clone(),
            ..Default::default()
        }
        .encode_to_vec()
    } else {
        entry.kv.encode_to_vec()
    }
}

/// Feeds every log row with `after < revision <= through` to `each`, in
/// (revision, sub) order, one page of revisions at a time.
pub async fn for_each_log_entry<T: ReadTxn>(
    txn: &mut T,
    after: i64,
    through: i64,
    mut each: impl FnMut(LogEntry),
) -> anyhow::Result<()> {
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

/// The (mod revision, key) of every key alive at `at` whose latest change
/// is at or below `compact`, and whether any key at all is alive at `at`.
pub async fn unchanged_keys<T: ReadTxn>(
    txn: &mut T,
    at: ReadAt,
    compact: i64,
) -> anyhow::Result<(HashSet<(i64, Vec<u8>)>, bool)> {
    let mut kept = HashSet::new();
    let mut any_alive = false;
    let mut keys = KeyRange {
        start: Vec::new(),
        end: None,
    };
    loop {
        let page = txn.range(&keys, at, KEY_PAGE, true).await?;
        any_alive |= !page.is_empty();
        let next = match page.last() {
            Some(last) if page.len() == KEY_PAGE => {
                let mut next = last.key.clone();
                next.push(0);
                Some(next)
            }
            _ => None,
        };
        for kv in page.into_iter().filter(|kv| kv.mod_revision <= compact) {
            kept.insert((kv.mod_revision, kv.key));
        }
        match next {
            Some(next) => keys.start = next,
            None => return Ok((kept, any_alive)),
        }
    }
}

/// etcd's leasepb.Lease, as stored in the `lease` bucket (read by
/// `crate::migrate::etcd_snapshot`, written by `snapshot`).
#[derive(Clone, PartialEq, Message)]
pub struct LeaseRecord {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    /// Set only by etcd's lease checkpoints; 0 (left out) otherwise.
    #[prost(int64, tag = "3")]
    pub remaining_ttl: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_etcd() {
        let put = LogEntry {
            kv: KeyValue {
                key: b"a".to_vec(),
                create_revision: 2,
                mod_revision: 3,
                version: 2,
                value: b"v".to_vec(),
                lease: 0,
            },
            sub: 1,
            deleted: false,
        };
        assert_eq!(
            entry_key(&put),
            [0, 0, 0, 0, 0, 0, 0, 3, b'_', 0, 0, 0, 0, 0, 0, 0, 1]
        );
        // gogo's bytes for KeyValue{Key:"a",CreateRevision:2,ModRevision:3,Version:2,Value:"v"}.
        assert_eq!(
            entry_value(&put),
            [0x0a, 1, b'a', 0x10, 2, 0x18, 3, 0x20, 2, 0x2a, 1, b'v']
        );
        let delete = LogEntry {
            kv: KeyValue {
                key: b"a".to_vec(),
                mod_revision: 4,
                ..Default::default()
            },
            sub: 0,
            deleted: true,
        };
        assert_eq!(entry_key(&delete).last(), Some(&b't'));
        assert_eq!(entry_value(&delete), [0x0a, 1, b'a']);
    }
}
