//! Several cetera instances on one shared database (PostgreSQL or MySQL):
//! revisions stay dense and ordered, every instance's watchers see every
//! instance's writes in order (and soon: what an instance reports, its
//! watchers deliver), killing one instance loses no acknowledged write, and
//! writes queued while another commit holds the lock share one commit.
//! Runs when CETERA_TEST_BACKEND is postgres or mysql.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Cetera;
use common::datastore::{TestBackend, test_backend};
use common::fault_proxy::FaultProxy;
use etcd_client::{
    Client, Compare, CompareOp, Event, EventType, GetOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::watch;

const KEYS: usize = 4;

/// Only a shared database can have two instances.
fn shared_backend() -> bool {
    if test_backend() == TestBackend::Sqlite {
        eprintln!(
            "multi-instance tests need CETERA_TEST_BACKEND=postgres or mysql; skipped on SQLite"
        );
        return false;
    }
    true
}

/// The revision the server `client` is connected to reports now (in the header of a
/// read).
async fn current_revision(client: &mut Client) -> i64 {
    let read = client.get("x", None).await.unwrap();
    read.header().unwrap().revision()
}

/// Compare-and-swap increments of a few counters until `stop`; returns the
/// revision of every acknowledged increment.
async fn cas_writer(endpoint: String, writes: usize) -> Vec<i64> {
    let mut client = Client::connect([endpoint], None).await.unwrap();
    let mut acked = Vec::new();
    let mut attempt = 0usize;
    while acked.len() < writes {
        attempt += 1;
        let key = format!("/cas/k{}", attempt % KEYS);
        let Ok(current) = client.get(key.as_str(), None).await else {
            break;
        };
        let (value, mod_revision) = match current.kvs().first() {
            Some(kv) => (
                kv.value_str().unwrap().parse::<u64>().unwrap(),
                kv.mod_revision(),
            ),
            None => (0, 0),
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                mod_revision,
            )])
            .and_then([TxnOp::put(key.as_str(), (value + 1).to_string(), None)]);
        match client.txn(txn).await {
            Ok(resp) if resp.succeeded() => acked.push(resp.header().unwrap().revision()),
            Ok(_) => {}      // lost the race: read again
            Err(_) => break, // the instance is gone
        }
    }
    acked
}

/// Collects what `seen` makes of each event a watcher of `prefix` on
/// `endpoint` receives, through the write of the key `prefix` + "end".
async fn watch_until_end<T>(
    endpoint: String,
    prefix: &str,
    options: WatchOptions,
    seen: fn(&Event) -> T,
) -> Vec<T> {
    let end = format!("{prefix}end");
    let mut client = Client::connect([endpoint], None).await.unwrap();
    let mut stream = client.watch(prefix, Some(options)).await.unwrap();
    let mut events = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(20), stream.message()).await;
        let Ok(Ok(Some(resp))) = next else { break };
        let mut ended = false;
        for event in resp.events() {
            events.push(seen(event));
            ended |= event.kv().is_some_and(|kv| kv.key() == end.as_bytes());
        }
        if ended {
            break;
        }
    }
    events
}

/// The puts under `/cas/` a watcher on `endpoint` receives from `start`:
/// revision, key, value.
async fn watch_revisions(endpoint: String, start: i64) -> Vec<(i64, String, String)> {
    let options = WatchOptions::new().with_prefix().with_start_revision(start);
    watch_until_end(endpoint, "/cas/", options, |event| {
        assert_eq!(event.event_type(), EventType::Put);
        let kv = event.kv().unwrap();
        (
            kv.mod_revision(),
            kv.key_str().unwrap().to_string(),
            kv.value_str().unwrap().to_string(),
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_dense_ordered_revisions() {
    if !shared_backend() {
        return;
    }
    let a = Cetera::start().await;
    let b = Cetera::start_on(a.datastore_endpoint()).await;
    let mut client = Client::connect([a.endpoint()], None).await.unwrap();
    let start = current_revision(&mut client).await + 1;

    let watch_a = tokio::spawn(watch_revisions(a.endpoint(), start));
    let watch_b = tokio::spawn(watch_revisions(b.endpoint(), start));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let writers: Vec<_> = [a.endpoint(), a.endpoint(), b.endpoint(), b.endpoint()]
        .into_iter()
        .map(|endpoint| tokio::spawn(cas_writer(endpoint, 60)))
        .collect();
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.unwrap());
    }
    acked.sort();
    let last = *acked.last().unwrap();
    assert_eq!(
        acked,
        (start..=last).collect::<Vec<_>>(),
        "revisions must be dense and unique"
    );

    // One last write tells the watchers they have seen everything.
    let end = client
        .put("/cas/end", "0", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let mut seen_a = watch_a.await.unwrap();
    let mut seen_b = watch_b.await.unwrap();
    assert_eq!(seen_a.pop().map(|e| e.0), Some(end));
    assert_eq!(seen_b.pop().map(|e| e.0), Some(end));

    // Both watchers saw every write, once, in revision order, with the same values.
    let revisions: Vec<i64> = seen_a.iter().map(|e| e.0).collect();
    assert_eq!(revisions, acked, "watcher on instance A");
    assert_eq!(seen_a, seen_b, "watchers on A and B disagree");

    // Counters: each acknowledged increment counted exactly once.
    let mut client = Client::connect([b.endpoint()], None).await.unwrap();
    let all = client
        .get("/cas/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let total: u64 = all
        .kvs()
        .iter()
        .filter(|kv| kv.key() != b"/cas/end")
        .map(|kv| kv.value_str().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total as usize, acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_instance_loses_no_acknowledged_write() {
    if !shared_backend() {
        return;
    }
    let a = Cetera::start().await;
    let mut b = Cetera::start_on(a.datastore_endpoint()).await;
    let acked: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();

    let mut writers = Vec::new();
    for (w, endpoint) in [a.endpoint(), b.endpoint(), b.endpoint()]
        .into_iter()
        .enumerate()
    {
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            let mut client = Client::connect([endpoint], None).await.unwrap();
            for i in 0..400 {
                let key = format!("/durable/w{w}/{i:04}");
                match client.put(key.as_str(), "v", None).await {
                    Ok(resp) => {
                        acked
                            .lock()
                            .unwrap()
                            .insert(key, resp.header().unwrap().revision());
                    }
                    Err(_) => break,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    b.kill();
    for writer in writers {
        writer.await.unwrap();
    }

    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let mut client = Client::connect([a.endpoint()], None).await.unwrap();
    let stored = client
        .get("/durable/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let stored: BTreeMap<String, i64> = stored
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().to_string(), kv.mod_revision()))
        .collect();
    for (key, revision) in &acked {
        assert_eq!(
            stored.get(key),
            Some(revision),
            "acknowledged {key} at {revision} lost"
        );
    }
    // B comes back on the same database and sees everything A has.
    b.restart().await;
    let mut client_b = Client::connect([b.endpoint()], None).await.unwrap();
    let count = client_b
        .get(
            "/durable/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    assert_eq!(count as usize, stored.len());
}

/// `endpoint` (a database URL) with its `host:port` replaced by `proxy`'s.
fn through(endpoint: &str, proxy: &FaultProxy) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap();
    let (user, rest) = rest.split_once('@').unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    format!("{scheme}://{user}@{}/{path}", proxy.addr())
}

/// The address of the database server `endpoint` names.
fn database_addr(endpoint: &str) -> std::net::SocketAddr {
    let rest = endpoint.split_once('@').unwrap().1;
    let host_port = rest.split(['/', '?']).next().unwrap();
    host_port.parse().unwrap()
}

/// The highest revision a prefix watch on `endpoint` has delivered, kept up to date.
async fn delivered_through(endpoint: String, prefix: &str, start: i64) -> watch::Receiver<i64> {
    let mut client = Client::connect([endpoint], None).await.unwrap();
    let mut stream = client
        .watch(
            prefix,
            Some(WatchOptions::new().with_prefix().with_start_revision(start)),
        )
        .await
        .unwrap();
    let (delivered, receiver) = watch::channel(start - 1);
    tokio::spawn(async move {
        while let Ok(Some(resp)) = stream.message().await {
            if let Some(last) = resp.events().last() {
                let revision = last.kv().unwrap().mod_revision();
                delivered.send_replace(revision);
            }
        }
    });
    receiver
}

/// Issue 15, item 1: with every write made on A, a watcher on B once stayed
/// two revisions behind what B's own Range reported until the next write
/// came (Postgres: a NOTIFY wake-up taken by the auth follower). Each burst of
/// puts on A must reach B's watcher, through a direct connection to the
/// database and through one that a slow network path delays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_delivers_what_it_reports() {
    if !shared_backend() {
        return;
    }
    const BURSTS: usize = 8;
    const PUTS: usize = 200;
    const WRITERS: usize = 8;
    for slowed in [false, true] {
        let a = Cetera::start().await;
        let proxy = slowed.then(|| {
            FaultProxy::start_slowed(
                database_addr(a.datastore_endpoint()),
                Duration::from_millis(3),
            )
        });
        let b_endpoint = match &proxy {
            Some(proxy) => through(a.datastore_endpoint(), proxy),
            None => a.datastore_endpoint().to_string(),
        };
        let b = Cetera::start_on(&b_endpoint).await;
        let mut reader = Client::connect([b.endpoint()], None).await.unwrap();
        let start = current_revision(&mut reader).await + 1;
        let mut delivered = delivered_through(b.endpoint(), "/burst/", start).await;

        for burst in 0..BURSTS {
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let endpoint = a.endpoint();
                    tokio::spawn(async move {
                        let mut client = Client::connect([endpoint], None).await.unwrap();
                        for i in 0..PUTS / WRITERS {
                            let key = format!("/burst/{burst}/{w}/{i}");
                            client.put(key, "v", None).await.unwrap();
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.await.unwrap();
            }
            // What B reports, B's watchers must deliver, with no further write.
            let reported = current_revision(&mut reader).await;
            let reached = tokio::time::timeout(
                Duration::from_secs(10),
                delivered.wait_for(|&revision| revision >= reported),
            )
            .await
            .is_ok();
            assert!(
                reached,
                "slowed={slowed}, burst {burst}: B reported revision {reported}, its watcher \
                 delivered only through {} in 10 s",
                *delivered.borrow()
            );
        }
    }
}

/// The gRPC code of a failed etcd-client call.
fn code_of(error: &etcd_client::Error) -> Option<tonic::Code> {
    match error {
        etcd_client::Error::GRpcStatus(status) => Some(status.code()),
        _ => None,
    }
}

/// Issue 15, item 3: an instance whose database is gone answered code
/// Unknown, on which etcd clients neither retry nor switch endpoints. It
/// must answer Unavailable (as an etcd member without quorum does), and
/// clients given a second instance must get their reads from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_database_is_gone_answers_unavailable() {
    if !shared_backend() {
        return;
    }
    let b = Cetera::start().await;
    let proxy = FaultProxy::start(database_addr(b.datastore_endpoint()));
    let a = Cetera::start_on(&through(b.datastore_endpoint(), &proxy)).await;
    let mut client_b = Client::connect([b.endpoint()], None).await.unwrap();
    client_b.put("/gone/k", "v", None).await.unwrap();
    let mut client_a = Client::connect([a.endpoint()], None).await.unwrap();
    client_a.get("/gone/k", None).await.unwrap();

    proxy.cut();
    let put = client_a.put("/gone/k2", "v", None).await.unwrap_err();
    assert_eq!(code_of(&put), Some(tonic::Code::Unavailable), "put: {put}");
    let get = client_a.get("/gone/k", None).await.unwrap_err();
    assert_eq!(code_of(&get), Some(tonic::Code::Unavailable), "get: {get}");

    // etcdctl retries a read on Unavailable, and its balancer then picks
    // the other endpoint: each of these must succeed whichever it tries first.
    if let Some(etcdctl) = common::etcdctl_35() {
        let endpoints = format!("{},{}", a.addr(), b.addr());
        for _ in 0..6 {
            let out = common::run_etcdctl(&etcdctl, &endpoints, &["get", "/gone/k"]);
            assert!(
                out.status.success(),
                "etcdctl get with a second endpoint failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), "/gone/k\nv\n");
        }
    }
    // etcd-client has no retry of its own: a caller that retries on
    // Unavailable reaches the instance that has its database.
    let mut both = Client::connect([a.endpoint(), b.endpoint()], None)
        .await
        .unwrap();
    for i in 0..6 {
        let key = format!("/gone/both/{i}");
        let mut attempts = 0;
        loop {
            attempts += 1;
            match both.put(key.as_str(), "v", None).await {
                Ok(_) => break,
                Err(error) => {
                    assert_eq!(code_of(&error), Some(tonic::Code::Unavailable), "{error}");
                    assert!(attempts < 20, "no attempt reached the second instance");
                }
            }
        }
    }
    proxy.heal();
}

/// An event as a comparable tuple: type, key, value, mod revision, and the
/// previous value with its mod revision.
type SeenEvent = (i32, String, String, i64, Option<(String, i64)>);

/// The events under `/p/`, with previous values, a watcher on `endpoint`
/// receives from `start`.
async fn watch_with_prev(endpoint: String, start: i64) -> Vec<SeenEvent> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(start)
        .with_prev_key();
    watch_until_end(endpoint, "/p/", options, |event| {
        let kv = event.kv().unwrap();
        let prev = event
            .prev_kv()
            .map(|p| (p.value_str().unwrap().to_string(), p.mod_revision()));
        (
            event.event_type() as i32,
            kv.key_str().unwrap().to_string(),
            kv.value_str().unwrap().to_string(),
            kv.mod_revision(),
            prev,
        )
    })
    .await
}

/// Two instances on one database, a client of each, and `/p/k1`..`/p/k3`
/// written as "v0".
struct TwoInstances {
    a: Cetera,
    b: Cetera,
    on_a: Client,
    on_b: Client,
    /// The revision after the keys.
    start: i64,
}

impl TwoInstances {
    async fn with_three_keys() -> TwoInstances {
        let a = Cetera::start().await;
        let b = Cetera::start_on(a.datastore_endpoint()).await;
        let mut on_a = Client::connect([a.endpoint()], None).await.unwrap();
        let on_b = Client::connect([b.endpoint()], None).await.unwrap();
        for key in ["/p/k1", "/p/k2", "/p/k3"] {
            on_a.put(key, "v0", None).await.unwrap();
        }
        let start = current_revision(&mut on_a).await + 1;
        TwoInstances {
            a,
            b,
            on_a,
            on_b,
            start,
        }
    }
}

/// A watcher's previous values are the same whether the writes came through
/// its own instance (published by its writer) or through another one (read
/// back from the log, the previous states of a batch of revisions at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_values_agree_on_both_instances() {
    if !shared_backend() {
        return;
    }
    let mut t = TwoInstances::with_three_keys().await;
    let watch_a = tokio::spawn(watch_with_prev(t.a.endpoint(), t.start));
    let watch_b = tokio::spawn(watch_with_prev(t.b.endpoint(), t.start));

    write_both_ways(&mut t.on_a, &mut t.on_b).await;

    let seen_a = watch_a.await.unwrap();
    let seen_b = watch_b.await.unwrap();
    assert_eq!(seen_a, seen_b, "watchers on A and B disagree");
    assert_eq!(summary(&seen_b), expected_summary());
}

/// Writes under `/p/` through A and through B in turn, ending with `/p/end`;
/// `/p/k1`..`/p/k3` hold "v0" before.
async fn write_both_ways(on_a: &mut Client, on_b: &mut Client) {
    on_b.put("/p/k1", "v1", None).await.unwrap();
    on_a.put("/p/k1", "v2", None).await.unwrap();
    on_b.delete("/p/k2", None).await.unwrap();
    on_a.put("/p/k2", "again", None).await.unwrap();
    let both = Txn::new().and_then([
        TxnOp::put("/p/k3", "v1", None),
        TxnOp::put("/p/k4", "new", None),
    ]);
    on_b.txn(both).await.unwrap();
    let prefix = etcd_client::DeleteOptions::new().with_prefix();
    on_a.delete("/p/k", Some(prefix)).await.unwrap();
    on_b.put("/p/k1", "last", None).await.unwrap();
    on_a.put("/p/end", "0", None).await.unwrap();
}

/// What each event of `write_both_ways` is, with its previous value.
fn summary(seen: &[SeenEvent]) -> Vec<(i32, String, Option<String>)> {
    seen.iter()
        .map(|e| (e.0, e.1.clone(), e.4.as_ref().map(|p| p.0.clone())))
        .collect()
}

/// The summary of `write_both_ways`'s events.
fn expected_summary() -> Vec<(i32, String, Option<String>)> {
    let put = EventType::Put as i32;
    let delete = EventType::Delete as i32;
    let v = |s: &str| Some(s.to_string());
    [
        (put, "/p/k1", v("v0")),
        (put, "/p/k1", v("v1")),
        (delete, "/p/k2", v("v0")),
        (put, "/p/k2", None),
        (put, "/p/k3", v("v0")),
        (put, "/p/k4", None),
        (delete, "/p/k1", v("v2")),
        (delete, "/p/k2", v("again")),
        (delete, "/p/k3", v("v1")),
        (delete, "/p/k4", v("new")),
        (put, "/p/k1", None),
        (put, "/p/end", None),
    ]
    .into_iter()
    .map(|(kind, key, prev)| (kind, key.to_string(), prev))
    .collect()
}

/// An instance that no one watches does not read other instances' writes
/// back (it only marks them seen); a watcher that comes later for those
/// revisions reads them from the log, previous values and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_watcher_gets_what_an_unwatched_instance_skipped() {
    if !shared_backend() {
        return;
    }
    let mut t = TwoInstances::with_three_keys().await;
    write_both_ways(&mut t.on_a, &mut t.on_b).await;
    // B's own writes after A's went into its window; A's did not.
    t.on_b.put("/q/after", "x", None).await.unwrap();

    let seen_a = watch_with_prev(t.a.endpoint(), t.start).await;
    let seen_b = watch_with_prev(t.b.endpoint(), t.start).await;
    assert_eq!(seen_a, seen_b, "watchers on A and B disagree");
    assert_eq!(summary(&seen_b), expected_summary());
}

/// A connection of the test's own, in a transaction holding the `meta` row
/// lock that every instance's commit takes first: another instance's commit
/// in progress, for as long as the test likes.
enum MetaLock {
    Postgres(tokio_postgres::Client),
    Mysql(mysql_async::Conn),
}

const LOCK_META: &str = "SELECT revision FROM meta WHERE id = 1 FOR UPDATE";

impl MetaLock {
    async fn take(datastore: &str) -> MetaLock {
        use mysql_async::prelude::Queryable;
        match test_backend() {
            TestBackend::Postgres => {
                let (client, connection) =
                    tokio_postgres::connect(datastore, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                tokio::spawn(connection);
                client.batch_execute("BEGIN").await.unwrap();
                client.execute(LOCK_META, &[]).await.unwrap();
                MetaLock::Postgres(client)
            }
            TestBackend::Mysql => {
                let opts = mysql_async::Opts::from_url(datastore).unwrap();
                let mut conn = mysql_async::Conn::new(opts).await.unwrap();
                conn.query_drop("START TRANSACTION").await.unwrap();
                conn.query_drop(LOCK_META).await.unwrap();
                MetaLock::Mysql(conn)
            }
            TestBackend::Sqlite => unreachable!("only a shared database has a meta lock"),
        }
    }

    async fn release(self) {
        use mysql_async::prelude::Queryable;
        match self {
            MetaLock::Postgres(client) => client.batch_execute("ROLLBACK").await.unwrap(),
            MetaLock::Mysql(mut conn) => {
                conn.query_drop("ROLLBACK").await.unwrap();
                conn.disconnect().await.unwrap();
            }
        }
    }
}

/// The value of the series `name` in the server's /metrics.
async fn metric(server: &Cetera, name: &str) -> f64 {
    common::http::scrape(&server.addr()).await.value(name, &[])
}

/// Writes that queue while another instance's commit holds the lock join
/// the commit that waited for it, once it has the lock: one commit for all
/// of them, not one for the first and one for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_behind_the_lock_share_one_commit() {
    if !shared_backend() {
        return;
    }
    const WRITES: usize = 16;
    let a = Cetera::start().await;
    let client = Client::connect([a.endpoint()], None).await.unwrap();
    let start = current_revision(&mut client.clone()).await;
    let commits = metric(&a, "cetera_writer_commits_total").await;

    let lock = MetaLock::take(a.datastore_endpoint()).await;
    let puts: Vec<_> = (0..WRITES)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.put(format!("/queued/{i}"), "v", None).await })
        })
        .collect();
    // Time for every put to reach the writer: the first waits for the
    // lock in a transaction, the others in the queue.
    tokio::time::sleep(Duration::from_secs(1)).await;
    lock.release().await;
    let mut revisions = Vec::new();
    for put in puts {
        revisions.push(put.await.unwrap().unwrap().header().unwrap().revision());
    }
    revisions.sort();
    assert_eq!(
        revisions,
        (start + 1..=start + WRITES as i64).collect::<Vec<_>>()
    );
    assert_eq!(
        metric(&a, "cetera_writer_commits_total").await - commits,
        1.0,
        "the writes queued behind the lock were committed apart"
    );
}

/// Lease ids the instances choose: each instance's increase (etcd's
/// generator: prefix, start time, counter), and no two instances, nor an
/// instance before and after a restart, hand out the same id, however the
/// grants interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_choose_distinct_increasing_lease_ids() {
    if !shared_backend() {
        return;
    }
    let mut a = Cetera::start().await;
    let b = Cetera::start_on(a.datastore_endpoint()).await;
    let mut on_a = Client::connect([a.endpoint()], None).await.unwrap();
    let mut on_b = Client::connect([b.endpoint()], None).await.unwrap();
    let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        from_a.push(on_a.lease_grant(600, None).await.unwrap().id());
        from_b.push(on_b.lease_grant(600, None).await.unwrap().id());
    }
    assert!(from_a.windows(2).all(|w| w[0] < w[1]), "{from_a:x?}");
    assert!(from_b.windows(2).all(|w| w[0] < w[1]), "{from_b:x?}");
    a.restart().await;
    let mut on_a = Client::connect([a.endpoint()], None).await.unwrap();
    let mut after_restart = Vec::new();
    for _ in 0..40 {
        after_restart.push(on_a.lease_grant(600, None).await.unwrap().id());
    }
    assert!(after_restart.windows(2).all(|w| w[0] < w[1]));
    let mut all: Vec<i64> = [from_a, from_b, after_restart].concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 120, "an id was handed out twice");
    assert!(all.iter().all(|id| *id > 0));
}
