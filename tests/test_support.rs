//! Tests of the test-support pieces used by the cluster fault tests: the linearizability
//! checker (tests/common/linearizability.rs) and the link-cutting TCP proxy
//! (tests/common/fault_proxy.rs); and that docker-compose.yml's databases are the ones
//! the tests connect to by default (tests/common/datastore.rs).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fault_proxy::FaultProxy;
use common::linearizability::{
    DEFAULT_BUDGET, History, Input, NEVER, Operation, Output, check, check_ops,
};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn op(client: u64, call: u64, ret: u64, input: Input, output: Output) -> Operation {
    Operation {
        client,
        input,
        call,
        ret,
        output,
    }
}

fn put(client: u64, call: u64, ret: u64, value: &str) -> Operation {
    op(client, call, ret, Input::put("k", value), Output::Ok)
}

fn get(client: u64, call: u64, ret: u64, value: Option<&str>) -> Operation {
    let seen = Output::Value(value.map(|v| v.as_bytes().to_vec()));
    op(client, call, ret, Input::get("k"), seen)
}

fn cas(client: u64, call: u64, ret: u64, from: Option<&str>, to: &str, ok: bool) -> Operation {
    op(
        client,
        call,
        ret,
        Input::cas("k", from, to),
        Output::Swapped(ok),
    )
}

/// A write whose client got an error: it may or may not have happened.
fn lost(client: u64, call: u64, input: Input) -> Operation {
    op(client, call, NEVER, input, Output::Unknown)
}

fn verdict(ops: &[Operation]) -> Result<(), String> {
    check_ops(ops, DEFAULT_BUDGET)
}

#[test]
fn checker_accepts_linearizable_histories() {
    let histories: Vec<(&str, Vec<Operation>)> = vec![
        (
            "sequential",
            vec![
                get(1, 0, 1, None),
                put(1, 2, 3, "a"),
                get(2, 4, 5, Some("a")),
                cas(2, 6, 7, Some("a"), "b", true),
                cas(1, 8, 9, Some("a"), "c", false),
                get(1, 10, 11, Some("b")),
            ],
        ),
        (
            "reads overlapping a write see old or new value",
            vec![
                put(1, 0, 10, "a"),
                get(2, 1, 3, Some("a")),
                get(3, 2, 20, None), // takes effect before the put despite returning later
                get(3, 21, 22, Some("a")),
            ],
        ),
        (
            "concurrent writes in either order",
            vec![
                put(1, 0, 10, "a"),
                put(2, 0, 10, "b"),
                get(3, 1, 2, Some("b")),
                get(3, 11, 12, Some("a")),
                get(4, 13, 14, Some("a")),
            ],
        ),
        (
            "racing CAS from absent: exactly one wins",
            vec![
                cas(1, 0, 10, None, "a", false),
                cas(2, 1, 9, None, "b", true),
                cas(3, 2, 8, Some("b"), "c", true),
                get(1, 11, 12, Some("c")),
            ],
        ),
        (
            "ops touching in time count as concurrent",
            vec![put(1, 0, 5, "a"), get(2, 5, 6, None)],
        ),
        (
            "unknown write observed later",
            vec![
                lost(1, 0, Input::put("k", "a")),
                get(2, 5, 6, None),
                get(2, 7, 8, Some("a")),
                get(3, 9, 10, Some("a")),
            ],
        ),
        (
            "unknown write never observed",
            vec![
                put(1, 0, 1, "a"),
                lost(2, 2, Input::put("k", "b")),
                get(1, 3, 4, Some("a")),
                get(1, 100, 101, Some("a")),
            ],
        ),
        (
            "unknown CAS that took effect, and a failed read that is dropped",
            vec![
                put(1, 0, 1, "a"),
                lost(2, 2, Input::cas("k", Some("a"), "b")),
                lost(3, 3, Input::get("k")),
                get(1, 4, 5, Some("b")),
            ],
        ),
        (
            "keys are independent",
            vec![
                op(1, 0, 1, Input::put("x", "1"), Output::Ok),
                op(1, 2, 3, Input::put("y", "1"), Output::Ok),
                op(2, 4, 5, Input::get("x"), Output::value("1")),
                op(2, 6, 7, Input::get("z"), Output::Value(None)),
            ],
        ),
    ];
    for (name, ops) in histories {
        assert_eq!(verdict(&ops), Ok(()), "{name}");
    }
}

#[test]
fn checker_rejects_non_linearizable_histories() {
    let histories: Vec<(&str, Vec<Operation>)> = vec![
        (
            "stale read after a completed write",
            vec![
                put(1, 0, 1, "a"),
                put(1, 2, 3, "b"),
                get(2, 4, 5, Some("a")),
            ],
        ),
        (
            "read of absent after a completed write",
            vec![put(1, 0, 10, "a"), get(2, 20, 30, None)],
        ),
        (
            "two successful CAS from the same expected value",
            vec![
                put(1, 0, 1, "0"),
                cas(2, 2, 10, Some("0"), "a", true),
                cas(3, 3, 11, Some("0"), "b", true),
            ],
        ),
        (
            "two successful CAS from absent",
            vec![
                cas(2, 0, 10, None, "a", true),
                cas(3, 1, 11, None, "b", true),
            ],
        ),
        (
            "read of a value never written",
            vec![put(1, 0, 1, "a"), get(2, 2, 3, Some("ghost"))],
        ),
        (
            "read sees a write that began after the read returned",
            vec![get(1, 0, 10, Some("a")), put(2, 20, 30, "a")],
        ),
        (
            "reads go back in time",
            vec![
                put(1, 0, 10, "a"),
                put(2, 0, 10, "b"),
                get(3, 11, 12, Some("a")),
                get(3, 13, 14, Some("b")),
            ],
        ),
        (
            "an unknown write, once seen, cannot be undone",
            vec![
                put(1, 0, 1, "a"),
                lost(2, 2, Input::put("k", "b")),
                get(3, 5, 6, Some("b")),
                get(3, 7, 8, Some("a")),
            ],
        ),
        (
            "failed CAS although the value matched",
            vec![put(1, 0, 1, "a"), cas(2, 2, 3, Some("a"), "b", false)],
        ),
    ];
    for (name, ops) in histories {
        let err = verdict(&ops).expect_err(name);
        assert!(
            err.contains("key \"k\"") && err.contains("not linearizable"),
            "{name}: {err}"
        );
    }
}

#[test]
fn checker_error_names_the_key_and_the_stuck_ops() {
    let ops = vec![
        op(1, 0, 1, Input::put("good", "1"), Output::Ok),
        op(1, 0, 1, Input::put("bad", "a"), Output::Ok),
        op(2, 4, 5, Input::get("bad"), Output::value("zzz")),
    ];
    let err = verdict(&ops).unwrap_err();
    assert!(err.starts_with("key \"bad\""), "{err}");
    assert!(err.contains("longest linearizable prefix: 1 ops"), "{err}");
    assert!(
        err.contains("* client 2 [4..5ns] get(\"bad\") -> \"zzz\""),
        "{err}"
    );
    assert!(!err.contains("good"), "{err}");
}

#[test]
fn checker_gives_up_when_over_budget() {
    // 14 concurrent writes and a read of a value none of them wrote: to reject it the
    // search must try every subset of the writes, far more than the first budget check.
    let mut ops: Vec<Operation> = (0..14).map(|i| put(i, 0, 100, &format!("v{i}"))).collect();
    ops.push(get(99, 0, 100, Some("ghost")));
    let err = check_ops(&ops, Duration::ZERO).unwrap_err();
    assert!(err.contains("undecided") && err.contains("\"k\""), "{err}");
    let err = verdict(&ops).unwrap_err();
    assert!(err.contains("not linearizable"), "{err}");
}

#[test]
fn checker_rejects_malformed_operations() {
    let err = verdict(&[op(1, 0, 1, Input::get("k"), Output::Ok)]).unwrap_err();
    assert!(err.contains("malformed"), "{err}");
    let err = verdict(&[put(1, 5, 4, "a")]).unwrap_err();
    assert!(err.contains("malformed"), "{err}");
}

/// Clients of a real (mutex-protected) register, recorded as the cluster tests will record
/// etcd clients: some writes report an error whether or not they took effect.
#[test]
fn checker_accepts_recorded_history_of_a_real_register() {
    let history = History::new();
    let store: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let start = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4u64)
        .map(|client| {
            let (history, store, start) = (history.clone(), store.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut rng = rand::rngs::StdRng::seed_from_u64(client);
                let mut last_seen: Option<String> = None;
                for i in 0..150 {
                    let key = format!("k{}", rng.random_range(0..3));
                    let value = format!("c{client}-{i}");
                    let (input, kind) = match rng.random_range(0..3) {
                        0 => (Input::put(key.as_str(), value.as_str()), 0),
                        1 => (Input::get(key.as_str()), 1),
                        _ => {
                            let from = last_seen.clone().filter(|_| rng.random_bool(0.7));
                            (Input::cas(key.as_str(), from.as_deref(), value.as_str()), 2)
                        }
                    };
                    let id = history.call(client, input.clone());
                    let output = {
                        let mut map = store.lock().unwrap();
                        match input {
                            Input::Put { .. } => {
                                map.insert(key.clone(), value.clone());
                                Output::Ok
                            }
                            Input::Get { .. } => {
                                last_seen = map.get(&key).cloned();
                                Output::Value(last_seen.clone().map(String::into_bytes))
                            }
                            Input::Cas { expected, .. } => {
                                let current = map.get(&key).map(|v| v.as_bytes().to_vec());
                                let swapped = current == expected;
                                if swapped {
                                    map.insert(key.clone(), value.clone());
                                }
                                Output::Swapped(swapped)
                            }
                        }
                    };
                    std::thread::yield_now();
                    // One in ten writes: the client sees an error although it took effect.
                    if kind != 1 && rng.random_bool(0.1) {
                        history.fail(id);
                    } else {
                        history.ret(id, output);
                    }
                }
                // A write that fails without taking effect, and one still in flight.
                history.fail(history.call(client, Input::put("k0", "never")));
                history.call(client, Input::put("k1", "in flight"));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let ops = history.ops();
    assert_eq!(ops.len(), 4 * 152);
    assert!(ops.iter().any(|o| o.output == Output::Unknown));
    let overlapping = |a: &Operation, b: &Operation| a.call < b.ret && b.call < a.ret;
    let concurrent = ops
        .iter()
        .filter(|a| {
            (a.ret != NEVER)
                && ops
                    .iter()
                    .any(|b| b.client != a.client && overlapping(a, b) && b.ret != NEVER)
        })
        .count();
    assert!(
        concurrent > 50,
        "only {concurrent} completed ops overlap another client's"
    );
    assert_eq!(check(&history), Ok(()));

    // The same history with one read changed to a value nobody wrote must fail.
    let mut bad = ops;
    let read = bad
        .iter_mut()
        .find(|o| matches!(o.input, Input::Get { .. }))
        .unwrap();
    read.output = Output::value("ghost");
    assert!(check_ops(&bad, DEFAULT_BUDGET).is_err());
}

/// An echo server on a free port, running on the test's runtime.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = socket.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

const WAIT: Duration = Duration::from_secs(5);

/// Sends `msg` and reads the echo.
async fn echo(conn: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    conn.write_all(msg).await?;
    let mut buf = vec![0; msg.len()];
    tokio::time::timeout(WAIT, conn.read_exact(&mut buf)).await??;
    Ok(buf)
}

/// True if the connection is closed: reads end (EOF or error) instead of waiting.
async fn closed(conn: &mut TcpStream) -> bool {
    let _ = conn.write_all(b"?").await;
    let mut buf = [0; 16];
    match tokio::time::timeout(WAIT, conn.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

#[tokio::test]
async fn proxy_forwards_cuts_and_heals() {
    let proxy = FaultProxy::start(echo_server().await);

    let mut live = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut live, b"hello").await.unwrap(), b"hello");

    proxy.cut();
    assert!(proxy.is_cut());
    assert!(closed(&mut live).await, "live connection survived cut()");
    // While cut, a new connection is either refused or closed right away.
    if let Ok(mut fresh) = TcpStream::connect(proxy.addr()).await {
        assert!(
            closed(&mut fresh).await,
            "new connection forwarded while cut"
        );
    }

    proxy.heal();
    assert!(!proxy.is_cut());
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut again, b"back").await.unwrap(), b"back");
    let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut second, b"two").await.unwrap(), b"two");

    // Dropping the proxy takes its links down with it.
    drop(proxy);
    assert!(
        closed(&mut again).await,
        "connection survived dropping the proxy"
    );
}

#[tokio::test]
async fn proxy_cut_kills_a_connection_mid_transfer() {
    let proxy = FaultProxy::start(echo_server().await);
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    let big = vec![7u8; 1 << 20];
    let (mut r, mut w) = conn.split();
    let writer = async {
        let _ = w.write_all(&big).await;
    };
    let reader = async {
        let mut got = 0;
        let mut buf = vec![0; 64 * 1024];
        loop {
            match tokio::time::timeout(WAIT, r.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(got),
                Ok(Ok(n)) => got += n,
                Err(_) => return Err(got),
            }
            if got >= 64 * 1024 {
                proxy.cut(); // idempotent: the rest of the transfer must stop
            }
        }
    };
    let (_, got) = tokio::join!(writer, reader);
    let got = got.expect("reads hung after cut()");
    assert!(got < big.len(), "whole transfer went through a cut link");
}

/// The lines of docker-compose.yml's service `name`, up to the next service.
fn compose_service(compose: &str, name: &str) -> String {
    let header = format!("  {name}:");
    compose
        .lines()
        .skip_while(|line| *line != header)
        .skip(1)
        .take_while(|line| line.is_empty() || line.starts_with("    "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `docker compose up` serves what the tests connect with by default: PostgreSQL's
/// `postgres` and MariaDB's `root` without a password, on the default ports; and the
/// README names the variables that point the tests elsewhere.
#[test]
fn docker_compose_serves_the_test_defaults() {
    use common::datastore::{DEFAULT_MYSQL_URL, DEFAULT_POSTGRES_URL};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let compose = std::fs::read_to_string(root.join("docker-compose.yml")).unwrap();
    assert_eq!(DEFAULT_POSTGRES_URL, "postgres://postgres@127.0.0.1:5432");
    let postgres = compose_service(&compose, "postgres");
    assert!(postgres.contains("\"127.0.0.1:5432:5432\""), "{postgres}");
    assert!(
        postgres.contains("POSTGRES_HOST_AUTH_METHOD: trust"),
        "{postgres}"
    );
    assert!(
        !postgres.contains("POSTGRES_USER"),
        "the superuser stays postgres: {postgres}"
    );
    assert_eq!(DEFAULT_MYSQL_URL, "mysql://root@127.0.0.1:3306");
    let mysql = compose_service(&compose, "mysql");
    assert!(mysql.contains("\"127.0.0.1:3306:3306\""), "{mysql}");
    assert!(
        mysql.contains("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD"),
        "{mysql}"
    );
    assert!(!mysql.contains("MARIADB_ROOT_PASSWORD"), "{mysql}");

    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for documented in [
        "CETERA_TEST_POSTGRES_URL",
        "CETERA_TEST_MYSQL_URL",
        "CETERA_TEST_BACKEND",
        DEFAULT_POSTGRES_URL,
        DEFAULT_MYSQL_URL,
    ] {
        assert!(
            readme.contains(documented),
            "README.md does not name {documented}"
        );
    }
}
