//! Applying one write request (Put, DeleteRange, Txn) inside a write
//! transaction, with etcd's rules: every change of the request shares one new
//! revision, versions count puts since creation, a Txn's compares choose a
//! branch, and checks run before anything is written so a failed request
//! leaves no trace.

mod lease;

pub use self::lease::{lease_deadline, now_ms};

use std::future::Future;
use std::pin::Pin;

use super::error::{StoreError, StoreResult};
use super::range::{self, key_range};
use crate::backend::{KeyRange, LogEntry, ReadAt, WriteTxn};
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::response_op::Response;
use crate::proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use crate::proto::mvccpb::{Event, KeyValue, event::EventType};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The order in which etcd checks the ops of a Txn's chosen branches before
/// it writes; the first failed check is the answer, so the order decides
/// which error a Txn with several faults gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TxnChecks {
    /// etcd 3.5 (applierV3backend.Txn): every Put first (its key for the
    /// ignore flags, then its lease), then every Range's revision.
    #[default]
    Etcd35,
    /// etcd 3.6 and later (checkTxn in server/etcdserver/txn): each op in
    /// its order, a Put's lease before its key.
    Etcd36,
}

/// A pass of etcd's Txn checks over the chosen branches.
#[derive(Clone, Copy)]
enum Check {
    /// etcd 3.5's first pass: the Puts.
    Puts,
    /// etcd 3.5's second pass: the Ranges.
    Ranges,
    /// etcd 3.6's one pass: every op in order.
    InOrder,
}

/// Which branch each Txn took: the top one, then its nested Txns in order.
struct TxnPath {
    succeeded: bool,
    nested: Vec<TxnPath>,
}

/// Applies one request at revision `begin + 1` and records its changes.
pub struct Applier<'a, T> {
    txn: &'a mut T,
    begin: i64,
    compact: i64,
    /// The request's time (Unix milliseconds), for lease deadlines: taken
    /// when it was queued, so that replicas applying it later agree.
    now_ms: i64,
    /// The order of a Txn's checks.
    checks: TxnChecks,
    /// The events of this request, in the order they happened.
    pub events: Vec<Event>,
}

impl<'a, T: WriteTxn> Applier<'a, T> {
    /// An applier for a request made at `now_ms` that follows revision
    /// `begin`, checking a Txn in the order `checks`.
    pub fn new(txn: &'a mut T, begin: i64, compact: i64, now_ms: i64, checks: TxnChecks) -> Self {
        Applier {
            txn,
            begin,
            compact,
            now_ms,
            checks,
            events: Vec::new(),
        }
    }

    /// The revision the store is at after what was applied so far.
    pub fn revision(&self) -> i64 {
        if self.events.is_empty() {
            self.begin
        } else {
            self.begin + 1
        }
    }

    /// A standalone Put.
    pub async fn put(&mut self, req: &PutRequest) -> StoreResult<PutResponse> {
        // A standalone Put checks its lease first; a Put in a Txn checks it last.
        self.check_lease(req).await?;
        self.check_ignore_flags(req).await?;
        self.apply_put(req).await
    }

    /// A standalone DeleteRange.
    pub async fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> StoreResult<DeleteRangeResponse> {
        self.apply_delete_range(req).await
    }

    /// A Txn: compares, then checks of the chosen branches, then the writes.
    pub async fn txn(&mut self, req: &TxnRequest) -> StoreResult<TxnResponse> {
        let path = self.choose_path(req).await?;
        match self.checks {
            TxnChecks::Etcd35 => {
                self.check_branch(req, &path, Check::Puts).await?;
                self.check_branch(req, &path, Check::Ranges).await?;
            }
            TxnChecks::Etcd36 => self.check_branch(req, &path, Check::InOrder).await?,
        }
        let mut resp = self.apply_txn(req, &path).await?;
        resp.header = Some(header(self.revision()));
        Ok(resp)
    }

    fn choose_path<'b>(&'b mut self, req: &'b TxnRequest) -> BoxFuture<'b, StoreResult<TxnPath>> {
        Box::pin(async move {
            let mut succeeded = true;
            for cmp in &req.compare {
                if !self.compare(cmp).await? {
                    succeeded = false;
                    break;
                }
            }
            let mut nested = Vec::new();
            for op in branch(req, succeeded) {
                if let Some(Request::RequestTxn(inner)) = &op.request {
                    nested.push(self.choose_path(inner).await?);
                }
            }
            Ok(TxnPath { succeeded, nested })
        })
    }

    async fn compare(&mut self, cmp: &Compare) -> StoreResult<bool> {
        let keys = key_range(&cmp.key, &cmp.range_end);
        let kvs = if keys.is_empty() {
            Vec::new()
        } else {
            self.txn.range(&keys, ReadAt::Current, 0, false).await?
        };
        let target = CompareTarget::try_from(cmp.target).ok();
        if kvs.is_empty() {
            // A missing key has no value to compare; other targets compare against zero.
            return Ok(target != Some(CompareTarget::Value)
                && compare_kv(cmp, target, &KeyValue::default()));
        }
        Ok(kvs.iter().all(|kv| compare_kv(cmp, target, kv)))
    }

    /// One pass of etcd's pre-write checks over the ops a Txn will run,
    /// against the state before the Txn.
    fn check_branch<'b>(
        &'b mut self,
        req: &'b TxnRequest,
        path: &'b TxnPath,
        check: Check,
    ) -> BoxFuture<'b, StoreResult<()>> {
        Box::pin(async move {
            let mut nested = path.nested.iter();
            for op in branch(req, path.succeeded) {
                match (&op.request, check) {
                    (Some(Request::RequestTxn(inner)), _) => {
                        let inner_path = nested.next().expect("one path per nested txn");
                        self.check_branch(inner, inner_path, check).await?;
                    }
                    (Some(Request::RequestPut(put)), Check::Puts) => {
                        self.check_ignore_flags(put).await?;
                        self.check_lease(put).await?;
                    }
                    (Some(Request::RequestPut(put)), Check::InOrder) => {
                        self.check_lease(put).await?;
                        self.check_ignore_flags(put).await?;
                    }
                    (Some(Request::RequestRange(range)), Check::Ranges | Check::InOrder) => {
                        // Unlike a plain Range, a negative revision is checked as it is.
                        if range.revision > self.begin {
                            return Err(StoreError::FutureRevision);
                        }
                        if range.revision != 0 && range.revision < self.compact {
                            return Err(StoreError::Compacted);
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        })
    }

    /// ignore_value and ignore_lease need an existing key.
    async fn check_ignore_flags(&mut self, req: &PutRequest) -> StoreResult<()> {
        if (req.ignore_value || req.ignore_lease) && self.current(&req.key).await?.is_none() {
            return Err(StoreError::KeyNotFound);
        }
        Ok(())
    }

    async fn check_lease(&mut self, req: &PutRequest) -> StoreResult<()> {
        if req.lease != 0 && !self.lease_exists(req.lease).await? {
            return Err(StoreError::LeaseNotFound);
        }
        Ok(())
    }

    /// A lease exists from its grant until it is revoked, even past its deadline.
    async fn lease_exists(&mut self, lease: i64) -> StoreResult<bool> {
        Ok(self.txn.lease(lease).await?.is_some())
    }

    fn apply_txn<'b>(
        &'b mut self,
        req: &'b TxnRequest,
        path: &'b TxnPath,
    ) -> BoxFuture<'b, StoreResult<TxnResponse>> {
        Box::pin(async move {
            let mut nested = path.nested.iter();
            let mut responses = Vec::new();
            for op in branch(req, path.succeeded) {
                let response = match &op.request {
                    Some(Request::RequestRange(r)) => Response::ResponseRange(self.range(r).await?),
                    Some(Request::RequestPut(p)) => Response::ResponsePut(self.apply_put(p).await?),
                    Some(Request::RequestDeleteRange(d)) => {
                        Response::ResponseDeleteRange(self.apply_delete_range(d).await?)
                    }
                    Some(Request::RequestTxn(inner)) => {
                        let inner_path = nested.next().expect("one path per nested txn");
                        Response::ResponseTxn(self.apply_txn(inner, inner_path).await?)
                    }
                    // The API layer refuses empty ops before they get here.
                    None => continue,
                };
                responses.push(ResponseOp {
                    response: Some(response),
                });
            }
            Ok(TxnResponse {
                // Nested Txns carry an empty header, as in etcd.
                header: Some(ResponseHeader::default()),
                succeeded: path.succeeded,
                responses,
            })
        })
    }

    async fn range(&mut self, req: &RangeRequest) -> StoreResult<RangeResponse> {
        let current = self.revision();
        range::range(self.txn, req, current, self.compact, None).await
    }

    async fn current(&mut self, key: &[u8]) -> StoreResult<Option<KeyValue>> {
        let keys = KeyRange::single(key);
        Ok(self
            .txn
            .range(&keys, ReadAt::Current, 1, false)
            .await?
            .pop())
    }

    async fn apply_put(&mut self, req: &PutRequest) -> StoreResult<PutResponse> {
        let revision = self.begin + 1;
        let prev = self.current(&req.key).await?;
        let value = match (&prev, req.ignore_value) {
            (Some(prev), true) => prev.value.clone(),
            _ => req.value.clone(),
        };
        let lease = match (&prev, req.ignore_lease) {
            (Some(prev), true) => prev.lease,
            _ => req.lease,
        };
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
            mod_revision: revision,
            version: prev.as_ref().map_or(0, |p| p.version) + 1,
            value,
            lease,
        };
        self.record(EventType::Put, kv, prev.clone()).await?;
        Ok(PutResponse {
            header: Some(header(revision)),
            prev_kv: if req.prev_kv { prev } else { None },
        })
    }

    async fn apply_delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> StoreResult<DeleteRangeResponse> {
        let keys = key_range(&req.key, &req.range_end);
        let existing = if keys.is_empty() {
            Vec::new()
        } else {
            self.txn.range(&keys, ReadAt::Current, 0, false).await?
        };
        let deleted = existing.len() as i64;
        for prev in &existing {
            let tombstone = KeyValue {
                key: prev.key.clone(),
                mod_revision: self.begin + 1,
                ..Default::default()
            };
            self.record(EventType::Delete, tombstone, Some(prev.clone()))
                .await?;
        }
        Ok(DeleteRangeResponse {
            header: Some(header(self.revision())),
            deleted,
            prev_kvs: if req.prev_kv { existing } else { Vec::new() },
        })
    }

    async fn record(
        &mut self,
        kind: EventType,
        kv: KeyValue,
        mut prev_kv: Option<KeyValue>,
    ) -> StoreResult<()> {
        // A key changed earlier in this request: watchers see its state before
        // the request as the previous one, as etcd reads it at revision - 1.
        if prev_kv
            .as_ref()
            .is_some_and(|p| p.mod_revision == self.begin + 1)
        {
            prev_kv = self
                .events
                .iter()
                .rev()
                .find(|e| e.kv.as_ref().is_some_and(|k| k.key == kv.key))
                .and_then(|e| e.prev_kv.clone());
        }
        let entry = LogEntry {
            sub: self.events.len() as i64,
            deleted: kind == EventType::Delete,
            kv,
        };
        self.txn.append(&entry).await?;
        self.events.push(Event {
            r#type: kind as i32,
            kv: Some(entry.kv),
            prev_kv,
        });
        Ok(())
    }
}

/// The ops of the branch a Txn takes.
fn branch(req: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &req.success
    } else {
        &req.failure
    }
}

fn header(revision: i64) -> ResponseHeader {
    ResponseHeader {
        revision,
        ..Default::default()
    }
}

/// Compares one key with `cmp`; an unknown target compares as equal, as in etcd.
fn compare_kv(cmp: &Compare, target: Option<CompareTarget>, kv: &KeyValue) -> bool {
    let Some(target) = target else {
        return result_holds(cmp, std::cmp::Ordering::Equal);
    };
    let ordering = match (target, &cmp.target_union) {
        (CompareTarget::Value, Some(TargetUnion::Value(v))) => kv.value.as_slice().cmp(v),
        (CompareTarget::Value, _) => kv.value.as_slice().cmp(&[][..]),
        (CompareTarget::Version, u) => kv.version.cmp(&int_target(u, |u| match u {
            TargetUnion::Version(v) => Some(*v),
            _ => None,
        })),
        (CompareTarget::Create, u) => kv.create_revision.cmp(&int_target(u, |u| match u {
            TargetUnion::CreateRevision(v) => Some(*v),
            _ => None,
        })),
        (CompareTarget::Mod, u) => kv.mod_revision.cmp(&int_target(u, |u| match u {
            TargetUnion::ModRevision(v) => Some(*v),
            _ => None,
        })),
        (CompareTarget::Lease, u) => kv.lease.cmp(&int_target(u, |u| match u {
            TargetUnion::Lease(v) => Some(*v),
            _ => None,
        })),
    };
    result_holds(cmp, ordering)
}

fn result_holds(cmp: &Compare, ordering: std::cmp::Ordering) -> bool {
    match CompareResult::try_from(cmp.result) {
        Ok(CompareResult::Equal) => ordering.is_eq(),
        Ok(CompareResult::NotEqual) => ordering.is_ne(),
        Ok(CompareResult::Greater) => ordering.is_gt(),
        Ok(CompareResult::Less) => ordering.is_lt(),
        // etcd treats an unknown result as true.
        Err(_) => true,
    }
}

/// The integer a compare names for its target; a mismatched union reads as 0, as in etcd.
fn int_target(union: &Option<TargetUnion>, pick: impl Fn(&TargetUnion) -> Option<i64>) -> i64 {
    union.as_ref().and_then(pick).unwrap_or(0)
}
