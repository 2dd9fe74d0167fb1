//! Snapshots, and restoring them into a datastore.
//!
//! A snapshot is an SQLite database with cetera's schema holding the rows of
//! one consistent view of the store (log, kv, meta, lease, and the identity
//! settings), whatever the backend it was taken from. The Snapshot RPC
//! streams that file followed by the SHA-256 of its bytes, as etcd does;
//! SQLite files are whole pages, so their size is a multiple of 512 and the
//! 32-byte trailer is recognisable by the size alone (etcd's rule).
//!
//! Both directions copy through the backend traits: a snapshot is a copy of
//! the store into a fresh SQLite backend, a restore a copy of a snapshot
//! file into the target backend. `cetera migrate` (crate::migrate) uses the
//! same copy between two datastores.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use super::settings::{AUTH_ENABLED, AUTH_REVISION, CLUSTER_ID, MEMBER_ID};
use super::sqlite::Sqlite;
use super::{
    AuthKind, Backend, KeyRange, LOG_PAGE_REVISIONS, ReadAt, ReadTxn, Revisions, WriteTxn,
};

/// Bytes of the SHA-256 trailer.
pub const TRAILER_BYTES: u64 = 32;

/// What a copy is for: it decides what happens to settings and lease deadlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Into a snapshot file: everything as it is.
    Snapshot,
    /// Into a datastore: a new identity, and leases restarted.
    Restore,
    /// From one datastore to another: the same identity and lease deadlines;
    /// without `history`, only each live key's latest row, compacted at the
    /// current revision.
    Migrate {
        /// Whether the log after the compact revision is copied.
        history: bool,
    },
}

/// Copies the store seen by `source` into the (empty) `target`, page by page,
/// calling `progress` with the revision reached after each page.
pub(crate) async fn copy<R: ReadTxn, W: WriteTxn>(
    source: &mut R,
    target: &mut W,
    purpose: Purpose,
    progress: &mut (dyn FnMut(i64) + Send),
) -> anyhow::Result<Revisions> {
    let mut revisions = source.revisions().await?;
    // Without history, a log row is copied only if it is its key's live row.
    let live = match purpose {
        Purpose::Migrate { history: false } => {
            revisions.compact = revisions.current;
            revisions.compacted_through = revisions.current;
            Some(live_mod_revisions(source).await?)
        }
        _ => None,
    };
    // Replaying the log in (revision, sub) order rebuilds the live-key table
    // too: each live key's latest row survives compaction.
    let mut from = 0;
    while from < revisions.current {
        let to = (from + LOG_PAGE_REVISIONS).min(revisions.current);
        for entry in source.log_entries(from, to).await? {
            let keep = live.as_ref().is_none_or(|live| {
                !entry.deleted && live.get(&entry.kv.key) == Some(&entry.kv.mod_revision)
            });
            if keep {
                target.append(&entry).await?;
            }
        }
        progress(to);
        from = to;
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for mut lease in source.leases().await? {
        if purpose == Purpose::Restore {
            // As etcd does when a restored member becomes leader: every lease
            // gets its full TTL again, rather than expiring at once because
            // the snapshot is old.
            lease.expires_at = now_ms + lease.ttl * 1000;
        }
        target.put_lease(&lease).await?;
    }
    // Users, roles and whether auth is on belong to the data, as in an etcd
    // snapshot: a restored store enforces the same rules.
    for kind in [AuthKind::User, AuthKind::Role] {
        for (name, record) in source.auth_records(kind).await? {
            target.put_auth_record(kind, &name, &record).await?;
        }
    }
    for name in [AUTH_ENABLED, AUTH_REVISION] {
        if let Some(value) = source.setting(name).await? {
            target.set_setting(name, value).await?;
        }
    }
    if purpose != Purpose::Restore {
        for name in [CLUSTER_ID, MEMBER_ID] {
            if let Some(value) = source.setting(name).await? {
                target.set_setting(name, value).await?;
            }
        }
    }
    if purpose == Purpose::Snapshot
        && let Some(mark) = source.replication_mark().await?
    {
        // A cluster member's snapshot says which log entry it is at.
        target.set_replication_mark(&mark).await?;
    }
    target.set_revisions(revisions).await?;
    Ok(revisions)
}

/// Every live key's mod revision, read page by page.
async fn live_mod_revisions<R: ReadTxn>(
    source: &mut R,
) -> anyhow::Result<std::collections::HashMap<Vec<u8>, i64>> {
    const PAGE: usize = 1000;
    let mut live = std::collections::HashMap::new();
    let mut keys = KeyRange {
        start: Vec::new(),
        end: None,
    };
    loop {
        let page = source.range(&keys, ReadAt::Current, PAGE, false).await?;
        let full = page.len() == PAGE;
        if let Some(last) = page.last() {
            keys.start = last.key.clone();
            keys.start.push(0);
        }
        live.extend(page.into_iter().map(|kv| (kv.key, kv.mod_revision)));
        if !full {
            return Ok(live);
        }
    }
}

/// Makes `target` ready to be copied into: refuses one holding any data
/// unless `force`; either way clears it (the identity too).
pub(crate) async fn empty_target<W: WriteTxn>(target: &mut W, force: bool) -> anyhow::Result<()> {
    if !force {
        let current = target.revisions().await?;
        let everything = KeyRange {
            start: Vec::new(),
            end: None,
        };
        let keys = target.count(&everything, ReadAt::Current).await?;
        let leases = target.leases().await?.len();
        if current != Revisions::EMPTY_STORE || keys > 0 || leases > 0 {
            bail!(
                "the target datastore is not empty (revision {}, {keys} keys, {leases} leases); \
                 use --force to replace its contents",
                current.current
            );
        }
    }
    target.clear().await?;
    Ok(())
}

/// Writes one consistent view of `backend` to a new snapshot database at
/// `path` (without the trailer).
pub async fn write_database<B: Backend>(backend: &B, path: &Path) -> anyhow::Result<()> {
    let mut source = backend.read_applied().await?;
    let file = Sqlite::open_scratch(path)?;
    file.prepare_bulk_load(true).await?;
    let mut target = file.write().await?;
    copy(&mut source, &mut target, Purpose::Snapshot, &mut |_| {}).await?;
    target.commit().await?;
    drop(source);
    file.finish_scratch().await?;
    Ok(())
}

/// Checks a snapshot file's trailer, if it has one. Returns whether it had
/// one. Files without (a bare database, size a multiple of 512) are accepted.
pub fn verify(path: &Path) -> anyhow::Result<bool> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let size = file.metadata()?.len();
    let mut magic = [0u8; 16];
    file.read_exact(&mut magic)
        .ok()
        .filter(|_| &magic == b"SQLite format 3\0")
        .with_context(|| {
            format!(
                "{} is neither an etcd snapshot (bbolt) nor a cetera snapshot (SQLite)",
                path.display()
            )
        })?;
    let data = match size % 512 {
        0 => return Ok(false),
        TRAILER_BYTES => size - TRAILER_BYTES,
        _ => bail!(
            "{} is not a whole snapshot: its size {size} is neither a multiple of 512 nor \
             that plus a 32-byte checksum",
            path.display()
        ),
    };
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let copied = std::io::copy(&mut (&mut file).take(data), &mut hasher)?;
    if copied != data {
        bail!("{} shrank while it was read", path.display());
    }
    let mut trailer = [0u8; TRAILER_BYTES as usize];
    file.read_exact(&mut trailer)?;
    if hasher.finalize().as_slice() != trailer {
        bail!(
            "{}: the SHA-256 checksum does not match; the snapshot is corrupt",
            path.display()
        );
    }
    Ok(true)
}

/// What a restore did.
#[derive(Clone, Copy, Debug)]
pub struct Restored {
    /// The restored counters.
    pub revisions: Revisions,
    /// Whether the file had a checksum trailer (verified).
    pub checksummed: bool,
}

/// Loads the snapshot at `file` into `backend`. Refuses a target with any
/// data unless `force`, which replaces everything in it.
pub async fn restore<B: Backend>(
    file: &Path,
    backend: &B,
    force: bool,
) -> anyhow::Result<Restored> {
    let checksummed = verify(file)?;
    let mut source = Sqlite::read_snapshot_file(file)
        .with_context(|| format!("cannot read snapshot {}", file.display()))?;
    let mut target = backend.write().await?;
    // This drops the target's identity too: a restored store is a new cluster.
    empty_target(&mut target, force).await?;
    let revisions = copy(&mut source, &mut target, Purpose::Restore, &mut |_| {}).await?;
    target.commit().await?;
    Ok(Restored {
        revisions,
        checksummed,
    })
}
