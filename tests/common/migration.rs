//! Helpers of the `cetera migrate` tests: fill a source quickly, run the
//! command, and read a whole store back (every key at a revision, every lease
//! with its keys) to compare the two sides of a migration.

use std::path::Path;
use std::process::{Command, Output};

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::request_op::Request;
use cetera::proto::etcdserverpb::{
    LeaseLeasesRequest, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, PutRequest, RequestOp,
    TxnRequest,
};
use cetera::proto::mvccpb::KeyValue;
use tonic::transport::Channel;

use super::client::channel;
use super::etcdctl::run_etcdctl;
use super::kv_fixtures::range_all;

/// Puts `count` keys in transactions of 100 puts each (one revision per
/// transaction); `key_value(n)` gives the `n`th key and value.
pub async fn put_in_txns(
    kv: &mut KvClient<Channel>,
    count: usize,
    key_value: impl Fn(usize) -> (String, String),
) {
    for first in (0..count).step_by(100) {
        let success = (first..count.min(first + 100))
            .map(|n| {
                let (key, value) = key_value(n);
                RequestOp {
                    request: Some(Request::RequestPut(PutRequest {
                        key: key.into(),
                        value: value.into(),
                        ..Default::default()
                    })),
                }
            })
            .collect();
        let txn = TxnRequest {
            compare: vec![],
            success,
            failure: vec![],
        };
        kv.txn(txn).await.unwrap();
    }
}

/// Starts `cetera migrate --from FROM --to TO` and kills it (SIGKILL) at
/// its first progress line that contains `progress` ("of N revisions");
/// fails if it ended before that.
pub fn kill_migrate_at_progress(from: &str, to: &str, progress: &str) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_cetera"))
        .args(["migrate", "--from", from, "--to", to])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cetera migrate");
    let mut seen = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains("copied ") && line.contains(progress) {
            child.kill().unwrap();
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "migrate finished before the kill: {seen:?}"
    );
}

/// Asserts that the store at `endpoint` is a new, empty one: no key, revision 1.
pub async fn assert_empty_store(endpoint: &str) {
    use cetera::proto::etcdserverpb::RangeRequest;
    let server = super::Cetera::start_on(endpoint).await;
    let mut kv = KvClient::new(channel(&server.endpoint()).await);
    let resp = kv
        .range(RangeRequest {
            key: vec![0],
            range_end: vec![0],
            count_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((resp.count, resp.header.unwrap().revision), (0, 1));
}

/// Runs `cetera migrate --from FROM --to TO [extra]`.
pub fn migrate(from: &str, to: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cetera"))
        .args(["migrate", "--from", from, "--to", to])
        .args(extra)
        .output()
        .expect("run cetera migrate")
}

/// Asserts that `output` is of a command that succeeded, showing its output if not.
pub fn assert_success(output: &Output, what: &str) {
    assert!(output.status.success(), "{what} failed: {}", text(output));
}

/// Asserts that `stdout` contains `part`, showing all of it if not.
pub fn assert_prints(stdout: &str, part: &str) {
    assert!(stdout.contains(part), "{stdout}");
}

/// The revision in etcdctl's `-w json` output.
pub fn json_revision(output: &str) -> i64 {
    output
        .split("\"revision\":")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Runs etcdctl on `addr` with the arguments it is given, asserts that it succeeded and
/// returns its stdout.
pub fn etcdctl_on<'a>(etcdctl: &'a Path, addr: &'a str) -> impl Fn(&[&str]) -> String + 'a {
    move |args| {
        let output = run_etcdctl(etcdctl, addr, args);
        assert_success(&output, &format!("etcdctl {args:?}"));
        String::from_utf8_lossy(&output.stdout).to_string()
    }
}

/// A command's stdout then stderr, as text.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Every key at `revision` (0: current) with the header's revision, or the error message.
pub async fn all_keys(endpoint: &str, revision: i64) -> Result<(i64, Vec<KeyValue>), String> {
    let mut kv = KvClient::new(channel(endpoint).await).max_decoding_message_size(usize::MAX);
    match kv.range(range_all(revision)).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            Ok((resp.header.unwrap().revision, resp.kvs))
        }
        Err(status) => Err(status.message().to_string()),
    }
}

/// Each lease's id and TimeToLive (with its keys, in the order the server gives), in id
/// order.
pub async fn lease_ttls(channel: Channel) -> Vec<(i64, LeaseTimeToLiveResponse)> {
    let mut lease = LeaseClient::new(channel);
    let list = lease.lease_leases(LeaseLeasesRequest {}).await.unwrap();
    let mut ids: Vec<i64> = list.into_inner().leases.iter().map(|l| l.id).collect();
    ids.sort();
    let mut rows = Vec::new();
    for id in ids {
        let ttl = lease
            .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: true })
            .await
            .unwrap()
            .into_inner();
        rows.push((id, ttl));
    }
    rows
}

/// Each lease: id, granted TTL, remaining TTL and its keys (sorted).
pub async fn leases(endpoint: &str) -> Vec<(i64, i64, i64, Vec<Vec<u8>>)> {
    let ttls = lease_ttls(channel(endpoint).await).await;
    ttls.into_iter()
        .map(|(id, ttl)| {
            let mut keys = ttl.keys;
            keys.sort();
            (id, ttl.granted_ttl, ttl.ttl, keys)
        })
        .collect()
}
