//! `cetera migrate --from etcd-snapshot:///path/file.db`: imports a snapshot
//! file written by `etcdctl snapshot save` (a bbolt database, usually with a
//! SHA-256 trailer) or an etcd member's `member/snap/db`, read with the small
//! reader in `crate::bbolt`.
//!
//! etcd's `key` bucket holds one record per change, keyed by revision (8-byte
//! big-endian main, '_', 8-byte big-endian sub, and a trailing 't' for a
//! deletion), valued by an mvccpb.KeyValue. Each record becomes one log row
//! at the same revision and sub, so the whole history the file holds is kept
//! with create/mod revisions and versions. The compact revision comes from
//! the `meta` bucket; a compaction etcd had scheduled but not finished is
//! completed here as etcd completes it on start. Leases come from the `lease`
//! bucket and, as when etcd restores a snapshot, start afresh: their
//! deadline is now plus their TTL (or the checkpointed remaining TTL). Users,
//! roles and the auth switch and revision come from `auth`, `authUsers` and
//! `authRoles`; members, alarms and the cluster id are not imported.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, bail};
use prost::Message;
use sha2::{Digest, Sha256};

use super::{Imported, Migrated};
use crate::backend::settings::{AUTH_ENABLED, AUTH_REVISION};
use crate::backend::snapshot::empty_target;
use crate::backend::{AuthKind, Backend, LeaseRow, LogEntry, Revisions, WriteTxn};
use crate::bbolt::Db;
use crate::bbolt::records::LeaseRecord;
use crate::proto::mvccpb::KeyValue;
use crate::store::hash::LiveKeysHasher;

/// The scheme of `--from` naming an etcd snapshot file.
pub const SCHEME: &str = "etcd-snapshot://";

/// The file named by an `etcd-snapshot://PATH` source, if `from` is one.
pub fn snapshot_path(from: &str) -> Option<&Path> {
    from.strip_prefix(SCHEME).map(Path::new)
}

/// The bbolt bytes of a snapshot file: a trailer (when the size is 32 more
/// than a multiple of 512, etcd's rule) is checked and cut off.
fn database_bytes<'a>(file: &'a [u8], path: &Path) -> anyhow::Result<&'a [u8]> {
    if file.len() % 512 != 32 {
        return Ok(file);
    }
    let (data, trailer) = file.split_at(file.len() - 32);
    if Sha256::digest(data).as_slice() != trailer {
        bail!(
            "{}: the SHA-256 checksum does not match; the snapshot is corrupt",
            path.display()
        );
    }
    Ok(data)
}

/// A revision from the `meta` bucket (17 bytes: main, '_', sub).
fn meta_revision(value: &[u8]) -> Option<i64> {
    value
        .get(..8)
        .map(|main| i64::from_be_bytes(main.try_into().unwrap_or_default()))
}

/// What the file holds, in cetera's terms.
struct Contents {
    /// Every kept record, in (revision, sub) order.
    log: Vec<LogEntry>,
    revisions: Revisions,
    /// The lease records.
    leases: Vec<LeaseRecord>,
    /// The auth switch and revision (`auth` bucket), if recorded.
    auth_enabled: Option<bool>,
    auth_revision: Option<i64>,
    /// Users and roles: (kind, name, authpb record).
    auth_records: Vec<(AuthKind, Vec<u8>, Vec<u8>)>,
}

/// Reads the `auth`, `authUsers` and `authRoles` buckets.
type AuthContents = (Option<bool>, Option<i64>, Vec<(AuthKind, Vec<u8>, Vec<u8>)>);

fn read_auth(db: &Db) -> anyhow::Result<AuthContents> {
    let (mut enabled, mut revision) = (None, None);
    if let Some(bucket) = db.bucket(b"auth")? {
        db.for_each(bucket, &mut |key, value, _| {
            match key {
                b"enabled" => enabled = Some(value == [1]),
                b"authRevision" => {
                    let bytes: [u8; 8] = value
                        .try_into()
                        .context("bad authRevision in the `auth` bucket")?;
                    revision = Some(i64::try_from(u64::from_be_bytes(bytes)).unwrap_or(i64::MAX));
                }
                _ => {}
            }
            Ok(())
        })?;
    }
    let mut records = Vec::new();
    for (name, kind) in [
        (&b"authUsers"[..], AuthKind::User),
        (b"authRoles", AuthKind::Role),
    ] {
        if let Some(bucket) = db.bucket(name)? {
            db.for_each(bucket, &mut |key, value, _| {
                records.push((kind, key.to_vec(), value.to_vec()));
                Ok(())
            })?;
        }
    }
    Ok((enabled, revision, records))
}

/// Reads and decodes the etcd data in `data` (a bbolt file).
fn read_contents(data: &[u8], history: bool) -> anyhow::Result<Contents> {
    let db = Db::open(data)?;
    let key_bucket = db
        .bucket(b"key")?
        .context("no `key` bucket: not an etcd v3 backend")?;
    let mut log = Vec::new();
    db.for_each(key_bucket, &mut |key, value, _| {
        let deleted = match key.len() {
            17 => false,
            18 if key[17] == b't' => true,
            _ => bail!("unexpected revision key {key:02x?} in the `key` bucket"),
        };
        if key[8] != b'_' {
            bail!("unexpected revision key {key:02x?} in the `key` bucket");
        }
        let (main, sub) = (&key[..8], &key[9..17]);
        let main = i64::from_be_bytes(main.try_into()?);
        let sub = i64::from_be_bytes(sub.try_into()?);
        let mut kv = KeyValue::decode(value)
            .with_context(|| format!("bad KeyValue record at revision {main}"))?;
        // A corrupt file can hold well-formed bytes that no etcd wrote:
        // rows must come in revision order and agree with their keys.
        let previous = log.last().map(|e: &LogEntry| (e.kv.mod_revision, e.sub));
        if main < 1 || sub < 0 || previous.is_some_and(|p| p >= (main, sub)) {
            bail!("revision record {main}_{sub} is out of order in the `key` bucket");
        }
        if !deleted
            && (kv.mod_revision != main
                || kv.create_revision < 1
                || kv.create_revision > main
                || kv.version < 1)
        {
            bail!(
                "the record at revision {main} says create revision {}, mod revision {}, \
                 version {}",
                kv.create_revision,
                kv.mod_revision,
                kv.version
            );
        }
        if deleted {
            // etcd stores only the key in a tombstone.
            kv = KeyValue {
                key: kv.key,
                mod_revision: main,
                ..Default::default()
            };
        }
        log.push(LogEntry { kv, sub, deleted });
        Ok(())
    })?;

    let mut compact = -1;
    if let Some(meta) = db.bucket(b"meta")? {
        db.for_each(meta, &mut |key, value, _| {
            if key == b"finishedCompactRev" || key == b"scheduledCompactRev" {
                compact = compact.max(meta_revision(value).unwrap_or(-1));
            }
            Ok(())
        })?;
    }
    let highest = log.last().map_or(1, |entry| entry.kv.mod_revision);
    let mut current = highest.max(compact).max(1);

    complete_compaction(&mut log, compact);
    if !history {
        // Only each live key's latest row, compacted at the current revision.
        let mut live: HashMap<Vec<u8>, (i64, bool)> = HashMap::new();
        for entry in &log {
            live.insert(entry.kv.key.clone(), (entry.kv.mod_revision, entry.deleted));
        }
        log.retain(|entry| live.get(&entry.kv.key) == Some(&(entry.kv.mod_revision, false)));
        compact = current;
    }
    current = current.max(compact);

    let mut leases = Vec::new();
    if let Some(bucket) = db.bucket(b"lease")? {
        db.for_each(bucket, &mut |_, value, _| {
            leases.push(LeaseRecord::decode(value).context("bad lease record")?);
            Ok(())
        })?;
    }
    let (auth_enabled, auth_revision, auth_records) = read_auth(&db)?;
    Ok(Contents {
        log,
        revisions: Revisions {
            current,
            compact,
            compacted_through: compact.max(0),
        },
        leases,
        auth_enabled,
        auth_revision,
        auth_records,
    })
}

/// Reads an etcd snapshot file's bytes as `import` does, without writing
/// anything: the checksum, every bucket it reads, the records' checks.
/// Returns the number of revision records. For fuzzing and tests.
pub fn parse(file: &[u8]) -> anyhow::Result<usize> {
    let data = database_bytes(file, Path::new("snapshot"))?;
    let contents = read_contents(data, true)?;
    expected_hash(&contents);
    Ok(contents.log.len())
}

/// Completes a compaction at `compact` that etcd had scheduled but not
/// finished (as etcd does on its next start): at or below it, only each
/// key's latest row survives, unless that row is a deletion.
fn complete_compaction(log: &mut Vec<LogEntry>, compact: i64) {
    if compact <= 0 {
        return;
    }
    let mut latest: HashMap<&[u8], usize> = HashMap::new();
    for (index, entry) in log.iter().enumerate() {
        if entry.kv.mod_revision <= compact {
            latest.insert(&entry.kv.key, index);
        }
    }
    let keep: Vec<bool> = log
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            entry.kv.mod_revision > compact
                || (!entry.deleted && latest.get(&entry.kv.key[..]) == Some(&index))
        })
        .collect();
    let mut keep = keep.into_iter();
    log.retain(|_| keep.next().unwrap_or(false));
}

/// The HashKV (at the current revision) of a store holding `contents`,
/// computed as etcd's HashByRev takes the rows (see `hash`): every row after
/// the compact revision, and below it the rows of the keys alive now, or
/// every remaining row when no key is alive. Also the number of live keys.
fn expected_hash(contents: &Contents) -> (u32, usize) {
    let mut live: HashMap<&[u8], (i64, i64)> = HashMap::new();
    for entry in &contents.log {
        if entry.deleted {
            live.remove(&entry.kv.key[..]);
        } else {
            live.insert(&entry.kv.key, (entry.kv.mod_revision, entry.sub));
        }
    }
    let compact = contents.revisions.compact;
    let mut hasher = LiveKeysHasher::default();
    for entry in &contents.log {
        let kept = entry.kv.mod_revision > compact
            || live.is_empty()
            || live.get(&entry.kv.key[..]) == Some(&(entry.kv.mod_revision, entry.sub));
        if kept {
            hasher.add(entry);
        }
    }
    (hasher.finish(), live.len())
}

/// Copies the etcd snapshot at `path` into `target`, in one target
/// transaction, and checks the result.
pub async fn import<T: Backend>(
    path: &Path,
    target: &T,
    force: bool,
    history: bool,
) -> anyhow::Result<Migrated> {
    let file = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let data = database_bytes(&file, path)?;
    let contents = read_contents(data, history)
        .with_context(|| format!("{} is not a readable etcd snapshot", path.display()))?;
    let revisions = contents.revisions;
    tracing::info!(
        "importing {} revision records (revision {}, compact revision {}) and {} leases",
        contents.log.len(),
        revisions.current,
        revisions.compact,
        contents.leases.len()
    );

    let mut writer = target.write().await?;
    empty_target(&mut writer, force).await?;
    for entry in &contents.log {
        writer.append(entry).await?;
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for lease in &contents.leases {
        // As etcd's lessor on promotion: the checkpointed remaining TTL if
        // there is one, else the full TTL, from now.
        let remaining = if lease.remaining_ttl > 0 {
            lease.remaining_ttl
        } else {
            lease.ttl
        };
        let row = LeaseRow {
            id: lease.id,
            ttl: lease.ttl.max(1),
            expires_at: now_ms + remaining.max(1) * 1000,
        };
        writer.put_lease(&row).await?;
    }
    for (kind, name, record) in &contents.auth_records {
        writer.put_auth_record(*kind, name, record).await?;
    }
    if let Some(enabled) = contents.auth_enabled {
        writer.set_setting(AUTH_ENABLED, i64::from(enabled)).await?;
    }
    if let Some(revision) = contents.auth_revision {
        writer.set_setting(AUTH_REVISION, revision).await?;
    }
    writer.set_revisions(revisions).await?;
    writer.commit().await?;

    let (hash, keys) = expected_hash(&contents);
    super::verify_import(
        target,
        Imported {
            revisions,
            hash,
            keys,
            leases: contents.leases.len(),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailer_is_checked_and_cut() {
        let path = Path::new("x.db");
        let data = vec![7u8; 1024];
        assert_eq!(database_bytes(&data, path).unwrap().len(), 1024);
        let mut with = data.clone();
        with.extend_from_slice(&Sha256::digest(&data));
        assert_eq!(database_bytes(&with, path).unwrap(), &data[..]);
        let last = with.len() - 1;
        with[last] ^= 1;
        assert!(database_bytes(&with, path).is_err());
    }

    fn row(key: &str, revision: i64, deleted: bool) -> LogEntry {
        LogEntry::of_key(key, revision, deleted)
    }

    #[test]
    fn an_unfinished_compaction_is_completed() {
        let mut log = vec![
            row("a", 2, false),
            row("b", 3, false),
            row("a", 4, false),
            row("b", 5, true),
            row("c", 6, false),
            row("a", 7, false),
        ];
        complete_compaction(&mut log, 5);
        let left: Vec<(Vec<u8>, i64)> = log
            .iter()
            .map(|e| (e.kv.key.clone(), e.kv.mod_revision))
            .collect();
        assert_eq!(
            left,
            vec![(b"a".to_vec(), 4), (b"c".to_vec(), 6), (b"a".to_vec(), 7)]
        );
        let mut never = vec![row("a", 2, false), row("a", 3, true)];
        complete_compaction(&mut never, -1);
        assert_eq!(never.len(), 2);
    }

    /// A small snapshot written by cetera's writer (buckets as etcd's).
    fn sample_snapshot() -> Vec<u8> {
        use crate::bbolt::records::{entry_key, entry_value, revision_key};
        use crate::bbolt::writer::BboltWriter;
        let mut writer = BboltWriter::new(std::io::Cursor::new(Vec::new())).unwrap();
        let mut key = writer.bucket();
        for revision in 2..400i64 {
            let entry = LogEntry {
                kv: KeyValue {
                    key: format!("/k/{}", revision % 37).into_bytes(),
                    create_revision: 2,
                    mod_revision: revision,
                    version: revision - 1,
                    value: vec![b'v'; (revision % 90) as usize],
                    lease: revision % 3,
                },
                sub: 0,
                deleted: revision % 11 == 0,
            };
            writer
                .put(&mut key, &entry_key(&entry), &entry_value(&entry))
                .unwrap();
        }
        let key = writer.finish_bucket(key).unwrap();
        let mut meta = writer.bucket();
        let compacted = revision_key(100, 0, false);
        writer
            .put(&mut meta, b"finishedCompactRev", &compacted)
            .unwrap();
        writer
            .put(
                &mut meta,
                b"scheduledCompactRev",
                &revision_key(150, 0, false),
            )
            .unwrap();
        let meta = writer.finish_bucket(meta).unwrap();
        let mut lease = writer.bucket();
        let record = LeaseRecord {
            id: 1,
            ttl: 60,
            remaining_ttl: 0,
        };
        writer
            .put(&mut lease, &1i64.to_be_bytes(), &record.encode_to_vec())
            .unwrap();
        let lease = writer.finish_bucket(lease).unwrap();
        writer
            .finish(&[(b"key", key), (b"lease", lease), (b"meta", meta)])
            .unwrap()
            .into_inner()
    }

    /// Truncated and bit-flipped snapshots give an error (or, for a flip in
    /// bytes nothing reads, the same records), never a panic; with the
    /// trailer every change is caught by the checksum.
    #[test]
    fn damaged_snapshots_are_errors_not_panics() {
        let data = sample_snapshot();
        let records = parse(&data).unwrap();
        assert!(records > 200, "{records}");
        let mut with_trailer = data.clone();
        with_trailer.extend_from_slice(&Sha256::digest(&data));
        assert_eq!(parse(&with_trailer).unwrap(), records);
        for len in (0..data.len()).step_by(211) {
            // Without its meta pages nothing can be read; a later cut is
            // refused where a page the reader needs is missing.
            assert!(parse(&data[..len]).is_err() || len >= 2 * 4096, "{len}");
        }
        let mut errors = 0;
        for (n, at) in (0..data.len()).step_by(67).enumerate() {
            let mut damaged = data.clone();
            damaged[at] ^= 1 << (at % 8);
            // Either refused or read; what matters is that it returns.
            errors += usize::from(parse(&damaged).is_err());
            if n % 4 == 0 {
                let mut damaged = with_trailer.clone();
                damaged[at] ^= 1 << (at % 8);
                let error = parse(&damaged).unwrap_err();
                assert!(error.to_string().contains("checksum"), "{error}");
            }
        }
        assert!(errors > 0);
    }

    #[test]
    fn snapshot_scheme() {
        assert_eq!(
            snapshot_path("etcd-snapshot:///tmp/s.db"),
            Some(Path::new("/tmp/s.db"))
        );
        assert_eq!(snapshot_path("/tmp/s.db"), None);
    }
}
