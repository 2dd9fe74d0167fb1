//! The Maintenance service: Status and Alarm for now. Snapshot, Defragment,
//! Hash, HashKV, MoveLeader and Downgrade answer Unimplemented until their
//! issue lands.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{RAFT_TERM, ServerInfo};
use crate::backend::Backend;
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use crate::store::Store;

/// The Maintenance service on a store.
pub struct MaintenanceService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
}

impl<B: Backend> MaintenanceService<B> {
    /// The service answering for `store`.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>) -> Self {
        MaintenanceService { store, info }
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend> Maintenance for MaintenanceService<B> {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        if request.get_ref().action == AlarmAction::Get as i32 {
            self.info.auth.require_user(request.metadata())?;
        } else {
            self.info.auth.require_admin(request.metadata())?;
        }
        // No alarm is ever raised yet, so listing and disarming both find none.
        match AlarmAction::try_from(request.into_inner().action) {
            Ok(AlarmAction::Get | AlarmAction::Deactivate) => Ok(Response::new(AlarmResponse {
                header: self.info.header(self.store.revisions().current),
                alarms: Vec::new(),
            })),
            _ => Err(Status::unimplemented(
                "cetera: raising alarms is not implemented",
            )),
        }
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.info.auth.require_user(request.metadata())?;
        let size = self.store.size().await?;
        let revision = self.store.revisions().current;
        Ok(Response::new(StatusResponse {
            header: self.info.header(revision),
            version: self.info.version.clone(),
            db_size: size.total,
            leader: self.info.identity.member_id,
            // There is no raft log on a single node; the revision counts commits.
            raft_index: revision as u64,
            raft_term: RAFT_TERM,
            raft_applied_index: revision as u64,
            errors: Vec::new(),
            db_size_in_use: size.in_use,
            is_learner: false,
        }))
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.info.auth.require_admin(request.metadata())?;
        Err(Status::unimplemented(
            "cetera: Defragment is not implemented yet",
        ))
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.info.auth.require_admin(request.metadata())?;
        Err(Status::unimplemented("cetera: Hash is not implemented yet"))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.info.auth.require_admin(request.metadata())?;
        Err(Status::unimplemented(
            "cetera: HashKV is not implemented yet",
        ))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        self.info.auth.require_admin(request.metadata())?;
        Err(Status::unimplemented(
            "cetera: Snapshot is not implemented yet",
        ))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        self.info.auth.require_admin(request.metadata())?;
        Err(Status::unimplemented(
            "cetera: MoveLeader is not implemented yet",
        ))
    }

    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        self.info.auth.require_admin(request.metadata())?;
        Err(Status::unimplemented(
            "cetera: Downgrade is not implemented",
        ))
    }
}
