//! The etcd semantics boundary: revisions, ranges, txns and compaction,
//! written once on top of any `Backend`.
//!
//! Reads run on their own consistent snapshot. Writes are queued to one
//! writer task (see `writer`), which applies them in order with group commit.
//! Physical compaction runs in the background in short steps through the same
//! writer, so it never holds other writes up for long.

pub mod alarm;
mod apply;
mod background;
mod compaction_hashes;
#[cfg(test)]
mod conformance;
mod count_cache;
pub mod error;
pub mod hash;
mod history;
pub mod hub;
mod leader_leases;
mod lease_deadlines;
mod lease_ids;
mod publisher;
pub mod range;
pub mod range_stream;
mod replica;
pub mod request;
mod routing;
mod settings;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use self::alarm::Quota;
pub use self::apply::TxnChecks;
use self::background::CompactionState;
pub use self::background::auto_compaction::{self, AutoCompaction};
use self::count_cache::CountCache;
pub use self::error::{StoreError, StoreResult};
use self::leader_leases::LeaderLeases;
use self::lease_deadlines::LeaseDeadlines;
use self::lease_ids::LeaseIds;
use self::publisher::Publisher;
use self::request::{AlarmChange, Answer, AuthWrite, Queued, WriteRequest};
use self::routing::Writes;
pub use self::routing::{
    BoxFuture, DirectWritesPaused, Leadership, LeaseCall, Lessor, LocalWriter, Replication,
};
use crate::backend::{
    AlarmRow, Backend, DatabaseSize, DiskFull, LeaseRow, ReadTxn, Revisions, WriteTxn,
};
use crate::metrics::metrics;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveResponse, LeaseLeasesResponse,
    LeaseRevokeResponse, LeaseStatus, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use crate::store::hub::{RevisionEvents, WatchHub};

/// Write requests waiting for the writer before senders wait too.
const QUEUE_DEPTH: usize = 4096;

/// Ids a server-chosen grant passes over because another server granted
/// them, before it answers `lease already exists`: a bound that no
/// database shared by differently numbered instances comes near.
const MAX_LEASE_ID_CLASHES: u32 = 100;

/// The ids this store reports in every response header; chosen once, kept in
/// the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// etcd cluster id.
    pub cluster_id: u64,
    /// etcd member id of this server.
    pub member_id: u64,
}

/// Settings of a store beyond its database.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreOptions {
    /// etcd's --quota-backend-bytes: 0 for the 2 GiB default, negative for none.
    pub quota_backend_bytes: i64,
    /// Automatic compaction, if on.
    pub auto_compaction: Option<AutoCompaction>,
    /// Answer lease keep-alives from memory and store the deadlines in
    /// batches (`lease_deadlines`), where the backend is its database's
    /// only writer. Off for a cluster member, whose leases change through
    /// the replicated log.
    pub keep_alives_in_memory: bool,
    /// The order of a Txn's checks: the emulated etcd's.
    pub txn_checks: TxnChecks,
    /// Keep the HashKV of each compaction's revision and answer HashKV at
    /// the compact revision, as etcd 3.6 and later do (`compaction_hashes`).
    pub compaction_hashes: bool,
}

/// An etcd key-value store on a database.
pub struct Store<B: Backend> {
    backend: Arc<B>,
    /// The writer's queue, held open while the store is (`Writes` and
    /// `LocalWriter` hold it weakly).
    queue: mpsc::Sender<Queued>,
    /// Where writes go.
    writes: Writes,
    revisions: watch::Receiver<Revisions>,
    publisher: Arc<Publisher<B>>,
    cluster_id: u64,
    /// The member id: fixed, except when a new cluster member takes the id
    /// reserved for it (`adopt_member_id`).
    member_id: AtomicU64,
    quota: Quota,
    /// The compactor's out-of-space flag and, when kept as etcd 3.6 keeps
    /// them, the HashKV of the latest compactions.
    compaction: CompactionState,
    /// Range counts of committed revisions, reused by later reads.
    counts: CountCache,
    /// Lease deadlines ahead of the database, when keep-alives are answered
    /// from memory.
    lease_deadlines: Option<Arc<LeaseDeadlines>>,
    /// Lease deadlines while this member leads a cluster.
    leader_leases: Arc<LeaderLeases>,
    /// The ids of leases this server grants without a client's id.
    lease_ids: LeaseIds,
    writer: JoinHandle<()>,
    /// Compactor, lease expirer, poller: stopped at shutdown.
    background: Vec<JoinHandle<()>>,
}

impl<B: Backend> Store<B> {
    /// Opens the store on `backend` with default options (tests).
    #[cfg(test)]
    pub async fn open(backend: B) -> anyhow::Result<Self> {
        Self::open_with(backend, StoreOptions::default()).await
    }

    /// Opens the store on `backend` and starts its writer and compactors.
    pub async fn open_with(backend: B, options: StoreOptions) -> anyhow::Result<Self> {
        let backend = Arc::new(backend);
        let identity = settings::load_identity(&*backend).await?;
        let lease_ids = LeaseIds::new(
            settings::claim_lease_id_instance(&*backend).await?,
            apply::now_ms() as u64,
        );
        lease_deadlines::recover(&*backend).await?;
        let initial = backend.read().await?.revisions().await?;
        let hub = Arc::new(WatchHub::new(initial.current));
        let publisher = Arc::new(Publisher::new(
            backend.clone(),
            hub,
            watch::Sender::new(initial),
        ));
        let revisions = publisher.subscribe();
        let (queue, queue_rx) = mpsc::channel(QUEUE_DEPTH);
        let lease_deadlines = (options.keep_alives_in_memory && backend.is_only_writer())
            .then(|| Arc::new(LeaseDeadlines::default()));
        let writer = writer::start(
            backend.clone(),
            queue_rx,
            publisher.clone(),
            lease_deadlines.clone(),
            options.txn_checks,
        );
        let writes = Writes::new(&queue);
        let leader_leases = Arc::new(LeaderLeases::default());
        let compaction = CompactionState {
            out_of_space: Arc::new(AtomicBool::new(false)),
            hashes: options
                .compaction_hashes
                .then(|| Arc::new(compaction_hashes::CompactionHashes::default())),
        };
        let background = background::start(
            &backend,
            &writes,
            &leader_leases,
            &revisions,
            Arc::downgrade(&publisher),
            options.auto_compaction,
            &compaction,
        );
        Ok(Store {
            backend,
            queue,
            writes,
            revisions,
            publisher,
            cluster_id: identity.cluster_id,
            member_id: AtomicU64::new(identity.member_id),
            quota: Quota::new(options.quota_backend_bytes),
            compaction,
            counts: CountCache::default(),
            lease_deadlines,
            leader_leases,
            lease_ids,
            writer,
            background,
        })
    }

    /// The cluster and member ids.
    pub fn identity(&self) -> Identity {
        Identity {
            cluster_id: self.cluster_id,
            member_id: self.member_id.load(Ordering::Relaxed),
        }
    }

    /// Takes `member_id` as this store's member id from now on: the id a
    /// cluster reserved for this member before it joined.
    pub async fn adopt_member_id(&self, member_id: u64) -> anyhow::Result<()> {
        let mut txn = self.backend.write().await?;
        txn.set_setting(crate::backend::settings::MEMBER_ID, member_id as i64)
            .await?;
        txn.commit().await?;
        self.member_id.store(member_id, Ordering::Relaxed);
        Ok(())
    }

    /// Sends every later write through `replication`, which applies them here
    /// through `local_writer`. Done once: right after opening, or while
    /// direct writes are paused (`pause_direct_writes`).
    pub fn replicate_through(&self, replication: Arc<dyn Replication>) {
        self.writes.replicate_through(replication);
    }

    /// Makes a serving single store ready to become a cluster member: waits
    /// until every write sent straight to the writer is answered and holds
    /// later ones until the returned pause is dropped; then stores the lease
    /// deadlines keep-alives moved in memory and stops answering keep-alives
    /// from memory (in a cluster the leader holds the deadlines), so that
    /// the store a founding snapshot copies holds every promise made.
    pub async fn pause_direct_writes(&self) -> StoreResult<DirectWritesPaused> {
        let paused = self.writes.pause_direct_writes().await;
        if let Some(deadlines) = &self.lease_deadlines {
            let stored = lease_deadlines::Stored::at_stop(deadlines);
            let mut txn = self.backend.write().await?;
            stored.write(&mut txn).await?;
            txn.commit().await?;
        }
        Ok(paused)
    }

    /// The local writer, for the replicated log's entries.
    pub fn local_writer(&self) -> LocalWriter {
        LocalWriter::new(&self.queue)
    }

    /// Publishes to watchers (and to `revisions`) whatever the database holds
    /// beyond what was published, after its contents were replaced wholesale.
    pub async fn reload(&self) -> anyhow::Result<()> {
        self.publisher.replaced().await
    }

    /// The counters as of the last commit.
    pub fn revisions(&self) -> Revisions {
        *self.revisions.borrow()
    }

    /// The backend, for tests that look underneath the store.
    #[cfg(test)]
    pub(crate) fn backend(&self) -> &B {
        &self.backend
    }

    /// Counts the auth changes this store's writer applied (see
    /// `Publisher::auth_changes`).
    pub fn auth_changes(&self) -> watch::Receiver<u64> {
        self.publisher.auth_changes()
    }

    /// The hub that tells watchers about new revisions.
    pub fn hub(&self) -> &WatchHub {
        self.publisher.hub()
    }

    /// The revisions in `(after, through]`: from the hub's window while it
    /// reaches back that far (its events always carry the previous key),
    /// else from the log, each event with the key's state at the previous
    /// revision when `with_prev_kv` (and not compacted away), as etcd's
    /// watch catch-up delivers them.
    pub async fn revisions_after(
        &self,
        after: i64,
        through: i64,
        with_prev_kv: bool,
    ) -> StoreResult<Vec<Arc<RevisionEvents>>> {
        let wanted = usize::try_from(through - after).unwrap_or(0);
        if let Some(mut window) = self.hub().since(after, wanted) {
            window.retain(|r| r.revision <= through);
            return Ok(window);
        }
        let logged = history::read(&*self.backend, after, through, with_prev_kv).await?;
        Ok(logged.into_iter().map(Arc::new).collect())
    }

    /// The compact revision as the database holds it now: ahead of
    /// `revisions()` between a compaction's commit and its publication (on
    /// a shared database, another instance's compaction).
    pub async fn stored_compact_revision(&self) -> StoreResult<i64> {
        let mut txn = self.backend.read().await?;
        Ok(txn.revisions().await?.compact)
    }

    /// `revisions_after` read from the log only, for tests that hold the
    /// hub's window against it.
    #[cfg(test)]
    pub(crate) async fn logged_revisions(
        &self,
        after: i64,
        through: i64,
    ) -> StoreResult<Vec<RevisionEvents>> {
        history::read(&*self.backend, after, through, true).await
    }

    /// Size of the underlying database.
    pub async fn size(&self) -> StoreResult<DatabaseSize> {
        Ok(self.backend.size().await?)
    }

    /// etcd HashKV: a digest of the keys as of `revision` (0: current); at
    /// a compaction's revision, the digest taken before it, when kept.
    pub async fn hash_kv(&self, revision: i64) -> StoreResult<hash::KvHash> {
        if let Some(kept) = &self.compaction.hashes
            && let Some(mut hashed) = kept.at(revision)
        {
            hashed.current = self.backend.read().await?.revisions().await?.current;
            return Ok(hashed);
        }
        let at_compact = self.compaction.hashes.is_some();
        self.read_history(move |mut txn| async move {
            hash::hash_kv(&mut txn, revision, at_compact).await
        })
        .await
    }

    /// etcd Hash: a digest of the whole store, with the revision it is at.
    pub async fn hash(&self) -> StoreResult<(u32, i64)> {
        self.read_history(|mut txn| async move { hash::hash_all(&mut txn).await })
            .await
    }

    /// Runs `read`, a read of the whole history, on a blocking thread
    /// (`history::read_whole`).
    async fn read_history<T, E, F, Fut>(&self, read: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<anyhow::Error> + Send + 'static,
        F: FnOnce(B::Read) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>>,
    {
        history::read_whole(self.backend.clone(), read).await
    }

    /// etcd Defragment: gives freed space back to the file system.
    pub async fn defragment(&self) -> StoreResult<()> {
        Ok(self.backend.defragment().await?)
    }

    /// Writes an etcd v3 snapshot (bbolt) of one consistent view of the
    /// store to `path` (see `crate::bbolt::snapshot`).
    pub async fn snapshot_to(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let path = path.to_path_buf();
        self.read_history(move |mut txn| async move {
            let file = std::io::BufWriter::new(std::fs::File::create(path)?);
            let file = crate::bbolt::snapshot::write(&mut txn, file).await?;
            file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok(())
        })
        .await
    }

    /// etcd Range.
    pub async fn range(&self, req: &RangeRequest) -> StoreResult<RangeResponse> {
        if !req.serializable {
            self.read_barrier().await?;
        }
        let mut txn = self.backend.read().await?;
        if req.revision <= 0 {
            // The current revision: one backend call, one round trip on a
            // server database (see `ReadTxn::current_range`).
            let latest = self.revisions().current;
            if let Some(response) =
                range::range_current(&mut txn, req, Some(&self.counts), latest).await?
            {
                return Ok(response);
            }
            // The count was needed after all: read again in a transaction.
            txn = self.backend.read().await?;
        }
        let revs = txn.revisions().await?;
        range::range(
            &mut txn,
            req,
            revs.current,
            revs.compact,
            Some(&self.counts),
        )
        .await
    }

    /// etcd Put.
    pub async fn put(&self, req: PutRequest) -> StoreResult<PutResponse> {
        self.check_key(&req.key)?;
        self.check_quota(alarm::put_cost(&req)).await?;
        self.write_for(WriteRequest::Put(req)).await
    }

    /// etcd DeleteRange.
    pub async fn delete_range(&self, req: DeleteRangeRequest) -> StoreResult<DeleteRangeResponse> {
        self.write_for(WriteRequest::DeleteRange(req)).await
    }

    /// etcd Txn.
    pub async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        self.check_txn_keys(&req)?;
        self.check_quota(alarm::txn_cost(&req)).await?;
        self.write_for(WriteRequest::Txn(req)).await
    }

    /// etcd Compact. With `physical` it returns once the history is gone.
    pub async fn compact(&self, req: &CompactionRequest) -> StoreResult<CompactionResponse> {
        // etcd 3.6+'s digest of the history it removes is taken by the
        // compactor, before its first removal (`background::compactor`).
        let resp = self.write_for(WriteRequest::Compact(req.revision)).await?;
        if req.physical {
            let mut revisions = self.revisions.clone();
            let done = revisions.wait_for(|r| r.compacted_through >= req.revision);
            tokio::pin!(done);
            // The compactor cannot remove history while the datastore is
            // full: the answer says so rather than waiting for space.
            loop {
                tokio::select! {
                    done = &mut done => {
                        done.map_err(|_| StoreError::Stopped)?;
                        break;
                    }
                    _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {
                        if self.compaction.out_of_space.load(Ordering::SeqCst) {
                            return Err(StoreError::NoSpace);
                        }
                    }
                }
            }
        }
        Ok(resp)
    }

    /// In replicated mode, waits until this member has applied every write
    /// committed so far (etcd's linearizable read).
    pub async fn read_barrier(&self) -> StoreResult<()> {
        self.writes.read_barrier().await
    }

    /// etcd LeaseGrant.
    pub async fn lease_grant(&self, mut req: LeaseGrantRequest) -> StoreResult<LeaseGrantResponse> {
        self.check_quota(alarm::LEASE_OVERHEAD).await?;
        if req.id != 0 {
            return self.write_for(WriteRequest::LeaseGrant(req)).await;
        }
        // Chosen here, not where it is applied, so that every member of a
        // cluster applies the same id. An id another server took already
        // (see `lease_ids`) is passed over for the next one.
        let mut clashes = 0;
        loop {
            req.id = self.lease_ids.next(self.identity().member_id);
            match self.write_for(WriteRequest::LeaseGrant(req)).await {
                Err(StoreError::LeaseExists) if clashes < MAX_LEASE_ID_CLASHES => clashes += 1,
                answer => return answer,
            }
        }
    }

    /// Whether the store is a member of a replicated cluster.
    pub fn is_replicated(&self) -> bool {
        self.writes.replication().is_some()
    }

    /// etcd LeaseRevoke.
    pub async fn lease_revoke(&self, id: i64) -> StoreResult<LeaseRevokeResponse> {
        self.write_for(WriteRequest::LeaseRevoke(id)).await
    }

    /// One etcd LeaseKeepAlive request. A keep-alive of a lease whose
    /// deadline is held in memory is answered here, without a hop to the
    /// writer (see `lease_deadlines`); in a cluster the leader answers it
    /// (see `leader_leases`).
    pub async fn lease_keep_alive(&self, id: i64) -> StoreResult<LeaseKeepAliveResponse> {
        if let Some(replication) = self.writes.replication() {
            let ttl = replication.ask_lessor(LeaseCall::KeepAlive(id)).await?;
            return Ok(LeaseKeepAliveResponse {
                header: None,
                id,
                ttl: ttl.unwrap_or(0),
            });
        }
        if let Some(renewed) = self
            .lease_deadlines
            .as_ref()
            .and_then(|deadlines| deadlines.renew_one(id, apply::now_ms()))
        {
            metrics().leases_renewed.inc();
            return Ok(renewed);
        }
        self.write_for(WriteRequest::LeaseKeepAlive(id)).await
    }

    /// etcd LeaseTimeToLive: TTL -1 for an unknown lease, remaining seconds
    /// (rounded down) otherwise, and the attached keys when asked.
    pub async fn lease_time_to_live(
        &self,
        req: &LeaseTimeToLiveRequest,
    ) -> StoreResult<LeaseTimeToLiveResponse> {
        // Linearizable, as etcd's (a follower asks its leader).
        self.read_barrier().await?;
        let mut txn = self.backend.read().await?;
        let Some(lease) = txn.lease(req.id).await? else {
            return Ok(LeaseTimeToLiveResponse {
                id: req.id,
                ttl: -1,
                ..Default::default()
            });
        };
        let keys = if req.keys {
            txn.lease_keys(req.id)
                .await?
                .into_iter()
                .map(|kv| kv.key)
                .collect()
        } else {
            Vec::new()
        };
        let deadline = match self.writes.replication() {
            // The leader holds the deadline, as etcd's leader does.
            Some(replication) => {
                let Some(deadline) = replication.ask_lessor(LeaseCall::Deadline(req.id)).await?
                else {
                    return Ok(LeaseTimeToLiveResponse {
                        id: req.id,
                        ttl: -1,
                        ..Default::default()
                    });
                };
                deadline
            }
            None => self.lease_deadline(&lease),
        };
        Ok(LeaseTimeToLiveResponse {
            header: None,
            id: lease.id,
            // etcd's clock has nanoseconds, so some time has always passed since the
            // grant and a fresh 60 s lease shows 59; at millisecond resolution the
            // grant can look 0 ms old, so count at least 1 ms as gone.
            ttl: ((deadline - apply::now_ms() - 1) / 1000).max(0),
            granted_ttl: lease.ttl,
            keys,
        })
    }

    /// The deadline of `lease` as read, or as a keep-alive answered from
    /// memory moved it.
    fn lease_deadline(&self, lease: &LeaseRow) -> i64 {
        self.lease_deadlines
            .as_ref()
            .and_then(|deadlines| deadlines.deadline(lease.id))
            .unwrap_or(lease.expires_at)
    }

    /// etcd LeaseLeases: every lease, soonest deadline first.
    pub async fn leases(&self) -> StoreResult<LeaseLeasesResponse> {
        self.read_barrier().await?;
        let mut txn = self.backend.read().await?;
        let mut leases = txn.leases().await?;
        if self.lease_deadlines.is_some() {
            // Soonest first by the deadlines keep-alives moved, too.
            leases.sort_by_key(|lease| self.lease_deadline(lease));
        }
        Ok(LeaseLeasesResponse {
            header: None,
            leases: leases
                .into_iter()
                .map(|l| LeaseStatus { id: l.id })
                .collect(),
        })
    }

    /// Stores a change of users, roles or the auth switch (see
    /// `AuthWrite`), through the replicated log in a cluster.
    pub async fn change_auth(&self, change: AuthWrite) -> StoreResult<()> {
        self.write_for(WriteRequest::Auth(change)).await
    }

    /// The raised alarms of type `alarm` (every one for NONE), as etcd's
    /// Alarm GET lists them.
    pub async fn alarms(&self, alarm: i32) -> StoreResult<Vec<AlarmRow>> {
        let mut raised = self.backend.read().await?.alarms().await?;
        if self.quota.disk_full() {
            let row = self.disk_full_alarm();
            if !raised.contains(&row) {
                raised.push(row);
            }
        }
        Ok(alarm::matching(raised, alarm))
    }

    /// The NOSPACE alarm this member raises when its datastore is full.
    fn disk_full_alarm(&self) -> AlarmRow {
        AlarmRow {
            member_id: self.identity().member_id as i64,
            alarm: crate::proto::etcdserverpb::AlarmType::Nospace as i32,
        }
    }

    /// The stored target of the Downgrade in flight (0: none; see
    /// `settings::DOWNGRADE_TARGET`).
    pub async fn downgrade_target(&self) -> StoreResult<i64> {
        let mut txn = self.backend.read().await?;
        Ok(txn
            .setting(crate::backend::settings::DOWNGRADE_TARGET)
            .await?
            .unwrap_or(0))
    }

    /// Stores `target` as the Downgrade target if the stored one is still
    /// `expected`; answers the one stored before.
    pub async fn change_downgrade_target(&self, expected: i64, target: i64) -> StoreResult<i64> {
        self.write_for(WriteRequest::Downgrade { expected, target })
            .await
    }

    /// etcd Alarm ACTIVATE / DEACTIVATE: the alarm concerned, if any.
    pub async fn change_alarm(
        &self,
        change: AlarmChange,
        member_id: u64,
        alarm: i32,
    ) -> StoreResult<Vec<AlarmRow>> {
        let request = WriteRequest::Alarm {
            change,
            member_id,
            alarm,
        };
        let mut changed: Vec<AlarmRow> = self.write_for(request).await?;
        if change == AlarmChange::Deactivate {
            // The next write measures the database again, as etcd re-checks.
            self.quota.forget_size().await;
            let row = self.disk_full_alarm();
            if (row.member_id as u64, row.alarm) == (member_id, alarm)
                && self.quota.disarm_disk_full()
                && !changed.contains(&row)
            {
                changed.push(row);
            }
        }
        Ok(changed)
    }

    /// etcd's quota check in front of Put, Txn and LeaseGrant: a write that
    /// would take the database to the quota raises the NOSPACE alarm and is
    /// refused.
    async fn check_quota(&self, cost: i64) -> StoreResult<()> {
        if self.quota.disk_full() {
            return Err(StoreError::NoSpace);
        }
        if self.quota.available(&*self.backend, cost).await? {
            return Ok(());
        }
        let raise = WriteRequest::Alarm {
            change: AlarmChange::Activate,
            member_id: self.identity().member_id,
            alarm: crate::proto::etcdserverpb::AlarmType::Nospace as i32,
        };
        // As in etcd, the request is refused whether or not raising worked.
        if let Err(error) = self.writes.send(raise).await {
            tracing::warn!("cannot raise the NOSPACE alarm: {error}");
        }
        Err(StoreError::NoSpace)
    }

    /// Refuses a key the backend cannot store before it reaches the writer,
    /// where a failing row would fail the whole batch.
    fn check_key(&self, key: &[u8]) -> StoreResult<()> {
        let limit = self.backend.max_key_bytes();
        if key.len() > limit {
            return Err(StoreError::KeyTooLong(limit));
        }
        Ok(())
    }

    fn check_txn_keys(&self, req: &TxnRequest) -> StoreResult<()> {
        use crate::proto::etcdserverpb::request_op::Request;
        for op in req.success.iter().chain(&req.failure) {
            match &op.request {
                Some(Request::RequestPut(put)) => self.check_key(&put.key)?,
                Some(Request::RequestTxn(nested)) => self.check_txn_keys(nested)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes `request` and takes its answer out of the writer's reply.
    async fn write_for<A: Answer>(&self, request: WriteRequest) -> StoreResult<A> {
        let response = match self.writes.send(request).await {
            // A full datastore raises NOSPACE, as a database over its quota does.
            Err(StoreError::Backend(error)) if DiskFull::is(&error) => {
                self.quota.note_disk_full();
                return Err(StoreError::NoSpace);
            }
            response => response?,
        };
        A::from_response(response).ok_or_else(|| {
            StoreError::Internal(format!(
                "the writer's answer is not a {}",
                std::any::type_name::<A>()
            ))
        })
    }

    /// Stops accepting writes, lets the writer finish what is queued, and waits
    /// for it and the background jobs: then the backend is closed (an SQLite
    /// file unlocked) unless something outside the store still holds it.
    pub async fn shutdown(mut self) {
        let writer = std::mem::replace(&mut self.writer, tokio::spawn(async {}));
        let background = std::mem::take(&mut self.background);
        for task in &background {
            task.abort();
        }
        // Dropping the store closes the queue.
        drop(self);
        let _ = writer.await;
        for task in background {
            let _ = task.await;
        }
    }
}

impl<B: Backend> Drop for Store<B> {
    /// A store dropped without `shutdown` (in tests, say) stops its
    /// background jobs; the writer ends once the queue's senders are gone.
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
    }
}

/// The leader's lessor in a cluster: keep-alives and deadlines from memory
/// (see `leader_leases`), each lease as this member's database holds it.
impl<B: Backend> Lessor for Store<B> {
    fn answer(
        &self,
        leadership: Leadership,
        call: LeaseCall,
    ) -> BoxFuture<'_, StoreResult<Option<i64>>> {
        Box::pin(async move {
            let (LeaseCall::KeepAlive(id) | LeaseCall::Deadline(id)) = call;
            let Some(lease) = self.backend.read().await?.lease(id).await? else {
                return Ok(None);
            };
            let now = apply::now_ms();
            Ok(match call {
                LeaseCall::KeepAlive(_) => {
                    let renewed = self.leader_leases.renew(leadership, now, &lease);
                    if renewed.is_some() {
                        metrics().leases_renewed.inc();
                    }
                    renewed
                }
                LeaseCall::Deadline(_) => Some(self.leader_leases.deadline(leadership, &lease)),
            })
        })
    }
}
