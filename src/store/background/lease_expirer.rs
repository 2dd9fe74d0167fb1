//! Lease expiry: revokes the leases whose deadline passed.

use std::sync::Arc;
use std::time::Duration;

use super::lock::{LEASE_EXPIRY_LOCK, holds};
use crate::backend::{Backend, BackendResult, ReadTxn};
use crate::store::apply;
use crate::store::error::StoreError;
use crate::store::leader_leases::LeaderLeases;
use crate::store::request::WriteRequest;
use crate::store::routing::Writes;

/// How often expired leases are looked for, as etcd's lessor does.
const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Most leases expired in one check.
const MAX_EXPIRED_PER_CHECK: usize = 1000;

/// Revokes leases whose deadline passed: each in its own revision, through
/// the writer, which checks the deadline again in case of a late keep-alive.
/// In a cluster only the leader does, by the deadlines it holds
/// (`leader_leases`), through the replicated log.
pub(super) async fn run<B: Backend>(
    backend: Arc<B>,
    writes: Writes,
    leader_leases: Arc<LeaderLeases>,
) {
    let mut tick = tokio::time::interval(LEASE_CHECK_INTERVAL);
    loop {
        tick.tick().await;
        if !writes.decides() || !holds(&*backend, LEASE_EXPIRY_LOCK).await {
            continue;
        }
        let expired = match expired(&*backend, &writes, &leader_leases).await {
            Ok(expired) => expired,
            Err(error) => {
                tracing::warn!("cannot look for expired leases: {error:#}");
                continue;
            }
        };
        for id in expired {
            match writes.send(WriteRequest::LeaseExpire(id)).await {
                Ok(_) => tracing::debug!(lease = id, "lease expired"),
                Err(StoreError::Stopped) => return,
                // Under the CORRUPT alarm leases do not expire, as in etcd.
                Err(StoreError::Corrupt) => break,
                Err(error) => tracing::warn!(lease = id, "cannot expire lease: {error}"),
            }
        }
    }
}

/// The leases whose deadline passed: by the database's deadlines alone, or
/// by the leader's when this member leads a cluster.
async fn expired<B: Backend>(
    backend: &B,
    writes: &Writes,
    leader_leases: &LeaderLeases,
) -> BackendResult<Vec<i64>> {
    let now = apply::now_ms();
    let mut txn = backend.read().await?;
    match writes.replication().and_then(|r| r.leadership()) {
        Some(leadership) => {
            let leases = txn.leases().await?;
            Ok(leader_leases.expired(leadership, now, &leases, MAX_EXPIRED_PER_CHECK))
        }
        None => txn.expired_leases(now, MAX_EXPIRED_PER_CHECK).await,
    }
}
