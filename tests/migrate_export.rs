//! `cetera migrate --from DATASTORE --to http://etcd`: a cetera store (on
//! the test backend) with overwrites, deletions, binary values and leased
//! keys is exported into a real etcd 3.5.1; etcd then holds the same keys,
//! values and leases (same ids, TTLs not above the source's remaining TTL);
//! a non-empty etcd is refused without --force and written over with it;
//! an etcd source with an etcd target is refused; an https etcd asking for
//! client certificates is reached with --to-cacert/--to-cert/--to-key.

mod common;

use std::time::Duration;

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::{
    DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest,
};
use common::certs::Ca;
use common::migration::{leases, migrate, put_in_txns, text};
use common::{Cetera, ClientTls, Etcd, channel};
use rcgen::ExtendedKeyUsagePurpose;

fn put(key: &[u8], value: &[u8], lease: i64) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        lease,
        ..Default::default()
    }
}

/// Every live key as (key, value, lease), in key order.
async fn live_keys(endpoint: &str) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    let mut kv = KvClient::new(channel(endpoint).await).max_decoding_message_size(usize::MAX);
    let request = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    let resp = kv.range(request).await.unwrap().into_inner();
    resp.kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.lease))
        .collect()
}

/// 300 keys (more than two Txns of 128), overwrites, deletions, binary keys
/// and values, and three leases: two with keys, one without.
async fn write_source(endpoint: &str) {
    let channel = channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel);
    for (id, ttl) in [(0x7001, 3600), (0x7002, 900), (0x7003, 1800)] {
        lease
            .lease_grant(LeaseGrantRequest { ttl, id })
            .await
            .unwrap();
    }
    put_in_txns(&mut kv, 300, |n| {
        (format!("/data/{n:04}"), format!("v{}", n % 100))
    })
    .await;
    for j in 0..40 {
        let lease = [0, 0x7001, 0x7002][j % 3];
        kv.put(put(format!("/data/{j:04}").as_bytes(), b"rewritten", lease))
            .await
            .unwrap();
    }
    kv.delete_range(DeleteRangeRequest {
        key: b"/data/0200".to_vec(),
        range_end: b"/data/0250".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    kv.delete_range(DeleteRangeRequest {
        key: b"/data/0001".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    kv.put(put(b"\xff\x00binary", b"\x00\x01\xfe\xff", 0x7002))
        .await
        .unwrap();
    kv.put(put(b"/empty", b"", 0)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_live_keys_and_leases_to_a_real_etcd() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let mut source = Cetera::start().await;
    write_source(&source.endpoint()).await;
    let want_keys = live_keys(&source.endpoint()).await;
    let want_leases = leases(&source.endpoint()).await;
    assert_eq!(want_keys.len(), 300 - 50 - 1 + 2);
    assert_eq!(want_leases.len(), 3);
    source.terminate(Duration::from_secs(10));

    let output = migrate(source.datastore_endpoint(), &etcd.endpoint(), &[]);
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let n = want_keys.len();
    assert!(
        stdout.contains(&format!(
            "verified live keys: source {n} target {n} (equal)"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("verified hash of (key, value, lease): source "),
        "{stdout}"
    );
    assert!(stdout.contains("exported: 3 leases"), "{stdout}");
    assert!(
        stdout.contains("revisions, create/mod revisions, versions and history are not kept"),
        "{stdout}"
    );

    // The same keys, values and leases; the same lease ids with the same
    // keys, and no more time left than the source had.
    assert_eq!(live_keys(&etcd.endpoint()).await, want_keys);
    let got_leases = leases(&etcd.endpoint()).await;
    assert_eq!(got_leases.len(), want_leases.len());
    for ((id, _, ttl, keys), (want_id, _, want_ttl, want_lease_keys)) in
        got_leases.iter().zip(&want_leases)
    {
        assert_eq!((id, keys), (want_id, want_lease_keys));
        assert!(
            *ttl > 0 && ttl <= want_ttl,
            "lease {id:x}: etcd TTL {ttl}, source remaining {want_ttl}"
        );
    }
    assert!(got_leases[2].3.is_empty());

    // A second export finds etcd holding keys: refused, nothing changed...
    let refused = migrate(source.datastore_endpoint(), &etcd.endpoint(), &[]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("use --force"), "{}", text(&refused));

    // ...and with --force, written over: a key etcd alone has is kept (not
    // deleted), the exported keys are put again and verify.
    let mut kv = KvClient::new(channel(&etcd.endpoint()).await);
    kv.put(put(b"/only-in-etcd", b"mine", 0)).await.unwrap();
    kv.put(put(b"/data/0000", b"changed in etcd", 0))
        .await
        .unwrap();
    let forced = migrate(source.datastore_endpoint(), &etcd.endpoint(), &["--force"]);
    assert!(forced.status.success(), "{}", text(&forced));
    let mut after = live_keys(&etcd.endpoint()).await;
    let only = after
        .iter()
        .position(|(key, _, _)| key == b"/only-in-etcd")
        .expect("a key only etcd had is kept");
    assert_eq!(after.remove(only).1, b"mine");
    assert_eq!(after, want_keys);

    // Between two etcds cetera is no proxy.
    let both = migrate(&etcd.endpoint(), &etcd.endpoint(), &["--force"]);
    assert!(!both.status.success(), "{}", text(&both));
    assert!(
        text(&both).contains("--from and --to both name an etcd"),
        "{}",
        text(&both)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_to_an_https_etcd_with_client_certificates() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("cetera test CA");
    let server = ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    let client = ca.issue("root", ExtendedKeyUsagePurpose::ClientAuth);
    let path = |name: &str| pki.path().join(name).display().to_string();
    for (name, text) in [
        ("ca.pem", &ca.pem),
        ("server.pem", &server.0),
        ("server-key.pem", &server.1),
        ("client.pem", &client.0),
        ("client-key.pem", &client.1),
    ] {
        std::fs::write(path(name), text).unwrap();
    }
    let flags = [
        "--cert-file".to_string(),
        path("server.pem"),
        "--key-file".to_string(),
        path("server-key.pem"),
        "--trusted-ca-file".to_string(),
        path("ca.pem"),
        "--client-cert-auth".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let probe = ClientTls {
        ca_pem: ca.pem.clone(),
        identity: Some(client.clone()),
    };
    let Some(etcd) = Etcd::start_tls(&flags, probe.clone()).await else {
        return;
    };
    let mut source = Cetera::start().await;
    write_source(&source.endpoint()).await;
    let want_keys = live_keys(&source.endpoint()).await;
    source.terminate(Duration::from_secs(10));
    let https = format!("https://127.0.0.1:{}", etcd.port());

    // Without the CA, and without the client certificate, no export.
    let no_ca = migrate(source.datastore_endpoint(), &https, &[]);
    assert!(
        text(&no_ca).contains("needs --to-cacert"),
        "{}",
        text(&no_ca)
    );
    let ca_only = migrate(
        source.datastore_endpoint(),
        &https,
        &["--to-cacert", &path("ca.pem")],
    );
    assert!(!ca_only.status.success(), "{}", text(&ca_only));

    let output = migrate(
        source.datastore_endpoint(),
        &https,
        &[
            "--to-cacert",
            &path("ca.pem"),
            "--to-cert",
            &path("client.pem"),
            "--to-key",
            &path("client-key.pem"),
        ],
    );
    assert!(output.status.success(), "{}", text(&output));
    let endpoint = tonic::transport::Endpoint::from_shared(https)
        .unwrap()
        .tls_config(probe.tonic_config())
        .unwrap();
    let mut kv = KvClient::new(endpoint.connect().await.unwrap());
    let got: Vec<_> = kv
        .range(RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.lease))
        .collect();
    assert_eq!(got, want_keys);
}
