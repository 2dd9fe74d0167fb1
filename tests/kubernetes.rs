//! A Kubernetes-apiserver-shaped workload (etcd-semantics.md section 1), checked by the
//! invariants the apiserver relies on rather than by comparison:
//!
//! - objects are created, updated and deleted only through the apiserver's Txn shapes
//!   (Create: `MOD(key)=0`; Update/Delete: `MOD(key)=rev`, failure branch = Get), by two
//!   writers that race on the same keys;
//! - a prefix List, then a watch stream opened with `hasleader=true` holding two watchers
//!   (pods and events, start = listed revision + 1, prev_kv, progress_notify);
//! - RequestProgress every 100 ms on that stream while the writers run;
//! - compaction through the `compact_rev_key` Txn followed by Compact, every 500 ms;
//! - leases with a 3 s TTL that are never kept alive, expiring while the watch runs.
//!
//! Then: each watcher saw every change exactly once and in revision order, with one
//! revision never split; every non-create event carries the right prev_kv (the
//! apiserver treats a missing one as fatal), creates are recognizable as
//! create_revision == mod_revision; lease expiry deleted each lease's keys in one
//! revision; progress responses (watch_id -1) and notifications have the shape the
//! apiserver tests for, and each one's revision is >= every event before it and < every
//! event after it on the stream; nothing was canceled by the compactions.
//!
//! The same scenario runs against etcd 3.5.1 to validate the test, except the ordering of
//! RequestProgress answers: 3.5.1 answers them at once with the current revision even
//! while events are still queued (fixed in later 3.5 releases, which the apiserver
//! requires before it relies on RequestProgress).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cetera::proto::etcdserverpb::response_op::Response as OpResponse;
use cetera::proto::etcdserverpb::{
    CompactionRequest, Compare, LeaseGrantRequest, RangeRequest, TxnRequest, TxnResponse,
    WatchCreateRequest, WatchResponse, kv_client::KvClient, lease_client::LeaseClient,
};
use cetera::proto::mvccpb::{KeyValue, event::EventType};
use cetera::proto::ops;
use common::{Cetera, Etcd, WatchStream, progress_notify_interval_flag};
use rand::{Rng, SeedableRng, rngs::StdRng};
use tonic::transport::Channel;

const PODS: &[u8] = b"/registry/pods/";
const EVENTS: &[u8] = b"/registry/events/";
const COMPACT_REV_KEY: &[u8] = b"compact_rev_key";

/// Pods the writers race on: few enough that they collide often.
const POD_COUNT: usize = 12;
/// Operations per writer.
const OPS_PER_WRITER: usize = 150;
/// TTL of the event leases; the apiserver uses 3660 s for events and 15 s for endpoint
/// leases, shortened here.
const LEASE_TTL: i64 = 3;

#[tokio::test]
async fn kubernetes_workload_on_cetera() {
    let cetera = Cetera::start_with(&["--watch-progress-notify-interval", "200ms"]).await;
    within_a_minute(run(&cetera.endpoint(), true)).await;
}

#[tokio::test]
async fn kubernetes_workload_on_etcd() {
    let Some(etcd) = Etcd::start_with(&[progress_notify_interval_flag(), "200ms"]).await else {
        return;
    };
    within_a_minute(run(&etcd.endpoint(), false)).await;
}

/// Fails a test that hangs (a call the server never answers) instead of waiting forever.
async fn within_a_minute(test: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), test)
        .await
        .expect("the scenario did not finish within 60 s");
}

// ---------------------------------------------------------------------------------------
// The apiserver's requests
// ---------------------------------------------------------------------------------------

fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    end
}

fn compare_mod(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Mod as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::ModRevision(revision)),
        ..Default::default()
    }
}

/// Create: `Txn{[MOD(key)=0], success=[Put{key,value,lease}]}`.
fn create_txn(key: &[u8], value: &[u8], lease: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![compare_mod(key, 0)],
        success: vec![ops::put(key, value, lease)],
        failure: vec![],
    }
}

/// Update: `Txn{[MOD(key)=rev], success=[Put], failure=[Range{key}]}`.
fn update_txn(key: &[u8], value: &[u8], revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![compare_mod(key, revision)],
        success: vec![ops::put(key, value, 0)],
        failure: vec![ops::get(key)],
    }
}

/// Delete: `Txn{[MOD(key)=rev], success=[DeleteRange{key}], failure=[Range{key}]}`.
fn delete_txn(key: &[u8], revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![compare_mod(key, revision)],
        success: vec![ops::delete(key)],
        failure: vec![ops::get(key)],
    }
}

/// The kv a failed Update/Delete read back in its failure branch (None: key is gone).
fn failure_kv(response: &TxnResponse) -> Option<KeyValue> {
    match &response.responses.first()?.response {
        Some(OpResponse::ResponseRange(r)) => r.kvs.first().cloned(),
        _ => None,
    }
}

/// A change a writer made: what the watch must report for it.
#[derive(Clone, Debug, PartialEq)]
struct Change {
    revision: i64,
    key: Vec<u8>,
    /// None for a delete.
    value: Option<Vec<u8>>,
    create: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Action {
    Create,
    Update,
    Delete,
}

/// One apiserver-like writer: random creates, updates and deletes of the pods, each
/// with the object's last known mod revision, reading back the current object on
/// conflict like the apiserver's GuaranteedUpdate does. Returns its successful changes
/// and how many of its txns lost a race.
async fn writer(mut kv: KvClient<Channel>, seed: u64) -> (Vec<Change>, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Last known mod revision per pod (absent: believed not to exist).
    let mut known: HashMap<Vec<u8>, i64> = HashMap::new();
    let (mut changes, mut conflicts) = (Vec::new(), 0);
    for n in 0..OPS_PER_WRITER {
        let pod = format!("default/pod-{}", rng.random_range(0..POD_COUNT));
        let key = [PODS, pod.as_bytes()].concat();
        let value = format!("writer {seed} op {n}").into_bytes();
        let (txn, action) = match known.get(&key) {
            None => (create_txn(&key, &value, 0), Action::Create),
            Some(&rev) if rng.random_bool(0.75) => (update_txn(&key, &value, rev), Action::Update),
            Some(&rev) => (delete_txn(&key, rev), Action::Delete),
        };
        let response = kv.txn(txn).await.expect("txn").into_inner();
        let revision = common::header_rev(&response.header);
        if response.succeeded {
            changes.push(Change {
                revision,
                key: key.clone(),
                value: (action != Action::Delete).then(|| value.clone()),
                create: action == Action::Create,
            });
            if action == Action::Delete {
                known.remove(&key);
            } else {
                known.insert(key, revision);
            }
        } else {
            conflicts += 1;
            // Learn the current state, as the apiserver would: a failed Create has no
            // failure branch, so it reads the object separately.
            let current = if action == Action::Create {
                let r = kv
                    .range(RangeRequest {
                        key: key.clone(),
                        limit: 1,
                        ..Default::default()
                    })
                    .await
                    .expect("get")
                    .into_inner();
                r.kvs.first().cloned()
            } else {
                failure_kv(&response)
            };
            match current {
                Some(kv) => known.insert(key, kv.mod_revision),
                None => known.remove(&key),
            };
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..8))).await;
    }
    (changes, conflicts)
}

/// The apiserver's compactor, every `interval` until `stop`: the compact_rev_key Txn
/// (VERSION must be what this compactor last saw), and if it won, Compact at the
/// revision remembered from the previous round. Returns how many Compacts succeeded.
async fn compactor(
    mut kv: KvClient<Channel>,
    interval: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> usize {
    let (mut version, mut last_rev, mut compactions) = (0i64, 0i64, 0usize);
    while !*stop.borrow() {
        tokio::time::sleep(interval).await;
        let txn = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                key: COMPACT_REV_KEY.to_vec(),
                target_union: Some(TargetUnion::Version(version)),
                ..Default::default()
            }],
            success: vec![ops::put(
                COMPACT_REV_KEY,
                last_rev.to_string().as_bytes(),
                0,
            )],
            failure: vec![ops::get(COMPACT_REV_KEY)],
        };
        let response = kv.txn(txn).await.expect("compaction txn").into_inner();
        let current = common::header_rev(&response.header);
        if !response.succeeded {
            version = failure_kv(&response).map_or(0, |kv| kv.version);
            continue;
        }
        version += 1;
        if last_rev > 0 {
            kv.compact(CompactionRequest {
                revision: last_rev,
                physical: false,
            })
            .await
            .unwrap_or_else(|e| panic!("compact {last_rev}: {e}"));
            compactions += 1;
        }
        last_rev = current;
    }
    // The version counts every successful compaction txn: +1 per Put.
    let r = kv
        .range(RangeRequest {
            key: COMPACT_REV_KEY.to_vec(),
            ..Default::default()
        })
        .await
        .expect("get compact_rev_key")
        .into_inner();
    assert_eq!(
        r.kvs.first().map(|kv| kv.version),
        Some(version),
        "compact_rev_key version"
    );
    compactions
}

/// Grants a lease and creates `keys` event objects attached to it (Create txns).
/// Returns the lease id and the creations.
async fn leased_events(
    kv: &mut KvClient<Channel>,
    lease: &mut LeaseClient<Channel>,
    name: &str,
    keys: usize,
) -> (i64, Vec<Change>) {
    let granted = lease
        .lease_grant(LeaseGrantRequest {
            ttl: LEASE_TTL,
            id: 0,
        })
        .await
        .expect("grant")
        .into_inner();
    let mut changes = Vec::new();
    for i in 0..keys {
        // Created in reverse key order, so deletions in key order are not just creation
        // order.
        let key = [EVENTS, format!("default/{name}.{}", keys - i).as_bytes()].concat();
        let value = format!("event {name} {i}").into_bytes();
        let r = kv
            .txn(create_txn(&key, &value, granted.id))
            .await
            .expect("create event")
            .into_inner();
        assert!(r.succeeded, "create {}", common::show(&key));
        changes.push(Change {
            revision: common::header_rev(&r.header),
            key,
            value: Some(value),
            create: true,
        });
    }
    (granted.id, changes)
}

// ---------------------------------------------------------------------------------------
// The scenario
// ---------------------------------------------------------------------------------------

/// What arrived on the watch stream, in order.
#[derive(Debug)]
enum Item {
    /// A response with events, for watcher `id`.
    Events(i64, WatchResponse),
    /// A RequestProgress answer (watch_id -1) at this revision.
    Progress(i64),
    /// A progress notification for watcher `id` at this revision.
    Notify(i64, i64),
}

async fn run(endpoint: &str, strict_progress: bool) {
    let channel = common::channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel.clone());

    // Some pods and a first lease's events exist before the List.
    for i in 0..4 {
        let key = [PODS, format!("default/pod-{i}").as_bytes()].concat();
        let r = kv
            .txn(create_txn(&key, b"initial", 0))
            .await
            .expect("create")
            .into_inner();
        assert!(r.succeeded);
    }
    let (first_lease, _) = leased_events(&mut kv, &mut lease, "early", 5).await;

    // List (one page is enough here), then watch from the listed revision + 1.
    let list = kv
        .range(RangeRequest {
            key: PODS.to_vec(),
            range_end: prefix_end(PODS),
            limit: 500,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    let listed_rev = common::header_rev(&list.header);
    let events_list = kv
        .range(RangeRequest {
            key: EVENTS.to_vec(),
            range_end: prefix_end(EVENTS),
            revision: listed_rev,
            ..Default::default()
        })
        .await
        .expect("list events")
        .into_inner();

    let mut ws = WatchStream::open(channel.clone(), true);
    for prefix in [PODS, EVENTS] {
        ws.create(WatchCreateRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            start_revision: listed_rev + 1,
            prev_kv: true,
            progress_notify: true,
            ..Default::default()
        });
    }
    for id in 0..2 {
        let created = ws.recv(common::WAIT).await.expect("created");
        assert!(
            created.created && !created.canceled && created.watch_id == id,
            "{}",
            common::show_watch_response(&created)
        );
    }

    // The workload: two racing writers, a compactor, a second lease created mid-run.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writers = [1, 2].map(|seed| tokio::spawn(writer(kv.clone(), seed)));
    let compactions = tokio::spawn(compactor(kv.clone(), Duration::from_millis(500), stop_rx));
    let mut second = {
        let (mut kv, mut lease) = (kv.clone(), lease.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            leased_events(&mut kv, &mut lease, "late", 4).await
        })
    };

    // Read the stream, asking for progress every 100 ms, until everything is done and
    // a progress answer covers the last revision.
    let mut items = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut final_rev = None;
    let mut second_lease = None;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        assert!(
            Instant::now() < deadline,
            "workload did not finish; final revision {final_rev:?}, last items: {:?}",
            &items[items.len().saturating_sub(5)..]
        );
        tokio::select! {
            _ = tick.tick() => {
                ws.request_progress();
                if second_lease.is_none() && second.is_finished() {
                    second_lease = Some((&mut second).await.expect("second lease"));
                }
                // Done once the writers are and both leases have expired.
                let done = match &second_lease {
                    Some((id, _)) => {
                        writers.iter().all(|w| w.is_finished())
                            && lease_gone(&mut lease, first_lease).await
                            && lease_gone(&mut lease, *id).await
                    }
                    None => false,
                };
                if final_rev.is_none() && done {
                    let r = kv.range(RangeRequest { key: b"x".to_vec(), ..Default::default() })
                        .await.expect("current revision").into_inner();
                    final_rev = Some(common::header_rev(&r.header));
                }
            }
            response = ws.recv(Duration::from_secs(5)) => {
                let r = response.unwrap_or_else(|e| panic!("watch stream: {e}"));
                let item = classify(r);
                let covered = matches!(item, Item::Progress(rev) if Some(rev) >= final_rev && final_rev.is_some());
                items.push(item);
                if covered {
                    break;
                }
            }
        }
    }
    // etcd 3.5.1 may answer RequestProgress before sending the events it covers: give
    // those a moment to arrive. (Progress notifications keep the stream from going quiet.)
    if !strict_progress {
        let until = Instant::now() + Duration::from_secs(1);
        while let Ok(r) = ws
            .recv(until.saturating_duration_since(Instant::now()))
            .await
        {
            items.push(classify(r));
        }
    }
    stop_tx.send(true).expect("stop compactor");
    let compactions = compactions.await.expect("compactor");
    assert!(compactions >= 2, "only {compactions} compactions ran");

    let (mut pod_changes, mut conflicts) = (Vec::new(), 0);
    for w in writers {
        let (changes, lost) = w.await.expect("writer");
        pod_changes.extend(changes);
        conflicts += lost;
    }
    eprintln!(
        "{} pod changes ({conflicts} conflicts), {compactions} compactions, {} stream items",
        pod_changes.len(),
        items.len()
    );
    pod_changes.sort_by_key(|c| c.revision);
    let (second_lease, second_creates) = second_lease.expect("second lease");

    // Pods: exactly the writers' changes, in order.
    let initial: BTreeMap<Vec<u8>, KeyValue> = list
        .kvs
        .into_iter()
        .map(|kv| (kv.key.clone(), kv))
        .collect();
    let pods = check_watcher(&items, 0, &initial);
    let seen: Vec<Change> = pods.iter().map(|(_, c)| c.clone()).collect();
    assert_changes(&pod_changes, &seen, "pods");

    // Events: the late lease's creates, then both leases' expiry, each lease's keys in
    // one revision, in key order, with prev_kv.
    let initial: BTreeMap<Vec<u8>, KeyValue> = events_list
        .kvs
        .into_iter()
        .map(|kv| (kv.key.clone(), kv))
        .collect();
    let events = check_watcher(&items, 1, &initial);
    let creates: Vec<Change> = events
        .iter()
        .filter(|(_, c)| c.value.is_some())
        .map(|(_, c)| c.clone())
        .collect();
    assert_changes(&second_creates, &creates, "event creates");
    let deletes: Vec<&(i64, Change)> = events.iter().filter(|(_, c)| c.value.is_none()).collect();
    assert_eq!(
        deletes.len(),
        5 + 4,
        "one DELETE per leased key: {deletes:?}"
    );
    for (lease_id, count) in [(first_lease, 5), (second_lease, 4)] {
        let mine: Vec<&&(i64, Change)> = deletes.iter().filter(|(l, _)| *l == lease_id).collect();
        assert_eq!(
            mine.len(),
            count,
            "DELETEs of lease {lease_id}: {deletes:?}"
        );
        assert!(
            mine.iter().all(|(_, c)| c.revision == mine[0].1.revision),
            "lease {lease_id}'s keys deleted in one revision: {mine:?}"
        );
        assert!(
            mine.windows(2).all(|w| w[0].1.key < w[1].1.key),
            "lease {lease_id}'s keys deleted in key order: {mine:?}"
        );
    }

    check_progress(&items, strict_progress);
}

async fn lease_gone(lease: &mut LeaseClient<Channel>, id: i64) -> bool {
    let r = lease
        .lease_time_to_live(cetera::proto::etcdserverpb::LeaseTimeToLiveRequest { id, keys: false })
        .await
        .expect("timetolive");
    r.into_inner().ttl == -1
}

/// Sorts a response into events, RequestProgress answer or progress notification,
/// checking the shape the apiserver relies on for the latter two.
fn classify(r: WatchResponse) -> Item {
    let shown = common::show_watch_response(&r);
    assert!(!r.canceled, "nothing may be canceled: {shown}");
    assert!(!r.created, "no further created responses: {shown}");
    assert!(!r.fragment, "fragments were not asked for: {shown}");
    if !r.events.is_empty() {
        return Item::Events(r.watch_id, r);
    }
    // The apiserver's test for a progress notification.
    let rev = common::header_rev(&r.header);
    assert!(
        r.compact_revision == 0 && rev != 0,
        "progress shape: {shown}"
    );
    match r.watch_id {
        -1 => Item::Progress(rev),
        id @ (0 | 1) => Item::Notify(id, rev),
        _ => panic!("unknown watch id: {shown}"),
    }
}

/// Checks watcher `id`'s events against what the apiserver needs and returns them as
/// changes, each with the lease its deleted kv had (0 for other events):
/// revisions strictly increase between responses and one revision is never split;
/// a PUT is a create exactly when create_revision == mod_revision; every other event
/// carries prev_kv equal to the key's previous state (from the list, then the events).
fn check_watcher(
    items: &[Item],
    id: i64,
    initial: &BTreeMap<Vec<u8>, KeyValue>,
) -> Vec<(i64, Change)> {
    let mut state = initial.clone();
    let mut last_rev = 0;
    let mut changes = Vec::new();
    for item in items {
        let Item::Events(watch_id, r) = item else {
            continue;
        };
        if *watch_id != id {
            continue;
        }
        let shown = common::show_watch_response(r);
        let rev = r.events[0].kv.as_ref().expect("kv").mod_revision;
        assert!(
            rev > last_rev,
            "watcher {id}: revision {rev} after {last_rev}: {shown}"
        );
        last_rev = rev;
        for event in &r.events {
            let kv = event.kv.clone().expect("event kv");
            assert_eq!(kv.mod_revision, rev, "one revision per response: {shown}");
            let previous = state.get(&kv.key).cloned();
            let is_put = event.r#type == EventType::Put as i32;
            let create = is_put && kv.create_revision == kv.mod_revision;
            if create {
                assert!(previous.is_none(), "create of an existing key: {shown}");
            } else {
                assert!(
                    event.prev_kv.is_some(),
                    "non-create event without prev_kv: {shown}"
                );
                assert_eq!(event.prev_kv, previous, "prev_kv: {shown}");
            }
            let lease = previous.as_ref().map_or(0, |p| p.lease);
            if is_put {
                state.insert(kv.key.clone(), kv.clone());
            } else {
                state.remove(&kv.key);
            }
            changes.push((
                if is_put { 0 } else { lease },
                Change {
                    revision: rev,
                    value: is_put.then(|| kv.value.clone()),
                    key: kv.key,
                    create,
                },
            ));
        }
    }
    changes
}

/// Compares the changes made with those seen, reporting the first difference.
fn assert_changes(made: &[Change], seen: &[Change], what: &str) {
    let first_difference = made.iter().zip(seen).position(|(m, s)| m != s);
    if first_difference.is_some() || made.len() != seen.len() {
        let at = first_difference.unwrap_or(made.len().min(seen.len()));
        panic!(
            "{what}: {} changes made, {} seen by the watch; first difference at #{at}:\n  made: {:?}\n  seen: {:?}",
            made.len(),
            seen.len(),
            made.get(at),
            seen.get(at)
        );
    }
}

/// Every progress answer (watch_id -1, when `strict`) must cover all events sent before
/// it on the stream and precede all events with a greater revision; a watcher's own
/// notification, likewise for its events. RequestProgress must have been answered.
fn check_progress(items: &[Item], strict: bool) {
    let mut answers = 0;
    let mut notifications = 0;
    // (max event revision so far, least revision any later event may have), per watcher
    // and for the whole stream (index 2).
    let mut max_seen = [0i64; 3];
    let mut floor = [0i64; 3];
    let mut last_progress = 0;
    for (n, item) in items.iter().enumerate() {
        match item {
            Item::Events(id, r) => {
                let rev = r.events[0].kv.as_ref().map_or(0, |kv| kv.mod_revision);
                for i in [*id as usize, 2] {
                    assert!(
                        rev > floor[i],
                        "item {n}: event at revision {rev} after progress at {} ({})",
                        floor[i],
                        if i == 2 { "stream" } else { "watcher" }
                    );
                    max_seen[i] = max_seen[i].max(rev);
                }
            }
            Item::Progress(rev) => {
                answers += 1;
                assert!(
                    *rev >= last_progress,
                    "progress revisions go back: {rev} < {last_progress}"
                );
                last_progress = *rev;
                if strict {
                    assert!(
                        *rev >= max_seen[2],
                        "item {n}: progress at {rev} after an event at {}",
                        max_seen[2]
                    );
                    floor[2] = *rev;
                }
            }
            Item::Notify(id, rev) => {
                notifications += 1;
                let i = *id as usize;
                assert!(
                    *rev >= max_seen[i],
                    "item {n}: watcher {id}'s notification at {rev} after its event at {}",
                    max_seen[i]
                );
                floor[i] = *rev;
            }
        }
    }
    assert!(answers >= 10, "only {answers} RequestProgress answers");
    eprintln!("{answers} progress answers, {notifications} progress notifications");
}
