//! Builders of the ops a Txn carries (`etcdserverpb::RequestOp`), shared by
//! the server (Lock and Election build their Txns of them), its tests and
//! the benchmark client: a request message becomes an op with `From`
//! (`RequestOp::from(put)`, `put.into()`), and the common ops have a
//! function of their own.

use crate::etcdserverpb::request_op::Request;
use crate::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};

impl From<RangeRequest> for RequestOp {
    fn from(range: RangeRequest) -> Self {
        op(Request::RequestRange(range))
    }
}

impl From<PutRequest> for RequestOp {
    fn from(put: PutRequest) -> Self {
        op(Request::RequestPut(put))
    }
}

impl From<DeleteRangeRequest> for RequestOp {
    fn from(delete: DeleteRangeRequest) -> Self {
        op(Request::RequestDeleteRange(delete))
    }
}

impl From<TxnRequest> for RequestOp {
    fn from(txn: TxnRequest) -> Self {
        op(Request::RequestTxn(txn))
    }
}

fn op(request: Request) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

/// An op putting `key = value` under `lease` (0: none).
pub fn put(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        lease,
        ..Default::default()
    }
    .into()
}

/// An op reading the one key `key`.
pub fn get(key: &[u8]) -> RequestOp {
    RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }
    .into()
}

/// An op deleting the one key `key`.
pub fn delete(key: &[u8]) -> RequestOp {
    DeleteRangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }
    .into()
}
