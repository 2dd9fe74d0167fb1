//! Keys-only reads as etcd 3.7 answers them: it reads a keys-only Range
//! (unless sorted by value) from its in-memory key index
//! (`FastKeysOnly` in server/etcdserver/txn/range.go), which keeps no
//! leases, so every key comes back with lease 0. Range, a Txn's reads and
//! RangeStream all go that way; a 3.6 or 3.5 server reads the stored key
//! and answers its lease.

use crate::proto::etcdserverpb::range_request::SortTarget;
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest, TxnResponse};

/// Whether etcd 3.7 reads `req` from its key index.
pub(super) fn read_from_index(req: &RangeRequest) -> bool {
    req.keys_only && req.sort_target != SortTarget::Value as i32
}

/// Whether any read of `req`, in either branch or a nested Txn, is read
/// from the key index (so the Txn's answer is worth going over).
pub(super) fn any_read_from_index(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .any(|op| match &op.request {
            Some(Op::RequestRange(req)) => read_from_index(req),
            Some(Op::RequestTxn(req)) => any_read_from_index(req),
            _ => false,
        })
}

/// `resp` to `req` as etcd 3.7 gives it: without leases when read from the
/// key index.
pub(super) fn range(req: &RangeRequest, resp: &mut RangeResponse) {
    if read_from_index(req) {
        for kv in &mut resp.kvs {
            kv.lease = 0;
        }
    }
}

/// `resp` to `req` as etcd 3.7 gives it: each read of the branch that ran
/// (nested Txns included) as [`range`] gives it.
pub(super) fn txn(req: &TxnRequest, resp: &mut TxnResponse) {
    let branch = if resp.succeeded {
        &req.success
    } else {
        &req.failure
    };
    for (op, answer) in branch.iter().zip(&mut resp.responses) {
        match (&op.request, &mut answer.response) {
            (Some(Op::RequestRange(req)), Some(OpResponse::ResponseRange(resp))) => {
                range(req, resp)
            }
            (Some(Op::RequestTxn(req)), Some(OpResponse::ResponseTxn(resp))) => txn(req, resp),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{RequestOp, ResponseOp};
    use crate::proto::mvccpb::KeyValue;

    fn read(keys_only: bool, sort_target: SortTarget) -> RangeRequest {
        RangeRequest {
            key: b"k".to_vec(),
            keys_only,
            sort_target: sort_target as i32,
            ..Default::default()
        }
    }

    fn leased() -> RangeResponse {
        RangeResponse {
            kvs: vec![KeyValue {
                key: b"k".to_vec(),
                lease: 7,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn keys_only_reads_lose_their_leases_unless_sorted_by_value() {
        for (keys_only, target, lease) in [
            (true, SortTarget::Key, 0),
            (true, SortTarget::Mod, 0),
            (true, SortTarget::Value, 7),
            (false, SortTarget::Key, 7),
        ] {
            let mut resp = leased();
            range(&read(keys_only, target), &mut resp);
            assert_eq!(resp.kvs[0].lease, lease, "{keys_only} {target:?}");
        }
    }

    #[test]
    fn a_txn_follows_the_branch_that_ran_into_nested_txns() {
        let op = |request| RequestOp {
            request: Some(request),
        };
        let inner = TxnRequest {
            success: vec![op(Op::RequestRange(read(true, SortTarget::Key)))],
            ..Default::default()
        };
        let req = TxnRequest {
            success: vec![
                op(Op::RequestRange(read(false, SortTarget::Key))),
                op(Op::RequestTxn(inner)),
            ],
            failure: vec![op(Op::RequestRange(read(true, SortTarget::Key)))],
            ..Default::default()
        };
        let answer = |response| ResponseOp {
            response: Some(response),
        };
        let mut resp = TxnResponse {
            succeeded: true,
            responses: vec![
                answer(OpResponse::ResponseRange(leased())),
                answer(OpResponse::ResponseTxn(TxnResponse {
                    succeeded: true,
                    responses: vec![answer(OpResponse::ResponseRange(leased()))],
                    ..Default::default()
                })),
            ],
            ..Default::default()
        };
        assert!(any_read_from_index(&req));
        txn(&req, &mut resp);
        let lease_of = |answer: &ResponseOp| match &answer.response {
            Some(OpResponse::ResponseRange(r)) => r.kvs[0].lease,
            _ => unreachable!(),
        };
        assert_eq!(lease_of(&resp.responses[0]), 7);
        let Some(OpResponse::ResponseTxn(nested)) = &resp.responses[1].response else {
            unreachable!()
        };
        assert_eq!(lease_of(&nested.responses[0]), 0);
    }
}
