//! The server side of the peer service: hands openraft's messages to the
//! local Raft member, and serves cetera's own calls (a follower's forwarded
//! write, read index, lease calls, joins and membership changes, a
//! handover). Calls
//! without the cluster token are refused.

use std::sync::Arc;

use futures_util::future::join_all;
use openraft::raft::AppendEntriesResponse;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use super::cluster::Cluster;
use super::election::PreVote;
use super::membership::{MembershipChange, MembershipError};
use super::network::TOKEN_HEADER;
use super::proposal::{ENTRY_FORMAT, Proposal};
use super::{Member, TypeConfig};
use crate::proto::ceterapb::Payload;
use crate::proto::ceterapb::peer_server::Peer;
use crate::store::LeaseCall;

/// Why the leader did not do what a member asked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Refusal {
    /// This member does not lead; the leader, if it knows one.
    NotLeader(Option<(u64, Member)>),
    /// Another membership change is under way: ask again.
    Busy,
    /// A membership change breaks one of etcd's rules.
    Membership(MembershipError),
    /// It failed.
    Failed(String),
}

/// A member asking to join.
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinRequest {
    /// Its id (its etcd member id).
    pub id: u64,
    /// Its addresses.
    pub member: Member,
}

/// The answer to a join.
#[derive(Debug, Serialize, Deserialize)]
pub struct Joined {
    /// The cluster's id, which the new member reports from now on.
    pub cluster_id: u64,
    /// The index of the leader's log the new member held when it was
    /// promoted: it serves clients once it has applied that much.
    pub caught_up_to: u64,
}

/// The peer service of one member.
pub struct PeerService {
    cluster: Arc<Cluster>,
}

impl PeerService {
    /// The service of `cluster`'s member.
    pub fn new(cluster: Arc<Cluster>) -> Self {
        PeerService { cluster }
    }

    fn open<T: DeserializeOwned>(&self, request: Request<Payload>) -> Result<T, Status> {
        let token = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|t| t.to_str().ok());
        if token != Some(self.cluster.token()) {
            return Err(Status::unauthenticated(
                "cetera: the peer did not present this cluster's token",
            ));
        }
        postcard::from_bytes(&request.get_ref().data)
            .map_err(|e| Status::invalid_argument(format!("cetera: unreadable peer message: {e}")))
    }
}

fn answer<T: Serialize>(value: &T) -> Result<Response<Payload>, Status> {
    let data = postcard::to_stdvec(value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(Payload { data }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: openraft::raft::AppendEntriesRequest<TypeConfig> = self.open(request)?;
        let result = self.cluster.raft().append_entries(rpc).await;
        // Any answer but a higher vote takes the sender as this term's leader.
        if result
            .as_ref()
            .is_ok_and(|r| !matches!(r, AppendEntriesResponse::HigherVote(_)))
        {
            self.cluster.heard_from_leader();
        }
        answer(&result)
    }

    async fn vote(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: openraft::raft::VoteRequest<u64> = self.open(request)?;
        answer(&self.cluster.raft().vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Payload>,
    ) -> Result<Response<Payload>, Status> {
        let rpc: openraft::raft::InstallSnapshotRequest<TypeConfig> = self.open(request)?;
        let result = self.cluster.raft().install_snapshot(rpc).await;
        if result
            .as_ref()
            .is_ok_and(|r| r.vote == self.cluster.metrics().borrow().vote)
        {
            self.cluster.heard_from_leader();
        }
        answer(&result)
    }

    async fn forward(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let proposal: Proposal = self.open(request)?;
        answer(&self.cluster.lead_write(proposal).await)
    }

    async fn forward_several(
        &self,
        request: Request<Payload>,
    ) -> Result<Response<Payload>, Status> {
        let proposals: Vec<Proposal> = self.open(request)?;
        // Proposed together, they gather into the leader's next entry.
        let writes = proposals.into_iter().map(|p| self.cluster.lead_write(p));
        answer(&join_all(writes).await)
    }

    async fn read_index(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (): () = self.open(request)?;
        answer(&self.cluster.lead_read_index().await)
    }

    async fn join(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let join: JoinRequest = self.open(request)?;
        answer(&self.cluster.lead_join(join).await)
    }

    async fn change_members(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let change: MembershipChange = self.open(request)?;
        answer(&self.cluster.lead_membership_change(&change).await)
    }

    async fn reserved(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let peer_url: String = self.open(request)?;
        answer(&self.cluster.lead_reserved(&peer_url))
    }

    async fn campaign(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (): () = self.open(request)?;
        answer(&self.cluster.campaign().await)
    }

    async fn pre_vote(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let pre_vote: PreVote = self.open(request)?;
        answer(&self.cluster.answer_pre_vote(pre_vote).await)
    }

    async fn handing_over(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let leader: u64 = self.open(request)?;
        self.cluster.hear_handover(leader);
        answer(&())
    }

    async fn lease(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let call: LeaseCall = self.open(request)?;
        answer(&self.cluster.lead_lease_call(call).await)
    }

    async fn entry_format(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (): () = self.open(request)?;
        answer(&ENTRY_FORMAT)
    }
}
