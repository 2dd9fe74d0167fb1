//! Leases in the differential test: each server chooses its own lease ids,
//! so a request names a granted lease by a stand-in (`LEASE_SLOT` + its
//! grant order), sent to each server as that server's id, and the lease ids
//! in the answers are turned back into the stand-ins before they are
//! compared. A Txn comparing a key's LEASE with GREATER or LESS against a
//! granted lease then answers the same on both only if both hand out ids in
//! the same order (etcd's increase).

use cetera::proto::etcdserverpb::{
    Compare, RequestOp, ResponseOp, TxnRequest, TxnResponse, compare::TargetUnion,
    request_op::Request as Op, response_op::Response as OpResponse,
};
use cetera::proto::mvccpb::KeyValue;

/// The stand-in for the first lease granted; the n-th is `LEASE_SLOT + n`.
pub const LEASE_SLOT: i64 = 0x7e57_0000;

/// The lease ids one server chose, in grant order.
#[derive(Default)]
pub struct GrantedIds(Vec<i64>);

impl GrantedIds {
    /// Records the id the server chose for the next grant; its stand-in.
    pub fn granted(&mut self, id: i64) -> i64 {
        self.0.push(id);
        LEASE_SLOT + self.0.len() as i64 - 1
    }

    /// The server's id for a stand-in; other ids as they are.
    fn server_id(&self, id: i64) -> i64 {
        usize::try_from(id - LEASE_SLOT)
            .ok()
            .and_then(|n| self.0.get(n))
            .copied()
            .unwrap_or(id)
    }

    /// The stand-in for a server's id; other ids as they are.
    fn stand_in(&self, id: i64) -> i64 {
        match self.0.iter().position(|&granted| granted == id) {
            Some(n) if id != 0 => LEASE_SLOT + n as i64,
            _ => id,
        }
    }

    /// A Put's lease and the LEASE compares of a Txn, nested ones too, as
    /// this server's ids.
    pub fn put_lease(&self, lease: &mut i64) {
        *lease = self.server_id(*lease);
    }

    /// As `put_lease`, for a Txn.
    pub fn txn(&self, txn: &mut TxnRequest) {
        for compare in &mut txn.compare {
            self.compare(compare);
        }
        for op in txn.success.iter_mut().chain(&mut txn.failure) {
            self.op(op);
        }
    }

    fn compare(&self, compare: &mut Compare) {
        if let Some(TargetUnion::Lease(lease)) = &mut compare.target_union {
            *lease = self.server_id(*lease);
        }
    }

    fn op(&self, op: &mut RequestOp) {
        match &mut op.request {
            Some(Op::RequestPut(put)) => self.put_lease(&mut put.lease),
            Some(Op::RequestTxn(txn)) => self.txn(txn),
            _ => {}
        }
    }

    /// The lease of each of `kvs` as its stand-in.
    pub fn kvs<'a>(&self, kvs: impl IntoIterator<Item = &'a mut KeyValue>) {
        for kv in kvs {
            kv.lease = self.stand_in(kv.lease);
        }
    }

    /// As `kvs`, for every kv a Txn's answers carry.
    pub fn txn_response(&self, txn: &mut TxnResponse) {
        for op in &mut txn.responses {
            self.response_op(op);
        }
    }

    fn response_op(&self, op: &mut ResponseOp) {
        match &mut op.response {
            Some(OpResponse::ResponseRange(r)) => self.kvs(&mut r.kvs),
            Some(OpResponse::ResponsePut(r)) => self.kvs(&mut r.prev_kv),
            Some(OpResponse::ResponseDeleteRange(r)) => self.kvs(&mut r.prev_kvs),
            Some(OpResponse::ResponseTxn(r)) => self.txn_response(r),
            None => {}
        }
    }
}
