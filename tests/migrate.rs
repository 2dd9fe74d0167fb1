//! `cetera migrate`: a round trip SQLite -> PostgreSQL -> MySQL -> SQLite of a
//! store with 10k keys, history, deletions, a compaction and leases, compared
//! at every revision; migration without history; refusing a non-empty
//! target; a migration killed half-way, then run again; and an import from
//! a live etcd 3.5.1 populated with etcdctl.

mod common;

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::process::Command;

use cetera::backend::sqlite::Sqlite;
use cetera::backend::{Backend, LeaseRow, LogEntry, ReadTxn, Revisions, WriteTxn};
use cetera::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cetera::proto::etcdserverpb::request_op::Request;
use cetera::proto::etcdserverpb::{
    Compare, HashKvRequest, LeaseGrantRequest, RangeResponse, RequestOp, StatusRequest, TxnRequest,
};
use cetera::proto::mvccpb::KeyValue;
use common::datastore::{FreshDatabase, TestBackend};
use common::kv_fixtures::{compact, delete_range, get, put_request, range_all};
use common::migration::{
    all_keys, assert_empty_store, assert_prints, assert_success, etcdctl_on, json_revision,
    kill_migrate_at_progress, lease_ttls, leases, migrate, put_in_txns, text,
};
use common::{Cetera, Etcd, channel, etcdctl_35, in_ci};

/// 10k keys written 100 to a transaction, overwrites (some under leases),
/// a range deletion, a compaction at revision 120, then more changes.
/// Returns the current revision.
async fn write_store(endpoint: &str) -> i64 {
    let channel = channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel);
    for (id, ttl) in [(7001, 3600), (7002, 7200)] {
        lease
            .lease_grant(LeaseGrantRequest { ttl, id })
            .await
            .unwrap();
    }
    for batch in 0..100 {
        let success = (0..100)
            .map(|i| RequestOp {
                request: Some(Request::RequestPut(put_request(
                    &format!("/data/{:05}", batch * 100 + i),
                    &format!("v{i}"),
                    0,
                ))),
            })
            .collect();
        // A compare that holds, so the transaction is a real conditional one.
        let compare = vec![Compare {
            result: CompareResult::Greater as i32,
            target: CompareTarget::Mod as i32,
            key: b"/nothing".to_vec(),
            target_union: Some(TargetUnion::ModRevision(-1)),
            ..Default::default()
        }];
        let txn = TxnRequest {
            compare,
            success,
            failure: vec![],
        };
        kv.txn(txn).await.unwrap();
    }
    for j in 0..50 {
        let lease = [0, 7001, 7002][j % 3];
        kv.put(put_request(
            &format!("/data/{j:05}"),
            &format!("w{j}"),
            lease,
        ))
        .await
        .unwrap();
    }
    delete_range(&mut kv, "/data/00100", "/data/00150").await;
    compact(&mut kv, 120).await;
    for k in 0..30 {
        let lease = if k % 4 == 0 { 7002 } else { 0 };
        kv.put(put_request(&format!("/extra/{k:03}"), "e", lease))
            .await
            .unwrap();
    }
    let mut last = 0;
    for k in 0..5 {
        let key = format!("/extra/{:03}", k * 2 + 1);
        last = delete_range(&mut kv, &key, "")
            .await
            .header
            .unwrap()
            .revision;
    }
    last
}

/// The full range at `revision` in one line: header revision, count and a digest of the
/// keys.
fn digest_line(revision: i64, resp: RangeResponse) -> String {
    let mut hasher = DefaultHasher::new();
    format!("{:?}", resp.kvs).hash(&mut hasher);
    format!(
        "rev {revision}: header {} count {} digest {:x}",
        resp.header.unwrap().revision,
        resp.count,
        hasher.finish()
    )
}

/// What a server holds: for every revision from 1 to `through` a digest of
/// the full range (or the error), HashKV at the current revision and after
/// the compact revision, the leases with their keys, and the cluster id.
async fn state(endpoint: &str, through: i64) -> Vec<String> {
    let channel = channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let mut lines = Vec::new();
    for revision in 1..=through {
        lines.push(match kv.range(range_all(revision)).await {
            Ok(resp) => digest_line(revision, resp.into_inner()),
            Err(status) => format!("rev {revision}: {:?} {}", status.code(), status.message()),
        });
    }
    let mut maintenance = MaintenanceClient::new(channel.clone());
    // (No hashes when asked for no revisions: only the leases and identity.)
    for revision in [0, 121].into_iter().filter(|_| through > 0) {
        let hash = maintenance
            .hash_kv(HashKvRequest { revision })
            .await
            .unwrap()
            .into_inner();
        lines.push(format!(
            "hashkv {revision}: {} compact {}",
            hash.hash, hash.compact_revision
        ));
    }
    let status = maintenance.status(StatusRequest {}).await.unwrap();
    lines.push(format!(
        "cluster {}",
        status.into_inner().header.unwrap().cluster_id
    ));
    for (id, ttl) in lease_ttls(channel).await {
        lines.push(format!(
            "lease {id} granted {} keys {:?}",
            ttl.granted_ttl, ttl.keys
        ));
    }
    lines
}

/// The lease rows of an SQLite store, deadlines included.
async fn lease_rows(path: &str) -> Vec<LeaseRow> {
    let backend = Sqlite::open(Path::new(path)).unwrap();
    let mut rows = backend.read().await.unwrap().leases().await.unwrap();
    rows.sort_by_key(|row| row.id);
    rows
}

/// Skips (or, in CI, fails) when a database server is not running.
fn servers_reachable() -> bool {
    for backend in [TestBackend::Postgres, TestBackend::Mysql] {
        if !FreshDatabase::reachable(backend) {
            if in_ci() {
                panic!("{backend:?} is not reachable (CI=true, so this is an error)");
            }
            eprintln!("!!! WARNING: {backend:?} is not reachable; SKIPPING this test");
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_sqlite_postgres_mysql_sqlite_keeps_everything() {
    if !servers_reachable() {
        return;
    }
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let original = FreshDatabase::of(TestBackend::Sqlite, dir_a.path());
    let postgres = FreshDatabase::of(TestBackend::Postgres, dir_a.path());
    let mysql = FreshDatabase::of(TestBackend::Mysql, dir_a.path());
    let back = FreshDatabase::of(TestBackend::Sqlite, dir_b.path());

    let mut server = Cetera::start_on(&original.endpoint).await;
    let current = write_store(&server.endpoint()).await;
    server.kill();

    let mut outputs = Vec::new();
    for (from, to) in [(&original, &postgres), (&postgres, &mysql), (&mysql, &back)] {
        let output = migrate(&from.endpoint, &to.endpoint, &[]);
        assert_success(&output, "cetera migrate");
        outputs.push(String::from_utf8_lossy(&output.stdout).to_string());
    }
    // Each migration printed its verification.
    for stdout in &outputs {
        assert_prints(
            stdout,
            &format!("migrated: revision {current}, compact revision 120"),
        );
        assert_prints(
            stdout,
            &format!("verified HashKV at revision {current}: source"),
        );
        assert_prints(stdout, "verified HashKV at revision 121");
        assert_prints(
            stdout,
            &format!("verified keys at revision {current}: source 9975 target 9975"),
        );
        assert_prints(stdout, "verified leases: source 2 target 2");
    }

    // Lease deadlines are carried over exactly (the remaining TTL is kept).
    let (before, after) = (
        lease_rows(original.sqlite_path().unwrap()).await,
        lease_rows(back.sqlite_path().unwrap()).await,
    );
    assert_eq!(before.len(), 2);
    assert_eq!(after, before);

    let mut want = None;
    for store in [&original, &postgres, &mysql, &back] {
        let server = Cetera::start_on(&store.endpoint).await;
        let got = state(&server.endpoint(), current).await;
        match &want {
            None => {
                assert!(got[0].contains("required revision has been compacted"));
                assert!(got[119].contains("count 10000"), "{}", got[119]);
                want = Some(got);
            }
            Some(want) => assert_eq!(&got, want, "{}", store.endpoint),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_history_only_live_keys_are_copied_and_old_revisions_are_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let source_dir = tempfile::tempdir().unwrap();
    let source = FreshDatabase::of(TestBackend::Sqlite, source_dir.path());
    let target = FreshDatabase::new(dir.path());
    let mut server = Cetera::start_on(&source.endpoint).await;
    let current = write_store(&server.endpoint()).await;
    let want = state(&server.endpoint(), current).await;
    server.kill();

    let output = migrate(&source.endpoint, &target.endpoint, &["--history=false"]);
    assert_success(&output, "cetera migrate --history=false");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_prints(
        &stdout,
        &format!("migrated: revision {current}, compact revision {current}, history dropped"),
    );
    assert_prints(
        &stdout,
        &format!("verified keys at revision {current}: source 9975"),
    );

    let server = Cetera::start_on(&target.endpoint).await;
    let channel = channel(&server.endpoint()).await;
    let mut kv = KvClient::new(channel);
    // The current revision reads the same keys, with their create and mod
    // revisions and versions; every older revision is compacted.
    let mut got_current = None;
    for revision in [1, 121, current - 1, current] {
        match kv.range(range_all(revision)).await {
            Ok(resp) => {
                assert_eq!(revision, current);
                got_current = Some(digest_line(revision, resp.into_inner()));
            }
            Err(status) => {
                assert!(revision < current);
                assert_eq!(
                    status.message(),
                    "etcdserver: mvcc: required revision has been compacted"
                );
            }
        }
    }
    assert_eq!(got_current.as_ref(), Some(&want[current as usize - 1]));
    // Leases and their keys are kept.
    let leases = state(&server.endpoint(), 0).await;
    let want_leases: Vec<&String> = want.iter().filter(|l| l.starts_with("lease ")).collect();
    let got_leases: Vec<&String> = leases.iter().filter(|l| l.starts_with("lease ")).collect();
    assert_eq!(got_leases, want_leases);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_with_data_is_refused_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let source_dir = tempfile::tempdir().unwrap();
    let source = FreshDatabase::of(TestBackend::Sqlite, source_dir.path());
    write_log(Path::new(source.sqlite_path().unwrap()), 300).await;
    let target = FreshDatabase::new(dir.path());
    assert_success(
        &migrate(&source.endpoint, &target.endpoint, &[]),
        "first migrate",
    );
    let refused = migrate(&source.endpoint, &target.endpoint, &[]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("the target datastore is not empty (revision 301, 300 keys"),
        "{}",
        text(&refused)
    );
    let forced = migrate(&source.endpoint, &target.endpoint, &["--force"]);
    assert_success(&forced, "migrate --force");
    assert!(String::from_utf8_lossy(&forced.stdout).contains("verified keys at revision 301"));

    // Nonsense is refused before anything is opened.
    let same = migrate(&source.endpoint, &source.endpoint, &[]);
    assert!(
        text(&same).contains("name the same datastore"),
        "{}",
        text(&same)
    );
    let missing = migrate(
        "sqlite:///nonexistent/cetera.db",
        &target.endpoint,
        &["--force"],
    );
    assert!(
        text(&missing).contains("does not exist"),
        "{}",
        text(&missing)
    );
}

/// Writes a store of `revisions` single-key changes straight through the
/// backend (faster than through a server): keys /big/0000../big/4999 are
/// written over and over, so there are versions and history.
async fn write_log(path: &Path, revisions: i64) {
    let backend = Sqlite::open(path).unwrap();
    let mut txn = backend.write().await.unwrap();
    let mut keys: HashMap<Vec<u8>, (i64, i64)> = HashMap::new();
    for revision in 2..=revisions + 1 {
        let key = format!("/big/{:04}", revision % 5000).into_bytes();
        let (create, version) = keys.entry(key.clone()).or_insert((revision, 0));
        *version += 1;
        let kv = KeyValue {
            key,
            value: vec![b'x'; 100],
            create_revision: *create,
            mod_revision: revision,
            version: *version,
            lease: 0,
        };
        let entry = LogEntry {
            kv,
            sub: 0,
            deleted: false,
        };
        txn.append(&entry).await.unwrap();
    }
    let counters = Revisions {
        current: revisions + 1,
        compact: -1,
        compacted_through: 0,
    };
    txn.set_revisions(counters).await.unwrap();
    txn.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_killed_half_way_leaves_an_empty_target_and_a_rerun_completes() {
    let dir = tempfile::tempdir().unwrap();
    let source_dir = tempfile::tempdir().unwrap();
    let source = FreshDatabase::of(TestBackend::Sqlite, source_dir.path());
    write_log(Path::new(source.sqlite_path().unwrap()), 20_000).await;
    let target = FreshDatabase::new(dir.path());

    // Killed once it reports revisions copied (a tenth of them).
    kill_migrate_at_progress(&source.endpoint, &target.endpoint, " of 20001 revisions");
    // Nothing was committed: the target is an empty store.
    assert_empty_store(&target.endpoint).await;

    // So a rerun needs no --force, and completes and verifies.
    let rerun = migrate(&source.endpoint, &target.endpoint, &[]);
    assert_success(&rerun, "rerun of cetera migrate");
    let stdout = String::from_utf8_lossy(&rerun.stdout);
    assert_prints(&stdout, "verified HashKV at revision 20001");
    assert_prints(
        &stdout,
        "verified keys at revision 20001: source 5000 target 5000",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_a_live_etcd_at_one_revision() {
    let (Some(etcd), Some(etcdctl)) = (Etcd::start().await, etcdctl_35()) else {
        return;
    };
    let addr = etcd.addr();
    let ctl = etcdctl_on(&etcdctl, &addr);
    // Keys written and rewritten (versions), a transaction, deletions, a
    // compaction, and a lease with keys, all with etcdctl...
    let granted = ctl(&["lease", "grant", "3600"]);
    let lease_hex = granted.split_whitespace().nth(1).unwrap().to_string();
    for i in 0..5 {
        ctl(&["put", &format!("/app/{i}"), &format!("one{i}")]);
        ctl(&["put", &format!("/app/{i}"), &format!("two{i}")]);
    }
    ctl(&["put", "/leased/a", "x", &format!("--lease={lease_hex}")]);
    ctl(&["put", "/leased/b", "y", &format!("--lease={lease_hex}")]);
    ctl(&["del", "/app/3"]);
    let compact_at = json_revision(&ctl(&["put", "/app/3", "again", "-w", "json"]));
    ctl(&["compaction", &compact_at.to_string()]);
    // ...and, to need several pages, 2500 keys three transactions at a time.
    let mut kv = KvClient::new(channel(&etcd.endpoint()).await);
    put_in_txns(&mut kv, 2500, |n| (format!("/bulk/{n:05}"), "b".into())).await;
    ctl(&["put", "/app/0", "three"]);
    let (pinned, want_keys) = all_keys(&etcd.endpoint(), 0).await.unwrap();
    let want_leases = leases(&etcd.endpoint()).await;
    assert_eq!(want_keys.len(), 2507);

    let dir = tempfile::tempdir().unwrap();
    let target = FreshDatabase::new(dir.path());
    let output = migrate(&etcd.endpoint(), &target.endpoint, &[]);
    assert_success(&output, "cetera migrate --from etcd");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_prints(
        &stdout,
        &format!("migrated: revision {pinned}, compact revision {pinned}, history dropped"),
    );
    assert_prints(
        &stdout,
        &format!("verified keys at revision {pinned}: source 2507 target 2507"),
    );
    assert_prints(&stdout, "verified leases: source 1 target 1");

    let server = Cetera::start_on(&target.endpoint).await;
    // The same keys, values, create and mod revisions, versions and leases,
    // at the same revision; older revisions are compacted.
    let (got_revision, got_keys) = all_keys(&server.endpoint(), 0).await.unwrap();
    assert_eq!(got_revision, pinned);
    assert_eq!(got_keys, want_keys);
    assert_eq!(
        all_keys(&server.endpoint(), pinned - 1).await.unwrap_err(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    let got_leases = leases(&server.endpoint()).await;
    assert_eq!(got_leases.len(), 1);
    let ((id, granted, remaining, keys), (want_id, want_granted, want_remaining, want_lease_keys)) =
        (&got_leases[0], &want_leases[0]);
    assert_eq!(
        (id, granted, keys),
        (want_id, want_granted, want_lease_keys)
    );
    assert_eq!(keys.len(), 2);
    // The remaining TTL carries over (it is not reset to the granted TTL).
    assert!(
        *remaining > 0 && remaining <= want_remaining,
        "{remaining} vs {want_remaining}"
    );

    // A server with data is refused as a target, as for datastores.
    drop(server);
    let refused = migrate(&etcd.endpoint(), &target.endpoint, &[]);
    assert!(text(&refused).contains("use --force"), "{}", text(&refused));
}

/// The SQLite file of a running server is neither a migration's source or
/// target nor a restore's target: each is refused, naming the file, and
/// the server goes on serving what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_servers_sqlite_file_is_refused_by_migrate_and_restore() {
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let held = FreshDatabase::of(TestBackend::Sqlite, dir.path());
    let other = FreshDatabase::of(TestBackend::Sqlite, other_dir.path());
    let other_path = other.sqlite_path().unwrap();
    drop(Sqlite::open(Path::new(other_path)).unwrap());
    let server = Cetera::start_on(&held.endpoint).await;
    let mut kv = KvClient::new(channel(&server.endpoint()).await);
    kv.put(put_request("k", "v", 0)).await.unwrap();

    let from = migrate(&held.endpoint, &other.endpoint, &["--force"]);
    let to = migrate(&other.endpoint, &held.endpoint, &["--force"]);
    let restore = Command::new(env!("CARGO_BIN_EXE_cetera"))
        .args([
            "restore",
            other_path,
            "--force",
            "--endpoint",
            &held.endpoint,
        ])
        .output()
        .expect("run cetera restore");
    for (output, what) in [
        (from, "migrate from"),
        (to, "migrate to"),
        (restore, "restore into"),
    ] {
        assert!(!output.status.success(), "{what}: {}", text(&output));
        let message = format!(
            "SQLite database {} is in use by another cetera process",
            held.sqlite_path().unwrap()
        );
        assert!(
            text(&output).contains(&message),
            "{what}: {}",
            text(&output)
        );
    }
    assert_eq!(get(&mut kv, "k").await.kvs[0].value, b"v");
}
