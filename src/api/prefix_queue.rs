//! The waiting line that etcd's Lock and Election services build on (etcd's
//! clientv3 `concurrency` package, which etcd runs inside its server): every
//! contender owns the key `<name>/<lease id in hex>`, the contender whose key
//! was created first holds the lock or leads, and the others wait until every
//! earlier key is deleted. Waiting follows the watch hub (falling back to the
//! revision log), so a waiter never polls the database.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use super::ServerInfo;
use crate::auth::perms::Access;

use crate::backend::Backend;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::{
    Compare, LeaseGrantRequest, RangeRequest, RangeResponse, RequestOp, ResponseHeader, TxnRequest,
};
use crate::proto::mvccpb::event::EventType;
use crate::store::hub::RevisionEvents;
use crate::store::{Store, StoreError};

/// TTL of the lease etcd grants for a request that names lease 0
/// (concurrency.NewSession's default).
const SESSION_TTL_SECONDS: i64 = 60;

/// The lease a request's keys are attached to: the one it names, or, for 0,
/// a fresh 60-second lease that nobody keeps alive, as etcd's server does.
pub async fn session_lease<B: Backend>(store: &Store<B>, lease: i64) -> Result<i64, Status> {
    if lease != 0 {
        return Ok(lease);
    }
    let granted = store
        .lease_grant(LeaseGrantRequest {
            ttl: SESSION_TTL_SECONDS,
            id: 0,
        })
        .await?;
    Ok(granted.id)
}

/// `name` + "/": the prefix under which contenders queue.
pub fn queue_prefix(name: &[u8]) -> Vec<u8> {
    [name, b"/"].concat()
}

/// A contender's key: the prefix and the lease id in hex, as Go's `%x`
/// prints an int64 (a minus sign for negative ids).
pub fn contender_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    [prefix, hex.as_bytes()].concat()
}

/// The end of the range of keys starting with `prefix` (etcd's WithPrefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A Range for the single key under `prefix` created first (`Ascend`) or
/// last (`Descend`), optionally among keys created at or before
/// `max_create_revision`.
pub fn oldest_or_newest(prefix: &[u8], order: SortOrder, max_create_revision: i64) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        max_create_revision,
        ..Default::default()
    }
}

/// A txn compare `create_revision(key) == revision`.
pub fn created_at(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

/// A txn that runs `then` only while `key` still has create revision `revision`.
pub fn if_created_at(key: &[u8], revision: i64, then: RequestOp) -> TxnRequest {
    TxnRequest {
        compare: vec![created_at(key, revision)],
        success: vec![then],
        failure: Vec::new(),
    }
}

/// Serves one unary Lock or Election call as etcd's server does: the
/// caller's permissions on the queue named in the request (if it names one)
/// are checked first, then `call` runs, and its errors come back as etcd's
/// in-process client passes them on.
pub async fn serve_queue_call<T, R, F>(
    info: &ServerInfo,
    request: tonic::Request<T>,
    queue: fn(&T) -> Option<&[u8]>,
    write: bool,
    call: impl FnOnce(T) -> F,
) -> Result<tonic::Response<R>, Status>
where
    F: Future<Output = Result<R, Status>>,
{
    if let Some(name) = queue(request.get_ref()) {
        authorize_queue(info, request.metadata(), name, write)?;
    }
    call(request.into_inner())
        .await
        .map(tonic::Response::new)
        .map_err(through_internal_client)
}

/// Checks that the caller may use the queue `name`: read (Leader, Observe)
/// or read and write (joining, leaving, proclaiming) on every key under it.
pub fn authorize_queue(
    info: &ServerInfo,
    metadata: &MetadataMap,
    name: &[u8],
    write: bool,
) -> Result<(), Status> {
    let prefix = queue_prefix(name);
    let accesses: &[Access] = if write {
        &[Access::Read, Access::Write]
    } else {
        &[Access::Read]
    };
    let caller = info.caller(metadata).map_err(through_internal_client)?;
    info.auth
        .authorize_keys(&caller, &prefix, &prefix_end(&prefix), accesses)
        .map_err(through_internal_client)
}

/// An error as etcd's Lock and Election services return it: they call the
/// KV service through an in-process client, whose errors reach gRPC without
/// their code, so the caller sees code Unknown with etcd's message.
pub fn through_internal_client(error: impl Into<Status>) -> Status {
    Status::new(Code::Unknown, error.into().message())
}

/// The error every wait ends with when the server shuts down.
pub fn server_stopped() -> Status {
    StoreError::Stopped.into()
}

/// Whether `status` is [`server_stopped`]: the waiter leaves its key alone then.
pub fn is_server_stopped(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

/// Committed revisions from a starting revision on, as a watch delivers them:
/// from the hub's window while it reaches back far enough, else from the log.
pub struct RevisionFeed<B: Backend> {
    store: Arc<Store<B>>,
    /// Everything through this revision has been returned.
    after: i64,
    latest: watch::Receiver<i64>,
    stop: watch::Receiver<bool>,
}

impl<B: Backend> RevisionFeed<B> {
    /// A feed of the revisions from `from` on (inclusive, as etcd's WithRev);
    /// it ends with [`server_stopped`] once `stop` turns true.
    pub fn new(store: Arc<Store<B>>, from: i64, stop: watch::Receiver<bool>) -> Self {
        let latest = store.hub().subscribe();
        RevisionFeed {
            store,
            after: from - 1,
            latest,
            stop,
        }
    }

    /// The next committed revisions that changed something, waiting for a
    /// commit when there are none yet.
    pub async fn next(&mut self) -> Result<Vec<Arc<RevisionEvents>>, Status> {
        loop {
            if *self.stop.borrow() {
                return Err(server_stopped());
            }
            let through = *self.latest.borrow_and_update();
            if through > self.after {
                let after = self.after;
                let revisions = self.store.revisions_after(after, through, false).await?;
                self.after = through;
                if !revisions.is_empty() {
                    return Ok(revisions);
                }
            }
            tokio::select! {
                changed = self.latest.changed() => changed.map_err(|_| server_stopped())?,
                _ = self.stop.changed() => return Err(server_stopped()),
            }
        }
    }
}

/// Waits for a delete of `key` at revision `from` or later (etcd's waitDelete).
async fn wait_delete<B: Backend>(
    store: &Arc<Store<B>>,
    key: &[u8],
    from: i64,
    stop: &watch::Receiver<bool>,
) -> Result<(), Status> {
    let mut feed = RevisionFeed::new(store.clone(), from, stop.clone());
    loop {
        for revision in feed.next().await? {
            let deleted = revision.events.iter().any(|event| {
                event.r#type == EventType::Delete as i32
                    && event.kv.as_ref().is_some_and(|kv| kv.key == key)
            });
            if deleted {
                return Ok(());
            }
        }
    }
}

/// Waits until no key under `prefix` created at or before
/// `max_create_revision` is left (etcd's waitDeletes): waits for the newest
/// such key to go, then looks again, so a contender wakes only when the key
/// just ahead of it goes, not on every change of the queue.
pub async fn wait_deletes<B: Backend>(
    store: &Arc<Store<B>>,
    prefix: &[u8],
    max_create_revision: i64,
    stop: &watch::Receiver<bool>,
) -> Result<ResponseHeader, Status> {
    loop {
        let newest: RangeResponse = store
            .range(&oldest_or_newest(
                prefix,
                SortOrder::Descend,
                max_create_revision,
            ))
            .await?;
        let header = newest.header.unwrap_or_default();
        let Some(ahead) = newest.kvs.first() else {
            return Ok(header);
        };
        wait_delete(store, &ahead.key, header.revision, stop).await?;
    }
}

/// A write run in the background unless disarmed: how a waiting Lock or
/// Campaign cleans up after its caller went away, as etcd's server does
/// (Mutex.Lock unlocks, Election.Campaign resigns, with the server's own
/// context when the caller's is cancelled).
pub struct CleanupOnDrop<B: Backend> {
    store: Arc<Store<B>>,
    cleanup: Option<TxnRequest>,
}

impl<B: Backend> CleanupOnDrop<B> {
    /// Runs `cleanup` when dropped before [`Self::disarm`].
    pub fn new(store: Arc<Store<B>>, cleanup: TxnRequest) -> Self {
        CleanupOnDrop {
            store,
            cleanup: Some(cleanup),
        }
    }

    /// Leaves things as they are.
    pub fn disarm(&mut self) {
        self.cleanup = None;
    }
}

impl<B: Backend> Drop for CleanupOnDrop<B> {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        runtime.spawn(async move {
            if let Err(error) = store.txn(cleanup).await {
                tracing::warn!("cleaning up an abandoned lock or campaign key failed: {error}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contender_keys_print_the_lease_as_go_does() {
        assert_eq!(
            contender_key(b"l/", 0x694d77b6cc9c1c0b),
            b"l/694d77b6cc9c1c0b"
        );
        assert_eq!(contender_key(b"l/", 10), b"l/a");
        assert_eq!(contender_key(b"l/", -1), b"l/-1");
    }

    #[test]
    fn prefix_end_carries_past_0xff() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
