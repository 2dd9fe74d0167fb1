//! The server side of the peer service: hands openraft's messages to the
//! local Raft member, and serves cetera's own calls (a follower's forwarded
//! write, read index, lease calls, joins and membership changes, a
//! handover). Calls
//! without the cluster token are refused. Messages from a member that names
//! itself (`MEMBER_HEADER`) are counted in etcd's peer metrics, both ways.

use std::sync::Arc;

use futures_util::future::join_all;
use openraft::raft::AppendEntriesResponse;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use super::election::PreVote;
use super::membership::{JoinRequest, MembershipChange};
use super::network::{MEMBER_HEADER, TOKEN_HEADER, count_received};
use super::node::Node;
use super::openraft_types::TypeConfig;
use super::proposal::{ENTRY_FORMAT, Proposal};
use crate::metrics::{member_label, metrics};
use crate::proto::ceterapb::Payload;
use crate::proto::ceterapb::peer_server::Peer;
use crate::store::LeaseCall;

/// The peer service of one member.
pub struct PeerService {
    node: Arc<Node>,
}

impl PeerService {
    /// The service of `node`'s member.
    pub fn new(node: Arc<Node>) -> Self {
        PeerService { node }
    }

    /// The message of `request`, and the member that sent it, as a label,
    /// when it is one and says so.
    fn open<T: DeserializeOwned>(
        &self,
        request: Request<Payload>,
    ) -> Result<(T, Option<String>), Status> {
        let token = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|t| t.to_str().ok());
        if token != Some(self.node.token()) {
            return Err(Status::unauthenticated(
                "cetera: the peer did not present this cluster's token",
            ));
        }
        let from = self.sender(&request).map(member_label);
        let data = &request.get_ref().data;
        let message = postcard::from_bytes(data);
        if let Some(from) = &from {
            count_received(from, data.len(), message.is_ok());
        }
        let message = message.map_err(|e| {
            Status::invalid_argument(format!("cetera: unreadable peer message: {e}"))
        })?;
        Ok((message, from))
    }

    /// The id the caller gives, if it is another member's: labels come
    /// only from the membership, whatever a caller sends.
    fn sender(&self, request: &Request<Payload>) -> Option<u64> {
        let id = request.metadata().get(MEMBER_HEADER)?.to_str().ok()?;
        let id = u64::from_str_radix(id, 16).ok()?;
        let raft = self.node.metrics().borrow();
        let member = raft.membership_config.membership().get_node(&id).is_some();
        (member && id != self.node.id()).then_some(id)
    }
}

/// The answer `value` to the member `to` (a label), counted as sent to it.
fn answer<T: Serialize>(to: Option<String>, value: &T) -> Result<Response<Payload>, Status> {
    let data = postcard::to_stdvec(value).map_err(|e| Status::internal(e.to_string()))?;
    if let Some(to) = to {
        metrics()
            .peer_sent_bytes
            .with_label_values(&[&to])
            .inc_by(data.len() as u64);
    }
    Ok(Response::new(Payload { data }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (rpc, from): (openraft::raft::AppendEntriesRequest<TypeConfig>, _) =
            self.open(request)?;
        let result = self.node.raft().append_entries(rpc).await;
        // Any answer but a higher vote takes the sender as this term's leader.
        if result
            .as_ref()
            .is_ok_and(|r| !matches!(r, AppendEntriesResponse::HigherVote(_)))
        {
            self.node.heard_from_leader();
        }
        answer(from, &result)
    }

    async fn vote(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (rpc, from): (openraft::raft::VoteRequest<u64>, _) = self.open(request)?;
        answer(from, &self.node.raft().vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Payload>,
    ) -> Result<Response<Payload>, Status> {
        let (rpc, from): (openraft::raft::InstallSnapshotRequest<TypeConfig>, _) =
            self.open(request)?;
        let result = self.node.raft().install_snapshot(rpc).await;
        if result
            .as_ref()
            .is_ok_and(|r| r.vote == self.node.metrics().borrow().vote)
        {
            self.node.heard_from_leader();
        }
        answer(from, &result)
    }

    async fn forward(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (proposal, from): (Proposal, _) = self.open(request)?;
        answer(from, &self.node.lead_write(proposal).await)
    }

    async fn forward_several(
        &self,
        request: Request<Payload>,
    ) -> Result<Response<Payload>, Status> {
        let (proposals, from): (Vec<Proposal>, _) = self.open(request)?;
        // Proposed together, they gather into the leader's next entry.
        let writes = proposals.into_iter().map(|p| self.node.lead_write(p));
        answer(from, &join_all(writes).await)
    }

    async fn read_index(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let ((), from): ((), _) = self.open(request)?;
        answer(from, &self.node.lead_read_index().await)
    }

    async fn join(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (join, from): (JoinRequest, _) = self.open(request)?;
        answer(from, &self.node.lead_join(join).await)
    }

    async fn change_members(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (change, from): (MembershipChange, _) = self.open(request)?;
        answer(from, &self.node.lead_membership_change(&change).await)
    }

    async fn reserved(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (peer_url, from): (String, _) = self.open(request)?;
        answer(from, &self.node.lead_reserved(&peer_url))
    }

    async fn campaign(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let ((), from): ((), _) = self.open(request)?;
        answer(from, &self.node.campaign().await)
    }

    async fn pre_vote(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (pre_vote, from): (PreVote, _) = self.open(request)?;
        answer(from, &self.node.answer_pre_vote(pre_vote).await)
    }

    async fn handing_over(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (leader, from): (u64, _) = self.open(request)?;
        self.node.hear_handover(leader);
        answer(from, &())
    }

    async fn lease(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (call, from): (LeaseCall, _) = self.open(request)?;
        answer(from, &self.node.lead_lease_call(call).await)
    }

    async fn entry_format(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let ((), from): ((), _) = self.open(request)?;
        answer(from, &ENTRY_FORMAT)
    }
}
