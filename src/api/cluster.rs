//! The Cluster service: a single member lists itself. Adding, removing,
//! updating and promoting members needs the replicated mode and answers
//! Unimplemented until then.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::ServerInfo;
use crate::backend::Backend;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use crate::store::Store;

/// The Cluster service of a single server.
pub struct ClusterService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
}

impl<B: Backend> ClusterService<B> {
    /// The service describing the server that runs `store`.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>) -> Self {
        ClusterService { store, info }
    }
}

fn needs_replication() -> Status {
    Status::unimplemented("cetera: membership changes need the replicated mode")
}

#[tonic::async_trait]
impl<B: Backend> Cluster for ClusterService<B> {
    async fn member_add(
        &self,
        _: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(needs_replication())
    }

    async fn member_remove(
        &self,
        _: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(needs_replication())
    }

    async fn member_update(
        &self,
        _: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(needs_replication())
    }

    async fn member_list(
        &self,
        _: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let member = Member {
            id: self.info.identity.member_id,
            name: self.info.name.clone(),
            peer_ur_ls: Vec::new(),
            client_ur_ls: self.info.client_urls.clone(),
            is_learner: false,
        };
        Ok(Response::new(MemberListResponse {
            header: self.info.header(self.store.revisions().current),
            members: vec![member],
        }))
    }

    async fn member_promote(
        &self,
        _: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(needs_replication())
    }
}
