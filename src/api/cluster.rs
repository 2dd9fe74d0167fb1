//! The Cluster service: a single server lists itself; a member of a
//! replicated cluster lists the Raft membership and adds, updates, removes
//! and promotes members through it, with etcd's rules and errors. A single
//! server on SQLite founds a cluster with its data on its first MemberAdd,
//! as etcd's one-member cluster takes a second member.

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
use crate::store::BoxFuture;

/// Turns a single server into the founding member of a cluster that holds
/// its data (`crate::server::founding`).
pub trait Founder: Send + Sync + 'static {
    /// Founds the cluster, once; the cluster this server is then a member of.
    fn found(&self) -> BoxFuture<'_, anyhow::Result<Arc<crate::raft::Cluster>>>;
}

/// What a single server does with a membership change.
#[derive(Clone)]
pub enum SingleServer {
    /// On SQLite: founds a cluster first, then makes the change in it.
    Founds(Arc<dyn Founder>),
    /// On a shared database: refuses it, saying why.
    Refuses(&'static str),
}

/// The Cluster service of a server.
pub struct ClusterService {
    info: Arc<ServerInfo>,
    single: SingleServer,
}

impl ClusterService {
    /// The service describing this server, which `single` says how to grow
    /// while it is not a cluster member.
    pub fn new(info: Arc<ServerInfo>, single: SingleServer) -> Self {
        ClusterService { info, single }
    }
}

impl ClusterService {
    /// The members as MemberList shows them.
    fn members(&self) -> Vec<Member> {
        match self.info.cluster() {
            None => vec![Member {
                id: self.info.identity.member_id,
                name: self.info.name.clone(),
                peer_ur_ls: vec![self.info.peer_url.clone()],
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

    /// Makes a membership change, with etcd's errors; the members afterwards.
    async fn change(&self, change: MembershipChange) -> Result<Vec<Member>, Status> {
        let cluster = match (self.info.cluster(), &self.single) {
            (Some(cluster), _) => cluster.clone(),
            // Only an addition grows a single server; it has no other
            // member to remove, update or promote.
            (None, SingleServer::Founds(founder))
                if matches!(change, MembershipChange::Add { .. }) =>
            {
                founder.found().await.map_err(|error| {
                    Status::unavailable(format!("cetera: cannot found a cluster: {error:#}"))
                })?
            }
            (None, SingleServer::Founds(_)) => {
                return Err(Status::failed_precondition(
                    "cetera: a single server has no other member to change; `member add` \
                     makes it the first member of a cluster",
                ));
            }
            (None, SingleServer::Refuses(why)) => return Err(Status::failed_precondition(*why)),
        };
        cluster
            .change_membership(change)
            .await
            .map_err(membership_status)?;
        Ok(self.members())
    }
}

/// etcd's status for a failed membership change.
fn membership_status(error: MembershipError) -> Status {
    let code = match error {
        MembershipError::NotFound => Code::NotFound,
        MembershipError::NotLearner
        | MembershipError::LearnerNotReady
        | MembershipError::PeerUrlExists
        | MembershipError::TooManyLearners => Code::FailedPrecondition,
        MembershipError::NoLeader => Code::Unavailable,
        MembershipError::Failed(message) => {
            return Status::unavailable(format!("cetera: membership change failed: {message}"));
        }
    };
    Status::new(code, format!("etcdserver: {error}"))
}

/// Why a server on PostgreSQL or MySQL takes no members: its instances
/// share the database, which keeps their data and replicates it; none of
/// them is a Raft member.
pub const SHARED_DATABASE: &str = "cetera: servers sharing a PostgreSQL or MySQL database are not \
     Raft members: the database keeps and replicates the data; add a server by starting it \
     on the same --endpoint";

/// The one peer URL of a member, checked as etcd checks URLs: http or https,
/// a host with a port, nothing after it. A cetera member has one peer URL.
fn peer_url(urls: &[String]) -> Result<String, Status> {
    let bad = || Status::invalid_argument("etcdserver: given member URLs are invalid");
    let [url] = urls else {
        if urls.is_empty() {
            return Err(bad());
        }
        return Err(Status::invalid_argument(
            "cetera: a member has exactly one peer URL",
        ));
    };
    let url = url.trim();
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(bad());
    };
    let plain = matches!(scheme, "http" | "https")
        && authority.port().is_some()
        && url == format!("{scheme}://{authority}");
    if plain {
        Ok(url.to_string())
    } else {
        Err(bad())
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        // Membership changes are for admins (etcd's checkMembershipOperationPermission).
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let request = request.into_inner();
        let peer_url = peer_url(&request.peer_ur_ls)?;
        // etcd derives ids from the URLs and the time; any unused id will do.
        let id = rand::random_range(1..=i64::MAX as u64);
        let members = self
            .change(MembershipChange::Add {
                id,
                peer_url,
                learner: request.is_learner,
            })
            .await?;
        let member = members.iter().find(|m| m.id == id).cloned();
        Ok(Response::new(MemberAddResponse {
            header: self.info.header(0),
            member,
            members,
        }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        // Membership changes are for admins (etcd's checkMembershipOperationPermission).
        self.info
            .require_admin(request.metadata(), request.extensions())?;
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
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let request = request.into_inner();
        let peer_url = peer_url(&request.peer_ur_ls)?;
        let members = self
            .change(MembershipChange::Update {
                id: request.id,
                peer_url,
            })
            .await?;
        Ok(Response::new(MemberUpdateResponse {
            header: self.info.header(0),
            members,
        }))
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
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let members = self
            .change(MembershipChange::Promote(request.get_ref().id))
            .await?;
        Ok(Response::new(MemberPromoteResponse {
            header: self.info.header(0),
            members,
        }))
    }
}
