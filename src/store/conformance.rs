//! The conformance suite: etcd's semantics checked through the store, the
//! same tests on every backend. `conformance_suite!(test_database)` expands
//! to the suite on the databases an async `test_database` hands out (a
//! fresh, empty one each time, with the guard that removes it); the modules
//! at the end run it on each dialect.

use crate::backend::{Backend, ReadTxn};
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseTimeToLiveRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use crate::proto::mvccpb::event::EventType;
use crate::store::{Store, StoreError};

/// Auth records: kept per kind, listed by name bytewise, replaced in place,
/// removed, and invisible until their transaction commits.
pub async fn auth_records_are_stored_replaced_and_removed<B: Backend>(t: TestStore<B>) {
    use crate::backend::{AuthKind, WriteTxn};
    let backend = t.store.backend();
    let records = |kind| async move {
        let mut txn = backend.read().await.unwrap();
        txn.auth_records(kind).await.unwrap()
    };
    assert!(records(AuthKind::User).await.is_empty());

    let mut txn = backend.write().await.unwrap();
    txn.put_auth_record(AuthKind::User, b"root", b"r1")
        .await
        .unwrap();
    txn.put_auth_record(AuthKind::User, b"Zed", b"z1")
        .await
        .unwrap();
    txn.put_auth_record(AuthKind::Role, b"root", b"role")
        .await
        .unwrap();
    assert_eq!(txn.auth_records(AuthKind::User).await.unwrap().len(), 2);
    assert!(records(AuthKind::User).await.is_empty(), "uncommitted");
    txn.commit().await.unwrap();

    let mut txn = backend.write().await.unwrap();
    txn.put_auth_record(AuthKind::User, b"root", b"r2")
        .await
        .unwrap();
    txn.remove_auth_record(AuthKind::User, b"Zed")
        .await
        .unwrap();
    txn.remove_auth_record(AuthKind::User, b"nobody")
        .await
        .unwrap();
    txn.commit().await.unwrap();
    assert_eq!(
        records(AuthKind::User).await,
        vec![(b"root".to_vec(), b"r2".to_vec())]
    );
    assert_eq!(
        records(AuthKind::Role).await,
        vec![(b"root".to_vec(), b"role".to_vec())]
    );
    // A rolled-back change leaves nothing behind.
    let mut txn = backend.write().await.unwrap();
    txn.put_auth_record(AuthKind::Role, b"a", b"x")
        .await
        .unwrap();
    drop(txn);
    assert_eq!(records(AuthKind::Role).await.len(), 1);
}

/// Conformance test `a_write_answers_reads_of_what_it_read_ahead_or_wrote`:
/// after `read_ahead`, reads of those keys and leases answer as the database
/// would, through the transaction's own writes, and everything written
/// reaches the database at commit (a backend may defer its writes).
pub async fn a_write_answers_reads_of_what_it_read_ahead_or_wrote<B: Backend>(t: TestStore<B>) {
    use crate::backend::{KeyRange, LeaseRow, LogEntry, ReadAhead, ReadAt, WriteTxn};
    use crate::proto::mvccpb::KeyValue;
    t.store.put(put_req("a", "1")).await.unwrap();
    t.store.put(put_req("b", "1")).await.unwrap();
    let lease = t
        .store
        .lease_grant(LeaseGrantRequest { id: 7, ttl: 60 })
        .await
        .unwrap();
    assert_eq!(lease.id, 7);
    let backend = t.store.backend();
    let live = |key: &'static str| async move {
        let mut txn = backend.read().await.unwrap();
        txn.range(&KeyRange::single(key.as_bytes()), ReadAt::Current, 0, false)
            .await
            .unwrap()
    };
    let a = live("a").await;

    let mut txn = backend.write().await.unwrap();
    txn.read_ahead(&ReadAhead {
        keys: vec![b"a".to_vec(), b"b".to_vec(), b"none".to_vec()],
        leases: vec![7, 8],
    })
    .await
    .unwrap();
    let revs = txn.revisions().await.unwrap();
    assert_eq!(revs.current, 3, "a lease takes no revision");
    let single = |key: &str| KeyRange::single(key.as_bytes());
    assert_eq!(
        txn.range(&single("a"), ReadAt::Current, 1, false)
            .await
            .unwrap(),
        a
    );
    assert!(
        txn.range(&single("none"), ReadAt::Current, 0, false)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(txn.lease(7).await.unwrap().map(|l| l.ttl), Some(60));
    assert_eq!(txn.lease(8).await.unwrap(), None);

    // Revision 4 puts "none" and deletes "a"; a key not read ahead ("c") too.
    let put = |key: &str, sub: i64| LogEntry {
        kv: KeyValue {
            key: key.into(),
            value: b"4".to_vec(),
            create_revision: 4,
            mod_revision: 4,
            version: 1,
            lease: 7,
        },
        sub,
        deleted: false,
    };
    // "c" has a value long enough that a backend may write it otherwise
    // (MySQL: at once, with a prepared statement, between deferred writes).
    let big = LogEntry {
        kv: KeyValue {
            value: vec![b'x'; 100 << 10],
            ..put("c", 1).kv
        },
        ..put("c", 1)
    };
    txn.append(&put("none", 0)).await.unwrap();
    txn.append(&big).await.unwrap();
    txn.append(&LogEntry {
        kv: KeyValue {
            key: b"a".to_vec(),
            mod_revision: 4,
            ..Default::default()
        },
        sub: 2,
        deleted: true,
    })
    .await
    .unwrap();
    let renewed = LeaseRow {
        id: 7,
        ttl: 90,
        expires_at: 1,
    };
    txn.put_lease(&renewed).await.unwrap();
    txn.remove_lease(8).await.unwrap();
    assert_eq!(
        txn.range(&single("none"), ReadAt::Current, 0, false)
            .await
            .unwrap(),
        vec![put("none", 0).kv]
    );
    assert!(
        txn.range(&single("a"), ReadAt::Current, 0, false)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(txn.lease(7).await.unwrap(), Some(renewed));
    // A range read goes to the database, which has every write so far.
    let all = KeyRange {
        start: Vec::new(),
        end: None,
    };
    let keys: Vec<Vec<u8>> = txn
        .range(&all, ReadAt::Current, 0, true)
        .await
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(keys, vec![b"b".to_vec(), b"c".to_vec(), b"none".to_vec()]);
    assert_eq!(txn.count(&all, ReadAt::Current).await.unwrap(), 3);
    let mut revs = revs;
    revs.current = 4;
    txn.set_revisions(revs).await.unwrap();
    assert!(
        live("none").await.is_empty(),
        "nothing is visible before commit"
    );
    txn.commit().await.unwrap();

    assert!(live("a").await.is_empty());
    assert_eq!(live("c").await, vec![big.kv]);
    let mut read = backend.read().await.unwrap();
    assert_eq!(read.revisions().await.unwrap().current, 4);
    assert_eq!(read.lease(7).await.unwrap(), Some(renewed));
    assert_eq!(read.lease(8).await.unwrap(), None);
    assert_eq!(read.log_entries(3, 4).await.unwrap().len(), 3);
}

/// Conformance test `a_current_range_reads_counters_keys_and_count_together`:
/// `ReadTxn::current_range` answers as the separate reads do, whatever it
/// is asked for, and a store's Range at the current revision (limited,
/// counted, filtered, sorted) answers as a Range at that revision number.
pub async fn a_current_range_reads_counters_keys_and_count_together<B: Backend>(t: TestStore<B>) {
    use crate::backend::{CurrentRangeQuery, KeyRange, ReadAt};
    for (key, value) in [("k1", "c"), ("k2", "b"), ("k3", "a"), ("l", "x")] {
        t.store.put(put_req(key, value)).await.unwrap();
    }
    t.store
        .delete_range(DeleteRangeRequest {
            key: b"l".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let backend = t.store.backend();
    let prefix = KeyRange {
        start: b"k".to_vec(),
        end: Some(b"l".to_vec()),
    };
    let everything = KeyRange {
        start: Vec::new(),
        end: None,
    };
    for range in [&prefix, &everything, &KeyRange::single(b"l")] {
        for (rows, limit, keys_only, count) in [
            (true, 0, false, false),
            (true, 2, false, true),
            (true, 2, true, false),
            (false, 0, false, true),
            (false, 0, false, false),
        ] {
            let mut one = backend.read().await.unwrap();
            let read = one
                .current_range(CurrentRangeQuery {
                    range,
                    rows,
                    limit,
                    keys_only,
                    count,
                })
                .await
                .unwrap();
            let mut txn = backend.read().await.unwrap();
            assert_eq!(read.revisions, txn.revisions().await.unwrap());
            let mut kvs = match rows {
                true => txn
                    .range(range, ReadAt::Current, limit, false)
                    .await
                    .unwrap(),
                false => Vec::new(),
            };
            if keys_only {
                assert!(read.kvs.iter().all(|kv| kv.value.is_empty()));
                kvs.iter_mut().for_each(|kv| kv.value.clear());
            }
            assert_eq!(read.kvs, kvs, "{range:?} {rows} {limit}");
            let counted = match count {
                true => Some(txn.count(range, ReadAt::Current).await.unwrap()),
                false => None,
            };
            assert_eq!(read.count, counted);
        }
    }

    let now = t.store.revisions().current;
    let prefix_req = |revision, limit| RangeRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        revision,
        limit,
        ..Default::default()
    };
    for req in [
        prefix_req(0, 0),
        prefix_req(0, 2),
        prefix_req(0, 3),
        RangeRequest {
            count_only: true,
            ..prefix_req(0, 1)
        },
        RangeRequest {
            sort_target: crate::proto::etcdserverpb::range_request::SortTarget::Value as i32,
            keys_only: true,
            ..prefix_req(0, 2)
        },
        RangeRequest {
            min_mod_revision: 3,
            ..prefix_req(0, 1)
        },
        RangeRequest {
            key: b"l".to_vec(),
            range_end: Vec::new(),
            ..prefix_req(0, 0)
        },
        RangeRequest {
            key: b"z".to_vec(),
            range_end: b"a".to_vec(),
            ..prefix_req(0, 0)
        },
    ] {
        let current = t.store.range(&req).await.unwrap();
        let pinned = t
            .store
            .range(&RangeRequest {
                revision: now,
                ..req.clone()
            })
            .await
            .unwrap();
        assert_eq!(current, pinned, "{req:?}");
        // Twice: the second limited read may take its count from the cache.
        assert_eq!(t.store.range(&req).await.unwrap(), current, "{req:?}");
    }
    let page = t.store.range(&prefix_req(0, 2)).await.unwrap();
    assert_eq!((page.kvs.len(), page.more, page.count), (2, true, 3));
}

/// A store on a fresh database, and whatever keeps that database alive.
pub struct TestStore<B: Backend> {
    /// The store under test.
    pub store: Store<B>,
    /// Dropped with the store: a temporary directory, a database to drop...
    _guard: Box<dyn Send>,
}

impl<B: Backend> TestStore<B> {
    /// The store on `database`, as a backend's `test_database` hands it out.
    pub async fn open((backend, guard): (B, Box<dyn Send>)) -> Self {
        TestStore {
            store: Store::open(backend).await.unwrap(),
            _guard: guard,
        }
    }
}

fn put_req(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    }
}

fn get_req(key: &str, revision: i64) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        revision,
        ..Default::default()
    }
}

fn op(request: Op) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

fn version_is(key: &str, version: i64) -> Compare {
    Compare {
        key: key.into(),
        target: CompareTarget::Version as i32,
        result: CompareResult::Equal as i32,
        target_union: Some(TargetUnion::Version(version)),
        ..Default::default()
    }
}

/// Conformance test `empty_store_is_at_revision_one_and_never_compacted`.
pub async fn empty_store_is_at_revision_one_and_never_compacted<B: Backend>(t: TestStore<B>) {
    let revs = t.store.revisions();
    assert_eq!((revs.current, revs.compact), (1, -1));
    let resp = t.store.range(&get_req("a", 0)).await.unwrap();
    assert_eq!(resp.header.unwrap().revision, 1);
    assert_eq!(resp.count, 0);
}

/// Conformance test `a_txn_takes_one_revision_and_ranges_inside_see_its_writes`.
pub async fn a_txn_takes_one_revision_and_ranges_inside_see_its_writes<B: Backend>(
    t: TestStore<B>,
) {
    t.store.put(put_req("a", "1")).await.unwrap();
    let txn = TxnRequest {
        compare: vec![version_is("a", 1)],
        success: vec![
            op(Op::RequestRange(get_req("a", 0))),
            op(Op::RequestPut(put_req("a", "2"))),
            op(Op::RequestRange(get_req("a", 0))),
            op(Op::RequestPut(put_req("b", "1"))),
        ],
        ..Default::default()
    };
    let resp = t.store.txn(txn).await.unwrap();
    assert!(resp.succeeded);
    assert_eq!(resp.header.unwrap().revision, 3);
    let ranges: Vec<(i64, Vec<u8>)> = resp
        .responses
        .iter()
        .filter_map(|r| match &r.response {
            Some(OpResponse::ResponseRange(range)) => Some((
                range.header.as_ref().unwrap().revision,
                range.kvs[0].value.clone(),
            )),
            _ => None,
        })
        .collect();
    // Before the first write the txn is at the old revision, after it at the new one.
    assert_eq!(ranges, vec![(2, b"1".to_vec()), (3, b"2".to_vec())]);
    let b = t.store.range(&get_req("b", 0)).await.unwrap();
    assert_eq!(b.kvs[0].mod_revision, 3);
}

/// Conformance test `failed_checks_leave_no_trace`.
pub async fn failed_checks_leave_no_trace<B: Backend>(t: TestStore<B>) {
    t.store.put(put_req("a", "1")).await.unwrap();
    // The second op fails its pre-check, so the first must not be applied either.
    let txn = TxnRequest {
        success: vec![
            op(Op::RequestPut(put_req("b", "1"))),
            op(Op::RequestPut(PutRequest {
                key: "missing".into(),
                ignore_value: true,
                ..Default::default()
            })),
        ],
        ..Default::default()
    };
    assert!(matches!(
        t.store.txn(txn).await,
        Err(StoreError::KeyNotFound)
    ));
    assert_eq!(t.store.revisions().current, 2);
    assert!(
        t.store
            .range(&get_req("b", 0))
            .await
            .unwrap()
            .kvs
            .is_empty()
    );
}

/// Conformance test `read_only_and_no_op_txns_do_not_raise_the_revision`.
pub async fn read_only_and_no_op_txns_do_not_raise_the_revision<B: Backend>(t: TestStore<B>) {
    t.store.put(put_req("a", "1")).await.unwrap();
    let txn = TxnRequest {
        compare: vec![version_is("a", 7)],
        success: vec![op(Op::RequestPut(put_req("a", "2")))],
        failure: vec![op(Op::RequestDeleteRange(DeleteRangeRequest {
            key: "nothing-here".into(),
            ..Default::default()
        }))],
    };
    let resp = t.store.txn(txn).await.unwrap();
    assert!(!resp.succeeded);
    assert_eq!(resp.header.unwrap().revision, 2);
    assert_eq!(t.store.revisions().current, 2);
}

/// Conformance test `compare_on_a_missing_key_uses_zero_but_value_compares_fail`.
pub async fn compare_on_a_missing_key_uses_zero_but_value_compares_fail<B: Backend>(
    t: TestStore<B>,
) {
    let missing_version_zero = TxnRequest {
        compare: vec![version_is("nope", 0)],
        ..Default::default()
    };
    assert!(t.store.txn(missing_version_zero).await.unwrap().succeeded);
    let value_not_equal = TxnRequest {
        compare: vec![Compare {
            key: "nope".into(),
            target: CompareTarget::Value as i32,
            result: CompareResult::NotEqual as i32,
            target_union: Some(TargetUnion::Value(b"x".to_vec())),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(!t.store.txn(value_not_equal).await.unwrap().succeeded);
}

/// Conformance test `compares_see_the_keys_a_range_reads`: a Txn's compare on
/// each target, with each result, sees the keys a Range at the current
/// revision reads (whatever answers the compare: reading the rows, or an
/// index that knows each key's mod revision, as the branch `txn-compare`
/// tried), through
/// puts with and without leases, a delete, a re-create, a revoked lease and
/// a physical compaction, on single keys, on ranges and from a key to the end.
pub async fn compares_see_the_keys_a_range_reads<B: Backend>(t: TestStore<B>) {
    use crate::proto::mvccpb::KeyValue;
    let store = &t.store;
    let grant = |ttl| store.lease_grant(LeaseGrantRequest { id: 0, ttl });
    let (kept, revoked) = (grant(300).await.unwrap().id, grant(300).await.unwrap().id);
    let with_lease = |key: &str, lease| PutRequest {
        lease,
        ..put_req(key, "v")
    };
    let delete = |key: &str| DeleteRangeRequest {
        key: key.into(),
        ..Default::default()
    };
    // Each compare, checked against what a Range reads, the way etcd's
    // applyCompare reads it: no key fails a value compare and compares the
    // other targets with zero; otherwise every key must hold.
    let check = |step: &'static str| async move {
        let ranges: [(&str, &str); 6] = [
            ("a", ""),
            ("b", ""),
            ("d", ""),
            ("none", ""),
            ("a", "c"),
            ("b", "\0"),
        ];
        for (key, range_end) in ranges {
            let read = store
                .range(&RangeRequest {
                    key: key.into(),
                    range_end: range_end.into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .kvs;
            let field = |kv: &KeyValue, target| match target {
                CompareTarget::Version => kv.version,
                CompareTarget::Create => kv.create_revision,
                CompareTarget::Mod => kv.mod_revision,
                CompareTarget::Lease => kv.lease,
                CompareTarget::Value => unreachable!(),
            };
            let mut compares = Vec::new();
            for target in [
                CompareTarget::Version,
                CompareTarget::Create,
                CompareTarget::Mod,
                CompareTarget::Lease,
            ] {
                let mut near: Vec<i64> = read.iter().map(|kv| field(kv, target)).collect();
                near.push(0);
                for n in near.clone() {
                    near.extend([n - 1, n + 1]);
                }
                near.sort_unstable();
                near.dedup();
                for n in near {
                    let union = match target {
                        CompareTarget::Version => TargetUnion::Version(n),
                        CompareTarget::Create => TargetUnion::CreateRevision(n),
                        CompareTarget::Mod => TargetUnion::ModRevision(n),
                        _ => TargetUnion::Lease(n),
                    };
                    let holds = |kv: &KeyValue| field(kv, target).cmp(&n);
                    compares.push((
                        target,
                        union,
                        holds(&KeyValue::default()),
                        read.iter().map(holds).collect::<Vec<_>>(),
                    ));
                }
            }
            let mut values: Vec<Vec<u8>> = read.iter().map(|kv| kv.value.clone()).collect();
            values.extend([Vec::new(), b"zz".to_vec()]);
            for value in values {
                let holds = |kv: &KeyValue| kv.value.cmp(&value);
                compares.push((
                    CompareTarget::Value,
                    TargetUnion::Value(value.clone()),
                    std::cmp::Ordering::Equal,
                    read.iter().map(holds).collect(),
                ));
            }
            // Sent at once, so that they share batches as clients' Txns do.
            let mut cases = Vec::new();
            for (target, union, against_zero, orderings) in compares {
                for result in [
                    CompareResult::Equal,
                    CompareResult::NotEqual,
                    CompareResult::Greater,
                    CompareResult::Less,
                ] {
                    let holds = |ordering: std::cmp::Ordering| match result {
                        CompareResult::Equal => ordering.is_eq(),
                        CompareResult::NotEqual => ordering.is_ne(),
                        CompareResult::Greater => ordering.is_gt(),
                        CompareResult::Less => ordering.is_lt(),
                    };
                    let expected = if orderings.is_empty() {
                        target != CompareTarget::Value && holds(against_zero)
                    } else {
                        orderings.iter().all(|o| holds(*o))
                    };
                    let compare = Compare {
                        key: key.into(),
                        range_end: range_end.into(),
                        target: target as i32,
                        result: result as i32,
                        target_union: Some(union.clone()),
                    };
                    cases.push((compare, expected));
                }
            }
            let answers = futures_util::future::join_all(cases.iter().map(|(compare, _)| {
                store.txn(TxnRequest {
                    compare: vec![compare.clone()],
                    ..Default::default()
                })
            }))
            .await;
            for ((compare, expected), answer) in cases.iter().zip(answers) {
                let succeeded = answer.unwrap().succeeded;
                assert_eq!(succeeded, *expected, "{step}: {compare:?} against {read:?}");
            }
        }
    };
    check("empty").await;
    store.put(put_req("a", "1")).await.unwrap();
    store.put(with_lease("b", kept)).await.unwrap();
    store.put(with_lease("d", revoked)).await.unwrap();
    store.put(put_req("a", "2")).await.unwrap();
    check("puts").await;
    store.delete_range(delete("a")).await.unwrap();
    store.put(put_req("b", "2")).await.unwrap();
    store.lease_revoke(revoked).await.unwrap();
    check("deleted, a lease taken off, a lease revoked").await;
    store.put(with_lease("a", kept)).await.unwrap();
    check("re-created").await;
    let current = store.revisions().current;
    let a = store.range(&get_req("a", 0)).await.unwrap().kvs;
    assert_eq!(
        (
            a[0].create_revision,
            a[0].mod_revision,
            a[0].version,
            a[0].lease
        ),
        (current, current, 1, kept)
    );
    store.put(put_req("c", "1")).await.unwrap();
    store
        .compact(&CompactionRequest {
            revision: store.revisions().current,
            physical: true,
        })
        .await
        .unwrap();
    check("compacted").await;
}

/// Conformance test `swaps_of_one_revision_let_one_through`: Txns that
/// compare one key's mod revision and put it, sent at once (so that some
/// share a write transaction), see each other's puts: one succeeds.
pub async fn swaps_of_one_revision_let_one_through<B: Backend>(t: TestStore<B>) {
    let store = std::sync::Arc::new(t.store);
    let revision = store
        .put(put_req("k", "0"))
        .await
        .unwrap()
        .header
        .unwrap()
        .revision;
    let swaps = (0..32).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let txn = TxnRequest {
                compare: vec![Compare {
                    key: "k".into(),
                    target: CompareTarget::Mod as i32,
                    result: CompareResult::Equal as i32,
                    target_union: Some(TargetUnion::ModRevision(revision)),
                    ..Default::default()
                }],
                success: vec![op(Op::RequestPut(put_req("k", &i.to_string())))],
                failure: vec![op(Op::RequestRange(get_req("k", 0)))],
            };
            store.txn(txn).await.unwrap()
        })
    });
    let mut succeeded = 0;
    for swap in swaps {
        let response = swap.await.unwrap();
        if response.succeeded {
            succeeded += 1;
        } else {
            let Some(OpResponse::ResponseRange(range)) = &response.responses[0].response else {
                panic!("{response:?}");
            };
            assert_eq!(range.kvs[0].mod_revision, revision + 1);
        }
    }
    assert_eq!(succeeded, 1);
    let k = store.range(&get_req("k", 0)).await.unwrap().kvs;
    assert_eq!((k[0].version, k[0].mod_revision), (2, revision + 1));
}

/// Conformance test `compaction_refuses_old_reads_and_removes_history`.
pub async fn compaction_refuses_old_reads_and_removes_history<B: Backend>(t: TestStore<B>) {
    for value in ["1", "2", "3"] {
        t.store.put(put_req("a", value)).await.unwrap(); // revisions 2, 3, 4
    }
    let compact = |revision, physical| CompactionRequest { revision, physical };
    assert!(matches!(
        t.store.compact(&compact(9, false)).await,
        Err(StoreError::FutureRevision)
    ));
    t.store.compact(&compact(3, true)).await.unwrap();
    assert_eq!(t.store.revisions().compacted_through, 3);
    assert!(matches!(
        t.store.compact(&compact(3, false)).await,
        Err(StoreError::Compacted)
    ));
    assert!(matches!(
        t.store.range(&get_req("a", 2)).await,
        Err(StoreError::Compacted)
    ));
    let at3 = t.store.range(&get_req("a", 3)).await.unwrap();
    assert_eq!(at3.kvs[0].value, b"2");

    // Only the version at the compact revision and the newer one are left.
    let mut txn = t.store.backend().read().await.unwrap();
    let history = txn.log_entries(0, 10).await.unwrap();
    let revisions: Vec<i64> = history.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revisions, vec![3, 4]);
}

/// Conformance test `queued_writes_commit_together_in_order`.
pub async fn queued_writes_commit_together_in_order<B: Backend>(t: TestStore<B>) {
    let store = std::sync::Arc::new(t.store);
    let writes = (0..50).map(|i| {
        let store = store.clone();
        tokio::spawn(async move { store.put(put_req(&format!("k{i}"), "v")).await.unwrap() })
    });
    let mut revisions = Vec::new();
    for write in writes {
        revisions.push(write.await.unwrap().header.unwrap().revision);
    }
    revisions.sort();
    assert_eq!(revisions, (2..52).collect::<Vec<_>>());
}

/// Conformance test `concurrent_ranges_of_one_key_each_get_their_own`:
/// Ranges of one key at once (which a server backend may answer together)
/// each get their key, as a get, a keys-only get or a count, at the
/// current revision.
pub async fn concurrent_ranges_of_one_key_each_get_their_own<B: Backend>(t: TestStore<B>) {
    // k00..k15 put at revisions 2..17, k03 deleted, k16..k19 never written.
    for n in 0..16 {
        let (key, value) = (format!("k{n:02}"), format!("v{n}"));
        t.store.put(put_req(&key, &value)).await.unwrap();
    }
    let delete = DeleteRangeRequest {
        key: b"k03".to_vec(),
        ..Default::default()
    };
    t.store.delete_range(delete).await.unwrap();
    let revision = t.store.revisions().current;
    let store = std::sync::Arc::new(t.store);
    let reads: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            let req = RangeRequest {
                key: format!("k{:02}", i % 20).into_bytes(),
                keys_only: i % 3 == 1,
                count_only: i % 5 == 4,
                ..Default::default()
            };
            tokio::spawn(async move { (i, store.range(&req).await.unwrap()) })
        })
        .collect();
    for read in reads {
        let (i, resp) = read.await.unwrap();
        let n = i % 20;
        let exists = n < 16 && n != 3;
        assert_eq!(resp.header.unwrap().revision, revision, "read {i}");
        assert_eq!(resp.count, i64::from(exists), "read {i}");
        let expected: Vec<(Vec<u8>, Vec<u8>, i64)> = match exists && i % 5 != 4 {
            true => {
                let value = if i % 3 == 1 {
                    String::new()
                } else {
                    format!("v{n}")
                };
                vec![(format!("k{n:02}").into_bytes(), value.into_bytes(), n + 2)]
            }
            false => Vec::new(),
        };
        let got: Vec<_> = resp
            .kvs
            .into_iter()
            .map(|kv| (kv.key, kv.value, kv.mod_revision))
            .collect();
        assert_eq!(got, expected, "read {i}");
    }
}

/// Conformance test `a_key_written_again_in_one_transaction_keeps_the_last`.
pub async fn a_key_written_again_in_one_transaction_keeps_the_last<B: Backend>(t: TestStore<B>) {
    use crate::backend::{KeyRange, LogEntry, ReadAt, Revisions, WriteTxn};
    use crate::proto::mvccpb::KeyValue;
    let entry = |key: &str, revision: i64, sub: i64, value: Option<&str>| LogEntry {
        kv: KeyValue {
            key: key.into(),
            value: value.unwrap_or_default().into(),
            create_revision: if value.is_some() { 2 } else { 0 },
            mod_revision: revision,
            version: if value.is_some() { revision - 1 } else { 0 },
            lease: 0,
        },
        sub,
        deleted: value.is_none(),
    };
    let backend = t.store.backend();
    let mut txn = backend.write().await.unwrap();
    // As a batch of requests writes them: puts, deletes and puts again of
    // the same keys, then the counters.
    for written in [
        entry("a", 2, 0, Some("a2")),
        entry("b", 2, 1, Some("b2")),
        entry("c", 2, 2, Some("c2")),
        entry("a", 3, 0, None),
        entry("c", 3, 1, None),
        entry("b", 4, 0, Some("b4")),
        entry("a", 5, 0, Some("a5")),
        entry("b", 5, 1, None),
        entry("b", 6, 0, Some("b6")),
    ] {
        txn.append(&written).await.unwrap();
    }
    txn.set_revisions(Revisions {
        current: 6,
        compact: -1,
        compacted_through: 0,
    })
    .await
    .unwrap();
    txn.commit().await.unwrap();

    let mut read = backend.read().await.unwrap();
    let all = KeyRange {
        start: b"a".to_vec(),
        end: Some(b"d".to_vec()),
    };
    let live: Vec<(Vec<u8>, Vec<u8>, i64)> = read
        .range(&all, ReadAt::Current, 0, false)
        .await
        .unwrap()
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.mod_revision))
        .collect();
    assert_eq!(
        live,
        vec![
            (b"a".to_vec(), b"a5".to_vec(), 5),
            (b"b".to_vec(), b"b6".to_vec(), 6)
        ]
    );
    let at_four = read
        .range(&all, ReadAt::Revision(4), 0, false)
        .await
        .unwrap();
    let at_four: Vec<&[u8]> = at_four.iter().map(|kv| kv.value.as_slice()).collect();
    assert_eq!(at_four, vec![&b"b4"[..]], "the log keeps every row");
}

/// Conformance test `leases_attach_renew_and_revoke`.
pub async fn leases_attach_renew_and_revoke<B: Backend>(t: TestStore<B>) {
    let grant = |id, ttl| LeaseGrantRequest { id, ttl };
    let granted = t.store.lease_grant(grant(0, 1)).await.unwrap();
    assert!(granted.id > 0);
    assert_eq!(granted.ttl, 2, "TTLs below the minimum are raised");
    assert!(matches!(
        t.store.lease_grant(grant(granted.id, 5)).await,
        Err(StoreError::LeaseExists)
    ));
    assert!(matches!(
        t.store.lease_grant(grant(7, 9_000_000_001)).await,
        Err(StoreError::LeaseTtlTooLarge)
    ));
    let mine = t.store.lease_grant(grant(7, 60)).await.unwrap().id;
    for key in ["b", "a", "c"] {
        let put = PutRequest {
            lease: mine,
            ..put_req(key, "v")
        };
        t.store.put(put).await.unwrap();
    }
    // A put without a lease detaches the key.
    t.store.put(put_req("c", "w")).await.unwrap();
    let ttl = t
        .store
        .lease_time_to_live(&LeaseTimeToLiveRequest {
            id: mine,
            keys: true,
        })
        .await
        .unwrap();
    assert_eq!(
        (ttl.granted_ttl, ttl.keys.clone()),
        (60, vec![b"a".to_vec(), b"b".to_vec()])
    );
    assert!(ttl.ttl > 55 && ttl.ttl <= 60, "{}", ttl.ttl);
    assert_eq!(t.store.lease_keep_alive(mine).await.unwrap().ttl, 60);
    assert_eq!(t.store.lease_keep_alive(12345).await.unwrap().ttl, 0);

    let before = t.store.revisions().current;
    t.store.lease_revoke(mine).await.unwrap();
    assert_eq!(
        t.store.revisions().current,
        before + 1,
        "one revision for all the keys"
    );
    let events = t.store.hub().since(before, 10).unwrap();
    let deleted: Vec<&[u8]> = events[0]
        .events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().key.as_slice())
        .collect();
    assert_eq!(deleted, vec![&b"a"[..], b"b"]);
    assert!(events[0].events.iter().all(|e| e.prev_kv.is_some()));
    let gone = t
        .store
        .lease_time_to_live(&LeaseTimeToLiveRequest {
            id: mine,
            keys: false,
        })
        .await
        .unwrap();
    assert_eq!(gone.ttl, -1);
    assert!(matches!(
        t.store.lease_revoke(mine).await,
        Err(StoreError::LeaseNotFound)
    ));
    let unknown = PutRequest {
        lease: mine,
        ..put_req("d", "v")
    };
    assert!(matches!(
        t.store.put(unknown).await,
        Err(StoreError::LeaseNotFound)
    ));
}

/// Conformance test `expired_leases_delete_their_keys`.
pub async fn expired_leases_delete_their_keys<B: Backend>(t: TestStore<B>) {
    let id = t
        .store
        .lease_grant(LeaseGrantRequest { id: 0, ttl: 2 })
        .await
        .unwrap()
        .id;
    let put = PutRequest {
        lease: id,
        ..put_req("ephemeral", "v")
    };
    t.store.put(put).await.unwrap();
    let mut latest = t.store.hub().subscribe();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        latest.wait_for(|r| *r == 3),
    )
    .await
    .expect("lease expired in time")
    .unwrap();
    let events = t.store.hub().since(2, 10).unwrap();
    let event = &events[0].events[0];
    assert_eq!(event.r#type, EventType::Delete as i32);
    assert_eq!(event.prev_kv.as_ref().unwrap().value, b"v");
    assert!(t.store.leases().await.unwrap().leases.is_empty());
}

/// Conformance test `downgrade_target_is_set_only_from_the_one_expected`.
pub async fn downgrade_target_is_set_only_from_the_one_expected<B: Backend>(t: TestStore<B>) {
    assert_eq!(t.store.downgrade_target().await.unwrap(), 0);
    let target = (3 << 32) | 5;
    assert_eq!(t.store.change_downgrade_target(0, target).await.unwrap(), 0);
    assert_eq!(t.store.downgrade_target().await.unwrap(), target);
    // Decided on a stale reading: refused, the stored one answered.
    assert_eq!(t.store.change_downgrade_target(0, 7).await.unwrap(), target);
    assert_eq!(t.store.downgrade_target().await.unwrap(), target);
    let before = t.store.revisions();
    assert_eq!(
        t.store.change_downgrade_target(target, 0).await.unwrap(),
        target
    );
    assert_eq!(t.store.downgrade_target().await.unwrap(), 0);
    // Not a revision of the key space, as etcd's cluster state is not.
    assert_eq!(t.store.revisions(), before);
}

/// Conformance test `alarms_are_stored_and_refuse_writes`.
pub async fn alarms_are_stored_and_refuse_writes<B: Backend>(t: TestStore<B>) {
    use crate::backend::AlarmRow;
    use crate::proto::etcdserverpb::AlarmType;
    use crate::store::request::AlarmChange;
    let nospace = AlarmType::Nospace as i32;
    let corrupt = AlarmType::Corrupt as i32;
    // Member ids are unsigned in etcd; the largest must survive a signed column.
    let big = u64::MAX - 1;
    let row = |member: u64, alarm| AlarmRow {
        member_id: member as i64,
        alarm,
    };
    assert!(t.store.alarms(0).await.unwrap().is_empty());
    for _ in 0..2 {
        let raised = t
            .store
            .change_alarm(AlarmChange::Activate, big, nospace)
            .await;
        assert_eq!(raised.unwrap(), vec![row(big, nospace)]);
    }
    t.store
        .change_alarm(AlarmChange::Activate, 7, corrupt)
        .await
        .unwrap();
    assert_eq!(
        t.store.alarms(0).await.unwrap(),
        vec![row(big, nospace), row(7, corrupt)]
    );
    assert_eq!(
        t.store.alarms(nospace).await.unwrap(),
        vec![row(big, nospace)]
    );
    assert!(matches!(
        t.store.put(put_req("a", "1")).await,
        Err(StoreError::Corrupt)
    ));
    let gone = t
        .store
        .change_alarm(AlarmChange::Deactivate, 7, corrupt)
        .await;
    assert_eq!(gone.unwrap(), vec![row(7, corrupt)]);
    assert!(matches!(
        t.store.put(put_req("a", "1")).await,
        Err(StoreError::NoSpace)
    ));
    t.store
        .delete_range(DeleteRangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    t.store
        .change_alarm(AlarmChange::Deactivate, big, nospace)
        .await
        .unwrap();
    assert!(t.store.alarms(0).await.unwrap().is_empty());
    t.store.put(put_req("a", "1")).await.unwrap();
}

/// Conformance test `history_from_the_log_matches_what_watchers_saw`.
pub async fn history_from_the_log_matches_what_watchers_saw<B: Backend>(t: TestStore<B>) {
    t.store.put(put_req("a", "1")).await.unwrap();
    t.store.put(put_req("b", "1")).await.unwrap();
    t.store.put(put_req("a", "2")).await.unwrap();
    // etcd lets a txn delete from "\0" and put a key again: two changes of one key in one revision.
    let txn = TxnRequest {
        success: vec![
            op(Op::RequestDeleteRange(DeleteRangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            })),
            op(Op::RequestPut(put_req("b", "2"))),
        ],
        ..Default::default()
    };
    t.store.txn(txn).await.unwrap();
    let txn = TxnRequest {
        success: vec![
            op(Op::RequestPut(put_req("c", "1"))),
            op(Op::RequestDeleteRange(DeleteRangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            })),
        ],
        ..Default::default()
    };
    t.store.txn(txn).await.unwrap();
    let latest = t.store.revisions().current;
    let live: Vec<_> = t
        .store
        .hub()
        .since(1, 100)
        .unwrap()
        .iter()
        .map(|r| (**r).clone())
        .collect();
    let logged = t.store.logged_revisions(1, latest).await.unwrap();
    assert_eq!(logged, live);
    // The key's state at a revision is its last change in that revision.
    let b = t.store.range(&get_req("b", 5)).await.unwrap();
    assert_eq!(b.kvs[0].value, b"2");
    assert!(
        t.store
            .range(&get_req("c", 6))
            .await
            .unwrap()
            .kvs
            .is_empty()
    );
}

/// A store with history, a deletion, a compaction and a lease: revisions 2..=8.
async fn write_sample_history<B: Backend>(store: &Store<B>) -> i64 {
    for (key, value) in [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")] {
        store.put(put_req(key, value)).await.unwrap();
    }
    store
        .delete_range(DeleteRangeRequest {
            key: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    store
        .compact(&CompactionRequest {
            revision: 4,
            physical: true,
        })
        .await
        .unwrap();
    let lease = store
        .lease_grant(LeaseGrantRequest { id: 0, ttl: 300 })
        .await
        .unwrap()
        .id;
    let put = PutRequest {
        lease,
        ..put_req("d", "1")
    };
    store.put(put).await.unwrap();
    store.put(put_req("a", "3")).await.unwrap();
    lease
}

/// Conformance test `clear_leaves_an_empty_store`.
pub async fn clear_leaves_an_empty_store<B: Backend>(t: TestStore<B>) {
    use crate::backend::{KeyRange, ReadAt, Revisions, WriteTxn};
    write_sample_history(&t.store).await;
    let mut txn = t.store.backend().write().await.unwrap();
    txn.clear().await.unwrap();
    txn.commit().await.unwrap();
    let mut read = t.store.backend().read().await.unwrap();
    assert_eq!(read.revisions().await.unwrap(), Revisions::EMPTY_STORE);
    let everything = KeyRange {
        start: Vec::new(),
        end: None,
    };
    assert_eq!(read.count(&everything, ReadAt::Current).await.unwrap(), 0);
    assert!(read.log_entries(0, 100).await.unwrap().is_empty());
    assert!(read.leases().await.unwrap().is_empty());
    assert_eq!(
        read.setting(crate::backend::settings::CLUSTER_ID)
            .await
            .unwrap(),
        None
    );
}

/// Conformance test `defragment_keeps_every_revision`.
pub async fn defragment_keeps_every_revision<B: Backend>(t: TestStore<B>) {
    write_sample_history(&t.store).await;
    let all = |revision| RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision,
        ..Default::default()
    };
    let current = t.store.revisions().current;
    let mut before = Vec::new();
    for revision in 4..=current {
        before.push(t.store.range(&all(revision)).await.unwrap());
    }
    let hash = t.store.hash_kv(0).await.unwrap();
    t.store.defragment().await.unwrap();
    for (revision, expected) in (4..=current).zip(before) {
        assert_eq!(t.store.range(&all(revision)).await.unwrap(), expected);
    }
    assert_eq!(t.store.hash_kv(0).await.unwrap(), hash);
}

/// Conformance test `hash_kv_refuses_compacted_and_future_revisions`.
pub async fn hash_kv_refuses_compacted_and_future_revisions<B: Backend>(t: TestStore<B>) {
    write_sample_history(&t.store).await;
    let current = t.store.revisions().current;
    // etcd refuses the compact revision itself too.
    for revision in [1, 4] {
        assert!(matches!(
            t.store.hash_kv(revision).await,
            Err(StoreError::Compacted)
        ));
    }
    assert!(matches!(
        t.store.hash_kv(current + 1).await,
        Err(StoreError::FutureRevision)
    ));
    let latest = t.store.hash_kv(0).await.unwrap();
    assert_eq!((latest.current, latest.compact), (current, 4));
    assert_eq!(t.store.hash_kv(current).await.unwrap(), latest);
    let mut hashes: Vec<u32> = Vec::new();
    for revision in 5..=current {
        hashes.push(t.store.hash_kv(revision).await.unwrap().hash);
    }
    hashes.sort();
    hashes.dedup();
    assert_eq!(
        hashes.len() as i64,
        current - 4,
        "each revision hashes differently"
    );
}

/// Conformance test `snapshot_restores_into_sqlite_with_equal_hashes`: a
/// snapshot of this backend restored into SQLite reads the same at every
/// revision and hashes the same, so the hash does not depend on the backend.
pub async fn snapshot_restores_into_sqlite_with_equal_hashes<B: Backend>(t: TestStore<B>) {
    let lease = write_sample_history(&t.store).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snapshot.db");
    // The SQLite snapshot replicated mode sends between members (the
    // Snapshot RPC's etcd format is tested in tests/etcd_snapshot.rs).
    crate::backend::snapshot::write_database(&*t.store.backend, &file)
        .await
        .unwrap();
    let target = crate::backend::sqlite::Sqlite::open(&dir.path().join("restored.db")).unwrap();
    let restored = crate::backend::snapshot::restore(&file, &target, false)
        .await
        .unwrap();
    assert!(!restored.checksummed, "a bare database has no trailer");
    let copy = Store::open(target).await.unwrap();
    let current = t.store.revisions().current;
    assert_eq!(copy.revisions(), t.store.revisions());
    let all = |revision| RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision,
        ..Default::default()
    };
    for revision in 4..=current {
        assert_eq!(
            copy.range(&all(revision)).await.unwrap().kvs,
            t.store.range(&all(revision)).await.unwrap().kvs
        );
        let (original, restored) = (
            t.store.hash_kv(revision).await,
            copy.hash_kv(revision).await,
        );
        match (original, restored) {
            (Ok(original), Ok(restored)) => assert_eq!(original, restored),
            (Err(StoreError::Compacted), Err(StoreError::Compacted)) => assert_eq!(revision, 4),
            other => panic!("revision {revision}: {other:?}"),
        }
    }
    assert_eq!(copy.hash().await.unwrap(), t.store.hash().await.unwrap());
    let ttl = copy
        .lease_time_to_live(&LeaseTimeToLiveRequest {
            id: lease,
            keys: true,
        })
        .await
        .unwrap();
    assert_eq!((ttl.granted_ttl, ttl.keys), (300, vec![b"d".to_vec()]));
    assert_ne!(
        copy.identity(),
        t.store.identity(),
        "a restored store is a new cluster"
    );

    copy.put(put_req("e", "1")).await.unwrap();
    assert_ne!(
        copy.hash_kv(0).await.unwrap().hash,
        t.store.hash_kv(0).await.unwrap().hash
    );
}

/// Expands to one `#[tokio::test]` per conformance test, each on a store
/// on a fresh database from `$database`.
macro_rules! conformance_suite {
    ($database:path) => {
        #[tokio::test]
        async fn empty_store_is_at_revision_one_and_never_compacted() {
            crate::store::conformance::empty_store_is_at_revision_one_and_never_compacted(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn a_txn_takes_one_revision_and_ranges_inside_see_its_writes() {
            crate::store::conformance::a_txn_takes_one_revision_and_ranges_inside_see_its_writes(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn compares_see_the_keys_a_range_reads() {
            crate::store::conformance::compares_see_the_keys_a_range_reads(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn swaps_of_one_revision_let_one_through() {
            crate::store::conformance::swaps_of_one_revision_let_one_through(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn a_write_answers_reads_of_what_it_read_ahead_or_wrote() {
            crate::store::conformance::a_write_answers_reads_of_what_it_read_ahead_or_wrote(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn a_current_range_reads_counters_keys_and_count_together() {
            crate::store::conformance::a_current_range_reads_counters_keys_and_count_together(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn failed_checks_leave_no_trace() {
            crate::store::conformance::failed_checks_leave_no_trace(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn read_only_and_no_op_txns_do_not_raise_the_revision() {
            crate::store::conformance::read_only_and_no_op_txns_do_not_raise_the_revision(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn compare_on_a_missing_key_uses_zero_but_value_compares_fail() {
            crate::store::conformance::compare_on_a_missing_key_uses_zero_but_value_compares_fail(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn compaction_refuses_old_reads_and_removes_history() {
            crate::store::conformance::compaction_refuses_old_reads_and_removes_history(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn queued_writes_commit_together_in_order() {
            crate::store::conformance::queued_writes_commit_together_in_order(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn concurrent_ranges_of_one_key_each_get_their_own() {
            crate::store::conformance::concurrent_ranges_of_one_key_each_get_their_own(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn a_key_written_again_in_one_transaction_keeps_the_last() {
            crate::store::conformance::a_key_written_again_in_one_transaction_keeps_the_last(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn leases_attach_renew_and_revoke() {
            crate::store::conformance::leases_attach_renew_and_revoke(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn expired_leases_delete_their_keys() {
            crate::store::conformance::expired_leases_delete_their_keys(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn downgrade_target_is_set_only_from_the_one_expected() {
            crate::store::conformance::downgrade_target_is_set_only_from_the_one_expected(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn alarms_are_stored_and_refuse_writes() {
            crate::store::conformance::alarms_are_stored_and_refuse_writes(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn history_from_the_log_matches_what_watchers_saw() {
            crate::store::conformance::history_from_the_log_matches_what_watchers_saw(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn clear_leaves_an_empty_store() {
            crate::store::conformance::clear_leaves_an_empty_store(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn defragment_keeps_every_revision() {
            crate::store::conformance::defragment_keeps_every_revision(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn hash_kv_refuses_compacted_and_future_revisions() {
            crate::store::conformance::hash_kv_refuses_compacted_and_future_revisions(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn snapshot_restores_into_sqlite_with_equal_hashes() {
            crate::store::conformance::snapshot_restores_into_sqlite_with_equal_hashes(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
        #[tokio::test]
        async fn auth_records_are_stored_replaced_and_removed() {
            crate::store::conformance::auth_records_are_stored_replaced_and_removed(
                crate::store::conformance::TestStore::open($database().await).await,
            )
            .await
        }
    };
}

mod sqlite {
    use std::path::Path;

    use rusqlite::Connection;

    use super::put_req;
    use crate::backend::sqlite::Sqlite;
    use crate::store::Store;

    conformance_suite!(crate::backend::sqlite::tests::test_database);

    /// Commits leave `meta` alone; the revision comes back from the log after
    /// a restart, and from `meta` when compaction removed the log's last row.
    #[tokio::test]
    async fn revision_survives_reopen_without_meta_updates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
        for key in ["a", "b", "a"] {
            store.put(put_req("a", "1")).await.unwrap();
            store.put(put_req(key, "1")).await.unwrap();
        }
        let meta = |path: &Path| -> i64 {
            Connection::open(path)
                .unwrap()
                .query_row("SELECT revision FROM meta", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(meta(&path), 1, "plain commits do not write meta");
        store.shutdown().await;

        let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
        assert_eq!(store.revisions().current, 7);
        // Delete the newest key and compact at the present: the tombstone,
        // the log's last row, goes; the revision must not go back.
        let deleted = store
            .delete_range(crate::proto::etcdserverpb::DeleteRangeRequest {
                key: b"b".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        let revision = deleted.header.unwrap().revision;
        let compaction = crate::proto::etcdserverpb::CompactionRequest {
            revision,
            physical: true,
        };
        store.compact(&compaction).await.unwrap();
        store.shutdown().await;
        assert_eq!(meta(&path), revision);

        let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
        assert_eq!(store.revisions().current, revision);
        let next = store.put(put_req("c", "1")).await.unwrap();
        assert_eq!(next.header.unwrap().revision, revision + 1);
    }
}

/// Keep-alives answered from memory: the deadline moves before it is
/// stored, TimeToLive counts from it, a deadline is stored once the stored
/// one is within `STORE_AHEAD_MS`, and a clean stop stores the rest and
/// clears `covered_until`.
#[tokio::test]
async fn sqlite_keep_alives_from_memory_are_stored_when_due_and_at_stop() {
    use crate::backend::sqlite::Sqlite;
    use crate::store::StoreOptions;

    async fn stored(store: &Store<Sqlite>, id: i64) -> (i64, i64) {
        let mut txn = store.backend().read().await.unwrap();
        let lease = txn.lease(id).await.unwrap().unwrap();
        let covered = txn
            .setting(crate::backend::settings::LEASE_RENEWALS_COVERED_UNTIL)
            .await
            .unwrap();
        (lease.expires_at, covered.unwrap_or(0))
    }
    async fn grant(store: &Store<Sqlite>, ttl: i64) -> i64 {
        let req = LeaseGrantRequest { ttl, id: 0 };
        store.lease_grant(req).await.unwrap().id
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let options = StoreOptions {
        keep_alives_in_memory: true,
        ..Default::default()
    };
    let store = Store::open_with(Sqlite::open(&path).unwrap(), options)
        .await
        .unwrap();
    let (short, long) = (grant(&store, 3).await, grant(&store, 60).await);
    // The first keep-alive is stored, and opens the cover for the next.
    store.lease_keep_alive(short).await.unwrap();
    let (first, covered) = stored(&store, short).await;
    assert!(covered > first - 3_000, "covered until {covered}");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    for id in [short, long] {
        assert!(store.lease_keep_alive(id).await.unwrap().ttl > 0);
    }
    let in_memory = |id| {
        store
            .lease_deadlines
            .as_ref()
            .unwrap()
            .deadline(id)
            .unwrap()
    };
    let (short_deadline, long_deadline) = (in_memory(short), in_memory(long));
    assert_eq!(stored(&store, short).await.0, first, "not stored yet");
    assert!(short_deadline >= first + 20);
    let ttl = store
        .lease_time_to_live(&LeaseTimeToLiveRequest {
            id: long,
            keys: false,
        })
        .await
        .unwrap()
        .ttl;
    assert_eq!(ttl, (long_deadline - super::apply::now_ms() - 1) / 1000);
    // The writer commits within STORE_INTERVAL with no request to carry
    // it: the short lease's deadline is due, the long one's is not.
    tokio::time::sleep(super::lease_deadlines::STORE_INTERVAL * 2).await;
    let (stored_short, covered_after) = stored(&store, short).await;
    assert_eq!(stored_short, short_deadline, "stored when due");
    assert!(covered_after > covered, "the cover moved on");
    assert!(stored(&store, long).await.0 < long_deadline, "not due yet");
    store.shutdown().await;

    let store = Store::open(Sqlite::open(&path).unwrap()).await.unwrap();
    assert_eq!(
        stored(&store, long).await,
        (long_deadline, 0),
        "a clean stop stores the deadline and promised nothing unstored"
    );
}

mod postgres {
    conformance_suite!(crate::backend::postgres::tests::test_database);
}

mod mysql {
    conformance_suite!(crate::backend::mysql::tests::test_database);
}

/// etcd 3.6+'s compaction digest is taken by the compactor before it
/// removes anything, for a Compact that does not wait for the removal too:
/// HashKV at each compaction's revision answers the history as it was, with
/// the compaction before it as its compact revision.
#[tokio::test]
async fn sqlite_a_compactions_digest_is_taken_before_its_history_goes() {
    use crate::backend::sqlite::Sqlite;
    use crate::store::StoreOptions;

    async fn compact_and_wait(store: &Store<Sqlite>, revision: i64) {
        let req = CompactionRequest {
            revision,
            physical: false,
        };
        store.compact(&req).await.unwrap();
        let mut revisions = store.revisions.clone();
        let removed = revisions.wait_for(|r| r.compacted_through >= revision);
        tokio::time::timeout(std::time::Duration::from_secs(10), removed)
            .await
            .expect("the compactor removes the history")
            .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        compaction_hashes: true,
        ..Default::default()
    };
    let backend = Sqlite::open(&dir.path().join("state.db")).unwrap();
    let store = Store::open_with(backend, options).await.unwrap();
    for (key, value) in [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")] {
        store.put(put_req(key, value)).await.unwrap();
    }
    let before = store.hash_kv(4).await.unwrap();
    assert_eq!(before.compact, -1);
    compact_and_wait(&store, 4).await;
    assert_eq!(store.hash_kv(4).await.unwrap(), before, "a@2 still hashed");

    store.put(put_req("a", "3")).await.unwrap();
    let before = store.hash_kv(6).await.unwrap();
    compact_and_wait(&store, 6).await;
    let kept = store.hash_kv(6).await.unwrap();
    assert_eq!((kept.hash, kept.compact), (before.hash, 4));
}
