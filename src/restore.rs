//! `cetera restore FILE`: a snapshot into the datastore the flags name:
//! an etcd v3 snapshot (bbolt, from `etcdctl snapshot save` against etcd or
//! cetera, or a member's `member/snap/db`) or a cetera SQLite snapshot of
//! earlier versions, told apart by their first bytes.

use std::path::Path;

use crate::backend::Backend;
use crate::backend::open::{BackendJob, OpenFor, with_datastore};
use crate::backend::snapshot::{Restored, restore};
use crate::bbolt::is_bbolt;
use crate::config::Config;
use crate::migrate::etcd_snapshot;

/// Whether `file` starts as a bbolt database does (else it is taken for a
/// cetera SQLite snapshot, which `restore` checks).
fn is_etcd_snapshot(file: &Path) -> anyhow::Result<bool> {
    use anyhow::Context;
    use std::io::Read;
    let mut start = Vec::with_capacity(32);
    std::fs::File::open(file)
        .with_context(|| format!("cannot open {}", file.display()))?
        .take(32)
        .read_to_end(&mut start)?;
    Ok(is_bbolt(&start))
}

/// `cetera restore FILE`: opens the datastore named by the flags and restores into it.
pub async fn run(config: &Config, file: &Path, force: bool) -> anyhow::Result<()> {
    struct RestoreJob<'a> {
        file: &'a Path,
        force: bool,
    }
    impl BackendJob for RestoreJob<'_> {
        type Output = Restored;
        async fn run<B: Backend>(self, backend: B) -> anyhow::Result<Restored> {
            if !is_etcd_snapshot(self.file)? {
                return restore(self.file, &backend, self.force).await;
            }
            let checksummed = std::fs::metadata(self.file)?.len() % 512 == 32;
            let migrated = etcd_snapshot::import(self.file, &backend, self.force, true).await?;
            Ok(Restored {
                revisions: migrated.revisions,
                checksummed,
            })
        }
    }
    let job = RestoreJob { file, force };
    let tls = config.datastore_tls();
    let restored = with_datastore(&config.endpoint, &tls, OpenFor::BulkLoad, job).await?;
    if !restored.checksummed {
        tracing::warn!("the snapshot has no SHA-256 trailer; restored without checking it");
    }
    tracing::info!(
        revision = restored.revisions.current,
        compact_revision = restored.revisions.compact,
        "restored snapshot {}",
        file.display()
    );
    Ok(())
}
