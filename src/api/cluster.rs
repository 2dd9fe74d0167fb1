//! The Cluster service: a single server lists itself, a member of a
//! replicated cluster lists the Raft membership and removes or promotes
//! members through it. Members join with `--join`; MemberAdd and
//! MemberUpdate answer Unimplemented.

use std::sync::Arc;

use tonic::{Code, Request, Response, Status};

use super::ServerInfo;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use crate::raft::{MembershipChange, MembershipError};

/// The Cluster service of a single server.
pub struct ClusterService {
    info: Arc<ServerInfo>,
}

impl ClusterService {
    /// The service describing this server.
    pub fn new(info: Arc<ServerInfo>) -> Self {
        ClusterService { info }
    }
}

impl ClusterService {
    /// The members as MemberList shows them.
    fn members(&self) -> Vec<Member> {
        match &self.info.cluster {
            None => vec![Member {
                id: self.info.identity.member_id,
                name: self.info.name.clone(),
                peer_ur_ls: Vec::new(),
                client_ur_ls: self.info.client_urls.clone(),
                is_learner: false,
            }],
            Some(cluster) => cluster
                .members()
                .into_iter()
                .map(|m| Member {
                    id: m.id,
                    name: m.member.name,
                    peer_ur_ls: vec![m.member.peer_url],
                    client_ur_ls: m.member.client_urls,
                    is_learner: m.is_learner,
                })
                .collect(),
        }
    }

    /// Removes or promotes a member of the cluster, with etcd's errors; the
    /// members afterwards.
    async fn change(&self, change: MembershipChange) -> Result<Vec<Member>, Status> {
        let Some(cluster) = &self.info.cluster else {
            return Err(needs_replication());
        };
        match cluster.change_membership(change).await {
            Ok(()) => Ok(self.members()),
            Err(MembershipError::NotFound) => {
                Err(Status::new(Code::NotFound, "etcdserver: member not found"))
            }
            Err(MembershipError::NotLearner) => Err(Status::new(
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member",
            )),
            Err(MembershipError::NoLeader) => {
                Err(Status::new(Code::Unavailable, "etcdserver: no leader"))
            }
            Err(MembershipError::Failed(message)) => Err(Status::new(
                Code::Unavailable,
                format!("cetera: membership change failed: {message}"),
            )),
        }
    }
}

/// MemberAdd and MemberUpdate, and any change on a single server.
fn needs_replication() -> Status {
    Status::unimplemented(
        "cetera: members join a replicated cluster with --join; MemberAdd and MemberUpdate \
         are not implemented, and a single server has no members to change",
    )
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        // Membership changes are for admins (etcd's checkMembershipOperationPermission).
        self.info.auth.require_admin(request.metadata())?;
        Err(needs_replication())
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        // Membership changes are for admins (etcd's checkMembershipOperationPermission).
        self.info.auth.require_admin(request.metadata())?;
        let members = self
            .change(MembershipChange::Remove(request.get_ref().id))
            .await?;
        Ok(Response::new(MemberRemoveResponse {
            header: self.info.header(0),
            members,
        }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        // Membership changes are for admins (etcd's checkMembershipOperationPermission).
        self.info.auth.require_admin(request.metadata())?;
        Err(needs_replication())
    }

    async fn member_list(
        &self,
        _: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        Ok(Response::new(MemberListResponse {
            // etcd's cluster service fills only the ids and the term, no revision.
            header: self.info.header(0),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        // Membership changes are for admins (etcd's checkMembershipOperationPermission).
        self.info.auth.require_admin(request.metadata())?;
        let members = self
            .change(MembershipChange::Promote(request.get_ref().id))
            .await?;
        Ok(Response::new(MemberPromoteResponse {
            header: self.info.header(0),
            members,
        }))
    }
}
