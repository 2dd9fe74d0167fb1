//! The metrics server on `--metrics-address`: counters and gauges on
//! /metrics move with the requests sent (by method and gRPC code, including
//! errors), the revision gauges match the store, watcher and lease gauges go
//! up and down, and /healthz, /readyz and etcd's /health answer as a
//! supervisor expects, also while the datastore cannot be reached.
//! Runs on the backend chosen by CETERA_TEST_BACKEND.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::{
    CompactionRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest, WatchCreateRequest, kv_client::KvClient, lease_client::LeaseClient,
};
use common::http::{Scrape, get, scrape};
use common::{Cetera, Etcd, WatchStream};

#[test]
fn scrape_parser() {
    let scrape = Scrape::parse(
        "# HELP x y\n# TYPE x counter\nx{a=\"1\",b=\"2\"} 3\nx{a=\"1\",b=\"3\"} 4\ny 5\nh_bucket{le=\"+Inf\"} 6\n",
    );
    assert_eq!(scrape.value("x", &[("a", "1")]), 7.0);
    assert_eq!(scrape.value("x", &[("b", "3")]), 4.0);
    assert_eq!(scrape.value("y", &[]), 5.0);
    assert_eq!(scrape.value("h_bucket", &[("le", "+Inf")]), 6.0);
    assert_eq!(scrape.value("z", &[]), 0.0);
}

/// A cetera with its metrics server, and the address of the latter.
async fn start() -> (Cetera, String) {
    let address = format!("127.0.0.1:{}", common::free_port());
    let cetera = Cetera::start_with(&["--metrics-address", &address]).await;
    (cetera, address)
}

/// Scrapes until `done` holds of a scrape, for at most 10 s: the gauges of a
/// closed stream drop when the server has seen the stream end.
async fn scrape_until(address: &str, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    common::http::scrape_until(address, Duration::from_secs(10), what, done).await
}

#[tokio::test]
async fn counters_and_gauges_follow_requests() {
    let (cetera, address) = start().await;
    let channel = common::channel(&cetera.endpoint()).await;
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel.clone());
    let before = scrape(&address).await;

    let mut revision = 0;
    for i in 0..3 {
        let put = kv
            .put(PutRequest {
                key: format!("key{i}").into_bytes(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        revision = put.header.unwrap().revision;
    }
    for _ in 0..2 {
        kv.range(RangeRequest {
            key: b"key0".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let future = kv
        .range(RangeRequest {
            key: b"key0".to_vec(),
            revision: revision + 100,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(future.code(), tonic::Code::OutOfRange);
    let empty_key = kv.put(PutRequest::default()).await.unwrap_err();
    assert_eq!(empty_key.code(), tonic::Code::InvalidArgument);

    let after = scrape(&address).await;
    let moved = |f: &dyn Fn(&Scrape) -> f64| f(&after) - f(&before);
    assert_eq!(moved(&|s| s.handled("Put", "OK")), 3.0);
    assert_eq!(moved(&|s| s.handled("Put", "InvalidArgument")), 1.0);
    assert_eq!(moved(&|s| s.handled("Range", "OK")), 2.0);
    assert_eq!(moved(&|s| s.handled("Range", "OutOfRange")), 1.0);
    assert_eq!(
        after.value(
            "grpc_server_handled_total",
            &[
                ("grpc_method", "Put"),
                ("grpc_service", "etcdserverpb.KV"),
                ("grpc_type", "unary"),
                ("grpc_code", "OK"),
            ]
        ),
        after.handled("Put", "OK")
    );
    assert_eq!(
        moved(&|s| s.value("grpc_server_started_total", &[("grpc_method", "Put")])),
        4.0
    );
    assert_eq!(
        moved(&|s| s.value(
            "grpc_server_handling_seconds_count",
            &[("grpc_method", "Range")]
        )),
        3.0
    );
    assert_eq!(
        after.value("etcd_debugging_mvcc_current_revision", &[]),
        revision as f64
    );
    assert!(after.value("etcd_mvcc_db_total_size_in_bytes", &[]) > 0.0);
    assert!(after.value("etcd_mvcc_db_total_size_in_use_in_bytes", &[]) > 0.0);
    // Three Puts, committed one by one or together: between one and three commits,
    // and the batch histogram saw every commit and the three requests.
    let commits = moved(&|s| s.value("cetera_writer_commits_total", &[]));
    assert!((1.0..=3.0).contains(&commits), "{commits} commits");
    assert_eq!(
        moved(&|s| s.value("cetera_writer_batch_requests_count", &[])),
        commits
    );
    assert_eq!(
        moved(&|s| s.value("cetera_writer_batch_requests_sum", &[])),
        3.0
    );
    assert_eq!(
        moved(&|s| s.value("etcd_disk_backend_commit_duration_seconds_count", &[])),
        commits
    );
    assert_eq!(after.value("etcd_server_has_leader", &[]), 1.0);

    // Compaction moves the compact revision gauge.
    kv.compact(CompactionRequest {
        revision,
        physical: false,
    })
    .await
    .unwrap();
    let compacted = scrape(&address).await;
    assert_eq!(
        compacted.value("etcd_debugging_mvcc_compact_revision", &[]),
        revision as f64
    );

    // Watchers and watch streams: up while open, down once closed.
    let watchers = |s: &Scrape| s.value("etcd_debugging_mvcc_watcher_total", &[]);
    let streams = |s: &Scrape| s.value("etcd_debugging_mvcc_watch_stream_total", &[]);
    let idle = scrape(&address).await;
    let mut watch = WatchStream::open(channel.clone(), false);
    for key in ["a", "b"] {
        watch.create(WatchCreateRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        });
        assert!(watch.recv(Duration::from_secs(5)).await.unwrap().created);
    }
    let watching = scrape(&address).await;
    assert_eq!(watchers(&watching), watchers(&idle) + 2.0);
    assert_eq!(streams(&watching), streams(&idle) + 1.0);
    watch.cancel(0);
    assert!(watch.recv(Duration::from_secs(5)).await.unwrap().canceled);
    let one_left = scrape(&address).await;
    assert_eq!(watchers(&one_left), watchers(&idle) + 1.0);
    drop(watch);
    scrape_until(&address, "the watch stream closed", |s| {
        watchers(s) == watchers(&idle) && streams(s) == streams(&idle)
    })
    .await;

    // Leases: granted and revoked counters, renewals, the active gauge.
    let leases = |s: &Scrape| s.value("cetera_leases_active", &[]);
    let granted = |s: &Scrape| s.value("etcd_debugging_lease_granted_total", &[]);
    let revoked = |s: &Scrape| s.value("etcd_debugging_lease_revoked_total", &[]);
    let renewed = |s: &Scrape| s.value("etcd_debugging_lease_renewed_total", &[]);
    let no_leases = scrape(&address).await;
    assert_eq!(leases(&no_leases), 0.0);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let grant = lease
            .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
            .await
            .unwrap()
            .into_inner();
        ids.push(grant.id);
    }
    let mut keep_alive = lease
        .lease_keep_alive(tokio_stream::iter([LeaseKeepAliveRequest { id: ids[0] }]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keep_alive.message().await.unwrap().unwrap().ttl, 60);
    let two = scrape(&address).await;
    assert_eq!(leases(&two), 2.0);
    assert_eq!(granted(&two) - granted(&no_leases), 2.0);
    assert_eq!(renewed(&two) - renewed(&no_leases), 1.0);
    lease
        .lease_revoke(LeaseRevokeRequest { id: ids[1] })
        .await
        .unwrap();
    let one = scrape(&address).await;
    assert_eq!(leases(&one), 1.0);
    assert_eq!(revoked(&one) - revoked(&no_leases), 1.0);
    let unknown = lease
        .lease_revoke(LeaseRevokeRequest { id: ids[1] })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let after_unknown = scrape(&address).await;
    assert_eq!(revoked(&after_unknown), revoked(&one));
    assert_eq!(
        after_unknown.handled("LeaseRevoke", "NotFound")
            - no_leases.handled("LeaseRevoke", "NotFound"),
        1.0
    );

    // An expired lease counts as revoked too, as in etcd.
    lease
        .lease_grant(LeaseGrantRequest { ttl: 1, id: 0 })
        .await
        .unwrap();
    let expired = scrape_until(&address, "the short lease expire", |s| {
        leases(s) == 1.0 && revoked(s) - revoked(&no_leases) == 2.0
    })
    .await;
    assert_eq!(granted(&expired) - granted(&no_leases), 3.0);
}

#[tokio::test]
async fn health_endpoints_of_a_ready_server() {
    let (_cetera, address) = start().await;
    assert_eq!(
        get(&address, "/healthz").await.unwrap(),
        (200, "ok\n".into())
    );
    assert_eq!(
        get(&address, "/readyz").await.unwrap(),
        (200, "ok\n".into())
    );
    assert_eq!(get(&address, "/nope").await.unwrap().0, 404);
    let (status, body) = get(&address, "/health").await.unwrap();
    assert_eq!(status, 200);

    // etcd serves /health on its metrics URL too: the same JSON.
    let etcd_metrics = format!("127.0.0.1:{}", common::free_port());
    let Some(_etcd) =
        Etcd::start_with(&["--listen-metrics-urls", &format!("http://{etcd_metrics}")]).await
    else {
        return;
    };
    let (etcd_status, etcd_body) = get(&etcd_metrics, "/health").await.unwrap();
    assert_eq!((status, body.trim()), (etcd_status, etcd_body.trim()));
}

/// A server whose datastore does not answer is alive but not ready. The
/// datastore here is a PostgreSQL URL with nothing listening, which cetera
/// keeps retrying for 30 s at start.
#[tokio::test]
async fn not_ready_while_the_datastore_is_unreachable() {
    let address = format!("127.0.0.1:{}", common::free_port());
    let endpoint = format!(
        "postgres://postgres@127.0.0.1:{}/cetera?sslmode=disable",
        common::free_port()
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_cetera"))
        .args([
            "--listen-address",
            &format!("127.0.0.1:{}", common::free_port()),
        ])
        .args(["--endpoint", &endpoint, "--metrics-address", &address])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = loop {
        match get(&address, "/healthz").await {
            Ok(answer) => break answer,
            Err(error) => {
                assert!(Instant::now() < deadline, "no /healthz: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let ready = get(&address, "/readyz").await.unwrap();
    let health = get(&address, "/health").await.unwrap();
    let metrics = get(&address, "/metrics").await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(alive, (200, "ok\n".into()));
    assert_eq!(
        ready,
        (503, "not ready: the datastore is not open yet\n".into())
    );
    assert_eq!(
        health,
        (
            503,
            r#"{"health":"false","reason":"the datastore is not open yet"}"#.into()
        )
    );
    assert_eq!(metrics.0, 200);
    // Counters still show; the gauges read from the datastore stay unset.
    let scrape = Scrape::parse(&metrics.1);
    assert_eq!(scrape.value("etcd_server_has_leader", &[]), 1.0);
    assert_eq!(
        scrape.value("etcd_debugging_mvcc_current_revision", &[]),
        0.0
    );
}

/// `--log-format json` writes one JSON object per line, with etcd-like
/// fields a log shipper can index: timestamp, level, message.
#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let cetera = Cetera::start_with(&["--log-format", "json"]).await;
    let log = cetera.log();
    let lines: Vec<&str> = log.lines().filter(|line| !line.is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for line in &lines {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(object["timestamp"].is_string(), "{line}");
        assert!(object["level"].is_string(), "{line}");
        assert!(object["fields"]["message"].is_string(), "{line}");
    }
    assert!(
        lines
            .iter()
            .any(|line| line.contains(r#""message":"serving the etcd API (gRPC and HTTP)""#)),
        "{log}"
    );
}

/// A Watch stream whose client has half-closed its side lives on (etcd keeps it), but
/// still ends when the client cancels the call and when the server shuts down: its
/// session does not outlive the client, and a graceful stop does not wait for it.
// Two worker threads: the client's connection runs while the test waits for the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_watch_streams_end_with_the_client_and_the_server() {
    let (mut cetera, address) = start().await;
    let channel = common::channel(&cetera.endpoint()).await;
    let streams = |s: &Scrape| s.value("etcd_debugging_mvcc_watch_stream_total", &[]);
    let watchers = |s: &Scrape| s.value("etcd_debugging_mvcc_watcher_total", &[]);
    let idle = scrape(&address).await;
    let open = |channel: &tonic::transport::Channel| {
        let watch = WatchStream::open(channel.clone(), false);
        watch.create(WatchCreateRequest {
            key: b"a".to_vec(),
            ..Default::default()
        });
        watch
    };

    let mut watch = open(&channel);
    assert!(watch.recv(Duration::from_secs(5)).await.unwrap().created);
    watch.close_send();
    scrape_until(&address, "the half-closed stream counted", |s| {
        streams(s) == streams(&idle) + 1.0 && watchers(s) == watchers(&idle) + 1.0
    })
    .await;
    drop(watch);
    scrape_until(&address, "the cancelled stream gone", |s| {
        streams(s) == streams(&idle) && watchers(s) == watchers(&idle)
    })
    .await;

    let mut watch = open(&channel);
    assert!(watch.recv(Duration::from_secs(5)).await.unwrap().created);
    watch.close_send();
    let status = cetera.terminate(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}\n{}",
        cetera.log()
    );
    let end = watch.recv(Duration::from_secs(5)).await;
    assert!(end.is_err(), "the stream ended with the server: {end:?}");
}

/// Plain logs written to a file (stderr is no terminal) carry no ANSI colour codes.
#[tokio::test]
async fn plain_logs_to_a_file_have_no_colour_codes() {
    let cetera = Cetera::start().await;
    let log = cetera.log();
    assert!(log.contains("serving the etcd API"), "{log}");
    assert!(!log.contains('\x1b'), "escape codes in {log:?}");
}

/// The quota etcd's alert on database size divides by, the proposal gauges
/// of etcd's dashboards, on SQLite the record log's syncs where they look
/// for its WAL's, and no peer network series on a single server.
#[tokio::test]
async fn quota_and_wal_fsyncs_as_etcd_names_them() {
    let address = format!("127.0.0.1:{}", common::free_port());
    let cetera = Cetera::start_with(&[
        "--metrics-address",
        &address,
        "--quota-backend-bytes",
        "123456789",
    ])
    .await;
    let mut client = etcd_client::Client::connect([cetera.endpoint()], None)
        .await
        .unwrap();
    let before = scrape(&address).await;
    for i in 0..5 {
        client.put(format!("k{i}"), "v", None).await.unwrap();
    }
    let after = scrape(&address).await;
    assert_eq!(
        after.value("etcd_server_quota_backend_bytes", &[]),
        123_456_789.0
    );
    // A single server's revision counts its commits, as Status's raft index.
    assert_eq!(
        after.value("etcd_server_proposals_committed_total", &[]),
        6.0
    );
    assert_eq!(after.value("etcd_server_proposals_applied_total", &[]), 6.0);
    assert_eq!(after.value("etcd_server_proposals_pending", &[]), 0.0);
    assert_eq!(after.value("etcd_server_proposals_failed_total", &[]), 0.0);
    // No peers, so none of etcd's peer network series, as a one-member etcd.
    for (name, label) in [
        ("etcd_network_peer_sent_bytes_total", "To"),
        ("etcd_network_peer_received_bytes_total", "From"),
        ("etcd_network_peer_sent_failures_total", "To"),
        ("etcd_network_peer_round_trip_time_seconds_count", "To"),
        ("etcd_network_active_peers", "Remote"),
        ("etcd_network_disconnected_peers_total", "Remote"),
    ] {
        assert!(after.label_values(name, label).is_empty(), "{name}");
    }
    let syncs = |s: &Scrape| s.value("etcd_disk_wal_fsync_duration_seconds_count", &[]);
    if common::datastore::test_backend() == common::datastore::TestBackend::Sqlite {
        // One sync of the record log per acknowledged put, one at a time.
        assert_eq!(syncs(&after) - syncs(&before), 5.0);
    } else {
        // The database server syncs its own log.
        assert_eq!(syncs(&after), 0.0);
    }
}

/// etcd's default quota, when the flag is not given.
#[tokio::test]
async fn quota_defaults_to_etcds() {
    let (_cetera, address) = start().await;
    assert_eq!(
        scrape(&address)
            .await
            .value("etcd_server_quota_backend_bytes", &[]),
        2_147_483_648.0
    );
}

/// The bytes of the etcd API's messages, both ways, as etcd counts them
/// (here with each message's 5-byte gRPC frame header).
#[tokio::test]
async fn grpc_bytes_both_ways() {
    let (cetera, address) = start().await;
    let mut client = etcd_client::Client::connect([cetera.endpoint()], None)
        .await
        .unwrap();
    let received = |s: &Scrape| s.value("etcd_network_client_grpc_received_bytes_total", &[]);
    let sent = |s: &Scrape| s.value("etcd_network_client_grpc_sent_bytes_total", &[]);
    let value = "x".repeat(10_000);
    let before = scrape(&address).await;
    client.put("big", value.as_str(), None).await.unwrap();
    let put = scrape(&address).await;
    let grew = received(&put) - received(&before);
    assert!(
        (10_000.0..10_100.0).contains(&grew),
        "put: {grew} bytes received"
    );
    assert!(
        sent(&put) - sent(&before) < 100.0,
        "put: answered in a few bytes"
    );
    client.get("big", None).await.unwrap();
    let get = scrape(&address).await;
    let grew = sent(&get) - sent(&put);
    assert!(
        (10_000.0..10_200.0).contains(&grew),
        "get: {grew} bytes sent"
    );
}
