//! The KV service: Range, Put, DeleteRange, Txn and Compact, with etcd's
//! request validation (empty keys, ignore flags, txn op limits, duplicate keys)
//! and its request size limit.

use std::collections::HashSet;
use std::sync::Arc;

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use super::{ServerInfo, errors, keys_only};
use crate::backend::Backend;
use crate::proto::etcdserverpb::kv_server::Kv;
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, RequestOp, TxnRequest,
    TxnResponse,
};
use crate::store::Store;
use crate::store::range_stream::ChunkSink;

/// Bytes etcd adds around a write request in its raft entry (the request
/// header with its id, the field tags); its size limit counts them.
const RAFT_ENVELOPE_BYTES: usize = 15;

/// The KV service on a store.
pub struct KvService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
}

impl<B: Backend> KvService<B> {
    /// The service answering from `store`.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>) -> Self {
        KvService { store, info }
    }

    /// Refuses a write request that etcd would find too large for its raft log.
    fn check_size(&self, request: &impl Message) -> Result<(), Status> {
        let len = request.encoded_len();
        if len + prost::length_delimiter_len(len) + RAFT_ENVELOPE_BYTES
            > self.info.max_request_bytes
        {
            return Err(errors::request_too_large());
        }
        Ok(())
    }

    fn current_revision(&self) -> i64 {
        self.store.revisions().current
    }
}

#[tonic::async_trait]
impl<B: Backend> Kv for KvService<B> {
    type RangeStreamStream = ReceiverStream<Result<RangeStreamResponse, Status>>;

    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        check_range(&req, self.info.emulates_36())?;
        self.info
            .auth
            .authorize_range(&self.info.caller(&metadata, &extensions)?, &req)?;
        let mut resp = self.store.range(&req).await?;
        if self.info.emulates_37() {
            keys_only::range(&req, &mut resp);
        }
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }

    /// etcd 3.7's RangeStream: checked as Range is, then read on a task of
    /// its own that sends the chunks as the client takes them (a channel
    /// of one chunk), so memory holds a chunk or two, not the result.
    async fn range_stream(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        check_range_stream(&req)?;
        self.info
            .auth
            .authorize_range(&self.info.caller(&metadata, &extensions)?, &req)?;
        let (chunks, stream) = mpsc::channel(1);
        let store = self.store.clone();
        let info = self.info.clone();
        tokio::spawn(async move {
            let mut sink = GrpcChunks {
                chunks: chunks.clone(),
                info: info.clone(),
                without_leases: info.emulates_37() && keys_only::read_from_index(&req),
            };
            if let Err(error) = store
                .range_stream(&req, info.max_request_bytes, &mut sink)
                .await
            {
                let _ = chunks.send(Err(error.into())).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        check_put(&req)?;
        self.check_size(&req)?;
        self.info
            .auth
            .authorize_put(
                &self.info.caller(&metadata, &extensions)?,
                &req,
                &self.store,
            )
            .await?;
        let mut resp = self.store.put(req).await?;
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        check_delete(&req)?;
        self.check_size(&req)?;
        self.info
            .auth
            .authorize_delete(&self.info.caller(&metadata, &extensions)?, &req)?;
        let mut resp = self.store.delete_range(req).await?;
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        check_txn_as(&req, self.info.max_txn_ops, self.info.emulates_36())?;
        check_duplicates(&req.success)?;
        check_duplicates(&req.failure)?;
        self.check_size(&req)?;
        self.info
            .auth
            .authorize_txn(
                &self.info.caller(&metadata, &extensions)?,
                &req,
                &self.store,
            )
            .await?;
        let without_leases =
            (self.info.emulates_37() && keys_only::any_read_from_index(&req)).then(|| req.clone());
        let mut resp = self.store.txn(req).await?;
        if let Some(req) = &without_leases {
            keys_only::txn(req, &mut resp);
        }
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        self.info
            .require_admin(request.metadata(), request.extensions())?;
        let req = request.into_inner();
        self.check_size(&req)?;
        let mut resp = self.store.compact(&req).await?;
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }
}

/// etcd's checks of a Range (checkRangeRequest): a key, and from etcd 3.6
/// on (`sort_options`), a sort order and target etcd knows; a 3.5 takes
/// any number.
fn check_range(req: &RangeRequest, sort_options: bool) -> Result<(), Status> {
    if req.key.is_empty() {
        return Err(errors::empty_key());
    }
    if sort_options
        && (SortOrder::try_from(req.sort_order).is_err()
            || SortTarget::try_from(req.sort_target).is_err())
    {
        return Err(errors::invalid_sort_option());
    }
    Ok(())
}

/// etcd 3.7's checks of a RangeStream (checkRangeStreamRequest): those of
/// its Range as etcd 3.7 checks it (a key, known sort options), then no
/// sort order but etcd's default (a target with order NONE passes) and no
/// revision filters, which etcd answers Unimplemented.
fn check_range_stream(req: &RangeRequest) -> Result<(), Status> {
    check_range(req, true)?;
    let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    if !(order == SortOrder::None || (order == SortOrder::Ascend && target == SortTarget::Key)) {
        return Err(Status::new(
            Code::Unimplemented,
            "RangeStream does not support custom sort orders",
        ));
    }
    if req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
    {
        return Err(Status::new(
            Code::Unimplemented,
            "RangeStream does not support revision filters",
        ));
    }
    Ok(())
}

/// A RangeStream's chunks on their way to the client; the last one's header
/// gets the ids and the term, its revision being the stream's own (etcd's
/// headerFillingRangeStream).
struct GrpcChunks {
    chunks: mpsc::Sender<Result<RangeStreamResponse, Status>>,
    info: Arc<ServerInfo>,
    /// Whether the keys go without their leases, as etcd 3.7 reads a
    /// keys-only range (see `keys_only`).
    without_leases: bool,
}

impl ChunkSink for GrpcChunks {
    async fn send(&mut self, mut chunk: RangeResponse) -> bool {
        if chunk.header.is_some() {
            self.info.fill(&mut chunk.header, 0);
        }
        if self.without_leases {
            for kv in &mut chunk.kvs {
                kv.lease = 0;
            }
        }
        let chunk = RangeStreamResponse {
            range_response: Some(chunk),
        };
        self.chunks.send(Ok(chunk)).await.is_ok()
    }
}

fn check_put(req: &PutRequest) -> Result<(), Status> {
    if req.key.is_empty() {
        return Err(errors::empty_key());
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(errors::value_provided());
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(errors::lease_provided());
    }
    Ok(())
}

fn check_delete(req: &DeleteRangeRequest) -> Result<(), Status> {
    if req.key.is_empty() {
        return Err(errors::empty_key());
    }
    Ok(())
}

/// etcd's limit: no more than `max_ops` compares, or ops in either branch;
/// a nested txn gets what its parent left over. Ranges are checked as a 3.5
/// checks them.
pub(super) fn check_txn(req: &TxnRequest, max_ops: usize) -> Result<(), Status> {
    check_txn_as(req, max_ops, false)
}

/// `check_txn`, with the ranges' sort options checked too when
/// `sort_options` (etcd 3.6 and later).
fn check_txn_as(req: &TxnRequest, max_ops: usize, sort_options: bool) -> Result<(), Status> {
    let ops = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if ops > max_ops {
        return Err(errors::too_many_ops());
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(errors::empty_key());
    }
    for op in req.success.iter().chain(&req.failure) {
        match &op.request {
            Some(Op::RequestRange(r)) => check_range(r, sort_options)?,
            Some(Op::RequestPut(p)) => check_put(p)?,
            Some(Op::RequestDeleteRange(d)) => check_delete(d)?,
            Some(Op::RequestTxn(t)) => check_txn_as(t, max_ops - ops, sort_options)?,
            None => return Err(errors::key_not_found()),
        }
    }
    Ok(())
}

/// A deleted interval as etcd's duplicate check sees it: `[start, end)`, or
/// the single key `start` when `end` is empty. A "\0" end is taken literally
/// (and so holds no key), as etcd does.
struct Deleted<'a> {
    start: &'a [u8],
    end: &'a [u8],
}

impl Deleted<'_> {
    fn contains(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            key == self.start
        } else {
            self.start <= key && key < self.end
        }
    }
}

fn check_duplicates(ops: &[RequestOp]) -> Result<(), Status> {
    duplicate_scan(ops).map(|_| ())
}

/// etcd's rule: a txn may not put a key twice, nor put a key it deletes, at
/// any nesting level; then- and else-branches of one nested txn may put the
/// same key. Returns the keys put and the intervals deleted below `ops`.
fn duplicate_scan(ops: &[RequestOp]) -> Result<(HashSet<&[u8]>, Vec<Deleted<'_>>), Status> {
    let mut deleted: Vec<Deleted<'_>> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Op::RequestDeleteRange(d)) => Some(Deleted {
                start: &d.key,
                end: &d.range_end,
            }),
            _ => None,
        })
        .collect();
    let is_deleted = |deleted: &[Deleted<'_>], key: &[u8]| deleted.iter().any(|d| d.contains(key));

    let mut puts: HashSet<&[u8]> = HashSet::new();
    for op in ops {
        let Some(Op::RequestTxn(nested)) = &op.request else {
            continue;
        };
        let (puts_then, deleted_then) = duplicate_scan(&nested.success)?;
        let (puts_else, deleted_else) = duplicate_scan(&nested.failure)?;
        for key in &puts_then {
            if puts.contains(key) || is_deleted(&deleted, key) {
                return Err(errors::duplicate_key());
            }
            puts.insert(key);
        }
        for key in &puts_else {
            if (puts.contains(key) && !puts_then.contains(key)) || is_deleted(&deleted, key) {
                return Err(errors::duplicate_key());
            }
            puts.insert(key);
        }
        deleted.extend(deleted_then);
        deleted.extend(deleted_else);
    }

    for op in ops {
        let Some(Op::RequestPut(put)) = &op.request else {
            continue;
        };
        let key = put.key.as_slice();
        if puts.contains(key) || is_deleted(&deleted, key) {
            return Err(errors::duplicate_key());
        }
        puts.insert(key);
    }
    Ok((puts, deleted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::TxnRequest;

    fn put(key: &str) -> RequestOp {
        RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key: key.into(),
                ..Default::default()
            })),
        }
    }

    fn delete(key: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                key: key.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        }
    }

    fn nested(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> RequestOp {
        RequestOp {
            request: Some(Op::RequestTxn(TxnRequest {
                success,
                failure,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn duplicate_puts_are_refused() {
        assert!(check_duplicates(&[put("a"), put("a")]).is_err());
        assert!(check_duplicates(&[put("a"), put("b")]).is_ok());
    }

    #[test]
    fn put_inside_deleted_range_is_refused_in_any_order() {
        assert!(check_duplicates(&[delete("a", "c"), put("b")]).is_err());
        assert!(check_duplicates(&[put("b"), delete("a", "c")]).is_err());
        assert!(check_duplicates(&[put("c"), delete("a", "c")]).is_ok());
        assert!(check_duplicates(&[put("a"), delete("a", "")]).is_err());
    }

    #[test]
    fn from_key_delete_is_not_seen_as_overlapping() {
        // etcd compares the "\0" end literally, so it contains no key.
        assert!(check_duplicates(&[put("b"), delete("a", "\0")]).is_ok());
    }

    #[test]
    fn nested_branches_may_share_keys_but_not_with_the_parent() {
        assert!(check_duplicates(&[nested(vec![put("a")], vec![put("a")])]).is_ok());
        assert!(check_duplicates(&[put("a"), nested(vec![put("a")], vec![])]).is_err());
        assert!(check_duplicates(&[delete("a", "b"), nested(vec![], vec![put("a")])]).is_err());
        assert!(check_duplicates(&[nested(vec![delete("a", "b")], vec![]), put("a")]).is_err());
        assert!(check_duplicates(&[delete("a", "c"), delete("b", "d")]).is_ok());
    }

    #[test]
    fn op_limit_counts_the_largest_list_and_shrinks_for_nested_txns() {
        let txn = |n: usize| TxnRequest {
            success: (0..n).map(|i| put(&i.to_string())).collect(),
            ..Default::default()
        };
        assert!(check_txn(&txn(3), 3).is_ok());
        assert!(check_txn(&txn(4), 3).is_err());
        let outer = TxnRequest {
            success: vec![nested(txn(2).success, vec![])],
            ..Default::default()
        };
        assert!(check_txn(&outer, 3).is_ok());
        assert!(check_txn(&outer, 2).is_err());
    }

    #[test]
    fn empty_op_is_key_not_found() {
        let txn = TxnRequest {
            success: vec![RequestOp { request: None }],
            ..Default::default()
        };
        let err = check_txn(&txn, 128).unwrap_err();
        assert_eq!(err.message(), "etcdserver: key not found");
    }

    #[test]
    fn unknown_sort_options_are_refused_from_36_on() {
        let range = |order: i32, target: i32| RangeRequest {
            key: b"k".to_vec(),
            sort_order: order,
            sort_target: target,
            ..Default::default()
        };
        for (order, target) in [(3, 0), (0, 5), (-1, 0)] {
            assert!(check_range(&range(order, target), false).is_ok());
            let err = check_range(&range(order, target), true).unwrap_err();
            assert_eq!(err.message(), "etcdserver: invalid sort option");
        }
        assert!(check_range(&range(2, 4), true).is_ok());
        // Inside a Txn, nested ones included, as etcd's checkRequestOp.
        let inner = TxnRequest {
            failure: vec![RequestOp {
                request: Some(Op::RequestRange(range(9, 0))),
            }],
            ..Default::default()
        };
        let txn = TxnRequest {
            success: vec![nested(inner.success.clone(), inner.failure.clone())],
            ..Default::default()
        };
        assert!(check_txn_as(&txn, 128, false).is_ok());
        let err = check_txn_as(&txn, 128, true).unwrap_err();
        assert_eq!(err.message(), "etcdserver: invalid sort option");
    }
}
