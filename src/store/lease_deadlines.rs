//! Lease keep-alives answered from memory, their deadlines stored in
//! batches: on a store that is its database's only writer (SQLite, one
//! server), a keep-alive of a lease the writer knows needs no commit of its
//! own. The writer keeps every known lease's deadline here, answers a batch
//! of such keep-alives without a transaction, and stores the deadlines they
//! moved with its next commit, at the latest `STORE_INTERVAL` later.
//!
//! The bound on a crash. Each commit that stores deadlines, or answers a
//! keep-alive, also stores `covered_until` = its time + `COVER` in the
//! settings, and a keep-alive is answered from memory only before the
//! committed `covered_until`: so every promise made (a deadline of at most
//! `covered_until` + TTL) is covered by what the database holds. After a
//! kill -9, `recover` gives every lease alive at the last such commit at
//! least `covered_until` + its TTL. A lease therefore never expires earlier
//! than its last acknowledged keep-alive promised, and at most TTL + `COVER`
//! after the last commit before the crash. A clean stop stores every
//! deadline and clears `covered_until`, so a restart keeps each lease's
//! remaining time exactly.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::StoreResult;
use super::writer::{Queued, WriteRequest, WriteResponse};
use crate::backend::settings::LEASE_RENEWALS_COVERED_UNTIL;
use crate::backend::{Backend, BackendResult, LeaseRow, ReadTxn, WriteTxn};
use crate::proto::etcdserverpb::LeaseKeepAliveResponse;

/// Longest time a deadline moved by a keep-alive waits to be stored.
pub(crate) const STORE_INTERVAL: Duration = Duration::from_millis(500);

/// How long after a commit keep-alives may still be answered from memory:
/// twice the store interval, so steady keep-alives never wait for a commit.
const COVER_MS: i64 = 2 * STORE_INTERVAL.as_millis() as i64;

/// The writer's view of the leases' deadlines (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct LeaseDeadlines {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Leases as they are once `moved` is stored.
    known: HashMap<i64, LeaseRow>,
    /// Leases whose deadline moved since it was last stored.
    moved: HashSet<i64>,
    /// When the oldest of `moved` moved.
    moved_at: Option<Instant>,
    /// Until when (Unix ms) a keep-alive may be answered from memory: the
    /// committed `covered_until`.
    covered_until: i64,
}

/// What one commit stores: deadlines, and the new `covered_until`.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    rows: Vec<LeaseRow>,
    covered_until: Option<i64>,
}

impl LeaseDeadlines {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("lease deadlines poisoned")
    }

    /// The deadline of lease `id` (Unix ms) if the writer knows it: newer
    /// than the database's until it is stored.
    pub(crate) fn deadline(&self, id: i64) -> Option<i64> {
        self.inner().known.get(&id).map(|lease| lease.expires_at)
    }

    /// When the moved deadlines are due to be stored, if any wait.
    pub(crate) fn store_due(&self) -> Option<Instant> {
        self.inner().moved_at.map(|at| at + STORE_INTERVAL)
    }

    /// Answers `batch` from memory if it holds only keep-alives of known,
    /// live leases, made before `covered_until`; else `None` and nothing
    /// changes (the batch goes to the database).
    pub(crate) fn renew(&self, batch: &[Queued]) -> Option<Vec<StoreResult<WriteResponse>>> {
        let mut inner = self.inner();
        // An empty batch is the writer's call to store moved deadlines.
        let answerable = !batch.is_empty()
            && batch.iter().all(|queued| match queued.request {
                WriteRequest::LeaseKeepAlive(id) => {
                    queued.mark.is_none()
                        && queued.at_ms < inner.covered_until
                        && inner
                            .known
                            .get(&id)
                            .is_some_and(|lease| lease.expires_at > queued.at_ms)
                }
                _ => false,
            });
        if !answerable {
            return None;
        }
        let answers = batch
            .iter()
            .map(|queued| {
                let WriteRequest::LeaseKeepAlive(id) = queued.request else {
                    unreachable!("checked above: only keep-alives");
                };
                let lease = inner.known.get_mut(&id).expect("checked above");
                lease.expires_at = queued.at_ms.saturating_add(lease.ttl.saturating_mul(1000));
                let ttl = lease.ttl;
                inner.moved.insert(id);
                inner.moved_at.get_or_insert_with(Instant::now);
                Ok(WriteResponse::LeaseKeepAlive(LeaseKeepAliveResponse {
                    header: None,
                    id,
                    ttl,
                }))
            })
            .collect();
        Some(answers)
    }

    /// What a commit at `now_ms` of `batch` stores along with it: the moved
    /// deadlines, and a new `covered_until` when it stores any or answers a
    /// keep-alive (so that later ones can be answered from memory).
    pub(crate) fn to_store(&self, batch: &[Queued], now_ms: i64) -> Stored {
        let inner = self.inner();
        let rows: Vec<LeaseRow> = inner.moved.iter().map(|id| inner.known[id]).collect();
        let renews = batch.iter().any(|queued| {
            queued.mark.is_none() && matches!(queued.request, WriteRequest::LeaseKeepAlive(_))
        });
        Stored {
            covered_until: (renews || !rows.is_empty()).then_some(now_ms + COVER_MS),
            rows,
        }
    }

    /// Notes a commit: what it stored, and the leases its requests granted,
    /// renewed, revoked or expired.
    pub(crate) fn committed(
        &self,
        stored: Stored,
        batch: &[Queued],
        answers: &[StoreResult<WriteResponse>],
    ) {
        let mut inner = self.inner();
        for row in &stored.rows {
            inner.moved.remove(&row.id);
        }
        if inner.moved.is_empty() {
            inner.moved_at = None;
        }
        if let Some(covered_until) = stored.covered_until {
            inner.covered_until = covered_until;
        }
        for (queued, answer) in batch.iter().zip(answers) {
            if queued.mark.is_some() {
                continue;
            }
            let from = queued.at_ms;
            match (&queued.request, answer) {
                (WriteRequest::LeaseGrant(_), Ok(WriteResponse::LeaseGrant(granted))) => {
                    inner
                        .known
                        .insert(granted.id, row(granted.id, granted.ttl, from));
                }
                (WriteRequest::LeaseKeepAlive(id), Ok(WriteResponse::LeaseKeepAlive(renewed)))
                    if renewed.ttl > 0 =>
                {
                    inner.known.insert(*id, row(*id, renewed.ttl, from));
                }
                (
                    WriteRequest::LeaseRevoke(id) | WriteRequest::LeaseExpire(id),
                    Ok(WriteResponse::LeaseRevoke(_) | WriteResponse::LeaseExpire(true)),
                ) => {
                    inner.known.remove(id);
                    inner.moved.remove(id);
                    if inner.moved.is_empty() {
                        inner.moved_at = None;
                    }
                }
                _ => {}
            }
        }
    }
}

/// The lease as the applier stores it when granted or renewed at `from_ms`.
fn row(id: i64, ttl: i64, from_ms: i64) -> LeaseRow {
    LeaseRow {
        id,
        ttl,
        expires_at: from_ms.saturating_add(ttl.saturating_mul(1000)),
    }
}

impl Stored {
    /// Writes the deadlines and `covered_until` in `txn`.
    pub(crate) async fn write<T: WriteTxn>(&self, txn: &mut T) -> BackendResult<()> {
        for lease in &self.rows {
            txn.put_lease(lease).await?;
        }
        if let Some(covered_until) = self.covered_until {
            txn.set_setting(LEASE_RENEWALS_COVERED_UNTIL, covered_until)
                .await?;
        }
        Ok(())
    }

    /// What a clean stop stores: every moved deadline, and `covered_until`
    /// cleared (nothing was promised that the database does not hold).
    pub(crate) fn at_stop(deadlines: &LeaseDeadlines) -> Stored {
        let inner = deadlines.inner();
        Stored {
            rows: inner.moved.iter().map(|id| inner.known[id]).collect(),
            covered_until: (inner.covered_until > 0).then_some(0),
        }
    }
}

/// After a crash (`covered_until` still set): gives every lease alive at the
/// last commit that set it at least `covered_until` + its TTL, so no
/// keep-alive answered from memory is lost, then clears the setting.
pub(crate) async fn recover<B: Backend>(backend: &B) -> BackendResult<()> {
    let covered_until = backend
        .read()
        .await?
        .setting(LEASE_RENEWALS_COVERED_UNTIL)
        .await?
        .unwrap_or(0);
    if covered_until == 0 {
        return Ok(());
    }
    let last_commit = covered_until - COVER_MS;
    let mut txn = backend.write().await?;
    let mut extended = 0;
    for lease in txn.leases().await? {
        let promised = row(lease.id, lease.ttl, covered_until).expires_at;
        if lease.expires_at > last_commit && lease.expires_at < promised {
            txn.put_lease(&LeaseRow {
                expires_at: promised,
                ..lease
            })
            .await?;
            extended += 1;
        }
    }
    txn.set_setting(LEASE_RENEWALS_COVERED_UNTIL, 0).await?;
    txn.commit().await?;
    tracing::info!(
        leases = extended,
        "unclean stop: leases extended to cover keep-alives not yet stored"
    );
    Ok(())
}
