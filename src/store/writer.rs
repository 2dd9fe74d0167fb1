//! The single writer: drains queued write requests, applies them in order in
//! one database transaction (each request its own revision, later requests
//! seeing earlier ones), commits once, then answers them all. One commit, and
//! so one fsync, for every request that queued up while the last one ran.
//! With a journal (a single server on SQLite) that fsync is the journal
//! record's, written while the batch is applied, and the commit syncs
//! nothing (see `super::journal`).

use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::alarm::{self, AlarmChange};
use super::apply::Applier;
use super::command::Command;
use super::error::{StoreError, StoreResult};
use super::journal::{self, Journal};
use super::publisher::Publisher;
use super::range::check_revision;
use crate::backend::{AlarmRow, AuthKind, Backend, BackendResult, ReadTxn, Revisions, WriteTxn};
use crate::metrics::metrics;
use crate::proto::etcdserverpb::{
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseRevokeResponse, PutRequest, PutResponse,
    ResponseHeader, TxnRequest, TxnResponse,
};
use crate::watch::hub::RevisionEvents;

/// Most requests committed together.
const MAX_BATCH: usize = 256;
/// Revisions of history one physical-compaction step goes through.
const COMPACTION_STEP: i64 = 1000;

/// A write request for the writer.
pub enum WriteRequest {
    /// etcd Put.
    Put(PutRequest),
    /// etcd DeleteRange.
    DeleteRange(DeleteRangeRequest),
    /// etcd Txn.
    Txn(TxnRequest),
    /// etcd LeaseGrant.
    LeaseGrant(LeaseGrantRequest),
    /// etcd LeaseRevoke.
    LeaseRevoke(i64),
    /// One etcd LeaseKeepAlive request.
    LeaseKeepAlive(i64),
    /// Revoke a lease whose deadline passed (unless it was kept alive meanwhile).
    LeaseExpire(i64),
    /// etcd Compact: move the compact revision (the history goes later).
    Compact(i64),
    /// Remove the next stretch of history below the compact revision.
    CompactStep,
    /// etcd Alarm ACTIVATE or DEACTIVATE.
    Alarm {
        /// Raise or disarm.
        change: AlarmChange,
        /// The member the alarm is for.
        member_id: u64,
        /// etcdserverpb.AlarmType number.
        alarm: i32,
    },
    /// A change of users, roles or the auth switch, as `crate::auth`
    /// computed it; made only if the auth state is still as it was read.
    Auth(AuthWrite),
    /// Nothing but the replication mark of its `Queued` (a Raft entry that
    /// changes no key, such as a membership change).
    Nothing,
}

/// Auth records to store, computed by `crate::auth` from the state it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthWrite {
    /// Whether auth was enabled, and the auth revision, in the state the
    /// change was computed from: it applies only if they still are.
    pub read: (bool, u64),
    /// The auth switch after the change.
    pub enabled: bool,
    /// The auth revision after the change.
    pub revision: u64,
    /// Records to store (Some) or remove (None), by kind and name.
    pub records: Vec<(AuthKind, Vec<u8>, Option<Vec<u8>>)>,
}

/// The writer's answer to a `WriteRequest`.
pub enum WriteResponse {
    /// Answer to Put.
    Put(PutResponse),
    /// Answer to DeleteRange.
    DeleteRange(DeleteRangeResponse),
    /// Answer to Txn.
    Txn(TxnResponse),
    /// Answer to LeaseGrant.
    LeaseGrant(LeaseGrantResponse),
    /// Answer to LeaseRevoke.
    LeaseRevoke(LeaseRevokeResponse),
    /// Answer to LeaseKeepAlive.
    LeaseKeepAlive(LeaseKeepAliveResponse),
    /// Answer to LeaseExpire: whether the lease expired (a late keep-alive
    /// may have saved it).
    LeaseExpire(bool),
    /// Answer to Compact.
    Compact(CompactionResponse),
    /// Answer to CompactStep.
    CompactStep,
    /// Answer to Alarm: the alarm concerned, if any.
    Alarm(Vec<AlarmRow>),
    /// Answer to Auth.
    Auth,
    /// Answer to Nothing.
    Nothing,
}

/// A queued request and where its answer goes.
pub struct Queued {
    /// What to do.
    pub request: WriteRequest,
    /// When it was asked for (Unix milliseconds): the time lease deadlines
    /// count from.
    pub at_ms: i64,
    /// In replicated mode, the position in the replicated log this request
    /// brings the store to (see `crate::raft`), stored in the same commit.
    pub mark: Option<Vec<u8>>,
    /// Where to answer.
    pub reply: oneshot::Sender<StoreResult<WriteResponse>>,
}

/// Starts the writer: on a thread of its own when the backend works on the
/// calling thread (see `Backend::works_on_calling_thread`), else as a task.
pub fn start<B: Backend>(
    backend: Arc<B>,
    queue: mpsc::Receiver<Queued>,
    publisher: Arc<Publisher<B>>,
    journaling: Option<Journaling<B>>,
) -> JoinHandle<()> {
    let writer = run(backend.clone(), queue, publisher, journaling);
    if backend.works_on_calling_thread() {
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(writer))
    } else {
        tokio::spawn(writer)
    }
}

/// Runs until every sender of `queue` is gone.
async fn run<B: Backend>(
    backend: Arc<B>,
    mut queue: mpsc::Receiver<Queued>,
    publisher: Arc<Publisher<B>>,
    mut journaling: Option<Journaling<B>>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let started = std::time::Instant::now();
        let outcome = match &mut journaling {
            Some(journaling) => journaling.commit(&*backend, &mut batch).await,
            None => commit(&*backend, &mut batch, None).await,
        };
        match outcome {
            Ok((answers, now, committed)) => {
                metrics().record_commit(batch.len(), started.elapsed());
                count_lease_changes(&answers);
                // Watchers hear of a write before its writer does, as in etcd.
                publisher.committed(committed, now).await;
                if answers.iter().any(|a| matches!(a, Ok(WriteResponse::Auth))) {
                    publisher.auth_changed();
                }
                for (queued, answer) in batch.drain(..).zip(answers) {
                    let _ = queued.reply.send(answer);
                }
            }
            Err(error) => {
                tracing::error!("write batch failed: {error:#}");
                let message = format!("{error:#}");
                for queued in batch.drain(..) {
                    let error = anyhow::anyhow!("{message}");
                    let _ = queued.reply.send(Err(StoreError::Backend(error)));
                }
            }
        }
    }
}

/// Counts the lease changes of a committed batch.
fn count_lease_changes(answers: &[StoreResult<WriteResponse>]) {
    let metrics = metrics();
    for answer in answers {
        match answer {
            Ok(WriteResponse::LeaseGrant(_)) => metrics.leases_granted.inc(),
            Ok(WriteResponse::LeaseRevoke(_) | WriteResponse::LeaseExpire(true)) => {
                metrics.leases_revoked.inc()
            }
            Ok(WriteResponse::LeaseKeepAlive(renewed)) if renewed.ttl > 0 => {
                metrics.leases_renewed.inc()
            }
            _ => {}
        }
    }
}

/// Applies `batch` in one transaction. An error of one request is that
/// request's answer; a database error fails the whole batch.
/// The answers, the counters after the batch, and the events of each new revision.
type Committed = (
    Vec<StoreResult<WriteResponse>>,
    Revisions,
    Vec<RevisionEvents>,
);

async fn commit<B: Backend>(
    backend: &B,
    batch: &mut [Queued],
    journaled: Option<&mut Journaled>,
) -> anyhow::Result<Committed> {
    let mut txn = backend.write().await?;
    let start = txn.revisions().await?;
    let mut revs = start;
    let mut answers = Vec::with_capacity(batch.len());
    let mut committed = Vec::new();
    // The raised alarms, read once per batch when a request needs them.
    let mut alarms: Option<Vec<AlarmRow>> = None;
    let mut mark = None;
    for queued in batch.iter() {
        if queued.mark.is_some() {
            mark = queued.mark.as_deref();
        }
        if alarm::may_be_refused(&queued.request) {
            let raised = match &alarms {
                Some(raised) => raised,
                None => alarms.insert(txn.alarms().await?),
            };
            if let Some(refusal) = alarm::refusal(raised, &queued.request) {
                answers.push(Err(refusal));
                continue;
            }
        }
        if let WriteRequest::Alarm { .. } = queued.request {
            alarms = None;
        }
        let answer = apply(&mut txn, &mut revs, queued, &mut committed).await;
        if let Err(StoreError::Backend(error)) = answer {
            return Err(error);
        }
        answers.push(answer);
    }
    if revs != start {
        txn.set_revisions(revs).await?;
    }
    if let Some(mark) = mark {
        txn.set_replication_mark(mark).await?;
    }
    if let Some(journaled) = journaled {
        // Nothing of the batch may become visible before it is durable.
        journaled.durable().await?;
        txn.set_setting(JOURNAL_SEQ, journaled.seq as i64).await?;
    }
    txn.commit().await?;
    Ok((answers, revs, committed))
}

/// Setting holding the epoch of the journal run the database follows.
const JOURNAL_EPOCH: &str = "journal_epoch";
/// Setting holding the number of the last journal record the database holds.
const JOURNAL_SEQ: &str = "journal_seq";

/// The journal as the writer keeps it: one record per batch, and a sync of
/// the database in the background whenever the journal moves to its other
/// segment, after which that segment may be written over.
pub struct Journaling<B> {
    journal: Journal,
    backend: Arc<B>,
    syncing: Option<JoinHandle<BackendResult<()>>>,
}

/// A batch's journal record: its number, and the write that makes it
/// durable (none for a record read back from the journal).
struct Journaled {
    seq: u64,
    write: Option<JoinHandle<std::io::Result<()>>>,
    failed: bool,
}

impl Journaled {
    async fn durable(&mut self) -> anyhow::Result<()> {
        let Some(write) = self.write.take() else {
            return Ok(());
        };
        let written = match write.await {
            Ok(written) => written.map_err(anyhow::Error::from),
            Err(error) => Err(anyhow::Error::from(error)),
        };
        self.failed = written.is_err();
        written.map_err(|error| error.context("cannot write the journal"))
    }
}

impl<B: Backend> Journaling<B> {
    /// Brings the database up to the journal at `base` (applying again the
    /// records it lost, if the machine stopped before they reached its
    /// file), then starts a new journal run and lets the database's commits
    /// skip their sync from now on.
    pub async fn recover(backend: Arc<B>, base: &Path) -> anyhow::Result<Self> {
        let (epoch, seq) = {
            let mut txn = backend.read().await?;
            (
                txn.setting(JOURNAL_EPOCH).await?,
                txn.setting(JOURNAL_SEQ).await?,
            )
        };
        let mut pending: Vec<journal::Record> = journal::read(base)?
            .into_iter()
            .filter(|r| Some(r.epoch as i64) == epoch && r.seq as i64 > seq.unwrap_or(0))
            .collect();
        pending.sort_by_key(|r| r.seq);
        let mut expected = seq.unwrap_or(0) as u64 + 1;
        for record in &pending {
            if record.seq != expected {
                anyhow::bail!(
                    "the journal {}.* lacks record {expected} of the writes the database has \
                     not stored (it has up to {}); it is damaged",
                    base.display(),
                    expected - 1
                );
            }
            expected += 1;
            let mut batch = decode_batch(&record.payload)?;
            let mut journaled = Journaled {
                seq: record.seq,
                write: None,
                failed: false,
            };
            commit(&*backend, &mut batch, Some(&mut journaled)).await?;
        }
        if !pending.is_empty() {
            tracing::info!(
                records = pending.len(),
                "applied the journal's writes the database had lost"
            );
        }
        // A new run: its first record is 1. The database still syncs this
        // commit, and so everything before it.
        let epoch = super::random_id();
        let mut txn = backend.write().await?;
        txn.set_setting(JOURNAL_EPOCH, epoch as i64).await?;
        txn.set_setting(JOURNAL_SEQ, 0).await?;
        txn.commit().await?;
        backend.defer_durability().await?;
        Ok(Journaling {
            journal: Journal::start(base, epoch)?,
            backend,
            syncing: None,
        })
    }

    /// Commits `batch` with its journal record.
    async fn commit(&mut self, backend: &B, batch: &mut [Queued]) -> anyhow::Result<Committed> {
        let Some(payload) = encode_batch(batch) else {
            return commit(backend, batch, None).await;
        };
        let (seq, append) = self.journal.append(&payload)?;
        let mut journaled = Journaled {
            seq,
            write: Some(tokio::task::spawn_blocking(move || append.write())),
            failed: false,
        };
        let outcome = commit(backend, batch, Some(&mut journaled)).await;
        if journaled.failed {
            if let Err(error) = &outcome {
                self.journal.fail(error);
            }
        } else if outcome.is_err() {
            self.journal.withdraw();
        }
        self.rotate().await;
        outcome
    }

    /// Moves to the other segment once the active one is full, and syncs the
    /// database in the background so that the one left becomes free.
    async fn rotate(&mut self) {
        if self.syncing.as_ref().is_some_and(JoinHandle::is_finished) {
            let synced = self.syncing.take().expect("checked above").await;
            match synced {
                Ok(Ok(())) => self.journal.inactive_durable(),
                Ok(Err(error)) => tracing::warn!("cannot sync the database: {error:#}"),
                Err(error) => tracing::warn!("cannot sync the database: {error}"),
            }
        }
        if self.journal.full() && self.syncing.is_none() {
            // If the other segment is not free (its sync failed), this sync
            // frees it, and the next batch moves on.
            self.journal.switch();
            let backend = self.backend.clone();
            self.syncing = Some(tokio::spawn(async move { backend.make_durable().await }));
        }
    }
}

/// A batch's journal payload: its requests with the time each was made.
/// None if it holds only the writer's own housekeeping (compaction steps),
/// which a restart redoes by itself.
fn encode_batch(batch: &[Queued]) -> Option<Vec<u8>> {
    let requests: Vec<(i64, Command)> = batch
        .iter()
        .filter_map(|q| Command::of(&q.request).map(|command| (q.at_ms, command)))
        .collect();
    if requests.is_empty() {
        return None;
    }
    Some(postcard::to_stdvec(&requests).expect("requests always encode"))
}

/// The batch a journal payload holds, to apply again (nobody waits for
/// its answers).
fn decode_batch(payload: &[u8]) -> anyhow::Result<Vec<Queued>> {
    let requests: Vec<(i64, Command)> = postcard::from_bytes(payload)?;
    Ok(requests
        .into_iter()
        .map(|(at_ms, command)| Queued {
            request: command.request(),
            at_ms,
            mark: None,
            reply: oneshot::channel().0,
        })
        .collect())
}

async fn apply<T: WriteTxn>(
    txn: &mut T,
    revs: &mut Revisions,
    queued: &Queued,
    committed: &mut Vec<RevisionEvents>,
) -> StoreResult<WriteResponse> {
    let mut applier = Applier::new(txn, revs.current, revs.compact, queued.at_ms);
    let response = match &queued.request {
        WriteRequest::Put(req) => WriteResponse::Put(applier.put(req).await?),
        WriteRequest::DeleteRange(req) => {
            WriteResponse::DeleteRange(applier.delete_range(req).await?)
        }
        WriteRequest::Txn(req) => WriteResponse::Txn(applier.txn(req).await?),
        WriteRequest::LeaseGrant(req) => WriteResponse::LeaseGrant(applier.lease_grant(req).await?),
        WriteRequest::LeaseRevoke(id) => {
            WriteResponse::LeaseRevoke(applier.lease_revoke(*id).await?)
        }
        WriteRequest::LeaseKeepAlive(id) => {
            WriteResponse::LeaseKeepAlive(applier.lease_keep_alive(*id).await?)
        }
        WriteRequest::LeaseExpire(id) => {
            WriteResponse::LeaseExpire(applier.lease_expire(*id).await?)
        }
        WriteRequest::Compact(revision) => {
            compact(revs, *revision)?;
            return Ok(WriteResponse::Compact(CompactionResponse {
                header: Some(ResponseHeader {
                    revision: revs.current,
                    ..Default::default()
                }),
            }));
        }
        WriteRequest::CompactStep => return compact_step(txn, revs).await,
        WriteRequest::Alarm {
            change,
            member_id,
            alarm,
        } => {
            let changed = alarm::change(txn, *change, *member_id, *alarm).await?;
            return Ok(WriteResponse::Alarm(changed));
        }
        WriteRequest::Auth(change) => {
            change_auth(txn, revs, change).await?;
            return Ok(WriteResponse::Auth);
        }
        WriteRequest::Nothing => return Ok(WriteResponse::Nothing),
    };
    revs.current = applier.revision();
    if !applier.events.is_empty() {
        committed.push(RevisionEvents {
            revision: revs.current,
            events: std::mem::take(&mut applier.events),
        });
    }
    Ok(response)
}

/// Stores an auth change, unless the auth state moved since it was read.
async fn change_auth<T: WriteTxn>(
    txn: &mut T,
    revs: &Revisions,
    change: &AuthWrite,
) -> StoreResult<()> {
    if crate::auth::read_flags(txn).await? != change.read {
        return Err(StoreError::AuthChanged);
    }
    for (kind, name, record) in &change.records {
        match record {
            Some(record) => txn.put_auth_record(*kind, name, record).await?,
            None => txn.remove_auth_record(*kind, name).await?,
        }
    }
    txn.set_setting(crate::auth::ENABLED_SETTING, i64::from(change.enabled))
        .await?;
    txn.set_setting(crate::auth::REVISION_SETTING, change.revision as i64)
        .await?;
    // Storing the counters unchanged is what tells other instances sharing
    // the database (Postgres NOTIFY) that something changed.
    txn.set_revisions(*revs).await?;
    Ok(())
}

/// etcd's rule: the compact revision only moves forward, and not past the present.
fn compact(revs: &mut Revisions, revision: i64) -> StoreResult<()> {
    if revision <= revs.compact {
        return Err(StoreError::Compacted);
    }
    check_revision(revision, revs.current, revs.compact)?;
    revs.compact = revision;
    Ok(())
}

/// Removes history in `(compacted_through, compacted_through + STEP]`, capped
/// at the compact revision. After compaction at C each key keeps only its
/// newest entry at or below C, and none if that entry is a deletion. Earlier
/// steps left at most one entry per key below the window, so for each entry in
/// the window (in (revision, sub) order) it is enough to drop the key's
/// earlier entries, and to drop the entry itself if it is a deletion.
async fn compact_step<T: WriteTxn>(
    txn: &mut T,
    revs: &mut Revisions,
) -> StoreResult<WriteResponse> {
    let through = revs.compact.min(revs.compacted_through + COMPACTION_STEP);
    if through <= revs.compacted_through {
        return Ok(WriteResponse::CompactStep);
    }
    for entry in txn.log_entries(revs.compacted_through, through).await? {
        txn.remove_history_before(&entry).await?;
        if entry.deleted {
            txn.remove_entry(&entry).await?;
        }
    }
    revs.compacted_through = through;
    Ok(WriteResponse::CompactStep)
}
