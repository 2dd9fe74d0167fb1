//! Unit tests of the store's etcd semantics on a temporary SQLite database.

use super::*;
use crate::backend::sqlite::Sqlite;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::{Compare, RequestOp};

struct TestStore {
    store: Store<Sqlite>,
    _dir: tempfile::TempDir,
}

async fn open() -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    let backend = Sqlite::open(&dir.path().join("state.db")).unwrap();
    TestStore {
        store: Store::open(backend).await.unwrap(),
        _dir: dir,
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

#[tokio::test]
async fn empty_store_is_at_revision_one_and_never_compacted() {
    let t = open().await;
    let revs = t.store.revisions();
    assert_eq!((revs.current, revs.compact), (1, -1));
    let resp = t.store.range(&get_req("a", 0)).await.unwrap();
    assert_eq!(resp.header.unwrap().revision, 1);
    assert_eq!(resp.count, 0);
}

#[tokio::test]
async fn a_txn_takes_one_revision_and_ranges_inside_see_its_writes() {
    let t = open().await;
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

#[tokio::test]
async fn failed_checks_leave_no_trace() {
    let t = open().await;
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

#[tokio::test]
async fn read_only_and_no_op_txns_do_not_raise_the_revision() {
    let t = open().await;
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

#[tokio::test]
async fn compare_on_a_missing_key_uses_zero_but_value_compares_fail() {
    let t = open().await;
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

#[tokio::test]
async fn compaction_refuses_old_reads_and_removes_history() {
    let t = open().await;
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
    let mut txn = t.store.backend.read().await.unwrap();
    let history = txn.log_entries(0, 10).await.unwrap();
    let revisions: Vec<i64> = history.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revisions, vec![3, 4]);
}

#[tokio::test]
async fn queued_writes_commit_together_in_order() {
    let t = open().await;
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
