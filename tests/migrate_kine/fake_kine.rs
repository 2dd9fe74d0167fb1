//! A stand-in for a running kine (k3s-io/kine v0.16.4) on the etcd API, as
//! far as `cetera migrate --from http://...` reads it:
//! - Range lists as kine's pkg/server/list.go does on MySQL: the keys with
//!   `key <= name < range_end` (so etcd's "\0 to \0" for every key finds
//!   none), compared and ordered case-insensitively as kine's ascii column
//!   does, a limit fetches one more to set `more`, and `count` is then the
//!   whole range's; every version is 0 except the apiserver's
//!   `compact_rev_key`, and kine's own `compact_rev_key` row and health key
//!   are listed with the rest (pkg/server/kv.go toKV);
//! - the lease RPCs answer as kine's pkg/server/lease.go: LeaseGrant with
//!   ID = TTL, the others with the error "lease ... is not supported", which
//!   grpc-go sends with code Unknown.

use std::net::SocketAddr;

use cetera::proto::etcdserverpb::kv_server::{Kv, KvServer};
use cetera::proto::etcdserverpb::lease_server::{Lease, LeaseServer};
use cetera::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RangeStreamResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use cetera::proto::mvccpb::KeyValue;
use tonic::{Request, Response, Status, Streaming};

/// What the fake serves: each row by the name kine stores it under, and
/// the key value it lists it as.
pub struct FakeKine {
    rows: Vec<(Vec<u8>, KeyValue)>,
    revision: i64,
}

impl FakeKine {
    /// A kine at `revision` holding `rows` (stored name, listed key value).
    pub fn new(mut rows: Vec<(Vec<u8>, KeyValue)>, revision: i64) -> Self {
        rows.sort_by_key(|row| folded(&row.0));
        FakeKine { rows, revision }
    }

    /// Serves on a free port of 127.0.0.1 until the runtime ends.
    pub async fn serve(self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = std::sync::Arc::new(self);
        let server = tonic::transport::Server::builder()
            .add_service(KvServer::from_arc(shared.clone()))
            .add_service(LeaseServer::from_arc(shared))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        addr
    }

    fn header(&self) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision: self.revision,
            ..Default::default()
        })
    }
}

/// A name as MySQL's case-insensitive ascii collation compares it.
fn folded(name: &[u8]) -> Vec<u8> {
    name.to_ascii_lowercase()
}

fn not_supported(what: &str) -> Status {
    Status::unknown(format!("{what} is not supported"))
}

#[tonic::async_trait]
impl Kv for FakeKine {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let r = request.into_inner();
        if r.range_end.is_empty() {
            return Err(Status::unknown("the fake kine lists ranges only"));
        }
        if r.revision > self.revision {
            return Err(Status::out_of_range(
                "etcdserver: mvcc: required revision is a future revision",
            ));
        }
        let in_range: Vec<&KeyValue> = self
            .rows
            .iter()
            .filter(|(name, _)| {
                let name = folded(name);
                name >= folded(&r.key) && name < folded(&r.range_end)
            })
            .map(|(_, kv)| kv)
            .collect();
        let mut kvs: Vec<KeyValue> = in_range.iter().map(|kv| (*kv).clone()).collect();
        let mut more = false;
        if r.limit > 0 && kvs.len() as i64 > r.limit {
            more = true;
            kvs.truncate(r.limit as usize);
        }
        Ok(Response::new(RangeResponse {
            header: self.header(),
            count: if more {
                in_range.len() as i64
            } else {
                kvs.len() as i64
            },
            kvs,
            more,
        }))
    }

    type RangeStreamStream = tokio_stream::Empty<Result<RangeStreamResponse, Status>>;

    /// The kine this fakes (v0.16.4) predates RangeStream.
    async fn range_stream(
        &self,
        _: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(Status::unimplemented("unknown method RangeStream"))
    }

    async fn put(&self, _: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        Err(Status::unimplemented("read-only fake"))
    }

    async fn delete_range(
        &self,
        _: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        Err(not_supported("delete"))
    }

    async fn txn(&self, _: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        Err(Status::unimplemented("read-only fake"))
    }

    async fn compact(
        &self,
        _: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        Err(Status::unimplemented("read-only fake"))
    }
}

#[tonic::async_trait]
impl Lease for FakeKine {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let ttl = request.into_inner().ttl;
        Ok(Response::new(LeaseGrantResponse {
            header: Some(ResponseHeader::default()),
            id: ttl,
            ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        _: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        Err(not_supported("lease revoke"))
    }

    type LeaseKeepAliveStream = tokio_stream::Empty<Result<LeaseKeepAliveResponse, Status>>;

    async fn lease_keep_alive(
        &self,
        _: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        Err(not_supported("lease keep alive"))
    }

    async fn lease_time_to_live(
        &self,
        _: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        Err(not_supported("lease time to live"))
    }

    async fn lease_leases(
        &self,
        _: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        Err(not_supported("lease leases"))
    }
}
