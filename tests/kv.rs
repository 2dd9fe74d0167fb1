//! End-to-end tests of the KV, Maintenance and Cluster services over gRPC
//! with the `etcd-client` crate, the way applications and the Kubernetes
//! apiserver use them.

mod common;

use common::Cetera;
use etcd_client::{
    AlarmAction, AlarmType, Client, CompactionOptions, Compare, CompareOp, DeleteOptions,
    GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};

async fn client(server: &Cetera) -> Client {
    Client::connect([server.endpoint()], None)
        .await
        .expect("connect to cetera")
}

#[tokio::test]
async fn revisions_start_at_one_and_rise_by_one_per_write() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;

    let empty = c.get("missing", None).await.unwrap();
    assert_eq!(empty.header().unwrap().revision(), 1);
    assert!(empty.kvs().is_empty());

    let put = c.put("k", "v1", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), 2);
    c.put("k", "v2", None).await.unwrap();
    let got = c.get("k", None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!(
        (kv.create_revision(), kv.mod_revision(), kv.version()),
        (2, 3, 2)
    );
    assert_eq!(kv.value(), b"v2");

    // Deleting nothing does not raise the revision; deleting does; recreating restarts the version.
    let none = c.delete("absent", None).await.unwrap();
    assert_eq!((none.deleted(), none.header().unwrap().revision()), (0, 3));
    let del = c.delete("k", None).await.unwrap();
    assert_eq!((del.deleted(), del.header().unwrap().revision()), (1, 4));
    c.put("k", "v3", None).await.unwrap();
    let kv = c.get("k", None).await.unwrap().kvs()[0].clone();
    assert_eq!(
        (kv.create_revision(), kv.mod_revision(), kv.version()),
        (5, 5, 1)
    );

    // Old revisions stay readable until compacted.
    let old = c
        .get("k", Some(GetOptions::new().with_revision(3)))
        .await
        .unwrap();
    assert_eq!(old.kvs()[0].value(), b"v2");
    assert_eq!(old.header().unwrap().revision(), 5);
    let gone = c
        .get("k", Some(GetOptions::new().with_revision(4)))
        .await
        .unwrap();
    assert!(gone.kvs().is_empty());
}

#[tokio::test]
async fn keys_and_values_are_arbitrary_bytes() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;
    let key = vec![0u8, 0xff, b'/', 0, 7];
    let value: Vec<u8> = (0..=255u8).collect();
    c.put(key.clone(), value.clone(), None).await.unwrap();
    c.put(vec![0xffu8, 0xff], Vec::<u8>::new(), None)
        .await
        .unwrap();
    let got = c.get(key.clone(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), value.as_slice());
    let all = c
        .get(vec![0u8], Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    let keys: Vec<&[u8]> = all.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, vec![key.as_slice(), &[0xff, 0xff][..]]);
    assert_eq!(all.kvs()[1].value(), b"");
}

#[tokio::test]
async fn prefix_limit_sort_and_count() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;
    for (k, v) in [("/r/b", "2"), ("/r/a", "3"), ("/r/c", "1"), ("/s", "x")] {
        c.put(k, v, None).await.unwrap();
    }
    c.put("/r/a", "3b", None).await.unwrap();

    let page = c
        .get("/r/", Some(GetOptions::new().with_prefix().with_limit(2)))
        .await
        .unwrap();
    let keys: Vec<&str> = page.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, ["/r/a", "/r/b"]);
    assert!(page.more());
    assert_eq!(page.count(), 3);

    let by_value = c
        .get(
            "/r/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Value, SortOrder::Descend),
            ),
        )
        .await
        .unwrap();
    let values: Vec<&str> = by_value
        .kvs()
        .iter()
        .map(|kv| kv.value_str().unwrap())
        .collect();
    assert_eq!(values, ["3b", "2", "1"]);

    let by_version = c
        .get(
            "/r/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Version, SortOrder::None),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = by_version
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap())
        .collect();
    assert_eq!(keys, ["/r/b", "/r/c", "/r/a"]);

    let counted = c
        .get(
            "/r/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!((counted.count(), counted.kvs().len()), (3, 0));

    let keys_only = c
        .get(
            "/r/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    assert!(keys_only.kvs().iter().all(|kv| kv.value().is_empty()));

    let recent = c
        .get(
            "/",
            Some(GetOptions::new().with_prefix().with_min_mod_revision(5)),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = recent
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap())
        .collect();
    assert_eq!(keys, ["/r/a", "/s"]);
}

/// The apiserver's paginated List: first page at the current revision, later
/// pages pinned to it with the continue key lastKey + "\0".
#[tokio::test]
async fn paginated_list_is_pinned_to_the_first_page_revision() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;
    for i in 0..25 {
        c.put(format!("/registry/pods/p{i:02}"), "x", None)
            .await
            .unwrap();
    }
    let first = c
        .get(
            "/registry/pods/",
            Some(GetOptions::new().with_prefix().with_limit(10)),
        )
        .await
        .unwrap();
    let list_revision = first.header().unwrap().revision();
    // Writes after the first page must not show up in later pages.
    c.put("/registry/pods/p05", "changed", None).await.unwrap();
    c.delete("/registry/pods/p20", None).await.unwrap();

    let mut seen: Vec<String> = first
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect();
    let mut more = first.more();
    while more {
        let mut next = seen.last().unwrap().clone().into_bytes();
        next.push(0);
        let page = c
            .get(
                next,
                Some(
                    GetOptions::new()
                        .with_range("/registry/pods0")
                        .with_limit(10)
                        .with_revision(list_revision),
                ),
            )
            .await
            .unwrap();
        assert!(page.kvs().iter().all(|kv| kv.value() == b"x"));
        seen.extend(
            page.kvs()
                .iter()
                .map(|kv| kv.key_str().unwrap().to_string()),
        );
        more = page.more();
    }
    assert_eq!(seen.len(), 25);
}

/// Create, update, delete and compaction exactly as the apiserver sends them.
#[tokio::test]
async fn kubernetes_txn_shapes() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;
    let key = "/registry/configmaps/default/cm";

    let create = |value: &'static str| {
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, None)])
    };
    let created = c.txn(create("v1")).await.unwrap();
    assert!(created.succeeded());
    let rev = created.header().unwrap().revision();
    assert!(
        !c.txn(create("again")).await.unwrap().succeeded(),
        "create of an existing key"
    );

    let update = |from: i64, value: &'static str| {
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, from)])
            .and_then([TxnOp::put(key, value, None)])
            .or_else([TxnOp::get(key, None)])
    };
    let updated = c.txn(update(rev, "v2")).await.unwrap();
    assert!(updated.succeeded());
    let rev2 = updated.header().unwrap().revision();
    assert_eq!(rev2, rev + 1);

    // A stale update fails and returns the current object.
    let conflict = c.txn(update(rev, "v3")).await.unwrap();
    assert!(!conflict.succeeded());
    assert_eq!(
        conflict.header().unwrap().revision(),
        rev2,
        "failed txn must not raise the revision"
    );
    match &conflict.op_responses()[0] {
        TxnOpResponse::Get(get) => {
            assert_eq!(get.kvs()[0].value(), b"v2");
            assert_eq!(get.kvs()[0].mod_revision(), rev2);
        }
        other => panic!("expected a range response, got {other:?}"),
    }

    let deleted = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, rev2)])
                .and_then([TxnOp::delete(key, None)])
                .or_else([TxnOp::get(key, None)]),
        )
        .await
        .unwrap();
    assert!(deleted.succeeded());

    // Compaction: the compact_rev_key Txn on its version, then Compact.
    let compact_key = "compact_rev_key";
    for expected_version in [0, 1] {
        let current = c.get(key, None).await.unwrap().header().unwrap().revision();
        let txn = Txn::new()
            .when([Compare::version(
                compact_key,
                CompareOp::Equal,
                expected_version,
            )])
            .and_then([TxnOp::put(compact_key, current.to_string(), None)])
            .or_else([TxnOp::get(compact_key, None)]);
        assert!(c.txn(txn).await.unwrap().succeeded());
        c.compact(current, None).await.unwrap();
    }
    let err = c
        .get(key, Some(GetOptions::new().with_revision(rev)))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("required revision has been compacted"),
        "{err}"
    );
}

#[tokio::test]
async fn prev_kv_and_ignore_flags() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;
    let first = c
        .put("k", "a", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert!(first.prev_key().is_none());
    let second = c
        .put("k", "b", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(second.prev_key().unwrap().value(), b"a");

    c.put("k", "", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap();
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"b");
    let err = c
        .put("nope", "", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("etcdserver: key not found"),
        "{err}"
    );
    let err = c
        .put("k", "v", Some(PutOptions::new().with_lease(42)))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("etcdserver: requested lease not found"),
        "{err}"
    );

    c.put("k2", "c", None).await.unwrap();
    let del = c
        .delete(
            "k",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(del.deleted(), 2);
    let prev: Vec<&[u8]> = del.prev_kvs().iter().map(|kv| kv.value()).collect();
    assert_eq!(prev, [&b"b"[..], b"c"]);
}

#[tokio::test]
async fn errors_carry_etcd_codes_and_messages() {
    let server = Cetera::start_with(&["--max-txn-ops", "2", "--max-request-bytes", "1024"]).await;
    let mut c = client(&server).await;
    let status = |e: etcd_client::Error| match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("not a gRPC status: {other:?}"),
    };

    let (code, msg) = status(c.get("", None).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: key is not provided"
        )
    );

    let too_many = Txn::new().and_then([
        TxnOp::put("a", "", None),
        TxnOp::put("b", "", None),
        TxnOp::put("c", "", None),
    ]);
    let (code, msg) = status(c.txn(too_many).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: too many operations in txn request"
        )
    );

    let duplicate = Txn::new().and_then([TxnOp::put("a", "", None), TxnOp::put("a", "", None)]);
    let (_, msg) = status(c.txn(duplicate).await.unwrap_err());
    assert_eq!(msg, "etcdserver: duplicate key given in txn request");

    let (code, msg) = status(c.put("big", vec![0u8; 2048], None).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: request is too large"
        )
    );

    let (code, msg) = status(
        c.get("k", Some(GetOptions::new().with_revision(99)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );

    c.put("k", "v", None).await.unwrap();
    c.compact(2, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let (code, msg) = status(c.compact(2, None).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    // Reading at the compact revision itself is allowed.
    assert_eq!(
        c.get("k", Some(GetOptions::new().with_revision(2)))
            .await
            .unwrap()
            .kvs()
            .len(),
        1
    );
}

/// Physical compaction keeps, per key, the newest version at or below the
/// compact revision and drops keys whose newest version there is a deletion.
#[tokio::test]
async fn compaction_keeps_what_later_reads_need() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;
    for i in 0..5 {
        c.put("a", format!("a{i}"), None).await.unwrap(); // revisions 2..=6
    }
    c.put("b", "b0", None).await.unwrap(); // 7
    c.delete("b", None).await.unwrap(); // 8
    c.put("c", "c0", None).await.unwrap(); // 9
    c.put("a", "a5", None).await.unwrap(); // 10
    c.compact(9, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();

    let at = |rev| GetOptions::new().with_from_key().with_revision(rev);
    let at9 = c.get("a", Some(at(9))).await.unwrap();
    let seen: Vec<(&str, &str)> = at9
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap(), kv.value_str().unwrap()))
        .collect();
    assert_eq!(seen, [("a", "a4"), ("c", "c0")]);
    let now = c.get("a", None).await.unwrap();
    assert_eq!(
        (now.kvs()[0].value(), now.kvs()[0].version()),
        (&b"a5"[..], 6)
    );
    assert!(c.get("a", Some(at(8))).await.is_err());
}

#[tokio::test]
async fn maintenance_and_cluster_for_etcdctl() {
    let server = Cetera::start().await;
    let mut c = client(&server).await;
    c.put("k", "v", None).await.unwrap();

    let status = c.status().await.unwrap();
    let header = status.header().unwrap();
    assert_ne!(header.cluster_id(), 0);
    assert_ne!(header.member_id(), 0);
    assert_eq!(
        status.leader(),
        header.member_id(),
        "a single server leads itself"
    );
    assert_eq!(header.revision(), 2);
    assert!(
        status.version().as_bytes() >= b"3.5.13".as_slice(),
        "{}",
        status.version()
    );
    assert!(status.db_size() > 0);

    let alarms = c
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap();
    assert!(alarms.alarms().is_empty());

    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 1);
    let me = &members.members()[0];
    assert_eq!(me.id(), header.member_id());
    assert_eq!(me.client_urls(), [server.endpoint()]);
    // The peer URL it would found a cluster with (the default peer listen address).
    assert_eq!(me.peer_urls(), ["http://127.0.0.1:2380"]);
    assert_eq!(members.header().unwrap().cluster_id(), header.cluster_id());
    // etcd's one-member cluster takes a second member; so does a single
    // cetera server on SQLite, which founds a cluster with its data first
    // (tests/cluster.rs, `a_single_server_grows_by_etcds_runbook`). Servers
    // sharing a PostgreSQL or MySQL database are no Raft members: refused.
    // Nor has a single server another member to remove or promote.
    let shared = common::datastore::test_backend() != common::datastore::TestBackend::Sqlite;
    let grpc_status = |error: etcd_client::Error| match error {
        etcd_client::Error::GRpcStatus(status) => status,
        other => panic!("{other:?}"),
    };
    if shared {
        for learner in [false, true] {
            let options = learner.then(|| etcd_client::MemberAddOptions::new().with_is_learner());
            let refused = c
                .member_add(["http://127.0.0.1:2390"], options)
                .await
                .unwrap_err();
            let status = grpc_status(refused);
            assert_eq!(status.code(), tonic::Code::FailedPrecondition);
            assert!(
                status.message().contains("PostgreSQL or MySQL"),
                "{status:?}"
            );
        }
    }
    let refused = grpc_status(c.member_promote(me.id() + 1).await.unwrap_err());
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );

    // Ids are chosen once and survive a restart.
    let mut server = server;
    server.restart().await;
    let mut c = client(&server).await;
    let again = c.status().await.unwrap();
    assert_eq!(again.header().unwrap().member_id(), header.member_id());
    assert_eq!(again.header().unwrap().cluster_id(), header.cluster_id());
}

#[tokio::test]
async fn range_and_txn_refuse_unknown_sort_options_from_36_on() {
    use cetera::proto::etcdserverpb::request_op::Request as Op;
    use cetera::proto::etcdserverpb::{RangeRequest, RequestOp, TxnRequest};
    let range = RangeRequest {
        key: b"k".to_vec(),
        sort_order: 7,
        ..Default::default()
    };
    let txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestRange(RangeRequest {
                sort_order: 0,
                sort_target: 9,
                ..range.clone()
            })),
        }],
        ..Default::default()
    };
    for (args, refused) in [
        (&["--emulated-etcd-version", "3.5.13"][..], false),
        (&["--emulated-etcd-version", "3.6.11"][..], true),
        // The version the harness starts cetera with (3.7.3, its default,
        // beside etcd 3.7; 3.5.13 beside etcd 3.5).
        (&[][..], common::oracle().is_36_or_later()),
    ] {
        let server = Cetera::start_with(args).await;
        let mut kv = cetera::proto::etcdserverpb::kv_client::KvClient::new(
            common::channel(&server.endpoint()).await,
        );
        let results = [
            kv.range(range.clone()).await.err(),
            kv.txn(txn.clone()).await.err(),
        ];
        for result in results {
            let shown = result.map(|status| (status.code(), status.message().to_string()));
            let expected = refused.then(|| {
                (
                    tonic::Code::InvalidArgument,
                    "etcdserver: invalid sort option".to_string(),
                )
            });
            assert_eq!(shown, expected, "{args:?}");
        }
    }
}
