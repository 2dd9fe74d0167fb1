//! Crash safety: every write cetera acknowledged is still there, at its
//! revision, after the server is killed with SIGKILL and started again.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Cetera;
use etcd_client::{Client, GetOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let mut server = Cetera::start().await;
    let acked: Arc<Mutex<Vec<(String, String, i64)>>> = Arc::default();

    // Several writers keep the group-commit queue busy while the server dies.
    let mut writers = Vec::new();
    for w in 0..8 {
        let endpoint = server.endpoint();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            let mut client = Client::connect([endpoint], None).await.unwrap();
            for i in 0.. {
                let key = format!("/durable/w{w}/k{i:05}");
                let value = format!("value-{w}-{i}");
                match client.put(key.clone(), value.clone(), None).await {
                    Ok(resp) => {
                        acked
                            .lock()
                            .unwrap()
                            .push((key, value, resp.header().unwrap().revision()))
                    }
                    Err(_) => break, // the server is gone
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill();
    for writer in writers {
        writer.await.unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.len() > 100,
        "too few writes before the kill: {}",
        acked.len()
    );

    server.restart().await;
    let mut client = Client::connect([server.endpoint()], None).await.unwrap();
    let all = client
        .get("/durable/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let max_acked = acked.iter().map(|(_, _, rev)| *rev).max().unwrap();
    assert!(all.header().unwrap().revision() >= max_acked);
    let stored: std::collections::HashMap<&[u8], (&[u8], i64)> = all
        .kvs()
        .iter()
        .map(|kv| (kv.key(), (kv.value(), kv.mod_revision())))
        .collect();
    for (key, value, revision) in &acked {
        let found = stored.get(key.as_bytes());
        assert_eq!(
            found,
            Some(&(value.as_bytes(), *revision)),
            "acknowledged write {key} at revision {revision} lost after kill -9"
        );
    }
    // Revisions stayed dense: every acknowledged revision is distinct.
    let mut revisions: Vec<i64> = acked.iter().map(|(_, _, rev)| *rev).collect();
    revisions.sort();
    revisions.dedup();
    assert_eq!(revisions.len(), acked.len());
}

/// SIGTERM stops the server cleanly: in-flight writes are answered or
/// refused, never half-done, nothing is left to warn about (a metrics
/// scraper's open connection included), and the process exits with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly() {
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let mut server =
        Cetera::start_with(&["--listen-metrics-urls", &format!("http://{metrics}")]).await;
    // A scraper's kept-alive connection to the metrics listener.
    let mut scraper = tokio::net::TcpStream::connect(&metrics).await.unwrap();
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET /health HTTP/1.1\r\nHost: {metrics}\r\n\r\n");
        scraper.write_all(request.as_bytes()).await.unwrap();
        let mut answer = [0; 12];
        scraper.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200");
    }
    let mut client = Client::connect([server.endpoint()], None).await.unwrap();
    for i in 0..20 {
        client.put(format!("k{i}"), "v", None).await.unwrap();
    }
    let writer = {
        let mut client = client.clone();
        tokio::spawn(async move {
            let mut acked = 0;
            for i in 0.. {
                if client.put(format!("late{i}"), "v", None).await.is_err() {
                    break;
                }
                acked += 1;
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = server.terminate(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}\n{}",
        server.log()
    );
    let acked = writer.await.unwrap();
    // The store is shut down in order (queued writes answered, the batch
    // applied) rather than left to be dropped with the process.
    let log = server.last_log();
    let stopping = log
        .find("shutdown signal received")
        .expect("the server logs the signal");
    assert!(
        !log[stopping..].contains("WARN"),
        "a clean stop warned:\n{}",
        &log[stopping..]
    );

    drop(scraper);

    server.restart().await;
    let mut client = Client::connect([server.endpoint()], None).await.unwrap();
    let late = client
        .get(
            "late",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert!(
        late.count() >= acked,
        "{} stored < {acked} acknowledged",
        late.count()
    );
    assert!(
        late.count() <= acked + 1,
        "at most the one unanswered write may have landed"
    );
}

/// A clean stop (Ctrl-C) leaves the whole store in the database file: the WAL
/// is checkpointed and gone, so a copy of `state.db` alone is a full backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_stop_leaves_everything_in_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut server = Cetera::start_on(&format!("sqlite://{}", path.display())).await;
    let mut client = Client::connect([server.endpoint()], None).await.unwrap();
    for i in 0..50 {
        client.put(format!("k{i:02}"), "v", None).await.unwrap();
    }
    let status = server.interrupt(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}\n{}",
        server.log()
    );
    let wal = dir.path().join("state.db-wal");
    let wal_bytes = std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert_eq!(wal_bytes, 0, "the WAL still holds {wal_bytes} bytes");

    let copy_dir = tempfile::tempdir().unwrap();
    let copy = copy_dir.path().join("state.db");
    std::fs::copy(&path, &copy).unwrap();
    let restored = Cetera::start_on(&format!("sqlite://{}", copy.display())).await;
    let mut client = Client::connect([restored.endpoint()], None).await.unwrap();
    let all = client
        .get("k", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .unwrap();
    assert_eq!(all.count(), 50, "keys in a copy of the database file alone");
    assert_eq!(all.header().unwrap().revision(), 51);
}

/// One SQLite file has one server, as an etcd data dir has one etcd: a second
/// server on the file is refused at start (it would have the same member id
/// and never see the first one's writes), and a server killed with SIGKILL
/// leaves nothing behind that keeps the next one out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let endpoint = format!("sqlite://{}", path.display());
    let mut first = Cetera::start_on(&endpoint).await;
    let mut client = Client::connect([first.endpoint()], None).await.unwrap();
    client.put("k", "v", None).await.unwrap();

    let (status, log) = Cetera::refused_on(&endpoint).await;
    assert!(!status.success(), "exit status {status}\n{log}");
    let message = format!(
        "SQLite database {} is in use by another cetera process",
        path.display()
    );
    assert!(log.contains(&message), "{log}");
    assert!(
        log.contains(&format!("(pid {})", first.pid().unwrap())),
        "{log}"
    );

    first.kill();
    let second = Cetera::start_on(&endpoint).await;
    let mut client = Client::connect([second.endpoint()], None).await.unwrap();
    let got = client.get("k", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"v");
}

/// Keep-alives answered from memory (a deadline is stored later, when the
/// stored one comes within 5 s): after a kill -9 the lease expires no
/// earlier than the last acknowledged keep-alive promised, and at most TTL +
/// 1 s after the kill. The test reads the database file itself, to see an
/// acknowledged keep-alive the kill caught before it was stored (a stored
/// deadline that is still only in the record log counts as not stored: the
/// restart applies it). A 5 s lease
/// has its deadline stored at every commit, a 30 s one far less often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_survive_kill_9_within_their_bound() {
    let mut server = Cetera::start().await;
    let Some(path) = server.datastore_endpoint().strip_prefix("sqlite://") else {
        eprintln!("SKIPPED: keep-alives are answered from memory on SQLite only");
        return;
    };
    let path = std::path::PathBuf::from(path);
    keep_alive_through_kill_9(&mut server, &path, 30, false).await;
    keep_alive_through_kill_9(&mut server, &path, 5, true).await;
}

/// Keeps a lease of `ttl` seconds alive and kills the server right after an
/// acknowledged keep-alive, until a kill catches one unstored; then checks
/// the deadline after the restart and, with `expire`, that the lease expires.
async fn keep_alive_through_kill_9(
    server: &mut Cetera,
    path: &std::path::Path,
    ttl: i64,
    expire: bool,
) {
    let stored = |id: i64| -> i64 {
        let db =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        db.query_row("SELECT expires_at FROM lease WHERE id = ?1", [id], |row| {
            row.get(0)
        })
        .unwrap()
    };
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    for attempt in 0..5 {
        let mut client = Client::connect([server.endpoint()], None).await.unwrap();
        let id = client.lease_grant(ttl, None).await.unwrap().id();
        let key = format!("/leased/{ttl}/{attempt}");
        client
            .put(
                key.clone(),
                "v",
                Some(etcd_client::PutOptions::new().with_lease(id)),
            )
            .await
            .unwrap();
        let (mut keeper, mut acks) = client.lease_keep_alive(id).await.unwrap();
        let mut promised = 0;
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(70)).await;
            let sent_ms = now_ms();
            keeper.keep_alive().await.unwrap();
            let ack = acks.message().await.unwrap().unwrap();
            assert_eq!(ack.ttl(), ttl);
            promised = sent_ms + ttl * 1000;
        }
        server.kill();
        let killed_ms = now_ms();
        if stored(id) >= promised {
            eprintln!("attempt {attempt}: the last keep-alive was stored before the kill; again");
            server.restart().await;
            continue;
        }

        server.restart().await;
        // The restart's own commit of the deadlines reaches the file with
        // the record log's next batch, within a second or so.
        let mut after = stored(id);
        let settled = std::time::Instant::now() + Duration::from_secs(5);
        while after < promised && std::time::Instant::now() < settled {
            tokio::time::sleep(Duration::from_millis(50)).await;
            after = stored(id);
        }
        assert!(
            after >= promised,
            "{ttl} s lease: the deadline {after} is before its last keep-alive's promise {promised}"
        );
        assert!(
            after <= killed_ms + ttl * 1000 + 1000,
            "{ttl} s lease: the deadline {after} is more than TTL + 1 s after the kill at {killed_ms}"
        );
        if !expire {
            return;
        }
        let mut client = Client::connect([server.endpoint()], None).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(ttl as u64 + 5);
        loop {
            let left = client.get(key.as_str(), None).await.unwrap().count();
            let now = now_ms();
            if left == 0 {
                assert!(now >= promised, "the key went at {now}, before {promised}");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the lease did not expire"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    panic!("no kill caught an acknowledged keep-alive of a {ttl} s lease before it was stored");
}
