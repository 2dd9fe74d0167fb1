//! Snapshots in etcd's own format, both ways, against real etcd 3.5.1:
//!
//! - the same history written to etcd and to cetera gives snapshots whose
//!   `key`, `lease` and compaction records are byte for byte the same, and
//!   that `etcdutl snapshot status` reads alike;
//! - cetera's snapshot, put through `etcdutl snapshot restore`, starts a real
//!   etcd that serves the same keys at every revision from the compact
//!   revision on, the same leases, users and roles, and the same HashKV;
//! - etcd's snapshot, put through `cetera restore`, gives a cetera that does.

mod common;

use std::path::Path;
use std::process::Command;

use cetera::bbolt::Db;
use cetera::proto::authpb::{Permission, UserAddOptions};
use cetera::proto::etcdserverpb::auth_client::AuthClient;
use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cetera::proto::etcdserverpb::request_op::Request as Op;
use cetera::proto::etcdserverpb::{
    AuthRoleAddRequest, AuthRoleGetRequest, AuthRoleGrantPermissionRequest, AuthRoleListRequest,
    AuthUserAddRequest, AuthUserGetRequest, AuthUserGrantRoleRequest, AuthUserListRequest,
    HashKvRequest, LeaseGrantRequest, PutRequest, RequestOp, TxnRequest,
};
use common::datastore::FreshDatabase;
use common::kv_fixtures::{compact, delete_range, put_request, range_all};
use common::migration::{assert_success, lease_ttls};
use common::reference_binaries::etcdutl;
use common::{Cetera, Etcd, channel, etcdctl_35, run_etcdctl};
use tonic::transport::Channel;

/// A history with leases (fixed ids), overwrites, range deletes, a txn of
/// several changes, a compaction and writes after it, and users and roles.
async fn write_history(channel: Channel) {
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel.clone());
    for (id, ttl) in [(4001, 600), (4002, 900)] {
        lease
            .lease_grant(LeaseGrantRequest { ttl, id })
            .await
            .unwrap();
    }
    for i in 0..30 {
        let lease = [0, 4001, 4002][i % 3];
        kv.put(put_request(&format!("/k/{i:02}"), &format!("v{i}"), lease))
            .await
            .unwrap();
    }
    for i in 0..10 {
        kv.put(put_request(&format!("/k/{i:02}"), &format!("w{i}"), 0))
            .await
            .unwrap();
    }
    delete_range(&mut kv, "/k/20", "/k/25").await;
    let ops = ["/t/b", "/t/a", "/k/05"]
        .iter()
        .map(|key| RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key: key.as_bytes().to_vec(),
                value: b"txn".to_vec(),
                ..Default::default()
            })),
        })
        .collect();
    kv.txn(TxnRequest {
        success: ops,
        ..Default::default()
    })
    .await
    .unwrap();
    compact(&mut kv, 25).await;
    for i in 0..5 {
        kv.put(put_request(&format!("/k/{i:02}"), &format!("x{i}"), 4002))
            .await
            .unwrap();
    }
    delete_range(&mut kv, "/k/06", "").await;
    kv.put(put_request("/empty", "", 0)).await.unwrap();

    let mut auth = AuthClient::new(channel);
    for name in ["root", "reader"] {
        auth.user_add(AuthUserAddRequest {
            name: name.into(),
            password: format!("{name}pw"),
            options: Some(UserAddOptions { no_password: false }),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    auth.role_add(AuthRoleAddRequest {
        name: "readers".into(),
    })
    .await
    .unwrap();
    auth.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: "readers".into(),
        perm: Some(Permission {
            perm_type: 0,
            key: b"/k/".to_vec(),
            range_end: b"/k0".to_vec(),
        }),
    })
    .await
    .unwrap();
    for (user, role) in [("reader", "readers"), ("root", "root")] {
        auth.user_grant_role(AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })
        .await
        .unwrap();
    }
}

/// Everything a server serves: every key at each revision from `from` to
/// the current one (with the revision errors), leases, users and roles,
/// and HashKV.
async fn served(endpoint: &str, from: i64) -> Vec<String> {
    let channel = channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let current = kv
        .range(range_all(0))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let mut lines = vec![format!("current {current}")];
    for revision in from..=current + 1 {
        lines.push(match kv.range(range_all(revision)).await {
            Ok(r) => {
                let r = r.into_inner();
                format!("at {revision}: count {} {:?}", r.count, r.kvs)
            }
            Err(s) => format!("at {revision}: {:?} {}", s.code(), s.message()),
        });
    }
    for (id, mut ttl) in lease_ttls(channel.clone()).await {
        // etcd lists a lease's keys in map order.
        ttl.keys.sort();
        lines.push(format!(
            "lease {id} granted {} keys {:?}",
            ttl.granted_ttl, ttl.keys
        ));
    }
    let mut auth = AuthClient::new(channel.clone());
    let users = auth.user_list(AuthUserListRequest {}).await.unwrap();
    for name in users.into_inner().users {
        let user = auth
            .user_get(AuthUserGetRequest { name: name.clone() })
            .await
            .unwrap();
        lines.push(format!("user {name} roles {:?}", user.into_inner().roles));
    }
    let roles = auth.role_list(AuthRoleListRequest {}).await.unwrap();
    for role in roles.into_inner().roles {
        let got = auth
            .role_get(AuthRoleGetRequest { role: role.clone() })
            .await
            .unwrap();
        lines.push(format!("role {role} perms {:?}", got.into_inner().perm));
    }
    let mut maintenance = MaintenanceClient::new(channel);
    for revision in [0, from + 1, current] {
        let hash = maintenance
            .hash_kv(HashKvRequest { revision })
            .await
            .unwrap();
        let hash = hash.into_inner();
        lines.push(format!(
            "hashkv {revision}: {} compact {}",
            hash.hash, hash.compact_revision
        ));
    }
    lines
}

/// `etcdctl snapshot save` from `addr` into `dir/name`.
fn save(etcdctl: &Path, addr: &str, dir: &Path, name: &str) -> std::path::PathBuf {
    let file = dir.join(name);
    let out = run_etcdctl(etcdctl, addr, &["snapshot", "save", file.to_str().unwrap()]);
    assert_success(&out, "etcdctl snapshot save");
    file
}

/// `etcdutl snapshot status -w json`: (revision, total keys).
fn status(etcdutl: &Path, file: &Path) -> (i64, i64) {
    let out = Command::new(etcdutl)
        .args(["snapshot", "status", "-w", "json"])
        .arg(file)
        .output()
        .unwrap();
    assert_success(&out, "etcdutl snapshot status");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        json["revision"].as_i64().unwrap(),
        json["totalKey"].as_i64().unwrap(),
    )
}

/// The records of one bucket of a snapshot file (its trailer cut off).
fn bucket(file: &[u8], name: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let db = Db::open(&file[..file.len() - 32]).unwrap();
    let mut items = Vec::new();
    if let Some(bucket) = db.bucket(name).unwrap() {
        db.for_each(bucket, &mut |k, v, _| {
            items.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
    }
    items
}

/// Records in every bucket, as `etcdutl snapshot status` counts them.
fn total_records(file: &[u8]) -> i64 {
    let db = Db::open(&file[..file.len() - 32]).unwrap();
    let mut names = Vec::new();
    db.for_each(db.bucket_root(), &mut |k, _, _| {
        names.push(k.to_vec());
        Ok(())
    })
    .unwrap();
    names.iter().map(|n| bucket(file, n).len() as i64).sum()
}

/// Asserts that two servers serve the same, naming the first lines that differ.
fn assert_same(got: &[String], want: &[String], what: &str) {
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g, w, "{what}");
    }
    assert_eq!(got.len(), want.len(), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cetera_snapshot_restores_into_real_etcd() {
    let (Some(etcdctl), Some(etcdutl)) = (etcdctl_35(), etcdutl()) else {
        return;
    };
    let Some(reference) = Etcd::start().await else {
        return;
    };
    let original = Cetera::start().await;
    write_history(channel(&original.endpoint()).await).await;
    write_history(channel(&reference.endpoint()).await).await;
    let dir = tempfile::tempdir().unwrap();
    let ours = save(&etcdctl, &original.addr(), dir.path(), "cetera.db");
    let theirs = save(&etcdctl, &reference.addr(), dir.path(), "etcd.db");

    // The same records as etcd's own snapshot of the same history.
    let (a, b) = (
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap(),
    );
    assert_eq!(bucket(&a, b"key"), bucket(&b, b"key"));
    assert_eq!(bucket(&a, b"lease"), bucket(&b, b"lease"));
    let names = |file: &[u8], name: &[u8]| -> Vec<Vec<u8>> {
        bucket(file, name).into_iter().map(|(k, _)| k).collect()
    };
    for name in [&b"authUsers"[..], b"authRoles"] {
        assert_eq!(names(&a, name), names(&b, name));
    }
    assert_eq!(bucket(&a, b"authRoles"), bucket(&b, b"authRoles"));
    let compacted = |file: &[u8]| {
        bucket(file, b"meta")
            .into_iter()
            .filter(|(k, _)| k.ends_with(b"CompactRev"))
            .collect::<Vec<_>>()
    };
    assert_eq!(compacted(&a), compacted(&b));
    assert_eq!(bucket(&a, b"auth"), bucket(&b, b"auth"));
    let (revision, total) = status(&etcdutl, &ours);
    let (their_revision, their_total) = status(&etcdutl, &theirs);
    assert_eq!(revision, their_revision);
    if common::oracle().is_36_or_later() {
        // etcdutl 3.6 and later count the keys alive at the end (the key
        // buckets are equal, above), 3.5 every record of every bucket.
        assert_eq!(total, their_total);
    } else {
        assert_eq!(total, total_records(&a));
    }

    // etcdutl restore, then real etcd on the restored data dir.
    let restored = Etcd::start_restored(&ours).await.unwrap();
    let want = served(&original.endpoint(), 25).await;
    let got = served(&restored.endpoint(), 25).await;
    assert_same(&got, &want, "etcd restored from cetera's snapshot");
    let reference = served(&reference.endpoint(), 25).await;
    assert_same(&reference, &want, "etcd given the same writes");
    assert!(want[1].starts_with("at 25: count 24"), "{}", want[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_snapshot_restores_into_cetera() {
    let Some(etcdctl) = etcdctl_35() else { return };
    let Some(reference) = Etcd::start().await else {
        return;
    };
    write_history(channel(&reference.endpoint()).await).await;
    let dir = tempfile::tempdir().unwrap();
    let file = save(&etcdctl, &reference.addr(), dir.path(), "etcd.db");
    let target = FreshDatabase::new(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_cetera"))
        .arg("restore")
        .arg(&file)
        .args(["--endpoint", &target.endpoint])
        .output()
        .unwrap();
    assert_success(&out, "cetera restore of an etcd snapshot");
    let restored = Cetera::start_on(&target.endpoint).await;
    assert_same(
        &served(&restored.endpoint(), 25).await,
        &served(&reference.endpoint(), 25).await,
        "cetera restored from etcd's snapshot",
    );
}
