//! The single writer: drains queued write requests, applies them in order in
//! one database transaction (each request its own revision, later requests
//! seeing earlier ones), commits once, then answers them all. One commit, and
//! so one fsync, for every request that queued up while the last one ran
//! (on a shared database, and while this one waited for the lock).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::alarm;
use super::apply::{self, Applier};
use super::error::{StoreError, StoreResult};
use super::hub::RevisionEvents;
use super::lease_deadlines::{self, LeaseDeadlines};
use super::publisher::Publisher;
use super::range::check_revision;
use super::request::{AuthWrite, Queued, WriteRequest, WriteResponse};
use crate::backend::settings;
use crate::backend::{
    AlarmRow, Backend, BackendResult, DiskFull, ReadAhead, ReadTxn, Revisions, Unavailable,
    WriteTxn,
};
use crate::metrics::metrics;
use crate::proto::etcdserverpb::{CompactionResponse, PutRequest, ResponseHeader, TxnRequest};

/// Most requests committed together.
const MAX_BATCH: usize = 256;
/// Revisions of history one physical-compaction step goes through.
const COMPACTION_STEP: i64 = 1000;

/// Starts the writer: on a thread of its own when the backend works on the
/// calling thread (see `Backend::works_on_calling_thread`), else as a task.
/// With `deadlines`, keep-alives of leases it knows are answered from
/// memory and their deadlines stored in batches (see `lease_deadlines`).
pub fn start<B: Backend>(
    backend: Arc<B>,
    queue: mpsc::Receiver<Queued>,
    publisher: Arc<Publisher<B>>,
    deadlines: Option<Arc<LeaseDeadlines>>,
) -> JoinHandle<()> {
    let run = run(backend.clone(), queue, publisher, deadlines);
    if backend.works_on_calling_thread() {
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(run))
    } else {
        tokio::spawn(run)
    }
}

/// Waits for the next requests, or until the writer must commit for the
/// keep-alives answered from memory (then `batch` stays empty). False
/// once every sender is gone.
async fn next_batch(
    queue: &mut mpsc::Receiver<Queued>,
    batch: &mut Vec<Queued>,
    deadlines: Option<&LeaseDeadlines>,
) -> bool {
    let Some(deadlines) = deadlines else {
        return queue.recv_many(batch, MAX_BATCH).await > 0;
    };
    loop {
        match deadlines.store_due() {
            None => tokio::select! {
                received = queue.recv_many(batch, MAX_BATCH) => return received > 0,
                // A keep-alive answered on its caller's task: a commit is due in a while.
                _ = deadlines.commit_came_due() => {}
            },
            Some(due) => tokio::select! {
                received = queue.recv_many(batch, MAX_BATCH) => return received > 0,
                _ = tokio::time::sleep_until(due) => return true,
            },
        }
    }
}

/// Waits for the rest of a replicated log entry whose first requests are in
/// `batch` (see `Queued::entry_continues`): they are being queued now, maybe
/// after a request of this member's own housekeeping.
async fn whole_entries(queue: &mut mpsc::Receiver<Queued>, batch: &mut Vec<Queued>) {
    let entry_open = |batch: &[Queued]| {
        let last_replicated = batch.iter().rev().find(|queued| queued.mark.is_some());
        last_replicated.is_some_and(|queued| queued.entry_continues)
    };
    while entry_open(batch) {
        match queue.recv().await {
            Some(queued) => batch.push(queued),
            None => return,
        }
    }
}

/// Runs until every sender of `queue` is gone.
async fn run<B: Backend>(
    backend: Arc<B>,
    mut queue: mpsc::Receiver<Queued>,
    publisher: Arc<Publisher<B>>,
    deadlines: Option<Arc<LeaseDeadlines>>,
) {
    // On a database other instances write too, publishing a commit often
    // reads their revisions first (see `Publisher::committed`): a task does
    // it beside the next commit, in commit order. Alone on its database the
    // writer publishes itself, which saves a hop on every write.
    let (announcer, announcements) = match backend.is_only_writer() {
        true => (None, None),
        false => {
            let (sender, receiver) = mpsc::unbounded_channel();
            let task = tokio::spawn(announce_in_order(receiver, publisher.clone()));
            (Some(sender), Some(task))
        }
    };
    // On a shared database the lock wait is where requests pile up: they
    // join the batch once the lock is held (see `commit`).
    let joins_at_lock = !backend.is_only_writer();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while next_batch(&mut queue, &mut batch, deadlines.as_deref()).await {
        whole_entries(&mut queue, &mut batch).await;
        if let Some(answers) = deadlines.as_ref().and_then(|d| d.renew(&batch)) {
            count_lease_changes(&answers);
            for (queued, answer) in batch.drain(..).zip(answers) {
                let _ = queued.reply.send(answer);
            }
            continue;
        }
        let started = std::time::Instant::now();
        let stored = deadlines
            .as_ref()
            .map(|d| d.to_store(&batch, apply::now_ms()));
        let late = joins_at_lock.then_some(&mut queue);
        match commit(&*backend, &mut batch, stored.as_ref(), late).await {
            Ok((answers, now, committed)) => {
                if let (Some(deadlines), Some(stored)) = (&deadlines, stored) {
                    deadlines.committed(stored, &batch, &answers);
                }
                if !batch.is_empty() {
                    metrics().record_commit(batch.len(), started.elapsed());
                }
                count_lease_changes(&answers);
                let announcement = Announcement {
                    committed,
                    revisions: now,
                    answers: batch.drain(..).zip(answers).collect(),
                };
                match &announcer {
                    Some(announcer) => {
                        if let Err(unsent) = announcer.send(announcement) {
                            unsent.0.announce(&publisher).await;
                        }
                    }
                    None => announcement.announce(&publisher).await,
                }
            }
            Err(error) => {
                tracing::error!("write batch failed: {error:#}");
                if let Some(deadlines) = &deadlines {
                    // Tried again in a while, not at once.
                    deadlines.commit_failed();
                }
                let message = format!("{error:#}");
                let unavailable = Unavailable::is(&error);
                let disk_full = DiskFull::is(&error);
                for queued in batch.drain(..) {
                    // Each waiter gets its own copy, still saying whether
                    // the database was out of reach or out of space.
                    let error = match (unavailable, disk_full) {
                        (true, _) => Unavailable::error(&message),
                        (_, true) => DiskFull::error(&message),
                        _ => anyhow::anyhow!("{message}"),
                    };
                    let _ = queued.reply.send(Err(StoreError::Backend(error)));
                }
            }
        }
    }
    // Every commit is published and answered before the writer is done.
    drop(announcer);
    if let Some(task) = announcements {
        let _ = task.await;
    }
    if let Some(deadlines) = &deadlines {
        store_at_stop(&*backend, deadlines).await;
    }
}

/// A committed batch: what its watchers and then its writers are told.
struct Announcement {
    committed: Vec<RevisionEvents>,
    revisions: Revisions,
    answers: Vec<(Queued, StoreResult<WriteResponse>)>,
}

impl Announcement {
    async fn announce<B: Backend>(self, publisher: &Publisher<B>) {
        // Watchers hear of a write before its writer does, as in etcd.
        publisher.committed(self.committed, self.revisions).await;
        if self
            .answers
            .iter()
            .any(|(_, answer)| matches!(answer, Ok(WriteResponse::Auth)))
        {
            publisher.auth_changed();
        }
        for (queued, answer) in self.answers {
            let _ = queued.reply.send(answer);
        }
    }
}

/// Announces each batch the writer sends, in the order it sends them.
async fn announce_in_order<B: Backend>(
    mut announcements: mpsc::UnboundedReceiver<Announcement>,
    publisher: Arc<Publisher<B>>,
) {
    while let Some(announcement) = announcements.recv().await {
        announcement.announce(&publisher).await;
    }
}

/// A clean stop stores every moved lease deadline (see `lease_deadlines`).
async fn store_at_stop<B: Backend>(backend: &B, deadlines: &LeaseDeadlines) {
    let stored = lease_deadlines::Stored::at_stop(deadlines);
    let result = async {
        let mut txn = backend.write().await?;
        stored.write(&mut txn).await?;
        txn.commit().await
    };
    if let Err(error) = result.await {
        tracing::warn!("cannot store the lease deadlines at stop: {error:#}");
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

/// `stored` (moved lease deadlines) is written first, so that the requests
/// see them. With `late`, the requests that queued while the transaction
/// waited for the counters' lock join `batch` once it holds it: on a shared
/// database that wait is another instance's commit, and without them each
/// instance's commit would carry about half of its clients' requests (see
/// docs/benchmarks/shared-database.md, "Why two instances do less than one").
async fn commit<B: Backend>(
    backend: &B,
    batch: &mut Vec<Queued>,
    stored: Option<&lease_deadlines::Stored>,
    late: Option<&mut mpsc::Receiver<Queued>>,
) -> anyhow::Result<Committed> {
    let mut txn = backend.write().await?;
    if backend.reads_ahead() {
        read_ahead_of(&mut txn, batch).await?;
    }
    if let Some(queue) = late {
        // Locks the counters, if reading ahead did not: the wait is over.
        txn.revisions().await?;
        let joined = batch.len();
        while batch.len() < MAX_BATCH
            && let Ok(queued) = queue.try_recv()
        {
            batch.push(queued);
        }
        if backend.reads_ahead() {
            read_ahead_of(&mut txn, &batch[joined..]).await?;
        }
    }
    if let Some(stored) = stored {
        stored.write(&mut txn).await?;
    }
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
    txn.commit().await?;
    Ok((answers, revs, committed))
}

/// Reads ahead what the requests of `batch` will read, if anything.
async fn read_ahead_of<T: WriteTxn>(txn: &mut T, batch: &[Queued]) -> BackendResult<()> {
    let ahead = read_ahead(batch);
    if ahead.is_empty() {
        return Ok(());
    }
    txn.read_ahead(&ahead).await
}

/// The single keys and the leases the requests of `batch` read first, so
/// that the backend can read them with the transaction's first statements.
fn read_ahead(batch: &[Queued]) -> ReadAhead {
    let mut ahead = ReadAhead::default();
    for queued in batch {
        match &queued.request {
            WriteRequest::Put(req) => ahead_put(&mut ahead, req),
            WriteRequest::DeleteRange(req) => ahead_key(&mut ahead, &req.key, &req.range_end),
            WriteRequest::Txn(req) => ahead_txn(&mut ahead, req),
            WriteRequest::LeaseGrant(req) => ahead.leases.push(req.id),
            WriteRequest::LeaseRevoke(id)
            | WriteRequest::LeaseKeepAlive(id)
            | WriteRequest::LeaseExpire(id) => ahead.leases.push(*id),
            _ => {}
        }
    }
    ahead
}

fn ahead_key(ahead: &mut ReadAhead, key: &[u8], range_end: &[u8]) {
    if range_end.is_empty() {
        ahead.keys.push(key.to_vec());
    }
}

fn ahead_put(ahead: &mut ReadAhead, req: &PutRequest) {
    ahead.keys.push(req.key.clone());
    if req.lease != 0 {
        ahead.leases.push(req.lease);
    }
}

fn ahead_txn(ahead: &mut ReadAhead, req: &TxnRequest) {
    use crate::proto::etcdserverpb::request_op::Request;
    for compare in &req.compare {
        ahead_key(ahead, &compare.key, &compare.range_end);
    }
    for op in req.success.iter().chain(&req.failure) {
        match &op.request {
            Some(Request::RequestPut(put)) => ahead_put(ahead, put),
            Some(Request::RequestDeleteRange(delete)) => {
                ahead_key(ahead, &delete.key, &delete.range_end)
            }
            Some(Request::RequestRange(range)) => ahead_key(ahead, &range.key, &range.range_end),
            Some(Request::RequestTxn(nested)) => ahead_txn(ahead, nested),
            None => {}
        }
    }
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
        WriteRequest::Downgrade { expected, target } => {
            let stored = txn.setting(settings::DOWNGRADE_TARGET).await?.unwrap_or(0);
            if stored == *expected {
                txn.set_setting(settings::DOWNGRADE_TARGET, *target).await?;
            }
            return Ok(WriteResponse::Downgrade(stored));
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
    if super::settings::read_auth_flags(txn).await? != change.read {
        return Err(StoreError::AuthChanged);
    }
    for (kind, name, record) in &change.records {
        match record {
            Some(record) => txn.put_auth_record(*kind, name, record).await?,
            None => txn.remove_auth_record(*kind, name).await?,
        }
    }
    txn.set_setting(settings::AUTH_ENABLED, i64::from(change.enabled))
        .await?;
    txn.set_setting(settings::AUTH_REVISION, change.revision as i64)
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

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    fn queued(mark: Option<&str>, entry_continues: bool) -> Queued {
        Queued {
            request: WriteRequest::Nothing,
            at_ms: 0,
            mark: mark.map(|m| m.as_bytes().to_vec()),
            entry_continues,
            reply: oneshot::channel().0,
        }
    }

    fn marks(batch: &[Queued]) -> Vec<Option<&[u8]>> {
        batch.iter().map(|q| q.mark.as_deref()).collect()
    }

    #[tokio::test]
    async fn a_batch_takes_the_rest_of_an_entry_and_no_more() {
        let (send, mut queue) = mpsc::channel(16);
        // The writer woke with the first of entry 7's three requests; a
        // compaction step came between its second and its last.
        let mut batch = vec![queued(Some("7"), true)];
        for q in [
            queued(Some("7"), true),
            queued(None, false),
            queued(Some("7"), false),
            queued(Some("8"), false),
        ] {
            send.send(q).await.unwrap();
        }
        whole_entries(&mut queue, &mut batch).await;
        let want: Vec<Option<&[u8]>> = vec![Some(b"7"), Some(b"7"), None, Some(b"7")];
        assert_eq!(marks(&batch), want);
        // A batch that ends with a whole entry waits for nothing.
        let mut next = Vec::new();
        queue.recv_many(&mut next, 16).await;
        whole_entries(&mut queue, &mut next).await;
        assert_eq!(marks(&next), vec![Some(&b"8"[..])]);
    }
}
