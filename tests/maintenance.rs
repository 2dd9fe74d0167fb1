//! The Maintenance service: snapshots that etcdctl saves and `cetera restore`
//! loads back into any backend, Defragment, Hash and HashKV (errors checked
//! against real etcd 3.5.1).

mod common;

use std::path::Path;
use std::process::Command;

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cetera::proto::etcdserverpb::{
    DefragmentRequest, HashKvRequest, HashRequest, LeaseGrantRequest, MoveLeaderRequest,
    StatusRequest,
};
use common::datastore::FreshDatabase;
use common::kv_fixtures::{compact, delete_and_compact, delete_range, put_request, range_all};
use common::migration::{assert_success, lease_ttls};
use common::{Cetera, channel, differential, etcdctl_34, etcdctl_35, outcome, run_etcdctl};

/// Every key at `revision`, as text (header ids differ between servers and are left out).
async fn everything_at(kv: &mut KvClient<tonic::transport::Channel>, revision: i64) -> String {
    match kv.range(range_all(revision)).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            format!(
                "rev {} count {} more {} kvs {:?}",
                resp.header.unwrap().revision,
                resp.count,
                resp.more,
                resp.kvs
            )
        }
        Err(status) => format!("ERR {:?}: {}", status.code(), status.message()),
    }
}

/// A history with overwrites, a deletion, a compaction and two leases
/// (with fixed ids, so that two servers given it hold equal data).
/// Returns the lease ids.
async fn write_history(endpoint: &str) -> Vec<i64> {
    let channel = channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel);
    let mut leases = Vec::new();
    for (id, ttl) in [(1001, 600), (1002, 900)] {
        let grant = LeaseGrantRequest { ttl, id };
        leases.push(lease.lease_grant(grant).await.unwrap().into_inner().id);
    }
    for i in 0..20 {
        kv.put(put_request(&format!("/k/{i:02}"), &format!("v{i}"), 0))
            .await
            .unwrap();
    }
    for i in 0..10 {
        kv.put(put_request(
            &format!("/k/{i:02}"),
            &format!("w{i}"),
            leases[i % 2],
        ))
        .await
        .unwrap();
    }
    delete_range(&mut kv, "/k/15", "/k/18").await;
    compact(&mut kv, 12).await;
    kv.put(put_request("/k/00", "x", 0)).await.unwrap();
    leases
}

/// Runs `cetera restore FILE --endpoint ENDPOINT [extra]`.
fn restore(file: &Path, endpoint: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cetera"))
        .arg("restore")
        .arg(file)
        .args(["--endpoint", endpoint])
        .args(extra)
        .output()
        .expect("run cetera restore")
}

/// What a server holds at every readable revision, and its leases.
async fn state(endpoint: &str, from: i64, through: i64) -> Vec<String> {
    let channel = channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let mut lines = Vec::new();
    for revision in from..=through {
        lines.push(everything_at(&mut kv, revision).await);
    }
    for (id, ttl) in lease_ttls(channel).await {
        lines.push(format!(
            "lease {id} granted {} keys {:?}",
            ttl.granted_ttl, ttl.keys
        ));
    }
    lines
}

async fn snapshot_restores_on_the_test_backend(etcdctl: &Path) {
    let original = Cetera::start().await;
    write_history(&original.endpoint()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snapshot.db");
    let saved = run_etcdctl(
        etcdctl,
        &original.addr(),
        &["snapshot", "save", file.to_str().unwrap()],
    );
    assert_success(&saved, "etcdctl snapshot save");
    // etcdctl keeps the checksum trailer.
    assert_eq!(std::fs::metadata(&file).unwrap().len() % 512, 32);

    let target = FreshDatabase::new(dir.path());
    assert_success(&restore(&file, &target.endpoint, &[]), "cetera restore");
    let restored = Cetera::start_on(&target.endpoint).await;
    // Revision 1 to 11 are compacted away, 12 is the compact revision.
    let want = state(&original.endpoint(), 1, 33).await;
    let got = state(&restored.endpoint(), 1, 33).await;
    assert_eq!(got, want);
    assert!(want[0].contains("required revision has been compacted"));
    assert!(want[32].starts_with("rev 33 count 17"), "{}", want[32]);
    let (mut got, mut want) = (
        hashes(&restored.endpoint(), 33).await,
        hashes(&original.endpoint(), 33).await,
    );
    if common::oracle().is_36_or_later() {
        // At the compact revision (12) etcd 3.6+ answers the digest it kept
        // when it compacted, naming the compaction before that one (none:
        // -1); a restored or restarted server has kept none and names the
        // compact revision itself, as a restarted etcd does. The digests
        // themselves agree.
        for answers in [&mut got, &mut want] {
            answers[12] = answers[12].split(" compact").next().unwrap().to_string();
        }
    }
    assert_eq!(got, want);

    // The restored store is a cluster of its own.
    let status = |endpoint: String| async move {
        let mut m = MaintenanceClient::new(channel(&endpoint).await);
        m.status(StatusRequest {}).await.unwrap().into_inner()
    };
    let (a, b) = (
        status(original.endpoint()).await,
        status(restored.endpoint()).await,
    );
    assert_ne!(a.header.unwrap().cluster_id, b.header.unwrap().cluster_id);
    drop(restored);

    // A datastore with data is not overwritten unless asked.
    let refused = restore(&file, &target.endpoint, &[]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("use --force"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_success(
        &restore(&file, &target.endpoint, &["--force"]),
        "restore --force",
    );

    // A corrupt snapshot is refused before anything is written.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[5000] ^= 1;
    let corrupt = dir.path().join("corrupt.db");
    std::fs::write(&corrupt, bytes).unwrap();
    let refused = restore(&corrupt, &target.endpoint, &["--force"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("checksum does not match"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_35_snapshot_restores_every_revision_and_lease() {
    let Some(etcdctl) = etcdctl_35() else { return };
    snapshot_restores_on_the_test_backend(&etcdctl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_34_snapshot_restores_every_revision_and_lease() {
    let Some(etcdctl) = etcdctl_34() else { return };
    snapshot_restores_on_the_test_backend(&etcdctl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_taken_during_writes_is_one_revision() {
    let Some(etcdctl) = etcdctl_35() else { return };
    let original = Cetera::start().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (endpoint, stop) = (original.endpoint(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut kv = KvClient::new(channel(&endpoint).await);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                kv.put(put_request(
                    &format!("/w{w}/{}", i % 50),
                    &format!("{i}"),
                    0,
                ))
                .await
                .unwrap();
                i += 1;
            }
            i
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snapshot.db");
    let saved = run_etcdctl(
        &etcdctl,
        &original.addr(),
        &["snapshot", "save", file.to_str().unwrap()],
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut written = 0;
    for writer in writers {
        written += writer.await.unwrap();
    }
    assert_success(&saved, "etcdctl snapshot save");
    let target = FreshDatabase::new(dir.path());
    assert_success(&restore(&file, &target.endpoint, &[]), "cetera restore");
    let restored = Cetera::start_on(&target.endpoint).await;
    let mut kv = KvClient::new(channel(&restored.endpoint()).await);
    let at = everything_at(&mut kv, 0).await;
    let revision: i64 = at.split(' ').nth(1).unwrap().parse().unwrap();
    // Writers ran before the snapshot (and went on after it).
    assert!(
        revision > 1 && revision <= written + 1,
        "snapshot at {revision}"
    );
    // The copy holds exactly the original's state at that revision, and its history.
    let mut original_kv = KvClient::new(channel(&original.endpoint()).await);
    for r in [revision / 2, revision - 1, revision] {
        let mut want = everything_at(&mut original_kv, r).await;
        let mut got = everything_at(&mut kv, r).await;
        // The header revision is each server's current one.
        want = want.split_once(" count").unwrap().1.to_string();
        got = got.split_once(" count").unwrap().1.to_string();
        assert_eq!(got, want, "at revision {r}");
    }
}

async fn status(maintenance: &mut MaintenanceClient<tonic::transport::Channel>) -> (i64, i64) {
    let status = maintenance
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    (status.db_size, status.db_size_in_use)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_gives_back_the_space_of_deleted_keys() {
    let Some(etcdctl) = etcdctl_35() else { return };
    let server = Cetera::start().await;
    let channel = channel(&server.endpoint()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel);
    let value = "x".repeat(4000);
    for i in 0..500 {
        kv.put(put_request(&format!("/big/{i:04}"), &value, 0))
            .await
            .unwrap();
    }
    kv.put(put_request("/keep", "kept", 0)).await.unwrap();
    let deleted = delete_and_compact(&mut kv, "/big/", "/big0").await;
    assert_eq!(deleted.deleted, 500);
    let before = status(&mut maintenance).await;
    let defrag = run_etcdctl(&etcdctl, &server.addr(), &["defrag"]);
    assert_success(&defrag, "etcdctl defrag");
    let after = status(&mut maintenance).await;
    if server.datastore_endpoint().starts_with("sqlite://") {
        assert!(
            before.1 < before.0 / 2,
            "freed pages are not in use: {before:?}"
        );
        assert!(
            after.0 < before.0 / 4,
            "defrag shrank the file: before {before:?}, after {after:?}"
        );
        assert_eq!(after.0, after.1, "no free pages are left");
    }
    assert!(everything_at(&mut kv, 0).await.contains("count 1 "));
}

/// Puts `count` keys of 4000 bytes under `prefix` (which ends in '/'), deletes
/// them, and compacts their history away physically.
async fn fill_and_compact_away(
    kv: &mut KvClient<tonic::transport::Channel>,
    prefix: &str,
    count: usize,
) {
    let value = "x".repeat(4000);
    for i in 0..count {
        kv.put(put_request(&format!("{prefix}{i:04}"), &value, 0))
            .await
            .unwrap();
    }
    let range_end = format!("{}0", prefix.trim_end_matches('/'));
    delete_and_compact(kv, prefix, &range_end).await;
}

/// After many keys are deleted and compacted away, Status reports less space in use
/// than the database takes (etcd: the file minus its free pages), on every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_in_use_excludes_the_space_deletes_freed() {
    let server = Cetera::start().await;
    let channel = channel(&server.endpoint()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel);
    fill_and_compact_away(&mut kv, "/gone/", 300).await;
    let (size, in_use) = status(&mut maintenance).await;
    assert!(
        0 < in_use && in_use < size,
        "dbSize {size}, dbSizeInUse {in_use}"
    );
}

/// A SQLite database made before cetera turned on incremental vacuum is
/// converted by its first Defragment, and shrinks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_converts_an_old_sqlite_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA auto_vacuum = NONE; CREATE TABLE older_tool (x INTEGER);")
            .unwrap();
    }
    let endpoint = format!("sqlite://{}", path.display());
    let server = Cetera::start_on(&endpoint).await;
    let channel = channel(&server.endpoint()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel);
    fill_and_compact_away(&mut kv, "/big/", 300).await;
    let before = status(&mut maintenance).await;
    maintenance.defragment(DefragmentRequest {}).await.unwrap();
    let after = status(&mut maintenance).await;
    assert!(after.0 < before.0 / 4, "before {before:?}, after {after:?}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, 2, "now incremental");
}

/// HashKV at every revision, by raw gRPC.
async fn hashes(endpoint: &str, through: i64) -> Vec<String> {
    let mut maintenance = MaintenanceClient::new(channel(endpoint).await);
    let mut out = Vec::new();
    for revision in 0..=through {
        out.push(outcome(
            maintenance.hash_kv(HashKvRequest { revision }).await,
            |r| format!("{} compact {}", r.hash, r.compact_revision),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_is_equal_for_equal_data_on_different_backends() {
    let Some(etcdctl) = etcdctl_35() else { return };
    // One server on the backend under test, one on SQLite.
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("other.db").display());
    let (a, b) = (Cetera::start().await, Cetera::start_on(&sqlite).await);
    write_history(&a.endpoint()).await;
    write_history(&b.endpoint()).await;
    let (ha, hb) = (
        hashes(&a.endpoint(), 33).await,
        hashes(&b.endpoint(), 33).await,
    );
    assert_eq!(ha, hb);
    assert!(ha[11].starts_with("ERR OutOfRange"), "{}", ha[11]);
    assert!(ha[13].ends_with("compact 12"), "{}", ha[13]);

    let hash_of = |addr: String| {
        let etcdctl = etcdctl.clone();
        move || {
            let out = run_etcdctl(&etcdctl, &addr, &["endpoint", "hashkv", "-w", "json"]);
            assert_success(&out, "etcdctl endpoint hashkv");
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            json[0]["HashKV"]["hash"].as_u64().unwrap()
        }
    };
    let (hash_a, hash_b) = (hash_of(a.addr()), hash_of(b.addr()));
    assert_eq!(hash_a(), hash_b());

    let mut kv = KvClient::new(channel(&b.endpoint()).await);
    kv.put(put_request("/k/00", "x", 0)).await.unwrap();
    assert_ne!(
        hash_a(),
        hash_b(),
        "the same value rewritten is a new revision"
    );
    // Older revisions still agree.
    assert_eq!(hashes(&b.endpoint(), 33).await[1..], ha[1..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_and_hash_errors_match_etcd() {
    differential(&[], &[], async |side| {
        let mut maintenance = MaintenanceClient::new(side.channel.clone());
        for i in 0..6 {
            side.put(format!("k{}", i % 2).as_bytes(), b"v").await;
        }
        side.compact(4).await;
        for revision in [-1, 0, 1, 3, 4, 5, 7, 8, 100] {
            let result = maintenance.hash_kv(HashKvRequest { revision }).await;
            let shown = outcome(result, |r| {
                format!(
                    "header rev {} compact {}",
                    r.header.as_ref().unwrap().revision,
                    r.compact_revision
                )
            });
            side.note(format!("hashkv {revision}"), shown);
        }
        let shown = outcome(maintenance.hash(HashRequest {}).await, |r| {
            format!("header rev {}", r.header.as_ref().unwrap().revision)
        });
        side.note("hash", shown);
        let shown = outcome(maintenance.defragment(DefragmentRequest {}).await, |r| {
            format!("{r:?}")
        });
        side.note("defragment", shown);
    })
    .await;
}

/// A single member leads already: MoveLeader to itself succeeds without a
/// header, to anyone else it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_on_a_single_member_matches_etcd() {
    differential(&[], &[], async |side| {
        let mut maintenance = MaintenanceClient::new(side.channel.clone());
        let status = maintenance.status(StatusRequest {}).await.unwrap();
        let me = status.get_ref().header.as_ref().unwrap().member_id;
        for (what, target_id) in [("itself", me), ("unknown", me ^ 1), ("zero", 0)] {
            let result = maintenance
                .move_leader(MoveLeaderRequest { target_id })
                .await;
            side.note(
                format!("move to {what}"),
                outcome(result, |r| format!("{r:?}")),
            );
        }
    })
    .await;
}

/// Users, roles and the enabled flag are part of the data, as in an etcd
/// snapshot: the restored store asks for the same passwords and grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_restore_keeps_auth() {
    let Some(etcdctl) = etcdctl_35() else { return };
    let original = Cetera::start().await;
    let addr = original.addr();
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "reader:readerpw"],
        &["role", "add", "readers"],
        &[
            "role",
            "grant-permission",
            "readers",
            "read",
            "/a/",
            "--prefix=true",
        ],
        &["user", "grant-role", "reader", "readers"],
        &["put", "/a/1", "one"],
        &["auth", "enable"],
    ] {
        assert_success(&run_etcdctl(&etcdctl, &addr, args), &args.join(" "));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snapshot.db");
    let saved = run_etcdctl(
        &etcdctl,
        &addr,
        &[
            "--user",
            "root:rootpw",
            "snapshot",
            "save",
            file.to_str().unwrap(),
        ],
    );
    assert_success(&saved, "etcdctl snapshot save");

    let target = FreshDatabase::new(dir.path());
    assert_success(&restore(&file, &target.endpoint, &[]), "cetera restore");
    let restored = Cetera::start_on(&target.endpoint).await;
    let addr = restored.addr();
    let read = run_etcdctl(
        &etcdctl,
        &addr,
        &["--user", "reader:readerpw", "get", "/a/1"],
    );
    assert_success(&read, "get as reader");
    assert!(String::from_utf8_lossy(&read.stdout).contains("one"));
    let write = run_etcdctl(
        &etcdctl,
        &addr,
        &["--user", "reader:readerpw", "put", "/a/1", "x"],
    );
    assert!(
        String::from_utf8_lossy(&write.stderr).contains("permission denied"),
        "{write:?}"
    );
    let anonymous = run_etcdctl(&etcdctl, &addr, &["get", "/a/1"]);
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("user name is empty"),
        "{anonymous:?}"
    );
    let status = run_etcdctl(
        &etcdctl,
        &addr,
        &["--user", "root:rootpw", "auth", "status"],
    );
    assert!(String::from_utf8_lossy(&status.stdout).contains("Authentication Status: true"));
}
