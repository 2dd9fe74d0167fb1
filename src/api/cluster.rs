//! The Cluster service: a single server lists itself, a member of a
//! replicated cluster lists the Raft membership. Members join with `--join`;
//! adding, removing, updating and promoting them through this service
//! answers Unimplemented for now.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::ServerInfo;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};

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

fn needs_replication() -> Status {
    Status::unimplemented(
        "cetera: membership changes through the Cluster service are not implemented; \
         members join a replicated cluster with --join",
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
        Err(needs_replication())
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
        let members = match &self.info.cluster {
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
        };
        Ok(Response::new(MemberListResponse {
            // etcd's cluster service fills only the ids and the term, no revision.
            header: self.info.header(0),
            members,
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        // Membership changes are for admins (etcd's checkMembershipOperationPermission).
        self.info.auth.require_admin(request.metadata())?;
        Err(needs_replication())
    }
}
