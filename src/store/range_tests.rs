//! Tests of `range` with a count cache: cached counts are used only at
//! their revision, and every answer equals the one computed without cache.

use super::*;
use crate::backend::Backend;
use crate::backend::sqlite::Sqlite;
use crate::proto::etcdserverpb::PutRequest;
use crate::store::Store;

struct Fixture {
    store: Store<Sqlite>,
    _dir: tempfile::TempDir,
}

/// A store with keys k00..k{n-1}, each put once, in order.
async fn store_with_keys(n: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(Sqlite::open(&dir.path().join("state.db")).unwrap())
        .await
        .unwrap();
    for i in 0..n {
        put(&store, &format!("k{i:02}"), &format!("v{}", n - i)).await;
    }
    Fixture { store, _dir: dir }
}

async fn put(store: &Store<Sqlite>, key: &str, value: &str) {
    store
        .put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// `req` read the way `Store::range` reads it, with `cache` (or none).
async fn read(
    store: &Store<Sqlite>,
    req: &RangeRequest,
    cache: Option<&CountCache>,
) -> StoreResult<RangeResponse> {
    let mut txn = store.backend().read().await?;
    let revs = txn.revisions().await?;
    range(&mut txn, req, revs.current, revs.compact, cache).await
}

fn prefix(limit: i64, revision: i64) -> RangeRequest {
    RangeRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        limit,
        revision,
        ..Default::default()
    }
}

/// Pages through `req` as the apiserver does (pinned to the first page's
/// revision, next key = last + "\0"), checking every page against an
/// uncached read; returns the pages read.
async fn page_through(store: &Store<Sqlite>, mut req: RangeRequest, cache: &CountCache) -> usize {
    let mut pages = 0;
    loop {
        let cached = read(store, &req, Some(cache)).await.unwrap();
        let plain = read(store, &req, None).await.unwrap();
        assert_eq!(cached, plain, "page {pages} of {req:?}");
        pages += 1;
        if req.revision == 0 {
            req.revision = cached.header.as_ref().unwrap().revision;
        }
        match cached.kvs.last() {
            Some(last) if cached.more => req.key = [last.key.as_slice(), b"\0"].concat(),
            _ => return pages,
        }
    }
}

#[tokio::test]
async fn a_page_tells_the_count_of_the_next() {
    let f = store_with_keys(10).await;
    let cache = CountCache::default();
    let first = read(&f.store, &prefix(3, 0), Some(&cache)).await.unwrap();
    assert_eq!((first.count, first.more, first.kvs.len()), (10, true, 3));
    let revision = first.header.unwrap().revision;
    let rest = KeyRange {
        start: b"k02\0".to_vec(),
        end: Some(b"l".to_vec()),
    };
    assert_eq!(cache.get(&rest, revision), Some(7));
    assert_eq!(page_through(&f.store, prefix(3, 0), &cache).await, 4);
}

#[tokio::test]
async fn a_cached_count_serves_only_its_revision() {
    let f = store_with_keys(10).await;
    let cache = CountCache::default();
    let revision = f.store.revisions().current;
    let keys = KeyRange {
        start: b"k".to_vec(),
        end: Some(b"l".to_vec()),
    };
    // A count no query would give shows where the cache answered.
    cache.insert(&keys, revision, 99);
    assert_eq!(
        read(&f.store, &prefix(3, 0), Some(&cache))
            .await
            .unwrap()
            .count,
        99
    );
    let count_only = RangeRequest {
        count_only: true,
        ..prefix(0, 0)
    };
    assert_eq!(
        read(&f.store, &count_only, Some(&cache))
            .await
            .unwrap()
            .count,
        99
    );

    // A write moves the current revision on: the count is read again...
    put(&f.store, "k10", "new").await;
    let now = read(&f.store, &prefix(3, 0), Some(&cache)).await.unwrap();
    assert_eq!(now.count, 11);
    assert_eq!(cache.get(&keys, revision + 1), Some(11));
    // ...while a read pinned to the old revision still finds its count.
    let then = read(&f.store, &prefix(3, revision), Some(&cache))
        .await
        .unwrap();
    assert_eq!(then.count, 99);
}

#[tokio::test]
async fn every_kind_of_range_answers_as_without_cache() {
    let f = store_with_keys(12).await;
    let first = f.store.revisions().current;
    // History: rewrites, a delete and a new key after `first`.
    put(&f.store, "k03", "again").await;
    put(&f.store, "k11", "again").await;
    f.store
        .delete_range(crate::proto::etcdserverpb::DeleteRangeRequest {
            key: b"k05".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    put(&f.store, "k0", "between").await;
    let cache = CountCache::default();
    let orders = [SortOrder::None, SortOrder::Ascend, SortOrder::Descend];
    let targets = [
        SortTarget::Key,
        SortTarget::Version,
        SortTarget::Create,
        SortTarget::Mod,
        SortTarget::Value,
    ];
    for revision in [0, first, first + 2] {
        for limit in [0, 1, 4, 5, 20] {
            for order in orders {
                for target in targets {
                    let req = RangeRequest {
                        sort_order: order as i32,
                        sort_target: target as i32,
                        ..prefix(limit, revision)
                    };
                    page_through(&f.store, req, &cache).await;
                }
            }
            let filtered = [
                RangeRequest {
                    min_mod_revision: first,
                    ..prefix(limit, revision)
                },
                RangeRequest {
                    max_mod_revision: first - 3,
                    ..prefix(limit, revision)
                },
                RangeRequest {
                    min_create_revision: 4,
                    max_create_revision: first,
                    ..prefix(limit, revision)
                },
                RangeRequest {
                    keys_only: true,
                    ..prefix(limit, revision)
                },
                RangeRequest {
                    count_only: true,
                    ..prefix(limit, revision)
                },
            ];
            for req in filtered {
                page_through(&f.store, req, &cache).await;
            }
        }
    }
}
