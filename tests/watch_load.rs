//! Watch under load, cetera only: 1000 watchers on one prefix, spread over 50 streams on
//! 10 connections, while writers put 1000 keys with 1 KB values. Some streams read
//! slowly and ten (200 watchers) read nothing at all until the writers are done: the
//! server has to hold back 200,000 events (about 200 MB) for them without buffering
//! them in memory, and without slowing the writers or the other watchers down to the
//! pace of the stalled ones.
//!
//! Every watcher must receive every put exactly once, in revision order (checked as the
//! exact revision sequence plus a running hash of keys and values compared with the
//! writers' record), and the server's resident memory (VmRSS from /proc) must stay under
//! a bound throughout.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::{PutRequest, WatchCreateRequest, kv_client::KvClient};
use common::{Cetera, WatchStream};

const CONNECTIONS: usize = 10;
const STREAMS: usize = 50;
const WATCHERS_PER_STREAM: usize = 20;
const WRITERS: usize = 4;
const PUTS_PER_WRITER: usize = 250;
const VALUE_BYTES: usize = 1000;
/// Resident memory the server may use at most during the run.
const MAX_RSS_BYTES: u64 = 300 << 20;
/// A generous bound so that a hang fails the test instead of blocking CI; not a speed target.
const DEADLINE: Duration = Duration::from_secs(300);

/// How a stream's reader consumes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pace {
    Fast,
    /// Sleeps 10 ms every 100 responses.
    Slow,
    /// Reads nothing until the writers are done.
    Stalled,
}

/// Stream `s` runs on connection `s % CONNECTIONS`. Ten streams stall, one per
/// connection: the client's HTTP/2 implementation (h2) returns connection-level flow
/// control credit only as a stream's data is read, so each stalled stream keeps up to
/// its 2 MiB stream window of the connection's 5 MiB; more than two on one connection
/// would stall the other streams there too, on the client side.
fn pace(stream: usize) -> Pace {
    let (round, connection) = (stream / CONNECTIONS, stream % CONNECTIONS);
    if connection == round || connection == round + 5 {
        Pace::Stalled
    } else if connection == (round + 2) % CONNECTIONS {
        Pace::Slow
    } else {
        Pace::Fast
    }
}

/// FNV-1a over an event's revision, key and value, chained: equal hashes mean equal
/// event sequences.
fn chain(hash: u64, revision: i64, key: &[u8], value: &[u8]) -> u64 {
    let mut h = hash;
    for byte in revision.to_le_bytes().iter().chain(key).chain(value) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The server's resident set size, from /proc/PID/status.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Reads one stream until each of its watchers has seen `total` events starting at
/// revision `first`; returns each watcher's hash. Panics on anything unexpected.
async fn read_stream(
    index: usize,
    mut ws: WatchStream,
    first: i64,
    total: usize,
    writers_done: tokio::sync::watch::Receiver<bool>,
) -> Vec<u64> {
    let pace = pace(index);
    if pace == Pace::Stalled {
        let mut done = writers_done;
        done.wait_for(|d| *d).await.expect("writers finished");
    }
    let mut next = vec![first; WATCHERS_PER_STREAM];
    let mut hashes = vec![FNV_OFFSET; WATCHERS_PER_STREAM];
    let last = first + total as i64 - 1;
    let mut responses = 0usize;
    while next.iter().any(|&n| n <= last) {
        let r = ws
            .recv(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("stream {index} ({pace:?}): {e}; next revisions {next:?}"));
        let shown = || common::show_watch_response(&r);
        assert!(!r.canceled && !r.created, "stream {index}: {}", shown());
        let id = usize::try_from(r.watch_id).expect("watch id");
        for event in &r.events {
            let kv = event.kv.as_ref().expect("kv");
            assert_eq!(
                kv.mod_revision,
                next[id],
                "stream {index} watcher {id}: missing, repeated or reordered event: {}",
                shown()
            );
            hashes[id] = chain(hashes[id], kv.mod_revision, &kv.key, &kv.value);
            next[id] += 1;
        }
        responses += 1;
        if pace == Pace::Slow && responses.is_multiple_of(100) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    hashes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_watchers_with_slow_consumers() {
    let cetera = Cetera::start().await;
    let pid = cetera.pid().expect("server pid");
    let started = Instant::now();
    let mut connections = Vec::new();
    for _ in 0..CONNECTIONS {
        connections.push(common::channel(&cetera.endpoint()).await);
    }
    let mut kv = KvClient::new(connections[0].clone());
    let base = common::header_rev(
        &kv.put(PutRequest {
            key: b"unwatched".to_vec(),
            ..Default::default()
        })
        .await
        .expect("put")
        .into_inner()
        .header,
    );

    // Open the streams and create every watcher (from now) before writing.
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let mut ws = WatchStream::open(connections[s % CONNECTIONS].clone(), false);
        for _ in 0..WATCHERS_PER_STREAM {
            ws.create(WatchCreateRequest {
                key: b"load/".to_vec(),
                range_end: b"load0".to_vec(),
                ..Default::default()
            });
        }
        for w in 0..WATCHERS_PER_STREAM {
            let r = ws.recv(Duration::from_secs(10)).await.expect("created");
            assert!(
                r.created && r.watch_id == w as i64,
                "stream {s}: {}",
                common::show_watch_response(&r)
            );
        }
        streams.push(ws);
    }
    eprintln!(
        "{} watchers created in {:?}",
        STREAMS * WATCHERS_PER_STREAM,
        started.elapsed()
    );

    // Memory sampler.
    let max_rss = Arc::new(AtomicU64::new(0));
    let sampler = {
        let max_rss = max_rss.clone();
        tokio::spawn(async move {
            loop {
                if let Some(rss) = rss_bytes(pid) {
                    max_rss.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let total = WRITERS * PUTS_PER_WRITER;
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let readers: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, ws)| tokio::spawn(read_stream(i, ws, base + 1, total, done_rx.clone())))
        .collect();

    // Writers, on connections of their own (see `pace`); each records
    // revision -> (key, value).
    let write_start = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut kv = KvClient::new(common::channel(&cetera.endpoint()).await);
        writers.push(tokio::spawn(async move {
            let mut written = Vec::new();
            for n in 0..PUTS_PER_WRITER {
                let key = format!("load/{}", (n * WRITERS + w) % 300).into_bytes();
                let mut value = format!("writer {w} put {n} ").into_bytes();
                value.resize(VALUE_BYTES, b'.');
                let r = kv
                    .put(PutRequest {
                        key: key.clone(),
                        value: value.clone(),
                        ..Default::default()
                    })
                    .await
                    .expect("put")
                    .into_inner();
                written.push((common::header_rev(&r.header), key, value));
            }
            written
        }));
    }
    let mut record = BTreeMap::new();
    for w in writers {
        for (rev, key, value) in w.await.expect("writer") {
            assert!(
                record.insert(rev, (key, value)).is_none(),
                "revision {rev} twice"
            );
        }
    }
    eprintln!("{total} puts in {:?}", write_start.elapsed());
    done_tx.send(true).expect("signal readers");
    let revisions: Vec<i64> = record.keys().copied().collect();
    let expected_revisions: Vec<i64> = (base + 1..=base + total as i64).collect();
    assert_eq!(
        revisions, expected_revisions,
        "the puts got consecutive revisions"
    );
    let expected = record
        .iter()
        .fold(FNV_OFFSET, |h, (rev, (k, v))| chain(h, *rev, k, v));

    let left = DEADLINE.saturating_sub(started.elapsed());
    for (i, reader) in readers.into_iter().enumerate() {
        let hashes = tokio::time::timeout(left, reader)
            .await
            .unwrap_or_else(|_| {
                panic!("stream {i} ({:?}) did not get every event in time", pace(i))
            })
            .expect("reader");
        for (w, hash) in hashes.into_iter().enumerate() {
            assert_eq!(
                hash, expected,
                "stream {i} watcher {w}: events differ from the puts"
            );
        }
    }
    sampler.abort();
    let max = max_rss.load(Ordering::Relaxed);
    eprintln!(
        "every watcher saw all {total} events after {:?}; server max RSS {} MiB",
        started.elapsed(),
        max >> 20
    );
    assert!(max > 0, "could not read the server's VmRSS");
    assert!(
        max < MAX_RSS_BYTES,
        "server RSS reached {} MiB (limit {} MiB)",
        max >> 20,
        MAX_RSS_BYTES >> 20
    );
}
