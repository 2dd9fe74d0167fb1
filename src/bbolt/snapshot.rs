//! The etcd v3 snapshot the Snapshot RPC streams: a bbolt file with etcd
//! 3.5's buckets and records, written with `writer` from one read
//! transaction, so that `etcdutl snapshot status` and `snapshot restore`
//! take it as they take etcd's own.
//!
//! - `key`: every log row, keyed and encoded as etcd (`records`);
//!   at or below the compact revision only what etcd's compaction keeps
//!   (each key alive there, at its latest change), even while cetera's
//!   physical compaction is still on its way.
//! - `meta`: `consistent_index` and `term` (8-byte big-endian), and, once
//!   compacted, `scheduledCompactRev` and `finishedCompactRev` (a revision key).
//! - `lease`: 8-byte big-endian id -> leasepb.Lease{ID, TTL} (etcd restarts
//!   every lease's TTL on restore, as it does here).
//! - `auth`: `authRevision` (8-byte big-endian) and, if on, `enabled` = 1;
//!   `authUsers`, `authRoles`: name -> authpb record, as cetera stores them.
//! - `alarm`: marshaled AlarmMember -> empty.
//! - `cluster`: `clusterVersion` = `3.5.0`.
//! - `members`, `members_removed`: empty. `etcdutl snapshot restore` throws
//!   the members away and writes those of `--initial-cluster`.
//!
//! The log is read page by page and written as its leaf pages fill, so the
//! store is never held in memory.

use std::collections::HashSet;
use std::io::{Seek, Write};

use prost::Message;

use super::records::{
    LeaseRecord, entry_key, entry_value, for_each_log_entry, revision_key, unchanged_keys,
};
use super::writer::{BboltWriter, BucketWriter};
use crate::backend::settings::{AUTH_ENABLED, AUTH_REVISION};
use crate::backend::{AuthKind, ReadAt, ReadTxn};
use crate::proto::etcdserverpb::AlarmMember;

/// The cluster version etcd 3.5 records.
const CLUSTER_VERSION: &[u8] = b"3.5.0";

/// Writes a bucket holding `items`, which are sorted here.
fn small_bucket<W: Write + Seek>(
    writer: &mut BboltWriter<W>,
    mut items: Vec<(Vec<u8>, Vec<u8>)>,
) -> anyhow::Result<u64> {
    items.sort();
    let mut bucket = writer.bucket();
    for (key, value) in &items {
        writer.put(&mut bucket, key, value)?;
    }
    writer.finish_bucket(bucket)
}

/// Writes the etcd snapshot of the store seen by `txn` to `file`.
pub async fn write<T: ReadTxn, W: Write + Seek>(txn: &mut T, file: W) -> anyhow::Result<W> {
    let revs = txn.revisions().await?;
    // All but the log first, with the revisions: a long read of the log may
    // move on to a later snapshot of the rest (see `ReadTxn`).
    let leases = txn.leases().await?;
    let auth_revision = txn.setting(AUTH_REVISION).await?;
    let auth_enabled = txn.setting(AUTH_ENABLED).await?;
    let users = txn.auth_records(AuthKind::User).await?;
    let roles = txn.auth_records(AuthKind::Role).await?;
    let alarms = txn.alarms().await?;
    let mut writer = BboltWriter::new(file)?;

    let mut key = writer.bucket();
    write_key_bucket(txn, &mut writer, &mut key).await?;
    let key = writer.finish_bucket(key)?;

    let mut meta = vec![
        (
            b"consistent_index".to_vec(),
            (revs.current as u64).to_be_bytes().to_vec(),
        ),
        (b"term".to_vec(), 1u64.to_be_bytes().to_vec()),
    ];
    if revs.compact > 0 {
        for name in [&b"scheduledCompactRev"[..], b"finishedCompactRev"] {
            meta.push((name.to_vec(), revision_key(revs.compact, 0, false)));
        }
    }
    let meta = small_bucket(&mut writer, meta)?;

    let leases = leases
        .into_iter()
        .map(|lease| {
            // As etcd writes a lease without checkpoints: no remaining TTL.
            let record = LeaseRecord {
                id: lease.id,
                ttl: lease.ttl,
                remaining_ttl: 0,
            };
            (lease.id.to_be_bytes().to_vec(), record.encode_to_vec())
        })
        .collect();
    let lease = small_bucket(&mut writer, leases)?;

    let revision = auth_revision.unwrap_or(1).max(1) as u64;
    let mut auth = vec![(b"authRevision".to_vec(), revision.to_be_bytes().to_vec())];
    // etcd writes the flag when auth is first enabled; a store never
    // enabled has none, and "disabled" reads the same either way.
    if auth_enabled.unwrap_or(0) != 0 {
        auth.push((b"enabled".to_vec(), vec![1]));
    }
    let auth = small_bucket(&mut writer, auth)?;
    let users = small_bucket(&mut writer, users)?;
    let roles = small_bucket(&mut writer, roles)?;

    let alarms = alarms
        .into_iter()
        .map(|row| {
            let member = AlarmMember {
                member_id: row.member_id as u64,
                alarm: row.alarm,
            };
            (member.encode_to_vec(), Vec::new())
        })
        .collect();
    let alarm = small_bucket(&mut writer, alarms)?;
    let cluster = small_bucket(
        &mut writer,
        vec![(b"clusterVersion".to_vec(), CLUSTER_VERSION.to_vec())],
    )?;
    let members = small_bucket(&mut writer, Vec::new())?;
    let members_removed = small_bucket(&mut writer, Vec::new())?;

    writer.finish(&[
        (b"alarm", alarm),
        (b"auth", auth),
        (b"authRoles", roles),
        (b"authUsers", users),
        (b"cluster", cluster),
        (b"key", key),
        (b"lease", lease),
        (b"members", members),
        (b"members_removed", members_removed),
        (b"meta", meta),
    ])
}

/// Writes the `key` bucket: the log page by page, in (revision, sub) order,
/// which is the order of etcd's revision keys.
async fn write_key_bucket<T: ReadTxn, W: Write + Seek>(
    txn: &mut T,
    writer: &mut BboltWriter<W>,
    bucket: &mut BucketWriter,
) -> anyhow::Result<()> {
    let revs = txn.revisions().await?;
    // Rows physical compaction has yet to remove are left out, as etcd's
    // compaction removes them: below the compact revision, only each key's
    // state there survives.
    let kept: Option<HashSet<(i64, Vec<u8>)>> = if revs.compacted_through < revs.compact {
        let at = if revs.compact >= revs.current {
            ReadAt::Current
        } else {
            ReadAt::Revision(revs.compact)
        };
        Some(unchanged_keys(txn, at, revs.compact).await?.0)
    } else {
        None
    };
    let mut failed = None;
    for_each_log_entry(txn, 0, revs.current, |mut entry| {
        if failed.is_some() {
            return;
        }
        if let Some(kept) = kept
            .as_ref()
            .filter(|_| entry.kv.mod_revision <= revs.compact)
        {
            let probe = (entry.kv.mod_revision, std::mem::take(&mut entry.kv.key));
            if entry.deleted || !kept.contains(&probe) {
                return;
            }
            entry.kv.key = probe.1;
        }
        if let Err(error) = writer.put(bucket, &entry_key(&entry), &entry_value(&entry)) {
            failed = Some(error);
        }
    })
    .await?;
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sqlite::Sqlite;
    use crate::backend::{Backend, LogEntry, Revisions, WriteTxn};
    use crate::bbolt::reader::Db;
    use crate::proto::mvccpb::KeyValue;

    fn put(key: &str, revision: i64, create: i64, version: i64) -> LogEntry {
        LogEntry {
            kv: KeyValue {
                key: key.into(),
                create_revision: create,
                mod_revision: revision,
                version,
                value: b"v".to_vec(),
                lease: 0,
            },
            sub: 0,
            deleted: false,
        }
    }

    /// Compacted at 5 with none of the history removed yet: the snapshot
    /// holds only what etcd's compaction keeps (a@4, c@5, and everything
    /// after 5), as a store whose compaction had finished would.
    #[tokio::test]
    async fn rows_a_pending_compaction_removes_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Sqlite::open(&dir.path().join("state.db")).unwrap();
        let mut txn = backend.write().await.unwrap();
        let rows = [
            put("a", 2, 2, 1),
            put("b", 3, 3, 1),
            put("a", 4, 2, 2),
            LogEntry {
                kv: KeyValue {
                    key: b"b".to_vec(),
                    mod_revision: 5,
                    ..Default::default()
                },
                sub: 0,
                deleted: true,
            },
            LogEntry {
                sub: 1,
                ..put("c", 5, 5, 1)
            },
            put("a", 6, 2, 3),
        ];
        for row in &rows {
            txn.append(row).await.unwrap();
        }
        txn.set_revisions(Revisions {
            current: 6,
            compact: 5,
            compacted_through: 0,
        })
        .await
        .unwrap();
        txn.commit().await.unwrap();
        let mut read = backend.read().await.unwrap();
        let file = write(&mut read, std::io::Cursor::new(Vec::new()))
            .await
            .unwrap()
            .into_inner();
        let db = Db::open(&file).unwrap();
        let mut revisions = Vec::new();
        db.for_each(db.bucket(b"key").unwrap().unwrap(), &mut |k, _, _| {
            revisions.push((i64::from_be_bytes(k[..8].try_into().unwrap()), k.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(revisions, vec![(4, 17), (5, 17), (6, 17)]);
        let mut meta = Vec::new();
        db.for_each(db.bucket(b"meta").unwrap().unwrap(), &mut |k, v, _| {
            meta.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        assert!(meta.contains(&(b"finishedCompactRev".to_vec(), revision_key(5, 0, false))));
    }
}
