//! Physical compaction: removes the history below the compact revision in
//! short steps through the writer, so no step holds other writes up for
//! long, then lets the backend reclaim the space.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::lock::{COMPACTION_LOCK, holds};
use crate::backend::{Backend, DiskFull, Revisions};
use crate::store::error::StoreError;
use crate::store::request::WriteRequest;
use crate::store::routing::Writes;

/// Least time between two `Backend::reclaim_compacted` calls.
const RECLAIM_INTERVAL: Duration = Duration::from_secs(1);

/// Removes compacted history step by step whenever the compact revision is
/// ahead of what was removed, on one instance at a time, then lets the
/// backend reclaim the space. The steps go to this member's writer alone:
/// each member removes its own history.
pub(super) async fn run<B: Backend>(
    backend: Arc<B>,
    writes: Writes,
    mut revisions: watch::Receiver<Revisions>,
    out_of_space: Arc<AtomicBool>,
) {
    let mut last_reclaim: Option<Instant> = None;
    loop {
        if revisions
            .wait_for(|r| r.compacted_through < r.compact)
            .await
            .is_err()
        {
            return;
        }
        if !holds(&*backend, COMPACTION_LOCK).await {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        match writes.local(WriteRequest::CompactStep).await {
            Ok(_) => {
                out_of_space.store(false, Ordering::SeqCst);
                let caught_up = {
                    let r = revisions.borrow();
                    r.compacted_through >= r.compact
                };
                // Once per finished compaction, and at most every
                // RECLAIM_INTERVAL when compactions come back to back.
                if caught_up && last_reclaim.is_none_or(|at| at.elapsed() >= RECLAIM_INTERVAL) {
                    last_reclaim = Some(Instant::now());
                    if let Err(error) = backend.reclaim_compacted().await {
                        tracing::warn!("cannot reclaim compacted space: {error:#}");
                    }
                }
            }
            Err(StoreError::Stopped) => return,
            // A full datastore: a physical Compact answers so at once (see
            // `Store::compact`); steps are tried again now and then.
            Err(StoreError::Backend(error)) if DiskFull::is(&error) => {
                if !out_of_space.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        "the datastore is out of space: compaction waits until there is some \
                         ({error:#})"
                    );
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Err(error) => {
                tracing::warn!("compaction step failed, retrying: {error}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
