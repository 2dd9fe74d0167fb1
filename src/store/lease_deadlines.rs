//! Lease keep-alives answered from memory, their deadlines stored lazily:
//! on a store that is its database's only writer (SQLite, one server), a
//! keep-alive of a lease the writer knows needs no commit of its own. The
//! writer keeps every known lease's deadline here and answers a batch of
//! such keep-alives without a transaction. A moved deadline is stored only
//! once the stored one comes within `STORE_AHEAD` of the present (or at a
//! clean stop): a lease kept alive every TTL/3 is written about once per
//! TTL - `STORE_AHEAD` instead of at every keep-alive, and the stored
//! deadline of a live lease is always ahead of the last commit.
//!
//! The bound on a crash. While keep-alives are answered from memory the
//! writer commits at least every `STORE_INTERVAL`, and each such commit
//! stores `covered_until` = its time + `COVER_MS` in the settings; a
//! keep-alive is answered from memory only before the committed
//! `covered_until`, so every promise made is at most `covered_until` + TTL.
//! After a kill -9, `recover` gives every lease whose stored deadline is
//! after the last such commit (every lease alive then) at least
//! `covered_until` + its TTL. A lease therefore never expires earlier than
//! its last acknowledged keep-alive promised, and at most TTL + `COVER_MS`
//! after the last commit before the crash. A clean stop stores every
//! deadline and clears `covered_until`, so a restart keeps each lease's
//! remaining time exactly.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::error::StoreResult;
use super::request::{Queued, WriteRequest, WriteResponse};
use crate::backend::settings::LEASE_RENEWALS_COVERED_UNTIL;
use crate::backend::{Backend, BackendResult, LeaseRow, ReadTxn, WriteTxn};
use crate::proto::etcdserverpb::LeaseKeepAliveResponse;

/// Longest time between two commits while keep-alives are answered from
/// memory.
pub(crate) const STORE_INTERVAL: Duration = Duration::from_millis(500);

/// How long after a commit keep-alives may still be answered from memory:
/// twice the store interval, so steady keep-alives never wait for a commit.
const COVER_MS: i64 = 2 * STORE_INTERVAL.as_millis() as i64;

/// A moved deadline is stored once the stored one is this close (ms): well
/// past `COVER_MS` and the expirer's 500 ms, so no live lease looks expired
/// in the database.
const STORE_AHEAD_MS: i64 = 5_000;

/// The writer's view of the leases' deadlines (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct LeaseDeadlines {
    inner: Mutex<Inner>,
    /// Wakes the writer when a keep-alive answered on its caller's task
    /// makes a commit due (`renew_one`).
    commit_due: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Inner {
    /// Every lease the writer granted or renewed, as it is now, and the
    /// deadline the database holds for it.
    known: HashMap<i64, Known>,
    /// The leases whose deadline moved past the stored one, by stored
    /// deadline (then id): the first are the first to store.
    moved: BTreeSet<(i64, i64)>,
    /// When the first keep-alive since the last commit was answered from
    /// memory.
    renewed_at: Option<Instant>,
    /// Until when (Unix ms) a keep-alive may be answered from memory: the
    /// committed `covered_until`.
    covered_until: i64,
}

#[derive(Clone, Copy, Debug)]
struct Known {
    lease: LeaseRow,
    stored_until: i64,
}

/// What one commit stores: deadlines, and the new `covered_until`.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    rows: Vec<LeaseRow>,
    covered_until: Option<i64>,
}

impl Inner {
    /// Notes that the database holds `lease` as it is.
    fn know(&mut self, lease: LeaseRow) {
        self.forget(lease.id);
        self.known.insert(
            lease.id,
            Known {
                lease,
                stored_until: lease.expires_at,
            },
        );
    }

    fn forget(&mut self, id: i64) {
        if let Some(known) = self.known.remove(&id) {
            self.moved.remove(&(known.stored_until, id));
        }
    }

    /// Whether a keep-alive of `id` made at `at_ms` can be answered from memory.
    fn answerable(&self, id: i64, at_ms: i64) -> bool {
        at_ms < self.covered_until
            && self
                .known
                .get(&id)
                .is_some_and(|known| known.lease.expires_at > at_ms)
    }

    /// Renews `id` (answerable) from `at_ms`; its deadline is to be stored.
    fn renew(&mut self, id: i64, at_ms: i64) -> LeaseKeepAliveResponse {
        let known = self.known.get_mut(&id).expect("renewed only when known");
        known.lease = row(id, known.lease.ttl, at_ms);
        let (ttl, stored_until) = (known.lease.ttl, known.stored_until);
        self.moved.insert((stored_until, id));
        LeaseKeepAliveResponse {
            header: None,
            id,
            ttl,
        }
    }

    /// The moved deadlines whose stored one is before `until`.
    fn moved_before(&self, until: i64) -> Vec<LeaseRow> {
        self.moved
            .range(..(until, i64::MIN))
            .map(|(_, id)| self.known[id].lease)
            .collect()
    }
}

impl LeaseDeadlines {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("lease deadlines poisoned")
    }

    /// The deadline of lease `id` (Unix ms) if the writer knows it: newer
    /// than the database's until it is stored.
    pub(crate) fn deadline(&self, id: i64) -> Option<i64> {
        self.inner()
            .known
            .get(&id)
            .map(|known| known.lease.expires_at)
    }

    /// When the writer must commit (see `STORE_INTERVAL`), if it must.
    pub(crate) fn store_due(&self) -> Option<Instant> {
        self.inner().renewed_at.map(|at| at + STORE_INTERVAL)
    }

    /// Waits until a keep-alive answered by `renew_one` makes a commit due.
    pub(crate) async fn commit_came_due(&self) {
        self.commit_due.notified().await
    }

    /// Answers a keep-alive of `id` made at `at_ms` from memory, on the
    /// caller's task (no hop to the writer), if it can be; else `None` and
    /// the keep-alive goes to the writer.
    pub(crate) fn renew_one(&self, id: i64, at_ms: i64) -> Option<LeaseKeepAliveResponse> {
        let mut inner = self.inner();
        if !inner.answerable(id, at_ms) {
            return None;
        }
        let answer = inner.renew(id, at_ms);
        let first = inner.renewed_at.is_none();
        inner.renewed_at.get_or_insert_with(Instant::now);
        drop(inner);
        if first {
            self.commit_due.notify_one();
        }
        Some(answer)
    }

    /// Answers `batch` from memory if it holds only keep-alives of known,
    /// live leases, made before `covered_until`; else `None` and nothing
    /// changes (the batch goes to the database).
    pub(crate) fn renew(&self, batch: &[Queued]) -> Option<Vec<StoreResult<WriteResponse>>> {
        let mut inner = self.inner();
        // An empty batch is the writer's call to commit.
        let answerable = !batch.is_empty()
            && batch.iter().all(|queued| match queued.request {
                WriteRequest::LeaseKeepAlive(id) => {
                    queued.mark.is_none() && inner.answerable(id, queued.at_ms)
                }
                _ => false,
            });
        if !answerable {
            return None;
        }
        inner.renewed_at.get_or_insert_with(Instant::now);
        let answers = batch
            .iter()
            .map(|queued| {
                let WriteRequest::LeaseKeepAlive(id) = queued.request else {
                    unreachable!("checked above: only keep-alives");
                };
                Ok(WriteResponse::LeaseKeepAlive(inner.renew(id, queued.at_ms)))
            })
            .collect();
        Some(answers)
    }

    /// What a commit at `now_ms` of `batch` stores along with it: the moved
    /// deadlines whose stored one is due, and a new `covered_until` when
    /// keep-alives were or are to be answered (so that later ones can be
    /// answered from memory).
    pub(crate) fn to_store(&self, batch: &[Queued], now_ms: i64) -> Stored {
        let inner = self.inner();
        let rows = inner.moved_before(now_ms + STORE_AHEAD_MS);
        let renews = inner.renewed_at.is_some()
            || batch.iter().any(|queued| {
                queued.mark.is_none() && matches!(queued.request, WriteRequest::LeaseKeepAlive(_))
            });
        Stored {
            covered_until: (renews || !rows.is_empty()).then_some(now_ms + COVER_MS),
            rows,
        }
    }

    /// Notes a failed commit: the next try to store is a `STORE_INTERVAL`
    /// away, so that a failing database is not asked again at once.
    pub(crate) fn commit_failed(&self) {
        let mut inner = self.inner();
        if inner.renewed_at.is_some() || !inner.moved.is_empty() {
            inner.renewed_at = Some(Instant::now());
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
        for lease in stored.rows {
            inner.know(lease);
        }
        if let Some(covered_until) = stored.covered_until {
            inner.covered_until = covered_until;
        }
        inner.renewed_at = None;
        for (queued, answer) in batch.iter().zip(answers) {
            if queued.mark.is_some() {
                continue;
            }
            let from = queued.at_ms;
            match (&queued.request, answer) {
                (WriteRequest::LeaseGrant(_), Ok(WriteResponse::LeaseGrant(granted))) => {
                    inner.know(row(granted.id, granted.ttl, from));
                }
                (WriteRequest::LeaseKeepAlive(id), Ok(WriteResponse::LeaseKeepAlive(renewed)))
                    if renewed.ttl > 0 =>
                {
                    inner.know(row(*id, renewed.ttl, from));
                }
                (
                    WriteRequest::LeaseRevoke(id) | WriteRequest::LeaseExpire(id),
                    Ok(WriteResponse::LeaseRevoke(_) | WriteResponse::LeaseExpire(true)),
                ) => inner.forget(*id),
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
        expires_at: super::apply::lease_deadline(from_ms, ttl),
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
    /// From then on no keep-alive is answered from memory.
    pub(crate) fn at_stop(deadlines: &LeaseDeadlines) -> Stored {
        let mut inner = deadlines.inner();
        let stored = Stored {
            rows: inner.moved_before(i64::MAX),
            covered_until: (inner.covered_until > 0).then_some(0),
        };
        inner.covered_until = 0;
        stored
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
