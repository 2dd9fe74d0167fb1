//! The Maintenance service: Status and Alarm for now. Snapshot, Defragment,
//! Hash, HashKV, MoveLeader and Downgrade answer Unimplemented until their
//! issue lands.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{RAFT_TERM, ServerInfo};
use crate::backend::{AlarmRow, Backend};
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse,
    DowngradeRequest, DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse,
    MoveLeaderRequest, MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest,
    StatusResponse,
};
use crate::store::Store;
use crate::store::alarm::{self, AlarmChange};

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

/// An alarm as the wire carries it.
fn alarm_member(row: AlarmRow) -> AlarmMember {
    AlarmMember {
        member_id: row.member_id as u64,
        alarm: row.alarm,
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend> Maintenance for MaintenanceService<B> {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let request = request.into_inner();
        let alarms = match AlarmAction::try_from(request.action) {
            Ok(AlarmAction::Get) => self.store.alarms(request.alarm).await?,
            Ok(AlarmAction::Activate) => {
                self.store
                    .change_alarm(AlarmChange::Activate, request.member_id, request.alarm)
                    .await?
            }
            Ok(AlarmAction::Deactivate) => {
                self.store
                    .change_alarm(AlarmChange::Deactivate, request.member_id, request.alarm)
                    .await?
            }
            // etcd's applier answers an unknown action with nothing.
            Err(_) => Vec::new(),
        };
        Ok(Response::new(AlarmResponse {
            header: self.info.header(self.store.revisions().current),
            alarms: alarms.into_iter().map(alarm_member).collect(),
        }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let size = self.store.size().await?;
        let revision = self.store.revisions().current;
        // etcd lists each raised alarm in the protobuf text form of its AlarmMember.
        let errors = self
            .store
            .alarms(AlarmType::None as i32)
            .await?
            .into_iter()
            .map(|row| {
                format!(
                    "memberID:{} alarm:{} ",
                    row.member_id as u64,
                    alarm::alarm_name(row.alarm)
                )
            })
            .collect();
        Ok(Response::new(StatusResponse {
            header: self.info.header(revision),
            version: self.info.version.clone(),
            db_size: size.total,
            leader: self.info.identity.member_id,
            // There is no raft log on a single node; the revision counts commits.
            raft_index: revision as u64,
            raft_term: RAFT_TERM,
            raft_applied_index: revision as u64,
            errors,
            db_size_in_use: size.in_use,
            is_learner: false,
        }))
    }

    async fn defragment(
        &self,
        _: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        Err(Status::unimplemented(
            "cetera: Defragment is not implemented yet",
        ))
    }

    async fn hash(&self, _: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(Status::unimplemented("cetera: Hash is not implemented yet"))
    }

    async fn hash_kv(&self, _: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        Err(Status::unimplemented(
            "cetera: HashKV is not implemented yet",
        ))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        Err(Status::unimplemented(
            "cetera: Snapshot is not implemented yet",
        ))
    }

    async fn move_leader(
        &self,
        _: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(Status::unimplemented(
            "cetera: MoveLeader is not implemented yet",
        ))
    }

    async fn downgrade(
        &self,
        _: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(Status::unimplemented(
            "cetera: Downgrade is not implemented",
        ))
    }
}
