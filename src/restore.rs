//! `cetera restore FILE`: a snapshot into the datastore the flags name.

use std::path::Path;

use crate::backend::Backend;
use crate::backend::open::{BackendJob, OpenFor, with_datastore};
use crate::backend::snapshot::{Restored, restore};
use crate::config::Config;

/// `cetera restore FILE`: opens the datastore named by the flags and restores into it.
pub async fn run(config: &Config, file: &Path, force: bool) -> anyhow::Result<()> {
    struct RestoreJob<'a> {
        file: &'a Path,
        force: bool,
    }
    impl BackendJob for RestoreJob<'_> {
        type Output = Restored;
        async fn run<B: Backend>(self, backend: B) -> anyhow::Result<Restored> {
            restore(self.file, &backend, self.force).await
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
