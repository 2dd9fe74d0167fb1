//! The Election service (v3electionpb), with the behaviour of etcd's server,
//! which runs clientv3's `concurrency.Election` in-process: candidates queue
//! the key `<name>/<lease hex>` holding their value, the one created first
//! leads; Proclaim and Resign act only while the caller's key still has the
//! create revision it was elected with; Observe streams the leader's value
//! as it changes hands or is proclaimed.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use super::ServerInfo;
use super::lock::txn_range_kvs;
use super::prefix_queue::{
    CleanupOnDrop, RevisionFeed, authorize_queue, contender_key, created_at, if_created_at,
    oldest_or_newest, queue_prefix, serve_queue_call, session_lease, wait_deletes,
};
use crate::backend::Backend;
use crate::proto::etcdserverpb::range_request::SortOrder;
use crate::proto::etcdserverpb::{RangeRequest, RequestOp, ResponseHeader, TxnRequest};
use crate::proto::mvccpb::KeyValue;
use crate::proto::mvccpb::event::EventType;
use crate::proto::ops;
use crate::proto::v3electionpb::election_server::Election;
use crate::proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use crate::store::Store;

/// The Election service on a store.
pub struct ElectionService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
    stop: watch::Receiver<bool>,
}

impl<B: Backend> ElectionService<B> {
    /// The service holding elections on `store`; waiting calls and Observe
    /// streams end when `stop` turns true.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>, stop: watch::Receiver<bool>) -> Self {
        ElectionService { store, info, stop }
    }

    /// A complete header from one the store started.
    fn complete(&self, header: Option<ResponseHeader>) -> Option<ResponseHeader> {
        let mut header = header;
        self.info.fill(&mut header, self.store.revisions().current);
        header
    }

    /// Refuses a write over --max-request-bytes, as etcd's server refuses
    /// the txn its election code proposes.
    fn check_size(&self, txn: &TxnRequest) -> Result<(), Status> {
        if prost::Message::encoded_len(txn) > self.info.max_request_bytes {
            return Err(super::errors::request_too_large());
        }
        Ok(())
    }

    /// etcd's Election.Campaign with the request's session.
    async fn campaign_inner(&self, req: CampaignRequest) -> Result<CampaignResponse, Status> {
        let lease = session_lease(&self.store, req.lease).await?;
        let prefix = queue_prefix(&req.name);
        let key = contender_key(&prefix, lease);
        let join = TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![ops::put(&key, &req.value, lease)],
            failure: vec![RequestOp::from(RangeRequest {
                key: key.clone(),
                ..Default::default()
            })],
        };
        self.check_size(&join)?;
        // A caller gone while the join commits leaves no candidate behind.
        let mut leave = CleanupOnDrop::new(
            self.store.clone(),
            TxnRequest {
                success: vec![ops::delete(&key)],
                ..Default::default()
            },
        );
        let joined = self.store.txn(join).await;
        leave.disarm();
        let joined = joined?;
        let mut rev = joined.header.as_ref().map_or(0, |h| h.revision);
        if !joined.succeeded {
            // This lease is already a candidate: keep its place in the
            // queue, and its value up to date.
            let existing = txn_range_kvs(&joined, 0)
                .first()
                .cloned()
                .unwrap_or_default();
            rev = existing.create_revision;
            if existing.value != req.value {
                let proclaimed = self
                    .store
                    .txn(if_created_at(&key, rev, ops::put(&key, &req.value, lease)))
                    .await;
                match proclaimed {
                    Ok(resp) if !resp.succeeded => return Err(not_leader()),
                    Ok(_) => {}
                    Err(error) => {
                        let _ = self
                            .store
                            .txn(if_created_at(&key, rev, ops::delete(&key)))
                            .await;
                        return Err(error.into());
                    }
                }
            }
        }
        // etcd resigns when the caller gives up waiting, and only then.
        let mut resign = CleanupOnDrop::new(
            self.store.clone(),
            if_created_at(&key, rev, ops::delete(&key)),
        );
        let waited = wait_deletes(&self.store, &prefix, rev - 1, &self.stop).await;
        resign.disarm();
        waited?;
        Ok(CampaignResponse {
            header: self.complete(joined.header),
            leader: Some(LeaderKey {
                name: req.name,
                key,
                rev,
                lease,
            }),
        })
    }

    /// etcd's Election.Proclaim on a resumed election.
    async fn proclaim_inner(&self, req: ProclaimRequest) -> Result<ProclaimResponse, Status> {
        let leader = req.leader.ok_or_else(missing_leader_key)?;
        let lease = session_lease(&self.store, leader.lease).await?;
        let txn = if_created_at(
            &leader.key,
            leader.rev,
            ops::put(&leader.key, &req.value, lease),
        );
        super::kv::check_txn(&txn, self.info.max_txn_ops)?;
        self.check_size(&txn)?;
        let proclaimed = self.store.txn(txn).await?;
        if !proclaimed.succeeded {
            return Err(not_leader());
        }
        Ok(ProclaimResponse {
            header: self.complete(proclaimed.header),
        })
    }

    /// etcd's Election.Resign on a resumed election.
    async fn resign_inner(&self, req: ResignRequest) -> Result<ResignResponse, Status> {
        let leader = req.leader.ok_or_else(missing_leader_key)?;
        session_lease(&self.store, leader.lease).await?;
        let txn = if_created_at(&leader.key, leader.rev, ops::delete(&leader.key));
        super::kv::check_txn(&txn, self.info.max_txn_ops)?;
        let resigned = self.store.txn(txn).await?;
        Ok(ResignResponse {
            header: self.complete(resigned.header),
        })
    }

    /// etcd's Election.Leader.
    async fn leader_inner(&self, req: LeaderRequest) -> Result<LeaderResponse, Status> {
        let prefix = queue_prefix(&req.name);
        let first = self
            .store
            .range(&oldest_or_newest(&prefix, SortOrder::Ascend, 0))
            .await?;
        let Some(kv) = first.kvs.into_iter().next() else {
            return Err(no_leader());
        };
        Ok(LeaderResponse {
            header: self.complete(first.header),
            kv: Some(kv),
        })
    }
}

/// etcd's ErrElectionNotLeader.
fn not_leader() -> Status {
    Status::new(Code::Unknown, "election: not leader")
}

/// etcd's ErrElectionNoLeader.
fn no_leader() -> Status {
    Status::new(Code::Unknown, "election: no leader")
}

/// etcd's ErrMissingLeaderKey, for Proclaim and Resign without a leader.
fn missing_leader_key() -> Status {
    Status::new(Code::Unknown, "\"leader\" field must be provided")
}

type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

/// Streams the leader of the election under `prefix` to `out` as etcd's
/// Election.Observe does: the current leader (or the first candidate to
/// appear), then every new value it proclaims, and once it goes, the next
/// leader. Returns when the client goes away or the feed fails.
async fn observe<B: Backend>(
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
    prefix: Vec<u8>,
    stop: watch::Receiver<bool>,
    out: mpsc::Sender<Result<LeaderResponse, Status>>,
) -> Result<(), Status> {
    let send = |revision: i64, kv: KeyValue| {
        out.send(Ok(LeaderResponse {
            header: info.header(revision),
            kv: Some(kv),
        }))
    };
    loop {
        let first = store
            .range(&oldest_or_newest(&prefix, SortOrder::Ascend, 0))
            .await?;
        let first_revision = first.header.as_ref().map_or(0, |h| h.revision);
        let (revision, leader) = match first.kvs.into_iter().next() {
            Some(kv) => (first_revision, kv),
            None => first_put(&store, &prefix, first_revision, &stop).await?,
        };
        let leader_key = leader.key.clone();
        if send(revision, leader).await.is_err() {
            return Ok(());
        }
        // Follow the leader's key until it is deleted.
        let mut feed = RevisionFeed::new(store.clone(), revision + 1, stop.clone());
        'leader: loop {
            for committed in feed.next().await? {
                for event in &committed.events {
                    let Some(kv) = event.kv.as_ref().filter(|kv| kv.key == leader_key) else {
                        continue;
                    };
                    if event.r#type == EventType::Delete as i32 {
                        break 'leader;
                    }
                    if send(committed.revision, kv.clone()).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The first key put under `prefix` from revision `from` on, and its revision.
async fn first_put<B: Backend>(
    store: &Arc<Store<B>>,
    prefix: &[u8],
    from: i64,
    stop: &watch::Receiver<bool>,
) -> Result<(i64, KeyValue), Status> {
    let mut feed = RevisionFeed::new(store.clone(), from, stop.clone());
    loop {
        for committed in feed.next().await? {
            let put = committed.events.iter().find_map(|event| {
                event.kv.as_ref().filter(|kv| {
                    event.r#type == EventType::Put as i32 && kv.key.starts_with(prefix)
                })
            });
            if let Some(kv) = put {
                return Ok((kv.mod_revision, kv.clone()));
            }
        }
    }
}

#[tonic::async_trait]
impl<B: Backend> Election for ElectionService<B> {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        serve_queue_call(
            &self.info,
            request,
            |r| Some(&r.name),
            true,
            |req| self.campaign_inner(req),
        )
        .await
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        serve_queue_call(
            &self.info,
            request,
            |r| r.leader.as_ref().map(|l| l.name.as_slice()),
            true,
            |req| self.proclaim_inner(req),
        )
        .await
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        serve_queue_call(
            &self.info,
            request,
            |r| Some(&r.name),
            false,
            |req| self.leader_inner(req),
        )
        .await
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        authorize_queue(
            &self.info,
            request.metadata(),
            &request.get_ref().name,
            false,
        )?;
        let prefix = queue_prefix(&request.into_inner().name);
        let (out, responses) = mpsc::channel(1);
        let watching = out.clone();
        let mut stop = self.stop.clone();
        let run = observe(
            self.store.clone(),
            self.info.clone(),
            prefix,
            self.stop.clone(),
            out,
        );
        tokio::spawn(async move {
            // etcd ends the stream quietly when its watch fails. Shutdown
            // ends it even while it waits for a client that stopped reading.
            tokio::select! {
                _ = run => {}
                _ = watching.closed() => {}
                _ = stop.wait_for(|stopping| *stopping) => {}
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        serve_queue_call(
            &self.info,
            request,
            |r| r.leader.as_ref().map(|l| l.name.as_slice()),
            true,
            |req| self.resign_inner(req),
        )
        .await
    }
}
