//! etcd 3.7's RangeStream against Range on the same server: random data over
//! many revisions, random requests, and the chunks merged must equal the
//! Range field by field; the chunk rules of etcd's rangeStream (header, more
//! and count on the last chunk only, 10 keys first); etcd's refusals; a
//! compaction during a stream; auth; and Status's etcd 3.6 fields. etcd
//! 3.5.1, the reference of the other suites, has no RangeStream: the
//! reference here is cetera's Range, itself checked against etcd by
//! tests/differential.rs.
//!
//! Runs on the backend CETERA_TEST_BACKEND names, and on a cluster follower
//! with CETERA_TEST_CLUSTER=1.

mod common;

use std::time::Duration;

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use cetera::proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest,
    RangeResponse,
};
use common::Cetera;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The servers' --max-request-bytes: small, so that chunks of values up to
/// 2 KiB grow and shrink within a few hundred keys.
const MAX_REQUEST_BYTES: &str = "8192";

/// A client whose HTTP/2 windows hold only a few chunks, so that a server
/// cannot run far ahead of what the test has read.
async fn kv_client(server: &Cetera) -> KvClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    KvClient::new(channel)
}

/// Every chunk of a RangeStream, or its error with the chunks before it.
async fn chunks(
    kv: &mut KvClient<Channel>,
    req: RangeRequest,
) -> (Vec<RangeResponse>, Option<Status>) {
    let mut stream = match kv.range_stream(req).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return (Vec::new(), Some(status)),
    };
    let mut got = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(chunk)) => got.push(chunk.range_response.expect("a range_response")),
            Ok(None) => return (got, None),
            Err(status) => return (got, Some(status)),
        }
    }
}

/// The chunks merged as etcd's proto.Merge would; checks etcd's chunk rules
/// on the way.
fn merge(chunks: Vec<RangeResponse>, req: &RangeRequest) -> RangeResponse {
    let last = chunks.len() - 1;
    let mut merged = RangeResponse::default();
    for (i, chunk) in chunks.into_iter().enumerate() {
        if i < last {
            assert!(
                chunk.header.is_none(),
                "header before the last chunk: {req:?}"
            );
            assert!(!chunk.more && chunk.count == 0, "more/count early: {req:?}");
            assert!(
                !chunk.kvs.is_empty(),
                "an empty chunk before the last: {req:?}"
            );
        } else {
            assert!(
                chunk.header.is_some(),
                "no header on the last chunk: {req:?}"
            );
        }
        // A sort by another target is answered whole, in one chunk.
        if i == 0 && req.sort_target == SortTarget::Key as i32 {
            assert!(
                chunk.kvs.len() <= 10,
                "first chunk of {}: {req:?}",
                chunk.kvs.len()
            );
        } else if i == 0 {
            assert_eq!(last, 0, "several chunks sorted by another target: {req:?}");
        }
        merged.kvs.extend(chunk.kvs);
        if i == last {
            merged.header = chunk.header;
            merged.more = chunk.more;
            merged.count = chunk.count;
        }
    }
    merged
}

/// Random puts (values of 0 to 2000 bytes, some under a lease) and deletes
/// over `a/`, `b/`, `c/`, one request per revision; returns the revisions
/// written.
async fn random_history(server: &Cetera, rng: &mut StdRng, writes: usize) -> Vec<i64> {
    let mut kv = kv_client(server).await;
    let mut leases = LeaseClient::new(common::channel(&server.endpoint()).await);
    let lease = leases
        .lease_grant(LeaseGrantRequest { ttl: 3600, id: 0 })
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut revisions = Vec::new();
    for _ in 0..writes {
        let key = format!(
            "{}/{:03}",
            ["a", "b", "c"][rng.random_range(0..3)],
            rng.random_range(0..150)
        );
        let revision = if rng.random_bool(0.1) {
            kv.delete_range(DeleteRangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .header
        } else {
            let size = if rng.random_bool(0.2) {
                rng.random_range(500..2000)
            } else {
                rng.random_range(0..40)
            };
            kv.put(PutRequest {
                key: key.into(),
                value: (0..size).map(|_| rng.random_range(b'a'..=b'z')).collect(),
                lease: if rng.random_bool(0.1) { lease } else { 0 },
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .header
        };
        revisions.push(revision.unwrap().revision);
    }
    revisions
}

/// The key interval of a random request: a prefix, from a key on, one key,
/// every key, or between two keys.
fn random_interval(rng: &mut StdRng) -> (Vec<u8>, Vec<u8>) {
    let key = |rng: &mut StdRng| {
        format!(
            "{}/{:03}",
            ["a", "b", "c"][rng.random_range(0..3)],
            rng.random_range(0..150)
        )
        .into_bytes()
    };
    match rng.random_range(0..5) {
        0 => {
            let prefix = ["a/", "b/", "c/"][rng.random_range(0..3)];
            let mut end = prefix.as_bytes().to_vec();
            *end.last_mut().unwrap() += 1;
            (prefix.into(), end)
        }
        1 => (key(rng), vec![0]),
        2 => (key(rng), Vec::new()),
        3 => (vec![0], vec![0]),
        _ => {
            let (a, b) = (key(rng), key(rng));
            (a.clone().min(b.clone()), a.max(b))
        }
    }
}

#[tokio::test]
async fn merged_chunks_equal_range_for_random_requests() {
    let server = Cetera::start_with(&["--max-request-bytes", MAX_REQUEST_BYTES]).await;
    let mut rng = StdRng::seed_from_u64(18);
    let revisions = random_history(&server, &mut rng, 900).await;
    // Compact part of the history, so that some requests read below it.
    let compact = revisions[100];
    let mut kv = kv_client(&server).await;
    kv.compact(CompactionRequest {
        revision: compact,
        physical: true,
    })
    .await
    .unwrap();

    let mut multi_chunk = 0;
    for i in 0..300 {
        let (key, range_end) = random_interval(&mut rng);
        let revision = match rng.random_range(0..4) {
            0 => revisions[rng.random_range(0..revisions.len())],
            1 => revisions[rng.random_range(revisions.len() - 50..revisions.len())],
            _ => 0,
        };
        let req = RangeRequest {
            key,
            range_end,
            limit: [0, 0, 1, 5, 10, 11, 37, 200, -1][rng.random_range(0..9)],
            revision,
            keys_only: rng.random_bool(0.25),
            count_only: rng.random_bool(0.1),
            serializable: rng.random_bool(0.3),
            ..Default::default()
        };
        // etcd's default order, or a target with order NONE (ascending by
        // it, as Range sorts).
        let req = match rng.random_range(0..10) {
            0 => RangeRequest {
                sort_order: SortOrder::Ascend as i32,
                ..req
            },
            1 => RangeRequest {
                sort_target: SortTarget::Mod as i32,
                ..req
            },
            _ => req,
        };
        let unary = kv.range(req.clone()).await.map(|r| r.into_inner());
        let (got, error) = chunks(&mut kv, req.clone()).await;
        match (unary, error) {
            (Ok(unary), None) => {
                multi_chunk += usize::from(got.len() > 1);
                let merged = merge(got, &req);
                assert_eq!(merged, unary, "request {i}: {req:?}");
            }
            (Err(expected), Some(status)) => {
                assert!(got.is_empty(), "chunks before {status:?}: {req:?}");
                assert_eq!(
                    (status.code(), status.message()),
                    (expected.code(), expected.message()),
                    "request {i}: {req:?}"
                );
            }
            (unary, error) => panic!("request {i}: {req:?}: Range {unary:?}, stream {error:?}"),
        }
    }
    assert!(
        multi_chunk > 30,
        "only {multi_chunk} streams had several chunks"
    );
}

#[tokio::test]
async fn chunks_start_at_ten_keys_and_adapt_to_the_request_size() {
    let server = Cetera::start_with(&["--max-request-bytes", MAX_REQUEST_BYTES]).await;
    let mut kv = kv_client(&server).await;
    // 100 small keys, then 100 of 3000 bytes: the chunks double while they
    // take under half of 8 KiB, and halve once they take over twice that.
    for i in 0..200 {
        let size = if i < 100 { 10 } else { 3000 };
        kv.put(PutRequest {
            key: format!("k/{i:03}").into(),
            value: vec![b'v'; size],
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let req = RangeRequest {
        key: b"k/".to_vec(),
        range_end: b"k0".to_vec(),
        ..Default::default()
    };
    let (got, error) = chunks(&mut kv, req.clone()).await;
    assert!(error.is_none(), "{error:?}");
    let sizes: Vec<usize> = got.iter().map(|c| c.kvs.len()).collect();
    // 40 small keys take about 1 KB; 80 keys, 50 of them large, 150 KB.
    assert_eq!(sizes, [10, 20, 40, 80, 40, 10]);
    let merged = merge(got, &req);
    assert_eq!(merged.count, 200);
    assert_eq!(merged, kv.range(req).await.unwrap().into_inner());
}

#[tokio::test]
async fn refusals_are_etcds() {
    let server = Cetera::start().await;
    let mut kv = kv_client(&server).await;
    kv.put(PutRequest {
        key: b"a".to_vec(),
        value: b"1".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = kv.clone();
    let refused = move |req: RangeRequest| {
        let mut kv = client.clone();
        async move {
            let (got, error) = chunks(&mut kv, req).await;
            assert!(got.is_empty());
            let error = error.expect("refused");
            (error.code(), error.message().to_string())
        }
    };
    let base = RangeRequest {
        key: b"a".to_vec(),
        range_end: vec![0],
        ..Default::default()
    };
    let sort_refused = (
        Code::Unimplemented,
        "RangeStream does not support custom sort orders".to_string(),
    );
    for (order, target) in [
        (SortOrder::Descend, SortTarget::Key),
        (SortOrder::Ascend, SortTarget::Mod),
        (SortOrder::Descend, SortTarget::Value),
    ] {
        let req = RangeRequest {
            sort_order: order as i32,
            sort_target: target as i32,
            ..base.clone()
        };
        assert_eq!(refused(req).await, sort_refused, "{order:?} {target:?}");
    }
    let filters_refused = (
        Code::Unimplemented,
        "RangeStream does not support revision filters".to_string(),
    );
    for filter in [
        RangeRequest {
            min_mod_revision: 1,
            ..base.clone()
        },
        RangeRequest {
            max_mod_revision: 5,
            ..base.clone()
        },
        RangeRequest {
            min_create_revision: 1,
            ..base.clone()
        },
        RangeRequest {
            max_create_revision: 5,
            ..base.clone()
        },
    ] {
        assert_eq!(refused(filter).await, filters_refused);
    }
    let empty = RangeRequest {
        key: Vec::new(),
        ..base.clone()
    };
    assert_eq!(
        refused(empty).await,
        (
            Code::InvalidArgument,
            "etcdserver: key is not provided".to_string()
        )
    );
    // An unknown sort option, with the message of etcd 3.6 and later (whose
    // Range refuses it too; 3.5's, which cetera's Range follows, does not).
    for invalid in [
        RangeRequest {
            sort_order: 7,
            ..base.clone()
        },
        RangeRequest {
            sort_target: 9,
            ..base.clone()
        },
    ] {
        assert_eq!(
            refused(invalid).await,
            (
                Code::InvalidArgument,
                "etcdserver: invalid sort option".to_string(),
            )
        );
    }
    // Revisions out of reach, as Range answers them.
    let future = RangeRequest {
        revision: 100,
        ..base.clone()
    };
    assert_eq!(
        refused(future).await,
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision".to_string()
        )
    );
}

#[tokio::test]
async fn a_compaction_past_the_streamed_revision_ends_the_stream() {
    let server = Cetera::start_with(&["--max-request-bytes", MAX_REQUEST_BYTES]).await;
    let mut kv = kv_client(&server).await;
    // About 1 MB in chunks of about 8 KiB: far more than the client's
    // windows, so the server is still reading when the compaction comes.
    for i in 0..250 {
        kv.put(PutRequest {
            key: format!("k/{i:03}").into(),
            value: vec![b'v'; 4000],
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut stream = kv
        .range_stream(RangeRequest {
            key: b"k/".to_vec(),
            range_end: b"k0".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.range_response.unwrap().kvs.len(), 10);
    // A write, then a compaction at it: past the stream's revision. On a
    // connection of their own: the stream's unread chunks fill this one's
    // window.
    let mut writer = kv_client(&server).await;
    let revision = writer
        .put(PutRequest {
            key: b"other".to_vec(),
            value: b"x".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    writer
        .compact(CompactionRequest {
            revision,
            physical: false,
        })
        .await
        .unwrap();
    let mut keys = 10;
    let error = loop {
        match stream.message().await {
            Ok(Some(chunk)) => {
                let chunk = chunk.range_response.unwrap();
                assert!(chunk.header.is_none(), "the stream finished");
                keys += chunk.kvs.len();
            }
            Ok(None) => panic!("the stream finished after {keys} keys"),
            Err(status) => break status,
        }
    };
    assert!(keys < 250, "{keys}");
    assert_eq!(
        (error.code(), error.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
}

#[tokio::test]
async fn status_has_the_36_fields_when_emulating_36_or_later() {
    use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
    use cetera::proto::etcdserverpb::{DowngradeInfo, StatusRequest};

    let status = |server: &Cetera| {
        let endpoint = server.endpoint();
        async move {
            MaintenanceClient::new(common::channel(&endpoint).await)
                .status(StatusRequest {})
                .await
                .unwrap()
                .into_inner()
        }
    };
    // As etcd 3.5: none of them.
    let v35 = Cetera::start_with(&["--emulated-etcd-version", "3.5.13"]).await;
    let resp = status(&v35).await;
    assert_eq!(
        (
            resp.storage_version.as_str(),
            resp.db_size_quota,
            resp.downgrade_info
        ),
        ("", 0, None)
    );
    // As etcd 3.6 fills them: the storage version at major.minor, the
    // quota (0 reported as the 2 GiB default), no downgrade.
    let v36 = Cetera::start_with(&["--emulated-etcd-version", "3.6.11"]).await;
    let resp = status(&v36).await;
    assert_eq!(resp.version, "3.6.11");
    assert_eq!(
        (
            resp.storage_version.as_str(),
            resp.db_size_quota,
            resp.downgrade_info
        ),
        (
            "3.6.0",
            2 * 1024 * 1024 * 1024,
            Some(DowngradeInfo {
                enabled: false,
                target_version: String::new()
            })
        )
    );
    let v37 = Cetera::start_with(&[
        "--emulated-etcd-version",
        "3.7.1",
        "--quota-backend-bytes",
        "100000000",
    ])
    .await;
    let resp = status(&v37).await;
    assert_eq!(
        (resp.storage_version.as_str(), resp.db_size_quota),
        ("3.7.0", 100_000_000)
    );
}

#[tokio::test]
async fn auth_is_checked_as_for_range() {
    use cetera::proto::authpb::{Permission, permission::Type};
    use cetera::proto::etcdserverpb::auth_client::AuthClient;
    use cetera::proto::etcdserverpb::{
        AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest, AuthenticateRequest,
    };

    let server = Cetera::start().await;
    let mut kv = kv_client(&server).await;
    for key in ["a/1", "a/2", "b/1"] {
        kv.put(PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // root, and alice who may read a/ only.
    let mut auth = AuthClient::new(common::channel(&server.endpoint()).await);
    for (user, role) in [("root", "root"), ("alice", "reader")] {
        auth.user_add(AuthUserAddRequest {
            name: user.into(),
            password: format!("{user}pw"),
            ..Default::default()
        })
        .await
        .unwrap();
        if role != "root" {
            auth.role_add(AuthRoleAddRequest { name: role.into() })
                .await
                .unwrap();
        }
        auth.user_grant_role(AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })
        .await
        .unwrap();
    }
    auth.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: "reader".into(),
        perm: Some(Permission {
            perm_type: Type::Read as i32,
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
        }),
    })
    .await
    .unwrap();
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();
    let token = auth
        .authenticate(AuthenticateRequest {
            name: "alice".into(),
            password: "alicepw".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token;

    let stream = |key: &[u8], end: &[u8], token: Option<&str>| {
        let mut request = tonic::Request::new(RangeRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        });
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("token", token.parse().unwrap());
        }
        let mut kv = kv.clone();
        async move {
            let mut chunks = kv.range_stream(request).await?.into_inner();
            let mut keys = 0;
            while let Some(chunk) = chunks.message().await? {
                keys += chunk.range_response.unwrap().kvs.len();
            }
            Ok::<usize, Status>(keys)
        }
    };
    assert_eq!(stream(b"a/", b"a0", Some(&token)).await.unwrap(), 2);
    let denied = stream(b"a/", b"c", Some(&token)).await.unwrap_err();
    assert_eq!(
        (denied.code(), denied.message()),
        (Code::PermissionDenied, "etcdserver: permission denied")
    );
    // Without a token: the error Range gives.
    let anonymous = stream(b"a/", b"a0", None).await.unwrap_err();
    let range = kv
        .range(RangeRequest {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (anonymous.code(), anonymous.message()),
        (range.code(), range.message())
    );
    assert_eq!(anonymous.message(), "etcdserver: user name is empty");
}
