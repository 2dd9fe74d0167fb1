//! Automatic compaction (`--auto-compaction-mode`, `--auto-compaction-retention`).
//!
//! - revision mode keeps the compact revision at current minus the retention: a Range
//!   at the oldest kept revision works, one below it gets etcd's compacted error, and
//!   the compact revision follows as more is written. etcd checks every 5 minutes, so
//!   cetera's `--auto-compaction-revision-interval` shortens that here.
//! - periodic mode with a short retention (`2s`, which etcd accepts as a duration),
//!   differential against real etcd 3.5.1: old revisions become compacted while the
//!   current one stays readable, and an explicit Compact below the automatic one gets
//!   etcd's error.
//! - a write-heavy store with automatic compaction stops growing.
//!
//! Tests wait for the background compactor with a generous deadline; nothing asserts
//! how long it took.

mod common;

use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cetera::proto::etcdserverpb::{
    CompactionRequest, PutRequest, RangeRequest, StatusRequest, kv_client::KvClient,
};
use common::{Cetera, Side, differential, outcome};
use tonic::transport::Channel;

/// Longest wait for a compaction that should come within a second or two.
const DEADLINE: Duration = Duration::from_secs(60);
const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

async fn put(kv: &mut KvClient<Channel>, key: &str, value: &[u8]) -> i64 {
    kv.put(PutRequest {
        key: key.into(),
        value: value.to_vec(),
        ..Default::default()
    })
    .await
    .expect("put")
    .into_inner()
    .header
    .expect("header")
    .revision
}

/// A Range of `key` at `revision`: Ok(count) or the error message.
async fn range_at(kv: &mut KvClient<Channel>, key: &str, revision: i64) -> Result<i64, String> {
    kv.range(RangeRequest {
        key: key.into(),
        revision,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().count)
    .map_err(|s| s.message().to_string())
}

/// Waits until a Range at `revision` is refused as compacted; panics after `DEADLINE`.
async fn wait_compacted(kv: &mut KvClient<Channel>, revision: i64) {
    let start = Instant::now();
    loop {
        match range_at(kv, "k", revision).await {
            Err(message) if message == COMPACTED => return,
            Err(message) => panic!("range at {revision}: unexpected error {message}"),
            Ok(_) if start.elapsed() > DEADLINE => {
                panic!("revision {revision} not compacted within {DEADLINE:?}")
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_mode_keeps_the_last_n_revisions() {
    let server = Cetera::start_with(&[
        "--auto-compaction-mode",
        "revision",
        "--auto-compaction-retention",
        "10",
        "--auto-compaction-revision-interval",
        "200ms",
    ])
    .await;
    let mut kv = KvClient::new(common::channel(&server.endpoint()).await);
    for round in 0..2 {
        let mut current = 0;
        for i in 0..30 {
            current = put(&mut kv, "k", format!("{round}-{i}").as_bytes()).await;
        }
        // Compacted to current - 10: that revision is still readable, the one below is not.
        wait_compacted(&mut kv, current - 11).await;
        assert_eq!(range_at(&mut kv, "k", current - 10).await, Ok(1));
        assert_eq!(range_at(&mut kv, "k", current).await, Ok(1));
        // A client's Compact below the automatic one gets etcd's error, as from etcd.
        let below = kv
            .compact(CompactionRequest {
                revision: current - 12,
                physical: false,
            })
            .await
            .expect_err("compact below the compact revision");
        assert_eq!(below.code(), tonic::Code::OutOfRange);
        assert_eq!(below.message(), COMPACTED);
    }
    // The apiserver's own Compact ahead of the automatic compactor works, and the
    // compactor does not move the compact revision back.
    let mut current = 0;
    for i in 0..5 {
        current = put(&mut kv, "k", format!("late-{i}").as_bytes()).await;
    }
    kv.compact(CompactionRequest {
        revision: current,
        physical: true,
    })
    .await
    .expect("compact at the current revision");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        range_at(&mut kv, "k", current - 1).await,
        Err(COMPACTED.to_string())
    );
    assert_eq!(range_at(&mut kv, "k", current).await, Ok(1));
}

/// Puts `k` and records only whether it worked (revisions are compared elsewhere).
async fn put_side(s: &mut Side, value: &str) -> i64 {
    let result =
        s.kv.put(PutRequest {
            key: b"k".to_vec(),
            value: value.into(),
            ..Default::default()
        })
        .await;
    let revision = result
        .as_ref()
        .map(|r| r.get_ref().header.as_ref().expect("header").revision)
        .unwrap_or(0);
    s.note(
        format!("put k={value}"),
        outcome(result, |_| "ok".to_string()),
    );
    revision
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_mode_matches_etcd() {
    let flags = ["--auto-compaction-retention", "2s"];
    differential(&flags, &flags, async |s: &mut Side| {
        let first = put_side(s, "1").await;
        put_side(s, "2").await;
        let last = put_side(s, "3").await;
        // Within a few seconds the compactor compacts to a revision sampled a period
        // ago; with no writes since, that reaches the last write.
        let start = Instant::now();
        let result = loop {
            let result = range_at(&mut s.kv, "k", first).await;
            if result.is_err() || start.elapsed() > DEADLINE {
                break result;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        s.note(
            "range at the first write's revision, eventually",
            format!("{result:?}"),
        );
        let result = range_at(&mut s.kv, "k", last).await;
        s.note("range at the last write's revision", format!("{result:?}"));
        let result =
            s.kv.compact(CompactionRequest {
                revision: first,
                physical: false,
            })
            .await;
        s.note(
            "compact below the automatic compaction",
            outcome(result, |_| "ok".to_string()),
        );
        let result =
            s.kv.range(RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            })
            .await;
        s.note(
            "range now",
            outcome(result, |r| {
                String::from_utf8_lossy(&r.kvs[0].value).into_owned()
            }),
        );
    })
    .await;
}

/// Database size as Status reports it. On PostgreSQL the size in use: cetera's
/// tables, without the system catalogs that make up most of a small database;
/// on MySQL too: the tables' data, without the free space InnoDB keeps in them.
async fn db_size(maintenance: &mut MaintenanceClient<Channel>) -> i64 {
    let status = maintenance
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    if std::env::var("CETERA_TEST_BACKEND").is_ok_and(|b| b == "postgres" || b == "mysql") {
        status.db_size_in_use
    } else {
        status.db_size
    }
}

/// Overwrites the same keys many times with revision-mode compaction keeping 100
/// revisions. Without compaction every write adds a log row and the database grows
/// by about `ROUNDS * WRITES * VALUE` (3 MB); with it the history stays around 100
/// rows and freed pages are reused, so after the first round the size stays put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_a_write_heavy_store_flat() {
    const ROUNDS: usize = 3;
    const WRITES: usize = 1000;
    const VALUE: usize = 1000;
    let backend = std::env::var("CETERA_TEST_BACKEND").unwrap_or_default();
    let server = Cetera::start_with(&[
        "--auto-compaction-mode",
        "revision",
        "--auto-compaction-retention",
        "100",
        "--auto-compaction-revision-interval",
        "100ms",
    ])
    .await;
    let channel = common::channel(&server.endpoint()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel);
    let value = vec![b'v'; VALUE];
    let mut sizes = Vec::new();
    for _ in 0..ROUNDS {
        let mut current = 0;
        for i in 0..WRITES {
            current = put(&mut kv, &format!("key/{}", i % 10), &value).await;
        }
        // Let the compactor catch up with this round before measuring.
        wait_compacted(&mut kv, current - 101).await;
        sizes.push(db_size(&mut maintenance).await);
    }
    eprintln!("database size after each round of {WRITES} writes: {sizes:?}");
    // Without compaction the log alone would hold ROUNDS * WRITES * VALUE = 3 MB.
    // Measured: SQLite about 0.9 MB, PostgreSQL 0.6-0.7 MB (its tables, vacuumed
    // after each compaction), MySQL 0.2-0.45 MB (InnoDB's estimates, refreshed
    // lazily). Half the uncompacted log is a generous bound.
    let last = *sizes.last().expect("rounds");
    let uncompacted = (ROUNDS * WRITES * VALUE) as i64;
    assert!(
        last < uncompacted / 2,
        "the database kept growing: {sizes:?}"
    );
    // Growth after the first round, against the 2 MB of log rows that two more
    // rounds would add without compaction. SQLite's page count is exact (under 2%
    // measured); PostgreSQL's tables grew by about 20% while VACUUM caught up.
    let allowed_growth = match backend.as_str() {
        "mysql" => return,
        "postgres" => 2,
        _ => 4,
    };
    let first = sizes[0];
    assert!(
        last <= first + first / allowed_growth,
        "the database kept growing: {sizes:?}"
    );
}
