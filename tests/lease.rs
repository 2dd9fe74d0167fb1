//! Lease service, differential against real etcd 3.5.1 (see `common::differential`):
//! grant (server-chosen and client-chosen ids, minimum and maximum TTL), Put with and
//! without a lease, TimeToLive, Leases, KeepAlive, Revoke, and expiry, with the watch
//! events that revocation and expiry produce. Lease ids the server chose differ between
//! the two servers; they are shown as `<lease#N>` (N = grant order) when comparing.
//!
//! Remaining TTLs shrink while a test runs, so they are recorded coarsely: "granted - 1"
//! right after a grant (etcd truncates the remaining time to whole seconds), and expiry
//! as "on time" when it happens within etcd's tolerance.
//!
//! Also here: `etcdctl lease grant / keep-alive --once / timetolive --keys / revoke /
//! list`, compared between the two servers, and a cetera-only test that a lease keeps its
//! remaining time across a restart.
//!
//! `CETERA_DIFF_SELF_CHECK=1` compares etcd with a second etcd instead: that must pass.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, PutRequest, WatchCreateRequest, lease_client::LeaseClient,
};
use common::{Cetera, Side, WatchStream, differential, header_rev, outcome};

/// A lease id no test grants.
const UNKNOWN: i64 = 0x0bad_1ea5e;

fn lease_client(s: &Side) -> LeaseClient<tonic::transport::Channel> {
    LeaseClient::new(s.channel.clone())
}

/// Grants a lease and records the outcome; `id` 0 lets the server choose, and the id it
/// chose is registered (and checked to be positive). Returns the lease id (0 on error).
async fn grant(s: &mut Side, ttl: i64, id: i64) -> i64 {
    let result = lease_client(s)
        .lease_grant(LeaseGrantRequest { ttl, id })
        .await;
    let granted = result.as_ref().map_or(0, |r| r.get_ref().id);
    if id == 0 && granted != 0 {
        s.server_lease(granted);
    }
    s.note(
        format!("grant TTL={ttl} ID={id}"),
        outcome(result, |r| {
            format!(
                "rev={} ID={} TTL={} error={:?} positive={}",
                header_rev(&r.header),
                r.id,
                r.ttl,
                r.error,
                r.id > 0
            )
        }),
    );
    granted
}

async fn revoke(s: &mut Side, id: i64) {
    let result = lease_client(s)
        .lease_revoke(LeaseRevokeRequest { id })
        .await;
    s.note(
        format!("revoke {id}"),
        outcome(result, |r| format!("rev={}", header_rev(&r.header))),
    );
}

/// Records TimeToLive. The remaining TTL is shown as `granted-1` when it is one or two
/// seconds below the granted TTL: etcd truncates the remaining time, so right after a
/// grant it reports one second less, two on a slow machine.
async fn time_to_live(s: &mut Side, id: i64, keys: bool) {
    let result = lease_client(s)
        .lease_time_to_live(LeaseTimeToLiveRequest { id, keys })
        .await;
    s.note(
        format!("timetolive {id} keys={keys}"),
        outcome(result, |r| {
            let remaining = match r.granted_ttl - r.ttl {
                1 | 2 if r.ttl > 0 => "granted-1".to_string(),
                _ => r.ttl.to_string(),
            };
            // etcd lists the keys in no particular order.
            let mut keys: Vec<String> = r.keys.iter().map(|k| common::show(k)).collect();
            keys.sort();
            format!(
                "rev={} ID={} TTL={remaining} grantedTTL={} keys=[{}]",
                header_rev(&r.header),
                r.id,
                r.granted_ttl,
                keys.join(", ")
            )
        }),
    );
}

/// Records the lease list, sorted (etcd orders it by expiry time, which ties for leases
/// granted together).
async fn leases(s: &mut Side) {
    let result = lease_client(s).lease_leases(LeaseLeasesRequest {}).await;
    let ids: Vec<i64> = result
        .as_ref()
        .map(|r| r.get_ref().leases.iter().map(|l| l.id).collect())
        .unwrap_or_default();
    // Sort by the name shown after masking, so both sides sort alike.
    let mut names: Vec<String> = ids.iter().map(|id| s.lease_name(*id)).collect();
    names.sort();
    s.note(
        "leases",
        outcome(result, |r| {
            format!("rev={} [{}]", header_rev(&r.header), names.join(", "))
        }),
    );
}

/// Sends each id on one KeepAlive stream and records each response.
async fn keep_alive(s: &mut Side, ids: &[i64]) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for &id in ids {
        tx.send(LeaseKeepAliveRequest { id })
            .expect("queue request");
    }
    let mut client = lease_client(s);
    let call = client.lease_keep_alive(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    let mut stream = match tokio::time::timeout(common::WAIT, call).await {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => {
            s.note(
                "keepalive stream",
                format!("ERR {:?}: {}", status.code(), status.message()),
            );
            return;
        }
        Err(_) => {
            s.note("keepalive stream", "no response");
            return;
        }
    };
    for &id in ids {
        let response = tokio::time::timeout(common::WAIT, stream.message()).await;
        let text = match response {
            Ok(Ok(Some(r))) => format!("rev={} ID={} TTL={}", header_rev(&r.header), r.id, r.ttl),
            Ok(Ok(None)) => "stream ended".to_string(),
            Ok(Err(status)) => format!("ERR {:?}: {}", status.code(), status.message()),
            Err(_) => "no response".to_string(),
        };
        s.note(format!("keepalive {id}"), text);
    }
}

/// A Put of `key=value` attached to `lease`.
fn leased(key: &[u8], value: &[u8], lease: i64) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        lease,
        ..Default::default()
    }
}

/// A watch on every key with prev_kv, created and confirmed.
async fn watch_everything(s: &mut Side) -> WatchStream {
    let mut ws = s.watch();
    ws.create(WatchCreateRequest {
        key: b"\0".to_vec(),
        range_end: b"\0".to_vec(),
        prev_kv: true,
        ..Default::default()
    });
    s.recv(&mut ws, "watch everything with prev_kv").await;
    ws
}

// ---------------------------------------------------------------------------------------
// Grant, TimeToLive, Leases, KeepAlive
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn grant_ids_and_ttls() {
    differential(&[], &[], async |s: &mut Side| {
        let chosen = grant(s, 60, 0).await;
        grant(s, 60, 1000).await;
        grant(s, 30, 1000).await; // already exists
        grant(s, 60, chosen).await; // already exists
        grant(s, 1, 1001).await; // below the minimum
        grant(s, 0, 1002).await;
        grant(s, -5, 1003).await;
        grant(s, 9_000_000_000, 1004).await; // the largest
        grant(s, 9_000_000_001, 1005).await; // too large
        grant(s, 10, -7).await; // negative id
        grant(s, 10, i64::MAX).await;
        let second = grant(s, 10, 0).await;
        let third = grant(s, 10, 0).await;
        s.note(
            "server-chosen ids are distinct",
            (chosen != second && second != third && chosen != third).to_string(),
        );
        for id in [chosen, 1000, 1001, 1002, 1003, 1004, second, UNKNOWN] {
            time_to_live(s, id, false).await;
        }
        leases(s).await;
        s.get(b"\0", b"\0").await; // granting writes no keys and no revision
    })
    .await;
}

#[tokio::test]
async fn keep_alive_stream() {
    differential(&[], &[], async |s: &mut Side| {
        let id = grant(s, 20, 0).await;
        grant(s, 1, 2000).await;
        keep_alive(s, &[id, 2000, UNKNOWN, id]).await;
        time_to_live(s, id, false).await;
        revoke(s, id).await;
        keep_alive(s, &[id, 2000]).await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Keys attached to leases
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn put_with_and_without_lease() {
    differential(&[], &[], async |s: &mut Side| {
        let lease = grant(s, 60, 0).await;
        let other = grant(s, 60, 3000).await;
        let mut ws = watch_everything(s).await;
        s.put_req(leased(b"a", b"1", lease)).await;
        s.put_req(leased(b"b", b"1", lease)).await;
        s.put_req(leased(b"c", b"1", other)).await;
        s.get(b"a", b"z").await;
        time_to_live(s, lease, true).await;
        // A Put without a lease detaches the key.
        s.put(b"a", b"2").await;
        // ignore_lease keeps the key's lease.
        s.put_req(PutRequest {
            ignore_lease: true,
            ..leased(b"b", b"2", 0)
        })
        .await;
        // Moving a key to another lease.
        s.put_req(PutRequest {
            prev_kv: true,
            ..leased(b"c", b"2", lease)
        })
        .await;
        s.get(b"a", b"z").await;
        time_to_live(s, lease, true).await;
        time_to_live(s, other, true).await;
        // Errors.
        s.put_req(leased(b"d", b"1", UNKNOWN)).await;
        s.put_req(PutRequest {
            ignore_lease: true,
            ..leased(b"missing", b"1", 0)
        })
        .await;
        s.put_req(PutRequest {
            ignore_lease: true,
            ..leased(b"b", b"1", lease)
        })
        .await;
        // Deleting a key detaches it.
        s.delete(b"b", b"").await;
        time_to_live(s, lease, true).await;
        time_to_live(s, UNKNOWN, true).await;
        // In a Txn, an unknown lease fails the whole Txn.
        let txn = cetera::proto::etcdserverpb::TxnRequest {
            success: vec![
                cetera::proto::etcdserverpb::RequestOp {
                    request: Some(
                        cetera::proto::etcdserverpb::request_op::Request::RequestPut(leased(
                            b"e", b"1", lease,
                        )),
                    ),
                },
                cetera::proto::etcdserverpb::RequestOp {
                    request: Some(
                        cetera::proto::etcdserverpb::request_op::Request::RequestPut(leased(
                            b"f", b"1", UNKNOWN,
                        )),
                    ),
                },
            ],
            ..Default::default()
        };
        s.txn("txn: put e with lease, put f with an unknown lease", txn)
            .await;
        s.get(b"a", b"z").await;
        // The events show each kv's lease, and prev_kv the previous one.
        s.recv_flat(&mut ws, 0, 7, "all events").await;
        s.quiet(
            &mut ws,
            Duration::from_millis(300),
            "no events for failed puts",
        )
        .await;
    })
    .await;
}

/// Revoke deletes every attached key in one revision: one watch response, DELETE events
/// in key order, each with prev_kv.
#[tokio::test]
async fn revoke_deletes_keys_in_one_revision() {
    differential(&[], &[], async |s: &mut Side| {
        let lease = grant(s, 60, 0).await;
        let empty = grant(s, 60, 0).await;
        for k in [b"c", b"a", b"b"] {
            s.put_req(leased(k, b"v", lease)).await;
        }
        s.put_req(leased(b"a", b"w", lease)).await;
        s.put(b"x", b"not leased").await;
        let mut ws = watch_everything(s).await;
        revoke(s, lease).await;
        s.recv(&mut ws, "one response: DELETE a, b, c with prev_kv")
            .await;
        s.get(b"\0", b"\0").await;
        revoke(s, lease).await;
        time_to_live(s, lease, true).await;
        revoke(s, empty).await; // no keys: no new revision
        s.quiet(&mut ws, Duration::from_millis(300), "no events")
            .await;
        revoke(s, UNKNOWN).await;
        leases(s).await;
        // A revoked id can be granted again.
        grant(s, 60, 5000).await;
        revoke(s, 5000).await;
        grant(s, 60, 5000).await;
        time_to_live(s, 5000, true).await;
    })
    .await;
}

/// A lease with the minimum TTL expires on its own: keys deleted in one revision,
/// DELETE events with prev_kv, and the lease is gone.
#[tokio::test]
async fn expiry_deletes_keys_with_prev_kv() {
    differential(&[], &[], async |s: &mut Side| {
        let lease = grant(s, 1, 0).await; // raised to 2 s
        let granted = Instant::now();
        let longer = grant(s, 3, 0).await;
        grant(s, 2, 4000).await; // no keys: its expiry writes nothing
        for k in [b"k2", b"k1", b"k3", b"k0"] {
            s.put_req(leased(k, b"v", lease)).await;
        }
        s.put(b"k0", b"detached").await; // survives the expiry
        s.put_req(leased(b"k4", b"v", longer)).await;
        let mut ws = watch_everything(s).await;
        let response = ws.recv(Duration::from_secs(5)).await;
        let elapsed = granted.elapsed();
        s.note(
            "first lease expires: one response",
            response.map_or_else(|e| e, |r| common::show_watch_response(&r)),
        );
        // etcd checks for expired leases every 500 ms.
        let on_time =
            elapsed > Duration::from_millis(1500) && elapsed < Duration::from_millis(3500);
        s.note("expired 1.5 to 3.5 s after the grant", on_time.to_string());
        let response = ws.recv(Duration::from_secs(3)).await;
        s.note(
            "second lease expires (the keyless one wrote nothing)",
            response.map_or_else(|e| e, |r| common::show_watch_response(&r)),
        );
        s.get(b"\0", b"\0").await;
        time_to_live(s, lease, true).await;
        keep_alive(s, &[lease]).await;
        leases(s).await;
        s.put_req(leased(b"k5", b"v", lease)).await;
    })
    .await;
}

/// KeepAlive renews a lease to its full TTL: kept alive past its TTL it survives, then
/// expires once the keep-alives stop.
#[tokio::test]
async fn keep_alive_extends_expiry() {
    differential(&[], &[], async |s: &mut Side| {
        let lease = grant(s, 2, 0).await;
        s.put_req(leased(b"k", b"v", lease)).await;
        let mut ws = watch_everything(s).await;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut client = lease_client(s);
        let call =
            client.lease_keep_alive(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        tx.send(LeaseKeepAliveRequest { id: lease }).expect("send");
        let mut stream = call.await.expect("keepalive stream").into_inner();
        let mut ttls = Vec::new();
        for _ in 0..7 {
            let r = stream
                .message()
                .await
                .expect("keepalive")
                .expect("response");
            ttls.push(r.ttl);
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.send(LeaseKeepAliveRequest { id: lease }).expect("send");
        }
        s.note("keep-alive TTLs over 3.5 s", format!("{ttls:?}"));
        s.get(b"k", b"").await;
        drop((tx, stream));
        let stopped = Instant::now();
        let response = ws.recv(Duration::from_secs(5)).await;
        s.note(
            "expires after the keep-alives stop",
            response.map_or_else(|e| e, |r| common::show_watch_response(&r)),
        );
        let elapsed = stopped.elapsed();
        s.note(
            "within 1 to 3.5 s",
            (elapsed > Duration::from_secs(1) && elapsed < Duration::from_millis(3500)).to_string(),
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// etcdctl lease
// ---------------------------------------------------------------------------------------

/// Runs etcdctl and records its normalized stdout and stderr. Registers the lease id
/// a `lease grant` reports (hex in "lease 694d7a0f3b9c4a04 granted with TTL(60s)",
/// decimal in JSON's `"ID":`) and returns it in hex.
fn etcdctl(s: &mut Side, etcdctl: &Path, args: &[&str]) -> Option<String> {
    let out = common::run_etcdctl(etcdctl, &s.addr, args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let granted = if stdout.contains(" granted with ") {
        stdout
            .strip_prefix("lease ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|hex| i64::from_str_radix(hex, 16).ok())
    } else if args.starts_with(&["lease", "grant"]) {
        stdout.split_once("\"ID\":").and_then(|(_, rest)| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
    } else {
        None
    };
    if let Some(id) = granted {
        s.server_lease(id);
    }
    let mut text = s.mask(&common::normalize_etcdctl(&format!(
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    )));
    if let Some((head, rest)) = text.split_once("attached keys([")
        && let Some((keys, tail)) = rest.split_once("])")
    {
        // etcd lists a lease's keys in no particular order.
        let mut keys: Vec<&str> = keys.split(' ').collect();
        keys.sort();
        text = format!("{head}attached keys([{}]){tail}", keys.join(" "));
    }
    if args.starts_with(&["lease", "list"]) {
        // etcd lists leases by expiry time; the order is not part of the contract.
        let mut lines: Vec<&str> = text.lines().collect();
        lines[1..].sort();
        text = lines.join("\n");
    }
    s.note(format!("etcdctl {}", args.join(" ")), text);
    granted.map(|id| format!("{id:x}"))
}

/// Waits until lease `id` has expired on the side's server (TimeToLive
/// answers TTL -1), which must happen within a minute; not a step of the
/// transcript.
async fn expire(s: &mut Side, id: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ttl = lease_client(s)
            .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
            .await
            .expect("timetolive")
            .into_inner()
            .ttl;
        if ttl == -1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: lease {id:x} has not expired within a minute",
            s.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn etcdctl_lease() {
    let Some(bin) = common::etcdctl_35() else {
        return;
    };
    differential(&[], &[], async |s: &mut Side| {
        let id = etcdctl(s, &bin, &["lease", "grant", "60"]).unwrap_or_default();
        let short = etcdctl(s, &bin, &["lease", "grant", "1"]);
        etcdctl(s, &bin, &["lease", "grant", "60", "-w", "json"]);
        let lease = format!("--lease={id}");
        etcdctl(s, &bin, &["put", "k1", "v", &lease]);
        etcdctl(s, &bin, &["put", "k2", "v", &lease]);
        etcdctl(s, &bin, &["lease", "keep-alive", "--once", &id]);
        etcdctl(s, &bin, &["lease", "keep-alive", "--once", "1bad1ea5e"]);
        etcdctl(s, &bin, &["lease", "timetolive", &id]);
        etcdctl(s, &bin, &["lease", "timetolive", "--keys", &id]);
        etcdctl(s, &bin, &["lease", "timetolive", "1bad1ea5e"]);
        // The 1-second lease has expired by the list on both servers,
        // however slow the steps before it ran.
        let short = short.expect("lease grant 1 reports its lease");
        expire(s, i64::from_str_radix(&short, 16).expect("a hex lease id")).await;
        etcdctl(s, &bin, &["lease", "list"]);
        etcdctl(s, &bin, &["get", "k1", "-w", "fields"]);
        etcdctl(s, &bin, &["lease", "revoke", &id]);
        etcdctl(s, &bin, &["lease", "revoke", &id]);
        etcdctl(s, &bin, &["get", "--prefix", "k"]);
        etcdctl(s, &bin, &["lease", "grant", "9000000001"]);
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// cetera only
// ---------------------------------------------------------------------------------------

/// The remaining TTL of a lease at `endpoint` (None if the call fails).
async fn remaining(lease: &mut LeaseClient<tonic::transport::Channel>, id: i64) -> Option<i64> {
    let r = lease
        .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
        .await
        .ok()?;
    Some(r.get_ref().ttl)
}

/// A lease keeps its remaining time across a restart (it is not renewed to its full TTL)
/// and still expires on time, deleting its keys with DELETE events carrying prev_kv.
#[tokio::test]
async fn lease_keeps_remaining_time_across_restart() {
    let mut cetera = Cetera::start().await;
    let channel = common::channel(&cetera.endpoint()).await;
    let mut lease = LeaseClient::new(channel.clone());
    let granted_at = Instant::now();
    let id = lease
        .lease_grant(LeaseGrantRequest { ttl: 8, id: 0 })
        .await
        .expect("grant")
        .into_inner()
        .id;
    let mut kv = cetera::proto::etcdserverpb::kv_client::KvClient::new(channel);
    kv.put(leased(b"k", b"v", id)).await.expect("put");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = remaining(&mut lease, id).await.expect("timetolive");
    assert!(
        (3..=5).contains(&before),
        "3 s into an 8 s lease, TTL is {before}"
    );

    cetera.restart().await;
    let channel = common::channel(&cetera.endpoint()).await;
    let mut lease = LeaseClient::new(channel.clone());
    let after = remaining(&mut lease, id)
        .await
        .expect("timetolive after restart");
    assert!(
        after <= before && after >= before - 2,
        "remaining TTL {before} before the restart, {after} after"
    );

    let mut ws = WatchStream::open(channel, false);
    ws.create(WatchCreateRequest {
        key: b"k".to_vec(),
        prev_kv: true,
        ..Default::default()
    });
    let created = ws.recv(common::WAIT).await.expect("created");
    assert!(created.created, "{created:?}");
    let left = Duration::from_secs(8).saturating_sub(granted_at.elapsed());
    let expired = ws
        .recv(left + Duration::from_secs(3))
        .await
        .expect("the lease expires");
    let at = granted_at.elapsed();
    assert!(
        at > Duration::from_millis(7000) && at < Duration::from_millis(10_000),
        "the 8 s lease expired after {at:?}"
    );
    assert_eq!(
        common::show_watch_response(&expired)
            .split_once(' ')
            .map(|(_, rest)| rest.to_string()),
        Some(format!(
            "id=0 events=[DELETE \"k\"=\"\" c=0 m={rev} ver=0 prev=[\"k\"=\"v\" c=2 m=2 ver=1 lease={id}]]",
            rev = header_rev(&expired.header)
        )),
    );
    assert_eq!(remaining(&mut lease, id).await, Some(-1));
}

/// Five grants in a row with the id left to the server: etcd's ids increase
/// (its id generator: member id bits, start time, counter), and so do
/// cetera's, across a restart too, so that a Txn comparing LEASE with
/// GREATER or LESS answers the same (tests/differential.rs compares such
/// Txns).
#[tokio::test]
async fn server_chosen_lease_ids_increase_as_etcds_do() {
    async fn grants(endpoint: &str) -> Vec<i64> {
        let mut lease = LeaseClient::new(common::channel(endpoint).await);
        let mut ids = Vec::new();
        for _ in 0..5 {
            let granted = lease
                .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
                .await
                .expect("grant");
            ids.push(granted.into_inner().id);
        }
        ids
    }
    let increasing = |ids: &[i64]| ids[0] > 0 && ids.windows(2).all(|w| w[0] < w[1]);
    let Some(etcd) = common::Etcd::start().await else {
        return;
    };
    let on_etcd = grants(&etcd.endpoint()).await;
    assert!(increasing(&on_etcd), "etcd: {on_etcd:x?}");
    let mut cetera = Cetera::start().await;
    let mut on_cetera = grants(&cetera.endpoint()).await;
    cetera.restart().await;
    on_cetera.extend(grants(&cetera.endpoint()).await);
    assert!(increasing(&on_cetera), "cetera: {on_cetera:x?}");
}
