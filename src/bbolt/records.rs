//! etcd's `key` bucket records, byte for byte as etcd 3.5 writes them: the
//! key is the revision (8-byte big-endian main, `_`, 8-byte big-endian sub,
//! and a trailing `t` for a deletion), the value a marshaled mvccpb.KeyValue
//! (a deletion's carries only the key). HashKV hashes these bytes and the
//! etcd snapshot writes them, so both are the same as etcd's.

use prost::Message;

use crate::backend::LogEntry;
use crate::proto::mvccpb::KeyValue;

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
