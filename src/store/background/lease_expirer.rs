//! Lease expiry: revokes the leases whose deadline passed.

use std::sync::Arc;
use std::time::Duration;

use super::lock::{LEASE_EXPIRY_LOCK, holds};
use crate::backend::{Backend, ReadTxn};
use crate::store::apply;
use crate::store::error::StoreError;
use crate::store::request::WriteRequest;
use crate::store::routing::Writes;

/// How often expired leases are looked for, as etcd's lessor does.
const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Revokes leases whose deadline passed: each in its own revision, through
/// the writer, which checks the deadline again in case of a late keep-alive.
/// In a cluster only the leader does, through the replicated log.
pub(super) async fn run<B: Backend>(backend: Arc<B>, writes: Writes) {
    let mut tick = tokio::time::interval(LEASE_CHECK_INTERVAL);
    loop {
        tick.tick().await;
        if !writes.decides() || !holds(&*backend, LEASE_EXPIRY_LOCK).await {
            continue;
        }
        let expired = match backend.read().await {
            Ok(mut txn) => txn.expired_leases(apply::now_ms(), 1000).await,
            Err(error) => Err(error),
        };
        let expired = match expired {
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
