//! `cetera migrate --from etcd-snapshot://FILE`: a real etcd 3.5.1 populated
//! with etcdctl (puts, overwrites, a deletion, a lease with keys, a
//! compaction) and over gRPC (hundreds of keys in transactions and a value
//! larger than a bbolt page, so the file has branch and overflow pages) is
//! saved with `etcdctl snapshot save`, imported into a fresh datastore, and
//! cetera on it is compared with the live etcd at every revision; also
//! without the trailer, with a damaged trailer, and with --history=false.

mod common;

use cetera::proto::etcdserverpb::kv_client::KvClient;
use common::datastore::FreshDatabase;
use common::migration::{
    all_keys, assert_prints, etcdctl_on, json_revision, leases, migrate, put_in_txns, text,
};
use common::{Cetera, Etcd, channel, etcdctl_35};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_an_etcdctl_snapshot_with_its_history() {
    let (Some(etcd), Some(etcdctl)) = (Etcd::start().await, etcdctl_35()) else {
        return;
    };
    let addr = etcd.addr();
    let ctl = etcdctl_on(&etcdctl, &addr);
    // Old history, compacted away: versions and a deletion below it.
    for i in 0..5 {
        ctl(&["put", &format!("/app/{i}"), &format!("one{i}")]);
        ctl(&["put", &format!("/app/{i}"), &format!("two{i}")]);
    }
    ctl(&["del", "/app/4"]);
    let granted = ctl(&["lease", "grant", "3600"]);
    let lease_hex = granted.split_whitespace().nth(1).unwrap().to_string();
    ctl(&["put", "/leased/a", "x", &format!("--lease={lease_hex}")]);
    let compact_at = json_revision(&ctl(&["put", "/app/3", "three", "-w", "json"]));
    ctl(&["compaction", "--physical", &compact_at.to_string()]);
    // History kept: overwrites, a deletion, a lease, hundreds of keys in
    // transactions, and a value larger than a page.
    ctl(&["put", "/leased/b", "y", &format!("--lease={lease_hex}")]);
    ctl(&["put", "/app/0", "again"]);
    ctl(&["del", "/app/1"]);
    let mut kv = KvClient::new(channel(&etcd.endpoint()).await);
    put_in_txns(&mut kv, 600, |n| {
        (
            format!("/bulk/{n:05}"),
            format!("value {} {}", n / 100, n % 100),
        )
    })
    .await;
    ctl(&["put", "/big", &"z".repeat(20_000)]);
    ctl(&["del", "/bulk/00042"]);
    ctl(&["put", "/app/2", "last"]);
    let (current, live) = all_keys(&etcd.endpoint(), 0).await.unwrap();
    let want_leases = leases(&etcd.endpoint()).await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etcd.db");
    ctl(&["snapshot", "save", file.to_str().unwrap()]);
    // etcdctl keeps the SHA-256 trailer the server sends.
    let size = std::fs::metadata(&file).unwrap().len();
    assert_eq!(size % 512, 32, "snapshot size {size}");

    let target = FreshDatabase::new(dir.path());
    let output = migrate(
        &format!("etcd-snapshot://{}", file.display()),
        &target.endpoint,
        &[],
    );
    assert!(output.status.success(), "migrate: {}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_prints(
        &stdout,
        &format!("migrated: revision {current}, compact revision {compact_at}, history kept"),
    );
    assert_prints(
        &stdout,
        &format!(
            "verified keys at revision {current}: source {0} target {0}",
            live.len()
        ),
    );
    assert_prints(&stdout, "verified leases: source 1 target 1");

    let server = Cetera::start_on(&target.endpoint).await;
    // Every readable revision, from the compact revision on, is the same.
    for revision in compact_at..=current {
        assert_eq!(
            all_keys(&server.endpoint(), revision).await,
            all_keys(&etcd.endpoint(), revision).await,
            "at revision {revision}"
        );
    }
    assert_eq!(
        all_keys(&server.endpoint(), 0).await.unwrap(),
        (current, live)
    );
    let compacted = all_keys(&server.endpoint(), compact_at - 1).await;
    assert_eq!(compacted, all_keys(&etcd.endpoint(), compact_at - 1).await);
    assert_eq!(
        compacted.unwrap_err(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    // The lease, its TTL and keys; as when etcd restores a snapshot, it
    // starts again with its TTL.
    let got_leases = leases(&server.endpoint()).await;
    assert_eq!(got_leases.len(), 1);
    let (id, granted, remaining, keys) = &got_leases[0];
    let (want_id, want_granted, _, want_keys) = &want_leases[0];
    assert_eq!((id, granted, keys), (want_id, want_granted, want_keys));
    assert_eq!(keys.len(), 2);
    assert!(*remaining > 0 && remaining <= granted, "{remaining}");
    drop(server);

    // A target with data is refused; the same file without its trailer
    // (as an etcd data directory's member/snap/db) imports the same.
    let refused = migrate(
        &format!("etcd-snapshot://{}", file.display()),
        &target.endpoint,
        &[],
    );
    assert!(text(&refused).contains("use --force"), "{}", text(&refused));
    let bytes = std::fs::read(&file).unwrap();
    let bare = dir.path().join("bare.db");
    std::fs::write(&bare, &bytes[..bytes.len() - 32]).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other = FreshDatabase::new(other_dir.path());
    let output = migrate(
        &format!("etcd-snapshot://{}", bare.display()),
        &other.endpoint,
        &[],
    );
    assert!(output.status.success(), "migrate bare: {}", text(&output));
    let server = Cetera::start_on(&other.endpoint).await;
    assert_eq!(
        all_keys(&server.endpoint(), compact_at).await,
        all_keys(&etcd.endpoint(), compact_at).await
    );
    drop(server);

    // Without history: the live keys, compacted at the current revision.
    let live_dir = tempfile::tempdir().unwrap();
    let live_only = FreshDatabase::new(live_dir.path());
    let from = format!("etcd-snapshot://{}", file.display());
    let output = migrate(&from, &live_only.endpoint, &["--history=false"]);
    assert!(output.status.success(), "migrate: {}", text(&output));
    let server = Cetera::start_on(&live_only.endpoint).await;
    assert_eq!(
        all_keys(&server.endpoint(), 0).await,
        all_keys(&etcd.endpoint(), 0).await
    );
    assert_eq!(
        all_keys(&server.endpoint(), current - 1).await.unwrap_err(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    drop(server);

    // A damaged trailer is refused.
    let mut damaged = bytes.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    let bad = dir.path().join("bad.db");
    std::fs::write(&bad, &damaged).unwrap();
    let third_dir = tempfile::tempdir().unwrap();
    let third = FreshDatabase::new(third_dir.path());
    let output = migrate(
        &format!("etcd-snapshot://{}", bad.display()),
        &third.endpoint,
        &[],
    );
    assert!(!output.status.success());
    assert!(
        text(&output).contains("checksum does not match"),
        "{}",
        text(&output)
    );
}
