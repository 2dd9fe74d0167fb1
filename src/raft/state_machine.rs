//! The state machine: this member's SQLite store. Entries apply through the
//! store's ordinary writer, each with its `Mark` in the same commit, so the
//! store always knows exactly which entries it holds and a restart replays
//! none twice. Because the store is durable, it is its own snapshot: building
//! one only records the mark, and a member that needs one gets a consistent
//! copy of the database (`crate::backend::snapshot`), taken when it is sent.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageIOError};

use super::member::Member;
use super::openraft_types::{LogId, StorageError, StoredMembership, TypeConfig, any_error};
use super::proposal::{Mark, Proposals, Waiters};
use crate::backend::Backend;
use crate::store::request::{WriteRequest, WriteResponse};
use crate::store::{Identity, LocalWriter, Store, StoreError};

type Entry = openraft::Entry<TypeConfig>;

/// This member's store as openraft's state machine.
pub struct StateMachine<B: Backend> {
    store: Arc<Store<B>>,
    writer: LocalWriter,
    waiters: Arc<Waiters>,
    /// This member's id: answers go to waiters only for its own proposals.
    member_id: u64,
    /// The membership as of the last entry applied.
    membership: StoredMembership,
    /// Folder for snapshot files while they are built or received.
    scratch: PathBuf,
    /// Whether openraft has read the current snapshot once: it does at
    /// startup, for the meta alone, which must not cost a database copy.
    started: bool,
}

impl<B: Backend> StateMachine<B> {
    /// The state machine on `store`, answering `waiters`.
    pub fn new(store: Arc<Store<B>>, waiters: Arc<Waiters>, scratch: PathBuf) -> Self {
        StateMachine {
            writer: store.local_writer(),
            member_id: store.identity().member_id,
            store,
            waiters,
            membership: StoredMembership::default(),
            scratch,
            started: false,
        }
    }

    async fn mark(&self) -> anyhow::Result<Mark> {
        match self.store.replica().mark().await? {
            Some(bytes) => Mark::decode(&bytes),
            None => Ok(Mark::default()),
        }
    }

    /// A consistent copy of the store, with the mark it is at.
    async fn copy(&self) -> anyhow::Result<(Vec<u8>, Mark)> {
        std::fs::create_dir_all(&self.scratch)?;
        let file = tempfile::NamedTempFile::new_in(&self.scratch)?;
        let mark = match self.store.replica().copy_to(file.path()).await? {
            Some(bytes) => Mark::decode(&bytes)?,
            None => Mark::default(),
        };
        Ok((std::fs::read(file.path())?, mark))
    }

    /// Replaces the store with the snapshot `data`, which is at `mark`.
    async fn replace(&self, data: &[u8], mark: &Mark, identity: Identity) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.scratch)?;
        let file = tempfile::NamedTempFile::new_in(&self.scratch)?;
        std::fs::write(file.path(), data)?;
        self.store
            .replica()
            .install(file.path(), &mark.encode(), identity)
            .await
    }
}

fn snapshot_meta(mark: &Mark) -> SnapshotMeta<u64, Member> {
    let id = match &mark.applied {
        Some(log_id) => format!("{}-{}", log_id.leader_id.term, log_id.index),
        None => "0-0".to_string(),
    };
    SnapshotMeta {
        last_log_id: mark.applied,
        last_membership: mark.membership.clone(),
        snapshot_id: id,
    }
}

fn sm_read_error(error: impl std::fmt::Display) -> StorageError {
    StorageIOError::read_state_machine(any_error(error)).into()
}

fn sm_write_error(error: impl std::fmt::Display) -> StorageError {
    StorageIOError::write_state_machine(any_error(error)).into()
}

/// Builds snapshots: the store is durable, so a snapshot is the mark it is at.
pub struct SnapshotBuilder<B: Backend> {
    store: Arc<Store<B>>,
}

impl<B: Backend> RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder<B> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let mark = match self.store.replica().mark().await.map_err(sm_read_error)? {
            Some(bytes) => Mark::decode(&bytes).map_err(sm_read_error)?,
            None => Mark::default(),
        };
        // The store commits without syncing (see Cluster::start); openraft
        // purges the log up to a snapshot, so what the mark covers must be
        // on disk first.
        self.store
            .replica()
            .make_durable()
            .await
            .map_err(sm_write_error)?;
        // The data is copied when a member needs it (get_current_snapshot).
        Ok(Snapshot {
            meta: snapshot_meta(&mark),
            snapshot: Box::new(Cursor::new(Vec::new())),
        })
    }
}

impl<B: Backend> RaftStateMachine<TypeConfig> for StateMachine<B> {
    type SnapshotBuilder = SnapshotBuilder<B>;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let mark = self.mark().await.map_err(sm_read_error)?;
        self.membership = mark.membership.clone();
        Ok((mark.applied, mark.membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Queue every entry first, so that the writer commits them together.
        let mut queued = Vec::new();
        for entry in entries {
            let proposals = match entry.payload {
                EntryPayload::Normal(Proposals(proposals)) => proposals,
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Vec::new()
                }
                EntryPayload::Blank => Vec::new(),
            };
            let mark = Mark {
                applied: Some(entry.log_id),
                membership: self.membership.clone(),
            };
            // An entry without requests still moves the mark.
            let (requests, waiting): (Vec<_>, Vec<_>) = match proposals.is_empty() {
                true => (vec![(WriteRequest::Nothing, 0)], vec![None]),
                false => proposals
                    .into_iter()
                    .map(|p| {
                        let waiting = (p.origin == self.member_id).then_some(p.seq);
                        ((p.request, p.at_ms), waiting)
                    })
                    .unzip(),
            };
            let answers = self
                .writer
                .queue_entry(requests, mark.encode())
                .await
                .map_err(sm_write_error)?;
            queued.push((entry.log_id, waiting, answers));
        }
        let mut applied = Vec::with_capacity(queued.len());
        for (log_id, waiting, answers) in queued {
            for (seq, answer) in waiting.into_iter().zip(answers) {
                let answer: Result<WriteResponse, StoreError> = answer
                    .await
                    .map_err(|_| StorageIOError::apply(log_id, any_error("the store stopped")))?;
                if let Err(StoreError::Backend(error)) = &answer {
                    return Err(
                        StorageIOError::apply(log_id, any_error(format!("{error:#}"))).into(),
                    );
                }
                if let Some(seq) = seq {
                    self.waiters.answer(seq, answer);
                }
            }
            applied.push(());
        }
        Ok(applied)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder<B> {
        SnapshotBuilder {
            store: self.store.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, Member>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let mark = Mark {
            applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        self.replace(snapshot.get_ref(), &mark, self.store.identity())
            .await
            .map_err(sm_write_error)?;
        // openraft purges the log the snapshot covers: the store must keep it.
        self.store
            .replica()
            .make_durable()
            .await
            .map_err(sm_write_error)?;
        tracing::info!(snapshot = %meta.snapshot_id, "installed a snapshot from the leader");
        self.membership = mark.membership;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        if !self.started {
            self.started = true;
            let snapshot = self.get_snapshot_builder().await.build_snapshot().await?;
            return Ok(snapshot.meta.last_log_id.is_some().then_some(snapshot));
        }
        let (data, mark) = self.copy().await.map_err(sm_read_error)?;
        if mark.applied.is_none() {
            return Ok(None);
        }
        Ok(Some(Snapshot {
            meta: snapshot_meta(&mark),
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
