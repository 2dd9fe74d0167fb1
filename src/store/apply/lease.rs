//! Applying lease requests: grant, revoke, keep-alive and expiry. A revoke
//! or an expiry deletes the lease's keys in sorted order at one revision, so
//! watchers get one response with every DELETE (carrying prev_kv).

use std::time::{SystemTime, UNIX_EPOCH};

use super::Applier;
use crate::backend::{LeaseRow, WriteTxn};
use crate::proto::etcdserverpb::{
    DeleteRangeRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveResponse,
    LeaseRevokeResponse,
};
use crate::store::error::{StoreError, StoreResult};

/// Shortest TTL granted, in seconds: etcd's ceil(1.5 x election timeout).
const MIN_LEASE_TTL: i64 = 2;
/// Longest TTL granted, in seconds, as in etcd.
const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// Wall-clock time in Unix milliseconds: lease deadlines must survive restarts.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The deadline (Unix ms) of a lease of `ttl` seconds granted or renewed at
/// `from_ms`.
pub fn lease_deadline(from_ms: i64, ttl: i64) -> i64 {
    from_ms.saturating_add(ttl.saturating_mul(1000))
}

impl<T: WriteTxn> Applier<'_, T> {
    /// LeaseGrant: a client-chosen id, or a fresh positive one (chosen by
    /// `Store::lease_grant` before the request is queued, so that every
    /// replica applies the same id).
    pub async fn lease_grant(
        &mut self,
        req: &LeaseGrantRequest,
    ) -> StoreResult<LeaseGrantResponse> {
        if req.ttl > MAX_LEASE_TTL {
            return Err(StoreError::LeaseTtlTooLarge);
        }
        if self.txn.lease(req.id).await?.is_some() {
            return Err(StoreError::LeaseExists);
        }
        let id = req.id;
        let ttl = req.ttl.max(MIN_LEASE_TTL);
        self.txn
            .put_lease(&LeaseRow {
                id,
                ttl,
                expires_at: lease_deadline(self.now_ms, ttl),
            })
            .await?;
        Ok(LeaseGrantResponse {
            header: None,
            id,
            ttl,
            error: String::new(),
        })
    }

    /// LeaseRevoke: deletes the lease and, at one revision, its keys.
    pub async fn lease_revoke(&mut self, id: i64) -> StoreResult<LeaseRevokeResponse> {
        if self.txn.lease(id).await?.is_none() {
            return Err(StoreError::LeaseNotFound);
        }
        self.revoke(id).await?;
        Ok(LeaseRevokeResponse {
            header: Some(super::header(self.revision())),
        })
    }

    /// Expiry: revokes lease `id` if its deadline has passed. A keep-alive
    /// that came first wins.
    pub async fn lease_expire(&mut self, id: i64) -> StoreResult<bool> {
        match self.txn.lease(id).await? {
            Some(lease) if lease.expires_at <= self.now_ms => self.revoke(id).await.map(|()| true),
            _ => Ok(false),
        }
    }

    /// LeaseKeepAlive: a full TTL from now. An unknown or already expired
    /// lease answers TTL 0, as etcd does.
    pub async fn lease_keep_alive(&mut self, id: i64) -> StoreResult<LeaseKeepAliveResponse> {
        let now = self.now_ms;
        let ttl = match self.txn.lease(id).await? {
            Some(lease) if lease.expires_at > now => {
                let renewed = LeaseRow {
                    expires_at: lease_deadline(now, lease.ttl),
                    ..lease
                };
                self.txn.put_lease(&renewed).await?;
                lease.ttl
            }
            _ => 0,
        };
        Ok(LeaseKeepAliveResponse {
            header: None,
            id,
            ttl,
        })
    }

    async fn revoke(&mut self, id: i64) -> StoreResult<()> {
        for kv in self.txn.lease_keys(id).await? {
            let single = DeleteRangeRequest {
                key: kv.key,
                ..Default::default()
            };
            self.apply_delete_range(&single).await?;
        }
        self.txn.remove_lease(id).await?;
        Ok(())
    }
}
