//! The store's background jobs, each a task that runs until the store
//! stops: the compactor (removes compacted history step by step), the lease
//! expirer, automatic compaction when configured, and the poller that
//! publishes other instances' commits on a shared database. Each writes
//! through `Writes`, like a client's request.

pub mod auto_compaction;
mod compactor;
mod lease_expirer;
mod lock;
mod poller;

use std::sync::{Arc, Weak};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::auto_compaction::AutoCompaction;
pub use self::compactor::CompactionState;
use super::leader_leases::LeaderLeases;
use super::publisher::Publisher;
use super::routing::Writes;
use crate::backend::{Backend, Revisions};

/// Starts the background jobs of a store on `backend`; the compactor sets
/// `compaction`'s flag while a full datastore holds it up, and keeps each
/// compaction's digest there.
pub(super) fn start<B: Backend>(
    backend: &Arc<B>,
    writes: &Writes,
    leader_leases: &Arc<LeaderLeases>,
    revisions: &watch::Receiver<Revisions>,
    publisher: Weak<Publisher<B>>,
    auto_compaction: Option<AutoCompaction>,
    compaction: &CompactionState,
) -> Vec<JoinHandle<()>> {
    let compactor = tokio::spawn(compactor::run(
        backend.clone(),
        writes.clone(),
        revisions.clone(),
        compaction.clone(),
    ));
    let lease_expirer = tokio::spawn(lease_expirer::run(
        backend.clone(),
        writes.clone(),
        leader_leases.clone(),
    ));
    let mut jobs = vec![compactor, lease_expirer];
    if let Some(mode) = auto_compaction {
        jobs.push(tokio::spawn(auto_compaction::run(
            mode,
            backend.clone(),
            writes.clone(),
            revisions.clone(),
        )));
    }
    jobs.push(tokio::spawn(poller::run(backend.clone(), publisher)));
    jobs
}
