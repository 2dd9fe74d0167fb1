//! Range evaluation with etcd's rules: revision checks, count, filters,
//! sorting and limit. Used by plain Range requests and by ranges inside a Txn.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::count_cache::CountCache;
use super::error::{StoreError, StoreResult};
use crate::backend::{CurrentRangeQuery, KeyRange, ReadAt, ReadTxn};
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
/// `counts`, when given, keeps and reuses range counts: only for a `txn`
/// whose revision `current` is committed (a read, not a write in progress).
pub async fn range<T: ReadTxn>(
    txn: &mut T,
    req: &RangeRequest,
    current: i64,
    compact: i64,
    counts: Option<&CountCache>,
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
    let overlay = match at {
        ReadAt::Revision(revision) => overlay(txn, &keys, revision, current).await?,
        ReadAt::Current => None,
    };
    let counter = Counter {
        keys: &keys,
        revision,
        at,
        overlay: overlay.as_ref(),
        cache: counts,
    };
    if req.count_only {
        return Ok(RangeResponse {
            header,
            count: counter.count(txn).await?,
            ..Default::default()
        });
    }

    let mut plan = Plan::of(req);
    let kvs = range_at(
        txn,
        &keys,
        at,
        overlay.as_ref(),
        plan.fetch_limit,
        plan.keys_only,
    )
    .await?;
    // The count ignores limit and filters; skip its query when everything was fetched.
    let count = if plan.fetched_all(&kvs) {
        kvs.len() as i64
    } else {
        let count = counter.count(txn).await?;
        // `kvs` are the range's first keys in key order (nothing sorted or
        // filtered yet): the keys after the first `limit` of them are the
        // next page's, and there are `count - limit` of them.
        let last = &kvs[req.limit as usize - 1].key;
        counter.remember_after(last, count - req.limit);
        count
    };
    let kvs = plan.finish(req, kvs);
    Ok(RangeResponse {
        header,
        more: plan.more,
        kvs,
        count,
    })
}

/// How a Range request reads its keys, and what it does with them after.
struct Plan {
    sort_order: SortOrder,
    sort_target: SortTarget,
    has_filter: bool,
    /// Keys to fetch (0 = all).
    fetch_limit: usize,
    /// Values need not be read.
    keys_only: bool,
    /// Set by `finish`: the limit cut the keys.
    more: bool,
}

impl Plan {
    fn of(req: &RangeRequest) -> Plan {
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
        Plan {
            sort_order,
            sort_target,
            has_filter,
            fetch_limit,
            keys_only: req.keys_only && sort_target != SortTarget::Value,
            more: false,
        }
    }

    /// Whether `kvs` is the whole range (so its count is its length).
    fn fetched_all(&self, kvs: &[KeyValue]) -> bool {
        self.fetch_limit == 0 || kvs.len() < self.fetch_limit
    }

    /// Filters, sorts and cuts the fetched keys as etcd does.
    fn finish(&mut self, req: &RangeRequest, mut kvs: Vec<KeyValue>) -> Vec<KeyValue> {
        if self.has_filter {
            kvs.retain(|kv| {
                (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
                    && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
                    && (req.max_create_revision == 0
                        || kv.create_revision <= req.max_create_revision)
                    && (req.min_create_revision == 0
                        || kv.create_revision >= req.min_create_revision)
            });
        }
        sort(&mut kvs, self.sort_order, self.sort_target);
        if req.limit > 0 && kvs.len() > req.limit as usize {
            kvs.truncate(req.limit as usize);
            self.more = true;
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        kvs
    }
}

/// Evaluates `req`, a read at the current revision, with one backend call
/// (`ReadTxn::current_range`), which must be the first read of `txn`: the
/// counters, the keys and, for a limited read, the count, from one snapshot.
/// `latest` is the newest revision this instance knows of: a count cached
/// at it is not read again. None when the revision read turned out newer
/// and the count is needed after all: the caller reads again in a
/// transaction (`range`).
pub async fn range_current<T: ReadTxn>(
    txn: &mut T,
    req: &RangeRequest,
    counts: Option<&CountCache>,
    latest: i64,
) -> StoreResult<Option<RangeResponse>> {
    let keys = key_range(&req.key, &req.range_end);
    let mut plan = Plan::of(req);
    let cached = counts.and_then(|cache| cache.get(&keys, latest));
    let rows = !keys.is_empty() && !req.count_only;
    let count = !keys.is_empty() && cached.is_none() && (req.count_only || plan.fetch_limit > 0);
    let read = txn
        .current_range(CurrentRangeQuery {
            range: &keys,
            rows,
            limit: plan.fetch_limit,
            keys_only: plan.keys_only,
            count,
        })
        .await?;
    let revision = read.revisions.current;
    let header = Some(ResponseHeader {
        revision,
        ..Default::default()
    });
    if keys.is_empty() {
        return Ok(Some(RangeResponse {
            header,
            ..Default::default()
        }));
    }
    let counted = read.count.or(cached.filter(|_| revision == latest));
    let counter = Counter::plain(&keys, revision, ReadAt::Current, counts);
    if let (Some(cache), Some(count), None) = (counts, read.count, cached) {
        cache.insert(&keys, revision, count);
    }
    if req.count_only {
        return Ok(counted.map(|count| RangeResponse {
            header,
            count,
            ..Default::default()
        }));
    }
    let kvs = read.kvs;
    let count = if plan.fetched_all(&kvs) {
        kvs.len() as i64
    } else {
        let Some(count) = counted else {
            return Ok(None);
        };
        counter.remember_after(&kvs[req.limit as usize - 1].key, count - req.limit);
        count
    };
    let kvs = plan.finish(req, kvs);
    Ok(Some(RangeResponse {
        header,
        more: plan.more,
        kvs,
        count,
    }))
}

/// A read at a recent past revision is served from the live keys, corrected
/// by the few keys changed since: the apiserver pins every page of a List to
/// its first page's revision, and this keeps those pages as cheap as current
/// reads instead of searching the history of every key in the range.
const OVERLAY_MAX_REVISIONS: i64 = 1000;

/// The keys of a range changed after a revision: their state then, and
/// whether they exist now.
struct Overlay {
    then: BTreeMap<Vec<u8>, Option<KeyValue>>,
    live_now: usize,
}

/// The overlay for reading `keys` at `revision`, or None when too much
/// changed since for it to pay off.
async fn overlay<T: ReadTxn>(
    txn: &mut T,
    keys: &KeyRange,
    revision: i64,
    current: i64,
) -> StoreResult<Option<Overlay>> {
    if current - revision > OVERLAY_MAX_REVISIONS {
        return Ok(None);
    }
    let changed: BTreeSet<Vec<u8>> = txn
        .log_entries(revision, current)
        .await?
        .into_iter()
        .filter(|entry| keys.contains(&entry.kv.key))
        .map(|entry| entry.kv.key)
        .collect();
    let mut then = BTreeMap::new();
    let mut live_now = 0;
    for key in changed {
        let single = KeyRange::single(&key);
        if !txn
            .range(&single, ReadAt::Current, 1, true)
            .await?
            .is_empty()
        {
            live_now += 1;
        }
        let old = txn
            .range(&single, ReadAt::Revision(revision), 1, false)
            .await?
            .pop();
        then.insert(key, old);
    }
    Ok(Some(Overlay { then, live_now }))
}

/// Keys in `keys` at `at`, ascending, at most `limit` (0 = all).
async fn range_at<T: ReadTxn>(
    txn: &mut T,
    keys: &KeyRange,
    at: ReadAt,
    overlay: Option<&Overlay>,
    limit: usize,
    keys_only: bool,
) -> StoreResult<Vec<KeyValue>> {
    let Some(overlay) = overlay else {
        return Ok(txn.range(keys, at, limit, keys_only).await?);
    };
    // Each changed key can displace at most one live key, so fetching that
    // many more guarantees `limit` correct keys below the last one fetched.
    let fetch = if limit == 0 {
        0
    } else {
        limit + overlay.then.len()
    };
    let live = txn.range(keys, ReadAt::Current, fetch, keys_only).await?;
    let cutoff = (fetch != 0 && live.len() == fetch)
        .then(|| live.last().map(|kv| kv.key.clone()))
        .flatten();
    let mut merged: Vec<KeyValue> = live
        .into_iter()
        .filter(|kv| !overlay.then.contains_key(&kv.key))
        .collect();
    merged.extend(
        overlay
            .then
            .values()
            .flatten()
            .filter(|kv| cutoff.as_ref().is_none_or(|cutoff| kv.key <= *cutoff))
            .cloned(),
    );
    merged.sort_by(|a, b| a.key.cmp(&b.key));
    if limit > 0 {
        merged.truncate(limit);
    }
    Ok(merged)
}

/// Counts the keys of one read's range, through the count cache if any.
pub(super) struct Counter<'a> {
    keys: &'a KeyRange,
    /// The revision read, `at` resolved: the cache's key.
    revision: i64,
    at: ReadAt,
    overlay: Option<&'a Overlay>,
    cache: Option<&'a CountCache>,
}

impl<'a> Counter<'a> {
    /// A counter of a read that is not corrected by an overlay.
    pub(super) fn plain(
        keys: &'a KeyRange,
        revision: i64,
        at: ReadAt,
        cache: Option<&'a CountCache>,
    ) -> Self {
        Counter {
            keys,
            revision,
            at,
            overlay: None,
            cache,
        }
    }

    /// Number of keys in the range at the revision read.
    pub(super) async fn count<T: ReadTxn>(&self, txn: &mut T) -> StoreResult<i64> {
        if let Some(count) = self.cache.and_then(|c| c.get(self.keys, self.revision)) {
            return Ok(count);
        }
        let count = count_at(txn, self.keys, self.at, self.overlay).await?;
        if let Some(cache) = self.cache {
            cache.insert(self.keys, self.revision, count);
        }
        Ok(count)
    }

    /// Notes that the range's keys after `last` number `count`.
    fn remember_after(&self, last: &[u8], count: i64) {
        let Some(cache) = self.cache else { return };
        let mut start = Vec::with_capacity(last.len() + 1);
        start.extend_from_slice(last);
        start.push(0);
        let rest = KeyRange {
            start,
            end: self.keys.end.clone(),
        };
        cache.insert(&rest, self.revision, count);
    }
}

/// Number of keys in `keys` at `at`.
async fn count_at<T: ReadTxn>(
    txn: &mut T,
    keys: &KeyRange,
    at: ReadAt,
    overlay: Option<&Overlay>,
) -> StoreResult<i64> {
    let Some(overlay) = overlay else {
        return Ok(txn.count(keys, at).await?);
    };
    let live_then = overlay.then.values().filter(|kv| kv.is_some()).count();
    let now = txn.count(keys, ReadAt::Current).await?;
    Ok(now - overlay.live_now as i64 + live_then as i64)
}

/// Sorts as etcd does: a target other than KEY with order NONE sorts ascending.
/// Keys arrive ascending, so ties keep key order.
pub(super) fn sort(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
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

#[cfg(test)]
#[path = "range_tests.rs"]
mod tests;
