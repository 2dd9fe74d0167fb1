//! Physical compaction: removes the history below the compact revision in
//! short steps through the writer, so no step holds other writes up for
//! long, then lets the backend reclaim the space. Before its first removal
//! for a compaction it takes etcd 3.6+'s digest of the history that goes
//! (`CompactionHashes`), as etcd's background compaction does, so that
//! Compact answers without reading the history.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::lock::{COMPACTION_LOCK, holds};
use crate::backend::{Backend, DiskFull, Revisions};
use crate::store::compaction_hashes::CompactionHashes;
use crate::store::error::StoreError;
use crate::store::hash;
use crate::store::history;
use crate::store::request::WriteRequest;
use crate::store::routing::Writes;

/// Least time between two `Backend::reclaim_compacted` calls.
const RECLAIM_INTERVAL: Duration = Duration::from_secs(1);

/// What the compactor shares with the store.
#[derive(Clone)]
pub struct CompactionState {
    /// Up while a full datastore holds the compactor up (a physical Compact
    /// then answers so at once).
    pub out_of_space: Arc<AtomicBool>,
    /// Emulating etcd 3.6+: each compaction's digest, taken before its
    /// history goes.
    pub hashes: Option<Arc<CompactionHashes>>,
}

/// Removes compacted history step by step whenever the compact revision is
/// ahead of what was removed, on one instance at a time, then lets the
/// backend reclaim the space. The steps go to this member's writer alone:
/// each member removes its own history.
pub(super) async fn run<B: Backend>(
    backend: Arc<B>,
    writes: Writes,
    mut revisions: watch::Receiver<Revisions>,
    state: CompactionState,
) {
    let CompactionState {
        out_of_space,
        hashes,
    } = state;
    let mut last_reclaim: Option<Instant> = None;
    // The compaction before the next one, which its digest starts from; the
    // removal mark when started in the middle of one.
    let mut previous = revisions.borrow().compacted_through;
    let mut digested = None;
    loop {
        {
            let r = revisions.borrow();
            if r.compacted_through >= r.compact {
                previous = r.compact;
            }
        }
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
        let target = revisions.borrow().compact;
        if let Some(hashes) = &hashes
            && digested != Some(target)
        {
            digest(&backend, hashes, target, previous).await;
            (digested, previous) = (Some(target), target);
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

/// Keeps the digest of a compaction at `revision` over the history since
/// `previous`; on a failed read, HashKV at that revision hashes what is left.
async fn digest<B: Backend>(
    backend: &Arc<B>,
    hashes: &CompactionHashes,
    revision: i64,
    previous: i64,
) {
    let read = history::read_whole(backend.clone(), move |mut txn| async move {
        hash::hash_kv_before_compaction(&mut txn, revision, previous).await
    });
    match read.await {
        Ok(digest) => hashes.record(digest),
        Err(error) => tracing::warn!("cannot take the digest of compaction {revision}: {error}"),
    }
}
