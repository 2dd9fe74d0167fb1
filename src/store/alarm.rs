//! etcd's space quota and alarms: what a write costs against
//! `--quota-backend-bytes`, the cached database size it is checked against,
//! how Alarm ACTIVATE/DEACTIVATE change the stored alarms, and which requests
//! a raised alarm refuses (etcd's "capped" and "corrupt" appliers).
//!
//! Alarms live in the database, so every instance on a shared database sees
//! the same ones: the writer reads them in the write transaction of any batch
//! holding a request an alarm could refuse.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::error::{StoreError, StoreResult};
use super::request::{AlarmChange, WriteRequest};
use crate::backend::{AlarmRow, Backend, WriteTxn};
use crate::metrics::metrics;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{AlarmType, PutRequest, RequestOp, TxnRequest};

/// etcd's default quota when `--quota-backend-bytes` is 0: 2 GiB.
pub const DEFAULT_QUOTA_BYTES: i64 = 2 * 1024 * 1024 * 1024;
/// Above this etcd warns that the quota is larger than it supports: 8 GiB.
pub const MAX_QUOTA_BYTES: i64 = 8 * 1024 * 1024 * 1024;
/// What etcd charges a put beyond its key and value.
const KV_OVERHEAD: i64 = 256;
/// What etcd charges a LeaseGrant.
pub const LEASE_OVERHEAD: i64 = 64;
/// How long a measured database size is trusted. Measuring is a query (on
/// Postgres a catalog lookup), too much to run on every write; a write burst
/// can overshoot the quota by what it writes in this time.
const SIZE_MAX_AGE: Duration = Duration::from_millis(100);

/// etcd's cost of a Put: key, value and a fixed overhead.
pub fn put_cost(put: &PutRequest) -> i64 {
    KV_OVERHEAD + put.key.len() as i64 + put.value.len() as i64
}

/// etcd's cost of a Txn: the puts of the costlier branch. As in etcd,
/// puts inside nested txns are not counted.
pub fn txn_cost(txn: &TxnRequest) -> i64 {
    let branch = |ops: &[RequestOp]| -> i64 {
        ops.iter()
            .map(|op| match &op.request {
                Some(Request::RequestPut(put)) => put_cost(put),
                _ => 0,
            })
            .sum()
    };
    branch(&txn.success).max(branch(&txn.failure))
}

/// True if a txn only reads: etcd serves those without its applier, so no
/// alarm refuses them.
fn txn_is_read_only(txn: &TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| matches!(op.request, Some(Request::RequestRange(_)) | None))
}

/// The quota etcd shows (Status's dbSizeQuota, its quota gauge) for
/// `--quota-backend-bytes`: only 0 becomes the 2 GiB default; a negative
/// value (no quota) is shown as given.
pub fn quota_as_shown(quota_backend_bytes: i64) -> i64 {
    match quota_backend_bytes {
        0 => DEFAULT_QUOTA_BYTES,
        bytes => bytes,
    }
}

/// The quota writes are checked against, with the last measured size.
pub struct Quota {
    /// The limit in bytes; `None` when the quota is off.
    limit: Option<i64>,
    /// Set when the datastore reported its storage full: the NOSPACE alarm,
    /// kept here since the full database may not take the alarm's row.
    disk_full: AtomicBool,
    /// When the size was last measured, and what it was.
    measured: Mutex<Option<(Instant, i64)>>,
}

impl Quota {
    /// The quota etcd sets for `--quota-backend-bytes`: negative turns it
    /// off, 0 means the 2 GiB default.
    pub fn new(quota_backend_bytes: i64) -> Self {
        let limit = match quota_backend_bytes {
            bytes if bytes < 0 => {
                tracing::info!(bytes, "backend quota disabled");
                None
            }
            0 => Some(DEFAULT_QUOTA_BYTES),
            bytes => {
                if bytes > MAX_QUOTA_BYTES {
                    tracing::warn!(
                        bytes,
                        maximum = MAX_QUOTA_BYTES,
                        "quota exceeds the maximum value"
                    );
                }
                Some(bytes)
            }
        };
        metrics()
            .quota_backend_bytes
            .set(quota_as_shown(quota_backend_bytes));
        Quota {
            limit,
            disk_full: AtomicBool::new(false),
            measured: Mutex::new(None),
        }
    }

    /// etcd's `Available`: whether the database plus `cost` stays below the
    /// quota. Note that this is checked even for a cost of 0, as etcd does
    /// for a Txn without puts.
    pub async fn available<B: Backend>(&self, backend: &B, cost: i64) -> StoreResult<bool> {
        let Some(limit) = self.limit else {
            return Ok(true);
        };
        let mut measured = self.measured.lock().await;
        let size = match *measured {
            Some((at, size)) if at.elapsed() < SIZE_MAX_AGE => size,
            _ => {
                let size = backend.quota_bytes(&backend.size().await?);
                *measured = Some((Instant::now(), size));
                size
            }
        };
        Ok(size + cost < limit)
    }

    /// Notes that the datastore reported its storage full: NOSPACE is raised.
    pub fn note_disk_full(&self) {
        if !self.disk_full.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                alarm = "NOSPACE",
                "alarm raised: the datastore is out of space; free space, then disarm the alarm"
            );
        }
    }

    /// Whether the datastore reported its storage full since the last disarm.
    pub fn disk_full(&self) -> bool {
        self.disk_full.load(Ordering::SeqCst)
    }

    /// Disarms the NOSPACE alarm the datastore's full storage raised;
    /// whether it was raised.
    pub fn disarm_disk_full(&self) -> bool {
        self.disk_full.swap(false, Ordering::SeqCst)
    }

    /// Forgets the measured size, so the next write measures again (after a
    /// disarm: the database may have shrunk since).
    pub async fn forget_size(&self) {
        *self.measured.lock().await = None;
    }
}

/// Whether `request` is one a raised alarm may refuse, so the writer must
/// know the alarms before applying it.
pub fn may_be_refused(request: &WriteRequest) -> bool {
    !matches!(
        request,
        WriteRequest::LeaseKeepAlive(_)
            | WriteRequest::CompactStep
            | WriteRequest::Alarm { .. }
            | WriteRequest::Auth(_)
            | WriteRequest::Downgrade { .. }
            | WriteRequest::Nothing
    )
}

/// The error a raised alarm gives `request`, if any. NOSPACE refuses what
/// etcd's capped applier refuses (Put, Txn with puts, LeaseGrant); CORRUPT
/// what its corrupt applier refuses (every write but keep-alives).
pub fn refusal(alarms: &[AlarmRow], request: &WriteRequest) -> Option<StoreError> {
    let raised = |alarm: AlarmType| alarms.iter().any(|row| row.alarm == alarm as i32);
    if raised(AlarmType::Corrupt) {
        let refused = match request {
            WriteRequest::Txn(txn) => !txn_is_read_only(txn),
            WriteRequest::Put(_)
            | WriteRequest::DeleteRange(_)
            | WriteRequest::LeaseGrant(_)
            | WriteRequest::LeaseRevoke(_)
            | WriteRequest::LeaseExpire(_)
            | WriteRequest::Compact(_) => true,
            _ => false,
        };
        if refused {
            return Some(StoreError::Corrupt);
        }
    }
    if raised(AlarmType::Nospace) {
        let refused = match request {
            WriteRequest::Txn(txn) => txn_cost(txn) > 0,
            WriteRequest::Put(_) | WriteRequest::LeaseGrant(_) => true,
            _ => false,
        };
        if refused {
            return Some(StoreError::NoSpace);
        }
    }
    None
}

/// Applies Alarm ACTIVATE or DEACTIVATE as etcd's applier does, answering
/// with the alarm concerned: ACTIVATE of NONE does nothing; ACTIVATE answers
/// with the alarm whether it was new or not; DEACTIVATE answers with it only
/// if it was raised.
pub async fn change<T: WriteTxn>(
    txn: &mut T,
    change: AlarmChange,
    member_id: u64,
    alarm: i32,
) -> StoreResult<Vec<AlarmRow>> {
    let row = AlarmRow {
        member_id: member_id as i64,
        alarm,
    };
    match change {
        AlarmChange::Activate => {
            if alarm == AlarmType::None as i32 {
                return Ok(Vec::new());
            }
            // etcd knows no other alarm and would panic here.
            if AlarmType::try_from(alarm).is_err() {
                return Err(StoreError::UnknownAlarm(alarm));
            }
            let raised = txn.alarms().await?;
            if !raised.contains(&row) {
                txn.add_alarm(&row).await?;
                tracing::warn!(
                    alarm = alarm_name(alarm),
                    from = format!("{member_id:x}"),
                    "alarm raised"
                );
            }
            Ok(vec![row])
        }
        AlarmChange::Deactivate => {
            if !txn.alarms().await?.contains(&row) {
                return Ok(Vec::new());
            }
            txn.remove_alarm(&row).await?;
            tracing::warn!(
                alarm = alarm_name(alarm),
                from = format!("{member_id:x}"),
                "alarm disarmed"
            );
            Ok(vec![row])
        }
    }
}

/// The alarms of type `alarm` (all of them for NONE), as etcd's GET lists them.
pub fn matching(alarms: Vec<AlarmRow>, alarm: i32) -> Vec<AlarmRow> {
    alarms
        .into_iter()
        .filter(|row| alarm == AlarmType::None as i32 || row.alarm == alarm)
        .collect()
}

/// etcd's name of an alarm type (the number itself if it has none).
pub fn alarm_name(alarm: i32) -> String {
    AlarmType::try_from(alarm)
        .map(|t| t.as_str_name().to_string())
        .unwrap_or_else(|_| alarm.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{DeleteRangeRequest, RangeRequest};

    fn put(key: &str, value: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn costs_follow_etcd() {
        let one = PutRequest {
            key: b"k".to_vec(),
            value: b"vv".to_vec(),
            ..Default::default()
        };
        assert_eq!(put_cost(&one), 259);
        let txn = TxnRequest {
            success: vec![put("a", "1"), put("b", "2")],
            failure: vec![put("c", "12345")],
            ..Default::default()
        };
        assert_eq!(txn_cost(&txn), 2 * 258);
        let nested = TxnRequest {
            success: vec![RequestOp {
                request: Some(Request::RequestTxn(txn)),
            }],
            ..Default::default()
        };
        assert_eq!(txn_cost(&nested), 0);
    }

    #[test]
    fn nospace_refuses_only_growing_writes() {
        let nospace = [AlarmRow {
            member_id: 1,
            alarm: AlarmType::Nospace as i32,
        }];
        let refused = |request: WriteRequest| refusal(&nospace, &request).is_some();
        assert!(refused(WriteRequest::Put(PutRequest::default())));
        assert!(refused(WriteRequest::LeaseGrant(Default::default())));
        assert!(!refused(WriteRequest::DeleteRange(
            DeleteRangeRequest::default()
        )));
        assert!(!refused(WriteRequest::Compact(5)));
        assert!(!refused(WriteRequest::LeaseRevoke(5)));
        let deletes = TxnRequest {
            success: vec![RequestOp {
                request: Some(Request::RequestDeleteRange(Default::default())),
            }],
            ..Default::default()
        };
        assert!(!refused(WriteRequest::Txn(deletes)));
        let puts = TxnRequest {
            failure: vec![put("a", "")],
            ..Default::default()
        };
        assert!(refused(WriteRequest::Txn(puts)));
    }

    #[test]
    fn corrupt_refuses_every_write_but_not_reads() {
        let corrupt = [AlarmRow {
            member_id: 1,
            alarm: AlarmType::Corrupt as i32,
        }];
        let refused = |request: WriteRequest| refusal(&corrupt, &request).is_some();
        assert!(refused(WriteRequest::DeleteRange(
            DeleteRangeRequest::default()
        )));
        assert!(refused(WriteRequest::Compact(5)));
        assert!(!refused(WriteRequest::LeaseKeepAlive(5)));
        let reads = TxnRequest {
            success: vec![RequestOp {
                request: Some(Request::RequestRange(RangeRequest::default())),
            }],
            ..Default::default()
        };
        assert!(!refused(WriteRequest::Txn(reads)));
    }
}
