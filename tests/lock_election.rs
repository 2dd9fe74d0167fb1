//! The Lock and Election services: differential against real etcd 3.5.1 over raw gRPC
//! (keys with lease ids masked, revisions, values, error codes and messages, waiting and
//! cancelled contenders), `etcdctl lock` / `etcdctl elect` (3.5 and 3.4) against both
//! servers, and etcd-client's lock and election APIs against cetera.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::{LeaseGrantRequest, LeaseRevokeRequest, RangeRequest};
use cetera::proto::v3electionpb::election_client::ElectionClient;
use cetera::proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest,
};
use cetera::proto::v3lockpb::lock_client::LockClient;
use cetera::proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest};
use common::{Cetera, Etcd, Side, differential, header_rev, outcome, show, show_kv};
use tonic::transport::Channel;

/// How long a test waits for something that must happen (a server-side cleanup, a
/// waiting contender getting its turn) before it records that it did not.
const PATIENCE: Duration = Duration::from_secs(20);

fn lock_client(s: &Side) -> LockClient<Channel> {
    LockClient::new(s.channel.clone())
}

fn election_client(s: &Side) -> ElectionClient<Channel> {
    ElectionClient::new(s.channel.clone())
}

async fn grant(s: &mut Side, ttl: i64) -> i64 {
    let id = LeaseClient::new(s.channel.clone())
        .lease_grant(LeaseGrantRequest { ttl, id: 0 })
        .await
        .expect("grant")
        .into_inner()
        .id;
    s.server_lease(id);
    id
}

/// Registers the lease id at the end of a contender key (`name/<hex>`) as server-chosen,
/// so that leases granted by the server itself (for lease 0) are masked too.
fn learn_lease_from_key(s: &mut Side, key: &[u8]) {
    let key = String::from_utf8_lossy(key);
    if let Some(hex) = key.rsplit('/').next()
        && let Ok(id) = i64::from_str_radix(hex, 16)
    {
        s.server_lease(id);
    }
}

fn show_lock(r: &LockResponse) -> String {
    format!("key={} rev={}", show(&r.key), header_rev(&r.header))
}

fn show_leader_key(l: &Option<LeaderKey>) -> String {
    match l {
        Some(l) => format!(
            "name={} key={} rev={} lease={}",
            show(&l.name),
            show(&l.key),
            l.rev,
            l.lease
        ),
        None => "no leader key".into(),
    }
}

fn show_campaign(r: &CampaignResponse) -> String {
    format!(
        "rev={} leader=[{}]",
        header_rev(&r.header),
        show_leader_key(&r.leader)
    )
}

/// Records every key under `prefix` (create/mod revisions, values, leases), oldest first.
async fn list(s: &mut Side, step: &str, prefix: &str) {
    let resp =
        s.kv.range(RangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            ..Default::default()
        })
        .await;
    s.note(
        step,
        outcome(resp, |r| {
            // Keys order by lease id, which each server picks at random: show them
            // in queue order instead.
            let mut kvs = r.kvs.clone();
            kvs.sort_by_key(|kv| kv.create_revision);
            let kvs: Vec<String> = kvs.iter().map(show_kv).collect();
            format!("rev={} [{}]", header_rev(&r.header), kvs.join("; "))
        }),
    );
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    end
}

/// How many keys are under `prefix`.
async fn count(kv: &KvClient<Channel>, prefix: &str) -> i64 {
    kv.clone()
        .range(RangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix),
            count_only: true,
            ..Default::default()
        })
        .await
        .expect("count")
        .into_inner()
        .count
}

/// Waits until `prefix` holds `want` keys; false if it never does within [`PATIENCE`].
async fn until_count(kv: &KvClient<Channel>, prefix: &str, want: i64) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if count(kv, prefix).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn lock_differential() {
    differential(&[], &[], async |s: &mut Side| {
        let a = grant(s, 60).await;
        let b = grant(s, 60).await;
        let mut locks = lock_client(s);
        let lock = |name: &str, lease: i64| LockRequest {
            name: name.into(),
            lease,
        };

        let first = locks.lock(lock("l", a)).await;
        let first_key = first
            .as_ref()
            .map(|r| r.get_ref().key.clone())
            .unwrap_or_default();
        s.note("lock l with lease a", outcome(first, show_lock));
        let again = locks.lock(lock("l", a)).await;
        s.note(
            "lock l again with lease a: same key",
            outcome(again, show_lock),
        );

        // b queues behind a and gets the lock only once a unlocks.
        let mut waiting = locks.clone();
        let second = tokio::spawn(async move { waiting.lock(lock("l", b)).await });
        let queued = until_count(&s.kv, "l/", 2).await;
        s.note(
            "b queued",
            format!("{queued} finished={}", second.is_finished()),
        );
        let unrelated = s.put(b"l-other", b"x").await;
        s.note(
            "b still waits after an unrelated put",
            format!("{unrelated} finished={}", second.is_finished()),
        );
        list(s, "keys while contended", "l/").await;
        let unlocked = locks
            .unlock(UnlockRequest {
                key: first_key.clone(),
            })
            .await;
        s.note(
            "unlock a",
            outcome(unlocked, |r| format!("rev={}", header_rev(&r.header))),
        );
        let second = finish(second).await;
        s.note("b acquires after a unlocked", outcome(second, show_lock));

        // Errors.
        let missing = locks.lock(lock("l", 0x1234)).await;
        s.note("lock with a missing lease", outcome(missing, show_lock));
        let unlock_empty = locks.unlock(UnlockRequest { key: vec![] }).await;
        s.note(
            "unlock without a key",
            outcome(unlock_empty, |r| format!("rev={}", header_rev(&r.header))),
        );
        let unlock_gone = locks.unlock(UnlockRequest { key: first_key }).await;
        s.note(
            "unlock a key already gone",
            outcome(unlock_gone, |r| format!("rev={}", header_rev(&r.header))),
        );

        // Lease 0: the server grants a 60 s lease of its own for the key.
        let own = locks.lock(lock("z", 0)).await;
        if let Ok(r) = &own {
            learn_lease_from_key(s, &r.get_ref().key);
        }
        s.note("lock with lease 0", outcome(own, show_lock));
        list(s, "keys under z/", "z/").await;
        let mut leases = LeaseClient::new(s.channel.clone());
        let listed = leases
            .lease_leases(cetera::proto::etcdserverpb::LeaseLeasesRequest {})
            .await;
        let listed = outcome(listed, |r| {
            let mut ids: Vec<String> = r.leases.iter().map(|l| s.lease_name(l.id)).collect();
            ids.sort_unstable();
            ids.join(" ")
        });
        s.note("leases", listed);

        // Revoking the lease of a waiting locker deletes its key; the server then
        // answers the waiter that its session expired.
        let c = grant(s, 60).await;
        let d = grant(s, 60).await;
        let held = locks.lock(lock("x", c)).await;
        s.note("lock x with c", outcome(held, show_lock));
        let mut waiting = locks.clone();
        let expired = tokio::spawn(async move { waiting.lock(lock("x", d)).await });
        let queued = until_count(&s.kv, "x/", 2).await;
        s.note("d queued on x", queued.to_string());
        let revoked = LeaseClient::new(s.channel.clone())
            .lease_revoke(LeaseRevokeRequest { id: d })
            .await;
        s.note(
            "revoke d",
            outcome(revoked, |r| format!("rev={}", header_rev(&r.header))),
        );
        s.note(
            "d still waits (c holds x)",
            format!("finished={}", expired.is_finished()),
        );
        let revoked = LeaseClient::new(s.channel.clone())
            .lease_revoke(LeaseRevokeRequest { id: c })
            .await;
        s.note(
            "revoke c",
            outcome(revoked, |r| format!("rev={}", header_rev(&r.header))),
        );
        let expired = finish(expired).await;
        s.note("d's wait ends", outcome(expired, show_lock));
    })
    .await;
}

#[tokio::test]
async fn cancelled_waiters_differential() {
    differential(&[], &[], async |s: &mut Side| {
        let a = grant(s, 60).await;
        let b = grant(s, 60).await;
        let mut locks = lock_client(s);
        let held = locks
            .lock(LockRequest {
                name: "c".into(),
                lease: a,
            })
            .await;
        s.note("a locks c", outcome(held, show_lock));
        // b's Lock call is abandoned by its client while it waits.
        let mut waiting = locks.clone();
        let abandoned = tokio::spawn(async move {
            waiting
                .lock(LockRequest {
                    name: "c".into(),
                    lease: b,
                })
                .await
        });
        let queued = until_count(&s.kv, "c/", 2).await;
        s.note("b queued on c", queued.to_string());
        abandoned.abort();
        let _ = abandoned.await;
        let cleaned = until_count(&s.kv, "c/", 1).await;
        s.note(
            "the server deleted b's key after the cancel",
            cleaned.to_string(),
        );
        list(s, "keys under c/", "c/").await;

        // The same for a campaign: the server resigns for the departed candidate.
        let mut elections = election_client(s);
        let leader = elections
            .campaign(CampaignRequest {
                name: "e".into(),
                lease: a,
                value: "a".into(),
            })
            .await;
        s.note("a campaigns", outcome(leader, show_campaign));
        let mut waiting = elections.clone();
        let abandoned = tokio::spawn(async move {
            waiting
                .campaign(CampaignRequest {
                    name: "e".into(),
                    lease: b,
                    value: "b".into(),
                })
                .await
        });
        let queued = until_count(&s.kv, "e/", 2).await;
        s.note("b campaigns and waits", queued.to_string());
        abandoned.abort();
        let _ = abandoned.await;
        let cleaned = until_count(&s.kv, "e/", 1).await;
        s.note(
            "the server resigned b after the cancel",
            cleaned.to_string(),
        );
        list(s, "keys under e/", "e/").await;
    })
    .await;
}

#[tokio::test]
async fn election_differential() {
    differential(&[], &[], async |s: &mut Side| {
        let a = grant(s, 60).await;
        let b = grant(s, 60).await;
        let mut elections = election_client(s);
        let name = || b"e".to_vec();

        let none = elections.leader(LeaderRequest { name: name() }).await;
        s.note(
            "leader with no candidates",
            outcome(none, |r| format!("{:?}", r.kv)),
        );

        // etcd sends an Observe stream's headers with its first leader, so the call
        // itself returns only once there is one.
        let mut observing = elections.clone();
        let observer =
            tokio::spawn(async move { observing.observe(LeaderRequest { name: name() }).await });

        let won = elections
            .campaign(CampaignRequest {
                name: name(),
                lease: a,
                value: "a1".into(),
            })
            .await;
        let a_leader = won.as_ref().ok().and_then(|r| r.get_ref().leader.clone());
        s.note("a campaigns", outcome(won, show_campaign));
        let mut observer = finish(observer).await.expect("observe").into_inner();
        observed(s, &mut observer, "observer sees a").await;

        let mut waiting = elections.clone();
        let b_campaign = tokio::spawn(async move {
            waiting
                .campaign(CampaignRequest {
                    name: b"e".to_vec(),
                    lease: b,
                    value: "b1".into(),
                })
                .await
        });
        let queued = until_count(&s.kv, "e/", 2).await;
        s.note(
            "b campaigns and waits",
            format!("{queued} finished={}", b_campaign.is_finished()),
        );

        let leader = elections.leader(LeaderRequest { name: name() }).await;
        s.note(
            "leader is a",
            outcome(leader, |r| {
                format!(
                    "rev={} kv={:?}",
                    header_rev(&r.header),
                    r.kv.as_ref().map(show_kv)
                )
            }),
        );

        let a_leader = a_leader.unwrap_or_default();
        let proclaimed = elections
            .proclaim(ProclaimRequest {
                leader: Some(a_leader.clone()),
                value: "a2".into(),
            })
            .await;
        s.note(
            "a proclaims a2",
            outcome(proclaimed, |r| format!("rev={}", header_rev(&r.header))),
        );
        observed(s, &mut observer, "observer sees a2").await;

        let stale = LeaderKey {
            rev: a_leader.rev + 100,
            ..a_leader.clone()
        };
        let not_leader = elections
            .proclaim(ProclaimRequest {
                leader: Some(stale.clone()),
                value: "x".into(),
            })
            .await;
        s.note(
            "proclaim with the wrong revision",
            outcome(not_leader, |r| format!("rev={}", header_rev(&r.header))),
        );
        let no_key = elections
            .proclaim(ProclaimRequest {
                leader: None,
                value: "x".into(),
            })
            .await;
        s.note(
            "proclaim without a leader",
            outcome(no_key, |r| format!("rev={}", header_rev(&r.header))),
        );
        let empty_key = elections
            .proclaim(ProclaimRequest {
                leader: Some(LeaderKey {
                    key: vec![],
                    ..a_leader.clone()
                }),
                value: "x".into(),
            })
            .await;
        s.note(
            "proclaim with an empty key",
            outcome(empty_key, |r| format!("rev={}", header_rev(&r.header))),
        );
        let missing_lease = elections
            .proclaim(ProclaimRequest {
                leader: Some(LeaderKey {
                    lease: 0x4321,
                    ..a_leader.clone()
                }),
                value: "x".into(),
            })
            .await;
        s.note(
            "proclaim with a missing lease",
            outcome(missing_lease, |r| format!("rev={}", header_rev(&r.header))),
        );
        let resign_stale = elections
            .resign(ResignRequest {
                leader: Some(stale),
            })
            .await;
        s.note(
            "resign with the wrong revision does nothing",
            outcome(resign_stale, |r| format!("rev={}", header_rev(&r.header))),
        );
        let resign_none = elections.resign(ResignRequest { leader: None }).await;
        s.note(
            "resign without a leader",
            outcome(resign_none, |r| format!("rev={}", header_rev(&r.header))),
        );

        // Campaigning again with the same lease keeps the place and updates the value.
        let again = elections
            .campaign(CampaignRequest {
                name: name(),
                lease: a,
                value: "a3".into(),
            })
            .await;
        s.note("a campaigns again with a3", outcome(again, show_campaign));
        observed(s, &mut observer, "observer sees a3").await;
        list(s, "candidates", "e/").await;

        let resigned = elections
            .resign(ResignRequest {
                leader: Some(a_leader),
            })
            .await;
        s.note(
            "a resigns",
            outcome(resigned, |r| format!("rev={}", header_rev(&r.header))),
        );
        let b_won = finish(b_campaign).await;
        let b_leader = b_won.as_ref().ok().and_then(|r| r.get_ref().leader.clone());
        s.note("b's campaign returns", outcome(b_won, show_campaign));
        observed(s, &mut observer, "observer sees b").await;

        let missing = elections
            .campaign(CampaignRequest {
                name: b"f".to_vec(),
                lease: 0x1234,
                value: "v".into(),
            })
            .await;
        s.note(
            "campaign with a missing lease",
            outcome(missing, show_campaign),
        );
        let big = elections
            .campaign(CampaignRequest {
                name: b"big".to_vec(),
                lease: a,
                value: vec![b'v'; 1_600_000],
            })
            .await;
        s.note(
            "campaign with a value over --max-request-bytes",
            outcome(big, show_campaign),
        );
        let own = elections
            .campaign(CampaignRequest {
                name: b"g".to_vec(),
                lease: 0,
                value: "v".into(),
            })
            .await;
        if let Ok(r) = &own
            && let Some(l) = &r.get_ref().leader
        {
            learn_lease_from_key(s, &l.key);
        }
        s.note("campaign with lease 0", outcome(own, show_campaign));

        // b's lease ends: the observer waits for the next candidate and sees it.
        let revoked = LeaseClient::new(s.channel.clone())
            .lease_revoke(LeaseRevokeRequest { id: b })
            .await;
        s.note(
            "revoke b",
            outcome(revoked, |r| format!("rev={}", header_rev(&r.header))),
        );
        let none = elections.leader(LeaderRequest { name: name() }).await;
        s.note(
            "no leader after b's lease is gone",
            outcome(none, |r| format!("{:?}", r.kv)),
        );
        let c = grant(s, 60).await;
        let c_won = elections
            .campaign(CampaignRequest {
                name: name(),
                lease: c,
                value: "c1".into(),
            })
            .await;
        s.note("c campaigns", outcome(c_won, show_campaign));
        observed(s, &mut observer, "observer sees c").await;
        let b_proclaims = elections
            .proclaim(ProclaimRequest {
                leader: b_leader,
                value: "b2".into(),
            })
            .await;
        s.note(
            "b proclaims after its lease is gone",
            outcome(b_proclaims, |r| format!("rev={}", header_rev(&r.header))),
        );

        // An observer that starts while there is a leader sees it at once.
        let mut late = elections
            .observe(LeaderRequest { name: name() })
            .await
            .expect("observe")
            .into_inner();
        observed(s, &mut late, "a late observer sees c").await;
    })
    .await;
}

/// The outcome of a call that runs in the background, or DeadlineExceeded "still
/// waiting" when it has not finished within [`PATIENCE`].
async fn finish<T>(
    call: tokio::task::JoinHandle<Result<tonic::Response<T>, tonic::Status>>,
) -> Result<tonic::Response<T>, tonic::Status> {
    match tokio::time::timeout(PATIENCE, call).await {
        Ok(joined) => joined.expect("join"),
        Err(_) => Err(tonic::Status::deadline_exceeded("still waiting")),
    }
}

/// Records the next leader an Observe stream reports.
async fn observed(
    s: &mut Side,
    stream: &mut tonic::Streaming<cetera::proto::v3electionpb::LeaderResponse>,
    step: &str,
) {
    let got = tokio::time::timeout(PATIENCE, stream.message()).await;
    let text = match got {
        Err(_) => "nothing".to_string(),
        Ok(Err(status)) => format!("ERR {:?}: {}", status.code(), status.message()),
        Ok(Ok(None)) => "stream ended".to_string(),
        Ok(Ok(Some(r))) => format!(
            "rev={} kv={:?}",
            header_rev(&r.header),
            r.kv.as_ref().map(show_kv)
        ),
    };
    s.note(step, text);
}

/// A running etcdctl whose stdout lines arrive on a channel.
struct Etcdctl {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Etcdctl {
    fn spawn(etcdctl: &Path, addr: &str, args: &[&str]) -> Etcdctl {
        let mut child = Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={addr}"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcdctl");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Etcdctl { child, lines }
    }

    /// The next line of output, or "<nothing>".
    fn line(&self) -> String {
        self.lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| "<nothing>".into())
    }

    /// Whether the program printed nothing yet beyond what was read.
    fn silent(&self) -> bool {
        self.lines.try_recv().is_err()
    }

    /// Interrupts it as Ctrl-C would: etcdctl then closes its session (revoking its
    /// lease), which releases its lock or leadership.
    fn interrupt(&mut self) {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill -INT");
        assert!(status.success());
        let _ = self.child.wait();
    }
}

impl Drop for Etcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name/<16 hex digits>` with the hex replaced, so transcripts compare across servers.
fn mask_lease_hex(line: &str) -> String {
    match line.rsplit_once('/') {
        Some((name, hex)) if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) => {
            format!("{name}/<lease>")
        }
        _ => line.to_string(),
    }
}

/// Two `etcdctl lock` processes contend; the second gets the lock only when the first
/// is interrupted. Returns the transcript.
async fn etcdctl_lock_scenario(etcdctl: &Path, addr: &str, kv: &KvClient<Channel>) -> Vec<String> {
    let mut transcript = Vec::new();
    let mut first = Etcdctl::spawn(etcdctl, addr, &["lock", "mylock"]);
    let first_key = first.line();
    transcript.push(format!("first holds {}", mask_lease_hex(&first_key)));
    let mut second = Etcdctl::spawn(etcdctl, addr, &["lock", "mylock"]);
    transcript.push(format!(
        "second queued: {}",
        until_count(kv, "mylock/", 2).await
    ));
    transcript.push(format!("second waits: {}", second.silent()));
    first.interrupt();
    let second_key = second.line();
    transcript.push(format!("second holds {}", mask_lease_hex(&second_key)));
    transcript.push(format!("different keys: {}", first_key != second_key));
    // A lock with a command runs it while holding the lock, with the key in the
    // environment, then releases it.
    second.interrupt();
    transcript.push(format!("released: {}", until_count(kv, "mylock/", 0).await));
    let ran = Etcdctl::spawn(
        etcdctl,
        addr,
        &[
            "lock",
            "mylock",
            "--",
            "sh",
            "-c",
            "echo got $ETCD_LOCK_KEY",
        ],
    );
    transcript.push(format!("command: {}", mask_lease_hex(&ran.line())));
    transcript
}

/// `etcdctl elect`: an observer sees each leader; a second candidate leads once the first
/// is interrupted. Returns the transcript.
async fn etcdctl_elect_scenario(etcdctl: &Path, addr: &str, kv: &KvClient<Channel>) -> Vec<String> {
    let mut transcript = Vec::new();
    let observer = Etcdctl::spawn(etcdctl, addr, &["elect", "-l", "myelection"]);
    let mut first = Etcdctl::spawn(etcdctl, addr, &["elect", "myelection", "p1"]);
    transcript.push(format!(
        "first leads: {} {}",
        mask_lease_hex(&first.line()),
        first.line()
    ));
    transcript.push(format!(
        "observer: {} {}",
        mask_lease_hex(&observer.line()),
        observer.line()
    ));
    let second = Etcdctl::spawn(etcdctl, addr, &["elect", "myelection", "p2"]);
    transcript.push(format!(
        "second queued: {}",
        until_count(kv, "myelection/", 2).await
    ));
    transcript.push(format!("second waits: {}", second.silent()));
    first.interrupt();
    transcript.push(format!(
        "second leads: {} {}",
        mask_lease_hex(&second.line()),
        second.line()
    ));
    transcript.push(format!(
        "observer: {} {}",
        mask_lease_hex(&observer.line()),
        observer.line()
    ));
    transcript
}

/// Runs `scenario` with `etcdctl` against real etcd and cetera; both transcripts must
/// match `expected`.
async fn etcdctl_on_both<F>(etcdctl: Option<std::path::PathBuf>, expected: &[&str], scenario: F)
where
    F: AsyncFn(&Path, &str, &KvClient<Channel>) -> Vec<String>,
{
    let Some(etcdctl) = etcdctl else { return };
    let (etcd, cetera) = tokio::join!(Etcd::start(), Cetera::start());
    let mut servers = vec![("cetera", cetera.addr(), cetera.endpoint())];
    if let Some(etcd) = &etcd {
        servers.insert(0, ("etcd", etcd.addr(), etcd.endpoint()));
    }
    for (name, addr, endpoint) in servers {
        let kv = KvClient::new(common::channel(&endpoint).await);
        let got = scenario(&etcdctl, &addr, &kv).await;
        assert_eq!(got, expected, "{name} with {}", etcdctl.display());
    }
}

#[tokio::test]
async fn etcdctl_lock_35_and_34() {
    let expected = [
        "first holds mylock/<lease>",
        "second queued: true",
        "second waits: true",
        "second holds mylock/<lease>",
        "different keys: true",
        "released: true",
        "command: got mylock/<lease>",
    ];
    etcdctl_on_both(common::etcdctl_35(), &expected, etcdctl_lock_scenario).await;
    etcdctl_on_both(common::etcdctl_34(), &expected, etcdctl_lock_scenario).await;
}

#[tokio::test]
async fn etcdctl_elect_35_and_34() {
    let expected = [
        "first leads: myelection/<lease> p1",
        "observer: myelection/<lease> p1",
        "second queued: true",
        "second waits: true",
        "second leads: myelection/<lease> p2",
        "observer: myelection/<lease> p2",
    ];
    etcdctl_on_both(common::etcdctl_35(), &expected, etcdctl_elect_scenario).await;
    etcdctl_on_both(common::etcdctl_34(), &expected, etcdctl_elect_scenario).await;
}

#[tokio::test]
async fn etcd_client_lock_and_election() {
    let cetera = Cetera::start().await;
    let mut client = etcd_client::Client::connect([cetera.endpoint()], None)
        .await
        .expect("connect");
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let other = client.lease_grant(60, None).await.expect("grant").id();

    // lock / unlock
    let locked = client
        .lock(
            "res",
            Some(etcd_client::LockOptions::new().with_lease(lease)),
        )
        .await
        .expect("lock");
    assert_eq!(locked.key(), format!("res/{lease:x}").as_bytes());
    let mut contender = client.clone();
    let waiting = tokio::spawn(async move {
        contender
            .lock(
                "res",
                Some(etcd_client::LockOptions::new().with_lease(other)),
            )
            .await
    });
    let mut kv = client.clone();
    let deadline = Instant::now() + PATIENCE;
    while kv
        .get(
            "res/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .expect("count")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the contender never queued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !waiting.is_finished(),
        "the contender must wait for the holder"
    );
    client.unlock(locked.key()).await.expect("unlock");
    let second = waiting.await.expect("join").expect("second lock");
    assert_eq!(second.key(), format!("res/{other:x}").as_bytes());
    let err = client
        .lock(
            "res",
            Some(etcd_client::LockOptions::new().with_lease(0x777)),
        )
        .await
        .expect_err("missing lease");
    assert!(
        err.to_string()
            .contains("etcdserver: requested lease not found"),
        "{err}"
    );

    // campaign / leader / proclaim / observe / resign
    let err = client.leader("job").await.expect_err("no leader yet");
    assert!(err.to_string().contains("election: no leader"), "{err}");
    let campaign = client
        .campaign("job", "first", lease)
        .await
        .expect("campaign");
    let leader_key = campaign.leader().expect("leader key").clone();
    assert_eq!(leader_key.name(), b"job");
    assert_eq!(leader_key.key(), format!("job/{lease:x}").as_bytes());
    assert_eq!(leader_key.lease(), lease);
    let mut observe = client.observe("job").await.expect("observe");
    let seen = observe.message().await.expect("observe").expect("a leader");
    assert_eq!(seen.kv().expect("kv").value(), b"first");
    client
        .proclaim(
            "second",
            Some(etcd_client::ProclaimOptions::new().with_leader(leader_key.clone())),
        )
        .await
        .expect("proclaim");
    let seen = observe.message().await.expect("observe").expect("a leader");
    assert_eq!(seen.kv().expect("kv").value(), b"second");
    let leader = client.leader("job").await.expect("leader");
    assert_eq!(leader.kv().expect("kv").value(), b"second");
    assert_eq!(leader.kv().expect("kv").create_revision(), leader_key.rev());

    let mut rival = client.clone();
    let rival_campaign = tokio::spawn(async move { rival.campaign("job", "rival", other).await });
    client
        .resign(Some(
            etcd_client::ResignOptions::new().with_leader(leader_key.clone()),
        ))
        .await
        .expect("resign");
    let rival_won = rival_campaign.await.expect("join").expect("rival campaign");
    assert_eq!(
        rival_won.leader().expect("leader key").key(),
        format!("job/{other:x}").as_bytes()
    );
    let seen = observe.message().await.expect("observe").expect("a leader");
    assert_eq!(seen.kv().expect("kv").value(), b"rival");
    let err = client
        .proclaim(
            "stale",
            Some(etcd_client::ProclaimOptions::new().with_leader(leader_key)),
        )
        .await
        .expect_err("not leader any more");
    assert!(err.to_string().contains("election: not leader"), "{err}");
}

/// A clean stop does not wait for a Lock or Campaign that would wait forever, nor for
/// an Observe stream, and the waiters' keys stay with their leases, which outlive the
/// restart.
// Multi-threaded so that the client keeps reading its connections while the test
// thread waits for the server to exit, as a real client would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_waiting_calls_and_keeps_their_keys() {
    let mut cetera = Cetera::start().await;
    let channel = common::channel(&cetera.endpoint()).await;
    let kv = KvClient::new(channel.clone());
    let mut leases = LeaseClient::new(channel.clone());
    let mut grant = async || {
        leases
            .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
            .await
            .expect("grant")
            .into_inner()
            .id
    };
    let (a, b) = (grant().await, grant().await);
    let mut locks = LockClient::new(channel.clone());
    let mut elections = ElectionClient::new(channel.clone());
    locks
        .lock(LockRequest {
            name: "s".into(),
            lease: a,
        })
        .await
        .expect("lock");
    elections
        .campaign(CampaignRequest {
            name: "t".into(),
            lease: a,
            value: "a".into(),
        })
        .await
        .expect("campaign");
    let mut waiting_lock = locks.clone();
    let lock_call = tokio::spawn(async move {
        waiting_lock
            .lock(LockRequest {
                name: "s".into(),
                lease: b,
            })
            .await
    });
    let mut waiting_campaign = elections.clone();
    let campaign_call = tokio::spawn(async move {
        waiting_campaign
            .campaign(CampaignRequest {
                name: "t".into(),
                lease: b,
                value: "b".into(),
            })
            .await
    });
    let mut observer = elections
        .observe(LeaderRequest { name: "t".into() })
        .await
        .expect("observe")
        .into_inner();
    observer.message().await.expect("observe").expect("leader");
    assert!(until_count(&kv, "s/", 2).await && until_count(&kv, "t/", 2).await);

    let status = cetera.terminate(PATIENCE);
    assert!(
        status.is_some_and(|s| s.success()),
        "cetera did not stop cleanly: {status:?}\n{}",
        cetera.log()
    );
    assert!(finish(lock_call).await.is_err());
    assert!(finish(campaign_call).await.is_err());

    cetera.restart().await;
    let kv = KvClient::new(common::channel(&cetera.endpoint()).await);
    assert_eq!(count(&kv, "s/").await, 2, "the waiting locker's key stays");
    assert_eq!(
        count(&kv, "t/").await,
        2,
        "the waiting candidate's key stays"
    );
}

/// On a shared database (PostgreSQL or MySQL) a Lock or Campaign waiting on one
/// instance gets its turn when the holder releases through another instance: the
/// waiter follows the other instance's commits through its watch hub.
#[tokio::test]
async fn waiters_see_releases_through_another_instance() {
    use common::datastore::{TestBackend, test_backend};
    if test_backend() == TestBackend::Sqlite {
        eprintln!("needs CETERA_TEST_BACKEND=postgres or mysql; skipped on SQLite");
        return;
    }
    let a = Cetera::start().await;
    let b = Cetera::start_on(a.datastore_endpoint()).await;
    let mut on_a = etcd_client::Client::connect([a.endpoint()], None)
        .await
        .expect("connect a");
    let mut on_b = etcd_client::Client::connect([b.endpoint()], None)
        .await
        .expect("connect b");
    let first = on_a.lease_grant(60, None).await.expect("grant").id();
    let second = on_a.lease_grant(60, None).await.expect("grant").id();

    let held = on_a
        .lock(
            "shared",
            Some(etcd_client::LockOptions::new().with_lease(first)),
        )
        .await
        .expect("lock on a");
    let mut waiter = on_b.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .lock(
                "shared",
                Some(etcd_client::LockOptions::new().with_lease(second)),
            )
            .await
    });
    let kv_b = KvClient::new(common::channel(&b.endpoint()).await);
    assert!(until_count(&kv_b, "shared/", 2).await, "b never queued");
    assert!(!waiting.is_finished(), "b must wait while a holds the lock");
    on_a.unlock(held.key()).await.expect("unlock on a");
    let got = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("b never got the lock")
        .expect("join")
        .expect("lock on b");
    assert_eq!(got.key(), format!("shared/{second:x}").as_bytes());

    let leader = on_a
        .campaign("vote", "a", first)
        .await
        .expect("campaign on a")
        .leader()
        .expect("leader key")
        .clone();
    let mut observe = on_b.observe("vote").await.expect("observe on b");
    let seen = observe.message().await.expect("observe").expect("leader");
    assert_eq!(seen.kv().expect("kv").value(), b"a");
    on_a.proclaim(
        "a2",
        Some(etcd_client::ProclaimOptions::new().with_leader(leader.clone())),
    )
    .await
    .expect("proclaim on a");
    let seen = tokio::time::timeout(PATIENCE, observe.message())
        .await
        .expect("b's observer never saw a2")
        .expect("observe")
        .expect("leader");
    assert_eq!(seen.kv().expect("kv").value(), b"a2");
    let mut rival = on_b.clone();
    let campaign = tokio::spawn(async move { rival.campaign("vote", "b", second).await });
    assert!(until_count(&kv_b, "vote/", 2).await, "b never campaigned");
    on_a.resign(Some(etcd_client::ResignOptions::new().with_leader(leader)))
        .await
        .expect("resign on a");
    tokio::time::timeout(PATIENCE, campaign)
        .await
        .expect("b never won")
        .expect("join")
        .expect("campaign on b");
    let seen = tokio::time::timeout(PATIENCE, observe.message())
        .await
        .expect("b's observer never saw b")
        .expect("observe")
        .expect("leader");
    assert_eq!(seen.kv().expect("kv").value(), b"b");
}

/// `msg` sent with the auth token `token`.
fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(msg);
    request
        .metadata_mut()
        .insert("token", token.parse().expect("token is ASCII"));
    request
}

/// With auth on, Lock and Election act on the queue's keys with the
/// caller's permissions, as etcd's in-process client does.
#[tokio::test]
async fn auth_applies_to_lock_and_election() {
    use cetera::proto::etcdserverpb::auth_client::AuthClient;
    use cetera::proto::etcdserverpb::{
        AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest, AuthenticateRequest,
    };
    differential(&[], &[], async |s: &mut Side| {
        let mut auth = AuthClient::new(s.channel.clone());
        for (name, password) in [("root", "rootpw"), ("alice", "alicepw")] {
            auth.user_add(AuthUserAddRequest {
                name: name.into(),
                password: password.into(),
                ..Default::default()
            })
            .await
            .expect("user add");
        }
        for role in ["root", "queue"] {
            auth.role_add(AuthRoleAddRequest { name: role.into() })
                .await
                .expect("role add");
        }
        auth.role_grant_permission(AuthRoleGrantPermissionRequest {
            name: "queue".into(),
            perm: Some(cetera::proto::authpb::Permission {
                perm_type: cetera::proto::authpb::permission::Type::Readwrite as i32,
                key: "q/".into(),
                range_end: "q0".into(),
            }),
        })
        .await
        .expect("grant permission");
        for (user, role) in [("root", "root"), ("alice", "queue")] {
            auth.user_grant_role(AuthUserGrantRoleRequest {
                user: user.into(),
                role: role.into(),
            })
            .await
            .expect("grant role");
        }
        auth.auth_enable(AuthEnableRequest {})
            .await
            .expect("enable");
        let token = auth
            .authenticate(AuthenticateRequest {
                name: "alice".into(),
                password: "alicepw".into(),
            })
            .await
            .expect("authenticate")
            .into_inner()
            .token;

        let mut locks = lock_client(s);
        let lock = |name: &str| LockRequest {
            name: name.into(),
            lease: 0,
        };
        let held = locks.lock(with_token(lock("q"), &token)).await;
        let key = held
            .as_ref()
            .map(|r| r.get_ref().key.clone())
            .unwrap_or_default();
        learn_lease_from_key(s, &key);
        s.note("lock q as alice", outcome(held, show_lock));
        let refused = locks.lock(with_token(lock("other"), &token)).await;
        s.note("lock other as alice", outcome(refused, show_lock));
        let anonymous = locks.lock(lock("q")).await;
        s.note("lock q without a token", outcome(anonymous, show_lock));
        let unlocked = locks
            .unlock(with_token(UnlockRequest { key: key.clone() }, &token))
            .await;
        s.note(
            "unlock as alice",
            outcome(unlocked, |r| format!("rev={}", header_rev(&r.header))),
        );

        let mut elections = election_client(s);
        let leader = |name: &str| LeaderRequest { name: name.into() };
        let none = elections.leader(with_token(leader("q"), &token)).await;
        s.note(
            "leader of q as alice",
            outcome(none, |r| show_kv_opt(&r.kv)),
        );
        let refused = elections.leader(with_token(leader("other"), &token)).await;
        s.note(
            "leader of other as alice",
            outcome(refused, |r| show_kv_opt(&r.kv)),
        );
        let campaign = |name: &str| CampaignRequest {
            name: name.into(),
            lease: 0,
            value: b"v".to_vec(),
        };
        let refused = elections
            .campaign(with_token(campaign("other"), &token))
            .await;
        s.note(
            "campaign for other as alice",
            outcome(refused, show_campaign),
        );
    })
    .await;
}

fn show_kv_opt(kv: &Option<cetera::proto::mvccpb::KeyValue>) -> String {
    kv.as_ref().map(show_kv).unwrap_or_else(|| "none".into())
}
