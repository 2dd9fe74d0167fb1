//! The Maintenance service: Status, Alarm, Snapshot, Defragment, Hash,
//! HashKV, MoveLeader and, on a single server, Downgrade (see
//! `super::downgrade`).

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::downgrade::Downgrade;
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
use crate::raft::HandoverError;
use crate::store::Store;
use crate::store::alarm;
use crate::store::request::AlarmChange;

/// The Maintenance service on a store.
pub struct MaintenanceService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
    downgrade: Downgrade,
}

impl<B: Backend> MaintenanceService<B> {
    /// The service answering for `store`.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>) -> Self {
        let downgrade = Downgrade::new(&info.version);
        MaintenanceService {
            store,
            info,
            downgrade,
        }
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

/// Bytes per snapshot message, as etcd sends them.
const SNAPSHOT_CHUNK_BYTES: usize = 32 * 1024;
/// Messages read ahead of a slow client.
const SNAPSHOT_CHUNKS_IN_FLIGHT: usize = 8;

/// Streams the file at `path` into `chunks`, then its SHA-256, each message
/// with etcd 3.6's storage `version` (empty for a 3.5). Stops quietly when
/// the client goes away.
fn send_snapshot(
    path: &std::path::Path,
    version: &str,
    chunks: &tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
) -> Result<(), Status> {
    use sha2::Digest;
    use std::io::Read;
    let read_error =
        |e: std::io::Error| Status::internal(format!("cetera: cannot read snapshot: {e}"));
    let mut file = std::fs::File::open(path).map_err(read_error)?;
    let total = file.metadata().map_err(read_error)?.len();
    let mut hasher = sha2::Sha256::new();
    let mut sent = 0u64;
    while sent < total {
        let mut blob = vec![0u8; SNAPSHOT_CHUNK_BYTES];
        let mut filled = 0;
        while filled < blob.len() {
            match file.read(&mut blob[filled..]).map_err(read_error)? {
                0 => break,
                n => filled += n,
            }
        }
        if filled == 0 {
            return Err(Status::internal("cetera: snapshot file shrank while sent"));
        }
        blob.truncate(filled);
        sent += filled as u64;
        hasher.update(&blob);
        let chunk = SnapshotResponse {
            header: None,
            remaining_bytes: total.saturating_sub(sent),
            blob,
            version: version.to_string(),
        };
        if chunks.blocking_send(Ok(chunk)).is_err() {
            return Ok(());
        }
    }
    let _ = chunks.blocking_send(Ok(SnapshotResponse {
        header: None,
        remaining_bytes: 0,
        blob: hasher.finalize().to_vec(),
        version: version.to_string(),
    }));
    Ok(())
}

#[tonic::async_trait]
impl<B: Backend> Maintenance for MaintenanceService<B> {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        if request.get_ref().action == AlarmAction::Get as i32 {
            self.info
                .require_user(request.metadata(), request.extensions())?;
        } else {
            self.info
                .require_admin(request.metadata(), request.extensions())?;
        }
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

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.info
            .require_user(request.metadata(), request.extensions())?;
        let size = self.store.size().await?;
        let revision = self.store.revisions().current;
        // etcd lists each raised alarm in the protobuf text form of its
        // AlarmMember: gogo's with a trailing space up to 3.5, protobuf-go's
        // without from 3.6.
        let end = if self.info.emulates_36() { "" } else { " " };
        let errors = self
            .store
            .alarms(AlarmType::None as i32)
            .await?
            .into_iter()
            .map(|row| {
                format!(
                    "memberID:{} alarm:{}{end}",
                    row.member_id as u64,
                    alarm::alarm_name(row.alarm)
                )
            })
            .collect();
        // A single node has no raft log; the revision counts its commits.
        let (leader, raft_index, raft_term, raft_applied_index, is_learner) =
            match self.info.cluster() {
                None => (
                    self.info.identity.member_id,
                    revision as u64,
                    RAFT_TERM,
                    revision as u64,
                    false,
                ),
                Some(cluster) => {
                    let status = cluster.status();
                    let me = self.info.identity.member_id;
                    let is_learner = cluster.members().iter().any(|m| m.id == me && m.is_learner);
                    (
                        status.leader.unwrap_or(0),
                        status.last_log_index,
                        status.term,
                        status.applied_index,
                        is_learner,
                    )
                }
            };
        let mut resp = StatusResponse {
            header: self.info.header(revision),
            version: self.info.version.clone(),
            db_size: size.total,
            leader,
            raft_index,
            raft_term,
            raft_applied_index,
            errors,
            db_size_in_use: size.in_use,
            is_learner,
            ..Default::default()
        };
        super::status_fields::fill(
            &mut resp,
            &self.info.version,
            self.info.quota_backend_bytes,
            self.downgrade.view(&self.store).await?,
        );
        Ok(Response::new(resp))
    }

    /// Like etcd, answers with an empty response (not even a header) once
    /// the space is given back.
    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        self.store.defragment().await?;
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let (hash, revision) = self.store.hash().await?;
        Ok(Response::new(HashResponse {
            header: self.info.header(revision),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let hashed = self.store.hash_kv(request.into_inner().revision).await?;
        Ok(Response::new(HashKvResponse {
            header: self.info.header(hashed.current),
            hash: hashed.hash,
            compact_revision: hashed.compact,
            // A 3.6 field; a 3.5 does not send it.
            hash_revision: if self.info.emulates_36() {
                hashed.revision
            } else {
                0
            },
        }))
    }

    type SnapshotStream = SnapshotStream;

    /// Builds the snapshot database in a temporary directory from one
    /// consistent read, then streams it in 32 KiB chunks counting down
    /// `remaining_bytes`, and last the SHA-256 of everything sent, as etcd does.
    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let dir = tempfile::Builder::new()
            .prefix("cetera-snapshot-")
            .tempdir()
            .map_err(|e| Status::internal(format!("cetera: cannot create a snapshot file: {e}")))?;
        let path = dir.path().join("snapshot.db");
        // The store copies on a blocking thread, holding no runtime worker.
        self.store.snapshot_to(&path).await.map_err(|e| {
            tracing::error!("snapshot failed: {e:#}");
            Status::internal(format!("cetera: snapshot failed: {e:#}"))
        })?;
        let version = super::status_fields::storage_version(
            &self.info.version,
            self.downgrade.view(&self.store).await?,
        );
        let (chunks, stream) = tokio::sync::mpsc::channel(SNAPSHOT_CHUNKS_IN_FLIGHT);
        tokio::task::spawn_blocking(move || {
            if let Err(status) = send_snapshot(&path, &version, &chunks) {
                let _ = chunks.blocking_send(Err(status));
            }
            // The temporary directory goes once everything is sent.
            drop(dir);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(stream),
        )))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let target = request.get_ref().target_id;
        let moved = match self.info.cluster() {
            // A single server leads already, and nobody else can.
            None if target == self.info.identity.member_id => Ok(()),
            None => Err(HandoverError::BadTransferee),
            Some(cluster) => cluster.move_leader(target).await,
        };
        moved.map_err(|error| {
            let code = match error {
                HandoverError::NotLeader | HandoverError::BadTransferee => {
                    tonic::Code::FailedPrecondition
                }
                HandoverError::TimedOut => tonic::Code::Unavailable,
            };
            Status::new(code, format!("etcdserver: {error}"))
        })?;
        // etcd answers without a header.
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }

    /// An admin is needed when auth is on, as in etcd 3.6 and 3.5.28 on
    /// (earlier 3.5 releases check nothing).
    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        if self.info.cluster().is_some() {
            // The state would have to be replicated, as etcd's cluster state is.
            return Err(Status::unimplemented(
                "cetera: Downgrade is served only by a single server",
            ));
        }
        let request = request.into_inner();
        let version = self
            .downgrade
            .answer(&self.store, request.action, &request.version)
            .await?;
        let revision = self.store.revisions().current;
        Ok(Response::new(DowngradeResponse {
            header: self.info.header(revision),
            version,
        }))
    }
}
