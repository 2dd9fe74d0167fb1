//! The Lock service (v3lockpb), with the behaviour of etcd's server, which
//! runs clientv3's `concurrency.Mutex` in-process: Lock queues the key
//! `<name>/<lease hex>` under the caller's lease and answers once every key
//! created before it is gone; Unlock deletes a key.

use std::sync::Arc;

use tokio::sync::watch;
use tonic::{Code, Request, Response, Status};

use super::ServerInfo;
use super::prefix_queue::{
    CleanupOnDrop, contender_key, created_at, is_server_stopped, oldest_or_newest, queue_prefix,
    serve_queue_call, session_lease, through_internal_client, wait_deletes,
};
use crate::auth::perms::Access;
use crate::backend::Backend;
use crate::proto::etcdserverpb::range_request::SortOrder;
use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::{
    DeleteRangeRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};
use crate::proto::ops;
use crate::proto::v3lockpb::lock_server::Lock;
use crate::proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use crate::store::Store;

/// The Lock service on a store.
pub struct LockService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
    stop: watch::Receiver<bool>,
}

impl<B: Backend> LockService<B> {
    /// The service locking on `store`; waiting calls end when `stop` turns true.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>, stop: watch::Receiver<bool>) -> Self {
        LockService { store, info, stop }
    }
}

/// etcd's concurrency.ErrSessionExpired: the lock key vanished (its lease
/// expired or someone deleted it) while waiting.
fn session_expired() -> Status {
    Status::new(Code::Unknown, "mutex: session is expired")
}

/// The key-values of the `index`th response of a txn that read there.
pub(super) fn txn_range_kvs(resp: &TxnResponse, index: usize) -> &[crate::proto::mvccpb::KeyValue] {
    match resp.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(OpResponse::ResponseRange(range)) => &range.kvs,
        _ => &[],
    }
}

impl<B: Backend> LockService<B> {
    /// etcd's Mutex.Lock with the request's session.
    async fn acquire(&self, req: LockRequest) -> Result<LockResponse, Status> {
        let lease = session_lease(&self.store, req.lease).await?;
        let prefix = queue_prefix(&req.name);
        let key = contender_key(&prefix, lease);
        let owner = || RequestOp::from(oldest_or_newest(&prefix, SortOrder::Ascend, 0));
        // Join the queue, or find the key this lease already queued.
        let acquire = TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![ops::put(&key, b"", lease), owner()],
            failure: vec![
                RequestOp::from(RangeRequest {
                    key: key.clone(),
                    ..Default::default()
                }),
                owner(),
            ],
        };
        // etcd unlocks when waiting fails, including when the caller gives
        // up. Armed before the txn, so that a caller gone while it commits
        // leaves no key behind either.
        let mut unlock = CleanupOnDrop::new(
            self.store.clone(),
            TxnRequest {
                success: vec![ops::delete(&key)],
                ..Default::default()
            },
        );
        let acquired = match self.store.txn(acquire).await {
            Ok(acquired) => acquired,
            Err(error) => {
                unlock.disarm();
                return Err(error.into());
            }
        };
        let mut header = acquired.header.unwrap_or_default();
        let my_revision = if acquired.succeeded {
            header.revision
        } else {
            txn_range_kvs(&acquired, 0)
                .first()
                .map_or(0, |kv| kv.create_revision)
        };
        let first = txn_range_kvs(&acquired, 1).first();
        if first.is_some_and(|kv| kv.create_revision != my_revision) {
            // Someone is ahead: wait our turn.
            if let Err(status) =
                wait_deletes(&self.store, &prefix, my_revision - 1, &self.stop).await
            {
                if is_server_stopped(&status) {
                    unlock.disarm();
                }
                return Err(status);
            }
            let mine = self
                .store
                .range(&RangeRequest {
                    key: key.clone(),
                    ..Default::default()
                })
                .await?;
            unlock.disarm();
            if mine.kvs.is_empty() {
                return Err(session_expired());
            }
            header = mine.header.unwrap_or_default();
        }
        unlock.disarm();
        let mut header = Some(header);
        self.info.fill(&mut header, self.store.revisions().current);
        Ok(LockResponse { header, key })
    }
}

#[tonic::async_trait]
impl<B: Backend> Lock for LockService<B> {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        serve_queue_call(
            &self.info,
            request,
            |r| Some(&r.name),
            true,
            |req| self.acquire(req),
        )
        .await
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let caller = self
            .info
            .caller(request.metadata())
            .map_err(through_internal_client)?;
        self.info
            .auth
            .authorize_keys(&caller, &request.get_ref().key, b"", &[Access::Write])
            .map_err(through_internal_client)?;
        let req = request.into_inner();
        if req.key.is_empty() {
            return Err(through_internal_client(super::errors::empty_key()));
        }
        let deleted = self
            .store
            .delete_range(DeleteRangeRequest {
                key: req.key,
                ..Default::default()
            })
            .await
            .map_err(through_internal_client)?;
        let mut header = deleted.header;
        self.info.fill(&mut header, self.store.revisions().current);
        Ok(Response::new(UnlockResponse { header }))
    }
}
