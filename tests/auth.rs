//! Auth against real etcd 3.5.1: the same etcdctl `user`, `role` and `auth`
//! commands, and reads and writes as users with and without permission, run on
//! a fresh etcd and a fresh cetera must print the same output, errors and exit
//! status. Raw gRPC cases compare error codes and messages, and watch
//! refusals. etcd-client's auth calls, the rules etcd 3.5 added after 3.5.1
//! (admin-only Compaction, nested Txn checks) and two instances on a shared
//! database are checked on cetera alone.

mod common;

use std::path::Path;
use std::time::Duration;

use cetera::proto::etcdserverpb::auth_client::AuthClient;
use cetera::proto::etcdserverpb::cluster_client::ClusterClient;
use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::request_op::Request as Op;
use cetera::proto::etcdserverpb::{
    AuthStatusRequest, AuthenticateRequest, CompactionRequest, LeaseGrantRequest,
    LeaseLeasesRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, MemberAddRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, WatchCreateRequest,
};
use common::{Cetera, Etcd};
use etcd_client::{Client, ConnectOptions, GetOptions, Permission};
use tonic::Request;

/// Runs etcdctl with `args`, feeding `stdin`; returns exit status, stdout and
/// stderr without etcdctl's JSON log lines.
fn etcdctl(etcdctl: &Path, endpoint: &str, args: &[&str], stdin: &str) -> String {
    let output = common::run_etcdctl_with_stdin(etcdctl, endpoint, args, stdin);
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        output.status.code(),
        common::normalize_etcdctl(&String::from_utf8_lossy(&output.stdout)),
        common::normalize_etcdctl(&String::from_utf8_lossy(&output.stderr))
    )
}

/// The command sequence, each with what it writes to etcdctl's stdin. The
/// `bool` marks commands etcdctl 3.4 lacks.
fn commands() -> Vec<(Vec<&'static str>, &'static str, bool)> {
    let c = |args: &[&'static str]| (args.to_vec(), "", true);
    let root = |args: &[&'static str]| {
        let mut all = vec!["--user", "root:rootpw"];
        all.extend_from_slice(args);
        (all, "", true)
    };
    let alice = |args: &[&'static str]| {
        let mut all = vec!["--user", "alice:alicepw"];
        all.extend_from_slice(args);
        (all, "", true)
    };
    vec![
        c(&["auth", "status"]),
        c(&["auth", "enable"]),
        c(&["user", "add", "root:rootpw"]),
        c(&["user", "add", "root:again"]),
        c(&["user", "get", "root"]),
        c(&["user", "get", "nobody"]),
        c(&["role", "add", "root"]),
        c(&["role", "add", "root"]),
        c(&["user", "grant-role", "root", "nosuch"]),
        c(&["user", "grant-role", "nobody", "root"]),
        c(&["user", "grant-role", "root", "root"]),
        c(&["user", "grant-role", "root", "root"]),
        c(&["user", "add", "alice:alicepw"]),
        (vec!["user", "add", "bob", "--no-password"], "", false),
        c(&["role", "add", "reader"]),
        c(&["role", "grant-permission", "reader", "read", "foo"]),
        c(&[
            "role",
            "grant-permission",
            "reader",
            "readwrite",
            "--prefix",
            "a/",
        ]),
        c(&["role", "grant-permission", "reader", "write", "b", "c"]),
        c(&["role", "grant-permission", "reader", "read", "b", "c"]),
        c(&["role", "grant-permission", "nosuch", "read", "x"]),
        c(&["role", "get", "reader"]),
        c(&["role", "get", "nosuch"]),
        c(&["role", "list"]),
        c(&["user", "list"]),
        c(&["user", "grant-role", "alice", "reader"]),
        c(&["user", "get", "alice"]),
        c(&["user", "revoke-role", "alice", "nosuch"]),
        c(&["role", "revoke-permission", "reader", "nosuch"]),
        c(&["role", "revoke-permission", "nosuch", "x"]),
        c(&["auth", "status"]),
        c(&["auth", "enable"]),
        c(&["put", "foo", "x"]),
        c(&["get", "foo"]),
        root(&["auth", "status"]),
        root(&["put", "foo", "bar"]),
        root(&["put", "zzz", "root-only"]),
        alice(&["get", "foo"]),
        alice(&["put", "foo", "no"]),
        alice(&["put", "a/1", "one"]),
        alice(&["get", "a/", "--prefix"]),
        alice(&["get", "foo", "--prefix"]),
        alice(&["get", "zzz"]),
        alice(&["get", "b"]),
        alice(&["put", "b", "write-only"]),
        alice(&["del", "a/1", "--prev-kv"]),
        alice(&["del", "b"]),
        alice(&["txn"]),
        alice(&["user", "list"]),
        alice(&["user", "get", "alice"]),
        alice(&["user", "get", "root"]),
        alice(&["role", "get", "reader"]),
        alice(&["role", "get", "root"]),
        alice(&["user", "add", "eve:x"]),
        alice(&["auth", "disable"]),
        c(&["--user", "alice:wrong", "get", "foo"]),
        c(&["--user", "nobody:x", "get", "foo"]),
        root(&["user", "delete", "root"]),
        root(&["user", "revoke-role", "root", "root"]),
        root(&["role", "delete", "root"]),
        (
            vec![
                "--user",
                "root:rootpw",
                "user",
                "passwd",
                "alice",
                "--interactive=false",
            ],
            "newpw\n",
            true,
        ),
        alice(&["get", "foo"]),
        c(&["--user", "alice:newpw", "get", "foo"]),
        root(&["role", "revoke-permission", "reader", "foo"]),
        c(&["--user", "alice:newpw", "get", "foo"]),
        root(&["user", "revoke-role", "alice", "reader"]),
        c(&["--user", "alice:newpw", "get", "a/x"]),
        root(&["role", "delete", "reader"]),
        root(&["role", "list"]),
        root(&["user", "delete", "alice"]),
        root(&["user", "delete", "alice"]),
        root(&["user", "list"]),
        root(&["auth", "disable"]),
        c(&["auth", "status"]),
        c(&["get", "zzz"]),
        c(&["role", "delete", "root"]),
        c(&["user", "revoke-role", "root", "root"]),
        c(&["user", "delete", "root"]),
        c(&["auth", "enable"]),
        c(&["auth", "status"]),
    ]
}

async fn etcdctl_scenario(etcdctl_bin: std::path::PathBuf, is_34: bool) {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let cetera = Cetera::start().await;
    let mut mismatches = Vec::new();
    for (args, stdin, in_34) in commands() {
        if is_34 && !in_34 {
            continue;
        }
        let expected = etcdctl(&etcdctl_bin, &etcd.endpoint(), &args, stdin);
        let actual = etcdctl(&etcdctl_bin, &cetera.endpoint(), &args, stdin);
        if std::env::var_os("CETERA_AUTH_VERBOSE").is_some() {
            eprintln!("$ etcdctl {}\n{expected}", args.join(" "));
        }
        if expected != actual {
            mismatches.push(format!(
                "$ etcdctl {}\n--- etcd:\n{expected}--- cetera:\n{actual}",
                args.join(" ")
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} command(s) differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[tokio::test]
async fn etcdctl_35_auth_matches_etcd() {
    let Some(bin) = common::etcdctl_35() else {
        return;
    };
    etcdctl_scenario(bin, false).await;
}

#[tokio::test]
async fn etcdctl_34_auth_matches_etcd() {
    let Some(bin) = common::etcdctl_34() else {
        return;
    };
    etcdctl_scenario(bin, true).await;
}

/// Sets up root (root role) and alice (read on `foo`, readwrite on `a/`) and
/// enables auth, through etcd-client.
async fn set_up_users(endpoint: &str) {
    let mut client = Client::connect([endpoint], None).await.unwrap();
    client.user_add("root", "rootpw", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.user_add("alice", "alicepw", None).await.unwrap();
    client.role_add("reader").await.unwrap();
    client
        .role_grant_permission("reader", Permission::read("foo"))
        .await
        .unwrap();
    client
        .role_grant_permission("reader", Permission::read_write("a/").with_prefix())
        .await
        .unwrap();
    client.user_grant_role("alice", "reader").await.unwrap();
    client.auth_enable().await.unwrap();
}

async fn token(endpoint: &str, name: &str, password: &str) -> String {
    let mut auth = AuthClient::new(common::channel(endpoint).await);
    auth.authenticate(AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .token
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    request
}

fn error_text<T>(result: Result<tonic::Response<T>, tonic::Status>) -> String {
    match result {
        Ok(_) => "ok".to_string(),
        Err(status) => format!("{:?}: {}", status.code(), status.message()),
    }
}

/// Raw gRPC requests on both servers: error codes and messages, and the
/// watch refusal, must match.
#[tokio::test]
async fn grpc_errors_and_watch_refusal_match_etcd() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let cetera = Cetera::start().await;
    let mut outcomes: Vec<Vec<String>> = Vec::new();
    for endpoint in [etcd.endpoint(), cetera.endpoint()] {
        set_up_users(&endpoint).await;
        let alice = token(&endpoint, "alice", "alicepw").await;
        let mut kv = KvClient::new(common::channel(&endpoint).await);
        let mut auth = AuthClient::new(common::channel(&endpoint).await);
        let mut seen = Vec::new();
        let range = |key: &str, end: &str| RangeRequest {
            key: key.into(),
            range_end: end.into(),
            ..Default::default()
        };
        seen.push(error_text(kv.range(range("foo", "")).await));
        seen.push(error_text(
            kv.range(with_token(range("foo", ""), "bogus.1")).await,
        ));
        seen.push(error_text(
            kv.range(with_token(range("foo", ""), &alice)).await,
        ));
        seen.push(error_text(
            kv.range(with_token(range("foo", "fop"), &alice)).await,
        ));
        seen.push(error_text(
            kv.range(with_token(range("a/", "a0"), &alice)).await,
        ));
        let put = |key: &str, prev_kv: bool| PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            prev_kv,
            ..Default::default()
        };
        seen.push(error_text(
            kv.put(with_token(put("a/x", true), &alice)).await,
        ));
        seen.push(error_text(
            kv.put(with_token(put("foo", false), &alice)).await,
        ));
        let txn = TxnRequest {
            success: vec![RequestOp {
                request: Some(Op::RequestPut(put("zzz", false))),
            }],
            ..Default::default()
        };
        seen.push(error_text(kv.txn(with_token(txn, &alice)).await));
        seen.push(error_text(
            auth.authenticate(AuthenticateRequest {
                name: "alice".into(),
                password: "wrong".into(),
            })
            .await,
        ));
        // A watch on keys alice cannot read is created and canceled at once.
        let mut watch =
            common::WatchStream::open_with_token(common::channel(&endpoint).await, &alice);
        watch.create(WatchCreateRequest {
            key: b"zzz".to_vec(),
            ..Default::default()
        });
        let refused = watch.recv(Duration::from_secs(5)).await.unwrap();
        seen.push(format!(
            "created={} canceled={} reason={}",
            refused.created, refused.canceled, refused.cancel_reason
        ));
        watch.create(WatchCreateRequest {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            ..Default::default()
        });
        let accepted = watch.recv(Duration::from_secs(5)).await.unwrap();
        seen.push(format!(
            "created={} canceled={}",
            accepted.created, accepted.canceled
        ));
        outcomes.push(seen);
    }
    assert_eq!(
        outcomes[0], outcomes[1],
        "etcd (left) and cetera (right) differ"
    );
}

/// etcd-client's auth calls, and the rules of later etcd 3.5 releases that
/// 3.5.1 lacks: Compaction is for admins, nested Txns are checked, a from-key
/// watch is not allowed by a single-key permission.
#[tokio::test]
async fn etcd_client_auth_and_later_35_rules() {
    let cetera = Cetera::start().await;
    set_up_users(&cetera.endpoint()).await;
    {
        let mut root = Client::connect(
            [cetera.endpoint()],
            Some(ConnectOptions::new().with_user("root", "rootpw")),
        )
        .await
        .unwrap();
        let users = root.user_list().await.unwrap();
        assert_eq!(users.users(), ["alice", "root"]);
        let role = root.role_get("reader").await.unwrap();
        assert_eq!(role.permissions().len(), 2);
        root.put("foo", "root wrote", None).await.unwrap();
    }
    let root_token = token(&cetera.endpoint(), "root", "rootpw").await;
    let mut auth = AuthClient::new(common::channel(&cetera.endpoint()).await);
    let status = auth
        .auth_status(with_token(AuthStatusRequest {}, &root_token))
        .await
        .unwrap()
        .into_inner();
    assert!(status.enabled);
    // Seven changes after the initial revision 1; enabling does not count.
    assert_eq!(status.auth_revision, 8);

    let mut alice = Client::connect(
        [cetera.endpoint()],
        Some(ConnectOptions::new().with_user("alice", "alicepw")),
    )
    .await
    .unwrap();
    let got = alice.get("foo", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"root wrote");
    let denied = alice
        .get("f", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap_err();
    assert!(denied.to_string().contains("permission denied"), "{denied}");

    let alice_token = token(&cetera.endpoint(), "alice", "alicepw").await;
    let mut kv = KvClient::new(common::channel(&cetera.endpoint()).await);
    assert_eq!(
        error_text(
            kv.compact(with_token(CompactionRequest::default(), &alice_token))
                .await
        ),
        "PermissionDenied: etcdserver: permission denied"
    );
    let nested = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestTxn(TxnRequest {
                success: vec![RequestOp {
                    request: Some(Op::RequestRange(RangeRequest {
                        key: b"zzz".to_vec(),
                        ..Default::default()
                    })),
                }],
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    assert_eq!(
        error_text(kv.txn(with_token(nested, &alice_token)).await),
        "PermissionDenied: etcdserver: permission denied"
    );
    let mut watch = common::WatchStream::open_with_token(
        common::channel(&cetera.endpoint()).await,
        &alice_token,
    );
    watch.create(WatchCreateRequest {
        key: b"foo".to_vec(),
        range_end: vec![0],
        ..Default::default()
    });
    let refused = watch.recv(Duration::from_secs(5)).await.unwrap();
    assert!(refused.canceled, "{refused:?}");

    // Membership changes are for admins, before anything else is looked at.
    let mut cluster = ClusterClient::new(common::channel(&cetera.endpoint()).await);
    assert_eq!(
        error_text(
            cluster
                .member_add(with_token(MemberAddRequest::default(), &alice_token))
                .await
        ),
        "PermissionDenied: etcdserver: permission denied"
    );

    // Leases: a lease with a key alice cannot write is root's to revoke;
    // alice may not list its keys, nor list leases, and anyone must log in.
    let mut lease = LeaseClient::new(common::channel(&cetera.endpoint()).await);
    assert_eq!(
        error_text(
            lease
                .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
                .await
        ),
        "InvalidArgument: etcdserver: user name is empty"
    );
    let id = lease
        .lease_grant(with_token(
            LeaseGrantRequest { ttl: 60, id: 0 },
            &root_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .id;
    kv.put(with_token(
        PutRequest {
            key: b"zzz".to_vec(),
            lease: id,
            ..Default::default()
        },
        &root_token,
    ))
    .await
    .unwrap();
    let denied = "PermissionDenied: etcdserver: permission denied";
    assert_eq!(
        error_text(
            lease
                .lease_time_to_live(with_token(
                    LeaseTimeToLiveRequest { id, keys: true },
                    &alice_token
                ))
                .await
        ),
        denied
    );
    assert_eq!(
        error_text(
            lease
                .lease_time_to_live(with_token(
                    LeaseTimeToLiveRequest { id, keys: false },
                    &alice_token
                ))
                .await
        ),
        "ok"
    );
    assert_eq!(
        error_text(
            lease
                .lease_leases(with_token(LeaseLeasesRequest {}, &alice_token))
                .await
        ),
        denied
    );
    assert_eq!(
        error_text(
            lease
                .lease_revoke(with_token(LeaseRevokeRequest { id }, &alice_token))
                .await
        ),
        denied
    );
    // Attaching that lease to a key alice may write is refused too.
    assert_eq!(
        error_text(
            kv.put(with_token(
                PutRequest {
                    key: b"a/leased".to_vec(),
                    lease: id,
                    ..Default::default()
                },
                &alice_token,
            ))
            .await
        ),
        denied
    );
    assert_eq!(
        error_text(
            lease
                .lease_revoke(with_token(LeaseRevokeRequest { id }, &root_token))
                .await
        ),
        "ok"
    );
}

/// Two instances on one database: users, roles and enabling made on one are
/// enforced by the other (which notices through NOTIFY or its poll).
#[tokio::test]
async fn auth_changes_reach_other_instances() {
    if common::datastore::test_backend() == common::datastore::TestBackend::Sqlite {
        eprintln!("needs CETERA_TEST_BACKEND=postgres or mysql; skipped on SQLite");
        return;
    }
    let a = Cetera::start().await;
    let b = Cetera::start_on(a.datastore_endpoint()).await;
    set_up_users(&a.endpoint()).await;

    // Tokens are per instance: b issues its own, once it sees auth enabled.
    let mut kv_b = KvClient::new(common::channel(&b.endpoint()).await);
    let anonymous = || RangeRequest {
        key: b"foo".to_vec(),
        ..Default::default()
    };
    wait_until("b enforces auth", || {
        let mut kv_b = kv_b.clone();
        async move { kv_b.range(anonymous()).await.is_err() }
    })
    .await;
    assert_eq!(
        error_text(kv_b.range(anonymous()).await),
        "InvalidArgument: etcdserver: user name is empty"
    );
    let alice_b = token(&b.endpoint(), "alice", "alicepw").await;
    assert_eq!(
        error_text(kv_b.range(with_token(anonymous(), &alice_b)).await),
        "ok"
    );

    // A permission revoked on a is refused on b.
    let mut root_a = Client::connect(
        [a.endpoint()],
        Some(ConnectOptions::new().with_user("root", "rootpw")),
    )
    .await
    .unwrap();
    root_a
        .role_revoke_permission("reader", "foo", None)
        .await
        .unwrap();
    wait_until("b refuses the revoked permission", || {
        let mut kv_b = kv_b.clone();
        let request = with_token(anonymous(), &alice_b);
        async move { kv_b.range(request).await.is_err() }
    })
    .await;
    assert_eq!(
        error_text(kv_b.range(with_token(anonymous(), &alice_b)).await),
        "PermissionDenied: etcdserver: permission denied"
    );

    // Deleting alice on a ends her token on b.
    root_a.user_delete("alice").await.unwrap();
    let request = || {
        with_token(
            RangeRequest {
                key: b"a/x".to_vec(),
                ..Default::default()
            },
            &alice_b,
        )
    };
    wait_until("b drops the deleted user's token", || {
        let mut kv_b = kv_b.clone();
        let request = request();
        async move { kv_b.range(request).await.is_err() }
    })
    .await;
    assert_eq!(
        error_text(kv_b.range(request()).await),
        "Unauthenticated: etcdserver: invalid auth token"
    );
}

/// Polls `condition` until it holds; fails after 20 seconds.
async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if condition().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting until {what}");
}
