//! etcd's require-leader metadata (`hasleader=true`, which etcd's clients set
//! with `WithRequireLeader`, the kube-apiserver on its watches, and etcd's
//! own client on its keep-alives): a call that carries it fails with
//! `etcdserver: no leader` on a member without one, and a Watch or
//! LeaseKeepAlive stream that carries it ends so once the member has had no
//! leader for a few election timeouts (`Cluster::leader_lost`), so that the
//! client moves to another member. A single server always has a leader.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;
use tonic::Status;
use tonic::metadata::MetadataMap;

use super::ClusterSlot;
use crate::raft::Cluster;

/// etcd's rpctypes.MetadataRequireLeaderKey.
const REQUIRE_LEADER_KEY: &str = "hasleader";
/// etcd's rpctypes.MetadataHasLeader.
const HAS_LEADER: &str = "true";

/// etcd's ErrGRPCNoLeader.
fn no_leader() -> Status {
    Status::unavailable("etcdserver: no leader")
}

fn requires_leader(headers: &http::HeaderMap) -> bool {
    headers
        .get(REQUIRE_LEADER_KEY)
        .is_some_and(|value| value.as_bytes() == HAS_LEADER.as_bytes())
}

/// Refuses every call that requires a leader while this member has none,
/// as etcd's unary and stream interceptors do.
#[derive(Clone)]
pub struct RequireLeaderLayer {
    cluster: ClusterSlot,
}

impl RequireLeaderLayer {
    /// The layer for a server that is a member of the cluster in `cluster`
    /// once it is one (a single server always has a leader).
    pub fn new(cluster: ClusterSlot) -> Self {
        RequireLeaderLayer { cluster }
    }
}

impl<S> tower::Layer<S> for RequireLeaderLayer {
    type Service = RequireLeader<S>;

    fn layer(&self, inner: S) -> RequireLeader<S> {
        RequireLeader {
            inner,
            cluster: self.cluster.clone(),
        }
    }
}

/// The service of `RequireLeaderLayer`.
#[derive(Clone)]
pub struct RequireLeader<S> {
    inner: S,
    cluster: ClusterSlot,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for RequireLeader<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let leaderless = self.cluster.get().is_some_and(|c| !c.has_leader());
        if leaderless && requires_leader(request.headers()) {
            return Box::pin(async { Ok(no_leader().into_http()) });
        }
        Box::pin(self.inner.call(request))
    }
}

/// A response stream that ends with `etcdserver: no leader` when its call
/// requires a leader and the member has been without one for a while.
pub struct EndWithoutLeader<S> {
    inner: S,
    lost: Option<WatchStream<u64>>,
    ended: bool,
}

/// `inner`, ended when the call whose `metadata` is given requires a leader
/// and the member of `cluster` loses it.
pub fn end_without_leader<S>(
    cluster: Option<&Arc<Cluster>>,
    metadata: &MetadataMap,
    inner: S,
) -> EndWithoutLeader<S> {
    let required = metadata
        .get(REQUIRE_LEADER_KEY)
        .is_some_and(|value| value.as_bytes() == HAS_LEADER.as_bytes());
    EndWithoutLeader {
        inner,
        lost: cluster
            .filter(|_| required)
            .map(|cluster| WatchStream::from_changes(cluster.leader_lost())),
        ended: false,
    }
}

impl<S, T> Stream for EndWithoutLeader<S>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(lost) = self.lost.as_mut() {
            match Pin::new(lost).poll_next(cx) {
                Poll::Ready(Some(_)) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(no_leader())));
                }
                // The member is stopping: the stream ends with the server.
                Poll::Ready(None) => self.lost = None,
                Poll::Pending => {}
            }
        }
        Pin::new(&mut self.inner).poll_next(cx)
    }
}
