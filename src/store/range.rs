//! Range evaluation with etcd's rules: revision checks, count, filters,
//! sorting and limit. Used by plain Range requests and by ranges inside a Txn.

use std::cmp::Ordering;

use super::error::{StoreError, StoreResult};
use crate::backend::{KeyRange, ReadAt, ReadTxn};
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use crate::proto::mvccpb::KeyValue;

/// The key interval a request names with etcd's `key` / `range_end` convention:
/// no end is the single key, "\0" is every key from `key` on.
pub fn key_range(key: &[u8], range_end: &[u8]) -> KeyRange {
    match range_end {
        [] => KeyRange::single(key),
        [0] => KeyRange {
            start: key.to_vec(),
            end: None,
        },
        end => KeyRange {
            start: key.to_vec(),
            end: Some(end.to_vec()),
        },
    }
}

/// Checks a read revision against the store's counters; 0 or less means current.
pub fn check_revision(revision: i64, current: i64, compact: i64) -> StoreResult<i64> {
    if revision > current {
        return Err(StoreError::FutureRevision);
    }
    let revision = if revision <= 0 { current } else { revision };
    if revision < compact {
        return Err(StoreError::Compacted);
    }
    Ok(revision)
}

/// Evaluates `req` on `txn`, whose latest state is at revision `current`.
pub async fn range<T: ReadTxn>(
    txn: &mut T,
    req: &RangeRequest,
    current: i64,
    compact: i64,
) -> StoreResult<RangeResponse> {
    let revision = check_revision(req.revision, current, compact)?;
    let at = if revision == current {
        ReadAt::Current
    } else {
        ReadAt::Revision(revision)
    };
    let keys = key_range(&req.key, &req.range_end);
    let header = Some(ResponseHeader {
        revision: current,
        ..Default::default()
    });
    if keys.is_empty() {
        return Ok(RangeResponse {
            header,
            ..Default::default()
        });
    }
    if req.count_only {
        return Ok(RangeResponse {
            header,
            count: txn.count(&keys, at).await?,
            ..Default::default()
        });
    }

    let sort_order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let sort_target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let has_filter = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    // As etcd: with sorting or filters everything is fetched, then cut;
    // otherwise one extra key tells whether there are more.
    let fetch_limit = if sort_order != SortOrder::None || has_filter || req.limit <= 0 {
        0
    } else {
        req.limit as usize + 1
    };
    let keys_only = req.keys_only && sort_target != SortTarget::Value;
    let mut kvs = txn.range(&keys, at, fetch_limit, keys_only).await?;
    // The count ignores limit and filters; skip its query when everything was fetched.
    let count = if fetch_limit == 0 || kvs.len() < fetch_limit {
        kvs.len() as i64
    } else {
        txn.count(&keys, at).await?
    };

    if has_filter {
        kvs.retain(|kv| {
            (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
                && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
                && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
                && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
        });
    }
    sort(&mut kvs, sort_order, sort_target);

    let mut more = false;
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header,
        kvs,
        more,
        count,
    })
}

/// Sorts as etcd does: a target other than KEY with order NONE sorts ascending.
/// Keys arrive ascending, so ties keep key order.
fn sort(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
    let order = match (order, target) {
        (SortOrder::None, SortTarget::Key) => return,
        (SortOrder::None, _) => SortOrder::Ascend,
        (order, _) => order,
    };
    let compare: fn(&KeyValue, &KeyValue) -> Ordering = match target {
        SortTarget::Key => |a, b| a.key.cmp(&b.key),
        SortTarget::Version => |a, b| a.version.cmp(&b.version),
        SortTarget::Create => |a, b| a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => |a, b| a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => |a, b| a.value.cmp(&b.value),
    };
    match order {
        SortOrder::Descend => kvs.sort_by(|a, b| compare(b, a)),
        _ => kvs.sort_by(compare),
    }
}
