//! Where a write goes: to the replicated log when the store joined one
//! (`crate::raft`), else straight to the local writer's queue. The one place
//! that rule is written; the store's calls and its background jobs all send
//! through `Writes`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::apply;
use super::error::{StoreError, StoreResult};
use super::request::{Queued, WriteRequest, WriteResponse};
use crate::metrics::{GaugeGuard, metrics};

/// A boxed future, for the object-safe `Replication`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A replicated log that decides the order of a cluster's writes and applies
/// them on every member (`crate::raft`). A store without one writes alone.
pub trait Replication: Send + Sync + 'static {
    /// Puts `request`, made at `at_ms` (Unix milliseconds), in the log, and
    /// answers once this member has applied it.
    fn propose(
        &self,
        request: WriteRequest,
        at_ms: i64,
    ) -> BoxFuture<'_, StoreResult<WriteResponse>>;

    /// Waits until this member has applied every write committed before the
    /// call: the barrier in front of a linearizable read.
    fn read_barrier(&self) -> BoxFuture<'_, StoreResult<()>>;

    /// This member's leadership, if it leads: the leader alone expires
    /// leases and runs automatic compaction, through the log, and holds the
    /// leases' deadlines (`leader_leases`).
    fn leadership(&self) -> Option<Leadership>;

    /// Has the leader's `Lessor` answer `call`: this member's own when it
    /// leads, else the leader's, asked over the peer network.
    fn ask_lessor(&self, call: LeaseCall) -> BoxFuture<'_, StoreResult<Option<i64>>>;
}

/// A term in which this member leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// The Raft term.
    pub term: u64,
    /// When (Unix ms) this member began to lead in it.
    pub since_ms: i64,
}

/// A lease call only the leader answers, as etcd's followers forward
/// keep-alives and TimeToLive to the leader's lessor.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub enum LeaseCall {
    /// Renew the lease: its TTL, or `None` for an unknown or expired one.
    KeepAlive(i64),
    /// The lease's deadline (Unix ms), or `None` for an unknown one.
    Deadline(i64),
}

/// The leader's side of `LeaseCall`s (the store's, see `leader_leases`).
pub trait Lessor: Send + Sync + 'static {
    /// Answers `call` as the leader in `leadership`.
    fn answer(
        &self,
        leadership: Leadership,
        call: LeaseCall,
    ) -> BoxFuture<'_, StoreResult<Option<i64>>>;
}

/// Where writes go: to the replicated log when there is one, else straight
/// to the local writer. Holds only a weak handle on the writer queue (the
/// store holds the strong one), so that background jobs holding a `Writes`
/// do not keep shutdown waiting.
#[derive(Clone)]
pub(crate) struct Writes {
    queue: mpsc::WeakSender<Queued>,
    replication: Arc<OnceLock<Arc<dyn Replication>>>,
    /// Held (shared) by every write on its way straight to the writer; held
    /// alone while a single server turns into a cluster's founding member
    /// (`pause_direct_writes`), so that no write reaches the store around
    /// the log once the log takes over.
    direct: Arc<tokio::sync::RwLock<()>>,
}

/// Held while a single server becomes a cluster member: writes wait, and
/// once it is dropped they go the way the store's writes go then.
pub struct DirectWritesPaused {
    _held: tokio::sync::OwnedRwLockWriteGuard<()>,
}

impl Writes {
    /// Writes into `queue` until a replicated log is set.
    pub(super) fn new(queue: &mpsc::Sender<Queued>) -> Self {
        Writes {
            queue: queue.downgrade(),
            replication: Arc::default(),
            direct: Arc::default(),
        }
    }

    /// Waits until every write sent straight to the writer is answered, and
    /// holds later ones until the pause is dropped (see `Writes::send`).
    pub(super) async fn pause_direct_writes(&self) -> DirectWritesPaused {
        DirectWritesPaused {
            _held: self.direct.clone().write_owned().await,
        }
    }

    /// Sends every later write through `replication`. Done once: right
    /// after opening, or while direct writes are paused.
    pub(super) fn replicate_through(&self, replication: Arc<dyn Replication>) {
        if self.replication.set(replication).is_err() {
            tracing::warn!("the store already has a replicated log");
        }
    }

    /// Sends `request` the way this store's writes go.
    pub(crate) async fn send(&self, request: WriteRequest) -> StoreResult<WriteResponse> {
        let _pending = GaugeGuard::new(&metrics().proposals_pending);
        let answer = match self.replication.get() {
            Some(replication) => replication.propose(request, apply::now_ms()).await,
            None => {
                // Looked at again once past the gate: a pause may have set a
                // replicated log meanwhile.
                let direct = self.direct.read().await;
                match self.replication.get() {
                    Some(replication) if request.is_replicated() => {
                        drop(direct);
                        replication.propose(request, apply::now_ms()).await
                    }
                    _ => self.local(request).await,
                }
            }
        };
        if let Err(error) = &answer
            && error.is_failed_proposal()
        {
            metrics().proposals_failed.inc();
        }
        answer
    }

    /// Sends `request` to this member's writer alone: the writer's own
    /// housekeeping (a compaction step), which is never replicated.
    pub(super) async fn local(&self, request: WriteRequest) -> StoreResult<WriteResponse> {
        let queue = self.queue.upgrade().ok_or(StoreError::Stopped)?;
        let (reply, answer) = oneshot::channel();
        let queued = Queued {
            request,
            at_ms: apply::now_ms(),
            mark: None,
            entry_continues: false,
            reply,
        };
        queue.send(queued).await.map_err(|_| StoreError::Stopped)?;
        answer.await.map_err(|_| StoreError::Stopped)?
    }

    /// In replicated mode, waits until this member has applied every write
    /// committed so far (etcd's linearizable read).
    pub(super) async fn read_barrier(&self) -> StoreResult<()> {
        match self.replication.get() {
            Some(replication) => replication.read_barrier().await,
            None => Ok(()),
        }
    }

    /// Whether this member decides cluster-wide writes of its own (lease
    /// expiry, automatic compaction): always when alone, when leading in a
    /// cluster.
    pub(crate) fn decides(&self) -> bool {
        self.replication
            .get()
            .is_none_or(|r| r.leadership().is_some())
    }

    /// The replicated log, when the store joined one.
    pub(crate) fn replication(&self) -> Option<&Arc<dyn Replication>> {
        self.replication.get()
    }
}

/// The local writer, for a replicated log applying its entries here.
#[derive(Clone)]
pub struct LocalWriter {
    queue: mpsc::WeakSender<Queued>,
}

impl LocalWriter {
    /// A writer that queues into `queue`, without holding it open.
    pub(super) fn new(queue: &mpsc::Sender<Queued>) -> Self {
        LocalWriter {
            queue: queue.downgrade(),
        }
    }

    /// Queues the requests of one replicated log entry (each with the time
    /// it was made), which bring the store to log position `mark`, and
    /// returns where their answers will come. The writer commits them in
    /// one commit.
    pub async fn queue_entry(
        &self,
        requests: Vec<(WriteRequest, i64)>,
        mark: Vec<u8>,
    ) -> StoreResult<Vec<oneshot::Receiver<StoreResult<WriteResponse>>>> {
        let queue = self.queue.upgrade().ok_or(StoreError::Stopped)?;
        // Room for all first, then no await until all are sent: a caller
        // stopped midway cannot leave part of an entry queued.
        let mut room = queue
            .reserve_many(requests.len())
            .await
            .map_err(|_| StoreError::Stopped)?;
        let last = requests.len().saturating_sub(1);
        let mut answers = Vec::with_capacity(requests.len());
        for (n, (request, at_ms)) in requests.into_iter().enumerate() {
            let (reply, answer) = oneshot::channel();
            let slot = room.next().ok_or(StoreError::Stopped)?;
            slot.send(Queued {
                request,
                at_ms,
                mark: Some(mark.clone()),
                entry_continues: n < last,
                reply,
            });
            answers.push(answer);
        }
        Ok(answers)
    }
}
