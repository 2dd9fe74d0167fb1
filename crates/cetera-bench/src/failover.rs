//! Failover and leader look-up for a cluster (cetera's replicated mode or etcd).
//!
//! `leader` asks every endpoint for its Status and prints the endpoint of the member
//! that reports itself as leader. `failover` runs one writer putting in a loop, first on
//! the leader's endpoint, switching to the next endpoint after a failed put or one not
//! answered within `--put-timeout` (as etcd's client moves on), kills the leader's
//! process with SIGKILL after `--warmup`, and measures:
//!   - new leader: until a surviving member names another leader in its Status;
//!   - writes back: until the first put sent after the kill is acknowledged. Besides the
//!     writer, a probe put goes out every `--poll` (round-robin over the endpoints, each
//!     waiting up to `--timeout`), so this does not depend on the writer's put timeout;
//!   - the longest gap between two puts the writer got acknowledged, which is what a
//!     client with that timeout saw.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cetera_proto::etcdserverpb::{
    PutRequest, StatusRequest, StatusResponse, maintenance_client::MaintenanceClient,
};
use clap::Args;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Stats};
use crate::keys::{self, Keys};
use crate::net;

/// How long one Status call may take before the member counts as not answering.
const STATUS_TIMEOUT: Duration = Duration::from_millis(300);

/// After a failed put, the writer waits this long before trying the next endpoint, so
/// that endpoints failing at once (connection refused) are not hammered in a busy loop.
const RETRY_PAUSE: Duration = Duration::from_millis(5);

#[derive(Args, Debug, Clone)]
pub struct FailoverArgs {
    /// The servers' process ids, in the order of --endpoints: the leader's is killed.
    #[arg(long, value_delimiter = ',', required = true)]
    pub pids: Vec<u32>,
    /// How long to write before killing the leader.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub warmup: Duration,
    /// How long to keep writing once there is a new leader and writes are back.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub settle: Duration,
    /// Give up when there is no new leader or no acknowledged put this long after the kill.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub timeout: Duration,
    /// A put not answered in this time counts as failed; the writer moves on.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub put_timeout: Duration,
    /// How often the survivors are asked for their Status, and a probe put is sent,
    /// after the kill.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10ms")]
    pub poll: Duration,
}

/// The leader as one member's Status tells it.
struct Leader {
    /// Index into the endpoints of the member that is the leader.
    index: usize,
    id: u64,
    term: u64,
}

/// Status of the member at `client`, or None if it does not answer in time.
async fn status(client: &mut MaintenanceClient<Channel>) -> Option<StatusResponse> {
    match tokio::time::timeout(STATUS_TIMEOUT, client.status(StatusRequest {})).await {
        Ok(Ok(response)) => Some(response.into_inner()),
        _ => None,
    }
}

/// The id of the member that answered `status`.
fn member_id(status: &StatusResponse) -> u64 {
    status.header.as_ref().map_or(0, |h| h.member_id)
}

/// Finds the member that reports itself as leader, waiting up to `timeout` for one.
async fn find_leader(
    clients: &mut [MaintenanceClient<Channel>],
    timeout: Duration,
) -> anyhow::Result<Leader> {
    let deadline = Instant::now() + timeout;
    loop {
        for (index, client) in clients.iter_mut().enumerate() {
            if let Some(s) = status(client).await
                && s.leader != 0
                && s.leader == member_id(&s)
            {
                return Ok(Leader {
                    index,
                    id: s.leader,
                    term: s.raft_term,
                });
            }
        }
        if Instant::now() >= deadline {
            bail!("no member reports itself as leader after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Maintenance client per channel.
fn maintenance(channels: &[Channel]) -> Vec<MaintenanceClient<Channel>> {
    channels
        .iter()
        .cloned()
        .map(MaintenanceClient::new)
        .collect()
}

/// `leader`: prints the leader's endpoint on stdout.
pub async fn print_leader(common: &Common, timeout: Duration) -> anyhow::Result<()> {
    let channels = net::connect(&common.endpoints, common.endpoints.len()).await?;
    let leader = find_leader(&mut maintenance(&channels), timeout).await?;
    println!("{}", common.endpoints[leader.index]);
    Ok(())
}

/// What the writer saw: when each put was acknowledged, and the failures.
struct Writes {
    acks: Vec<Instant>,
    hist: hdrhistogram::Histogram<u64>,
    failed: u64,
    first_error: Option<String>,
}

/// Puts in a loop until `stop` turns true, on one endpoint (first `start`) until a put
/// fails or times out, then on the next. Publishes the time of the latest acknowledgement.
async fn write_loop(
    channels: Vec<Channel>,
    start: usize,
    keys: Keys,
    mut rng: StdRng,
    put_timeout: Duration,
    stop: watch::Receiver<bool>,
    last_ack: watch::Sender<Option<Instant>>,
) -> Writes {
    let mut clients: Vec<_> = channels.iter().map(net::kv).collect();
    let mut writes = Writes {
        acks: Vec::new(),
        hist: driver::histogram(),
        failed: 0,
        first_error: None,
    };
    let mut current = start;
    let mut op = 0u64;
    while !*stop.borrow() {
        let index = keys.pick(op, &mut rng);
        op += 1;
        let request = PutRequest {
            key: keys.key(index),
            value: keys.value(),
            ..Default::default()
        };
        let began = Instant::now();
        let error = match tokio::time::timeout(put_timeout, clients[current].put(request)).await {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Some(format!("no answer in {put_timeout:?}")),
        };
        match error {
            None => {
                let now = Instant::now();
                driver::record(&mut writes.hist, now - began);
                writes.acks.push(now);
                let _ = last_ack.send(Some(now));
            }
            Some(error) => {
                writes.failed += 1;
                writes.first_error.get_or_insert(error);
                current = (current + 1) % clients.len();
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
    writes
}

/// Milliseconds, to a tenth.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// `failover`: kills the leader under a light write load; see the module comment.
pub async fn run(common: &Common, args: &FailoverArgs) -> anyhow::Result<Stats> {
    let endpoints = &common.endpoints;
    if args.pids.len() != endpoints.len() {
        bail!(
            "--pids has {} ids but --endpoints {} endpoints; give one pid per endpoint, in order",
            args.pids.len(),
            endpoints.len()
        );
    }
    let channels = net::connect(endpoints, endpoints.len()).await?;
    let mut clients = maintenance(&channels);
    let old = find_leader(&mut clients, Duration::from_secs(20)).await?;
    // Member ids by endpoint, to name the new leader's endpoint later.
    let mut ids = Vec::with_capacity(clients.len());
    for client in &mut clients {
        ids.push(status(client).await.map(|s| member_id(&s)));
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let (ack_tx, ack_rx) = watch::channel(None);
    let writer = tokio::spawn(write_loop(
        channels.clone(),
        old.index,
        Keys::new(common, common.prefix_or("failover/")),
        keys::rng(common.seed, 0),
        args.put_timeout,
        stop_rx,
        ack_tx,
    ));
    tokio::time::sleep(args.warmup).await;

    let pid = args.pids[old.index];
    let killed = tokio::task::spawn_blocking(move || {
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
    })
    .await
    .context("kill task")?
    .context("run kill")?;
    // The process is gone once kill(1) returns: the clock starts here.
    let kill_at = Instant::now();
    if !killed.success() {
        let _ = stop_tx.send(true);
        bail!("kill -KILL {pid} failed");
    }

    // Poll the survivors until one names a leader other than the dead one, and send
    // probe puts until one is acknowledged; wait for the writer to get through too.
    let survivors: Vec<usize> = (0..endpoints.len()).filter(|&i| i != old.index).collect();
    let deadline = kill_at + args.timeout;
    let mut new_leader: Option<(Instant, StatusResponse)> = None;
    let probe_keys = Keys::new(common, common.prefix_or("failover/") + "probe/");
    let first_probe_ack = Arc::new(Mutex::new(None::<Instant>));
    let mut probes = Vec::new();
    while Instant::now() < deadline {
        if first_probe_ack.lock().expect("probe lock").is_none() {
            let mut kv = net::kv(&channels[probes.len() % channels.len()]);
            let request = PutRequest {
                key: probe_keys.key(probes.len() as u64),
                value: probe_keys.value(),
                ..Default::default()
            };
            let first = first_probe_ack.clone();
            let timeout = deadline.saturating_duration_since(Instant::now());
            probes.push(tokio::spawn(async move {
                if let Ok(Ok(_)) = tokio::time::timeout(timeout, kv.put(request)).await {
                    let now = Instant::now();
                    let mut first = first.lock().expect("probe lock");
                    if first.is_none_or(|t| now < t) {
                        *first = Some(now);
                    }
                }
            }));
        }
        if new_leader.is_none() {
            let polls: Vec<_> = survivors
                .iter()
                .map(|&i| {
                    let mut client = clients[i].clone();
                    tokio::spawn(async move { (status(&mut client).await, Instant::now()) })
                })
                .collect();
            for poll in polls {
                if let (Some(s), at) = poll.await.context("status poll")?
                    && s.leader != 0
                    && s.leader != old.id
                    && new_leader.as_ref().is_none_or(|(t, _)| at < *t)
                {
                    new_leader = Some((at, s));
                }
            }
        }
        let writer_back = ack_rx.borrow().is_some_and(|t| t > kill_at);
        let probe_back = first_probe_ack.lock().expect("probe lock").is_some();
        if new_leader.is_some() && writer_back && probe_back {
            break;
        }
        tokio::time::sleep(args.poll).await;
    }
    tokio::time::sleep(args.settle).await;
    let _ = stop_tx.send(true);
    let writes = writer.await.context("writer task")?;
    for probe in &probes {
        probe.abort();
    }
    let first_probe_ack = *first_probe_ack.lock().expect("probe lock");

    let mut stats = Stats::new("failover", "op");
    stats.ops = writes.acks.len() as u64;
    stats.hist = writes.hist;
    stats.elapsed = match (writes.acks.first(), writes.acks.last()) {
        (Some(first), Some(last)) => *last - *first,
        _ => Duration::ZERO,
    };
    stats.note("killed_endpoint", endpoints[old.index].clone());
    stats.note("term_before", old.term);
    stats.note("failed_puts", writes.failed);
    stats.note("probes", probes.len());
    if let Some(error) = &writes.first_error {
        stats.note("first_put_error", error.clone());
    }
    match &new_leader {
        Some((at, s)) => {
            stats.note("new_leader_ms", ms(*at - kill_at));
            stats.note("term_after", s.raft_term);
            if let Some(i) = ids.iter().position(|id| *id == Some(s.leader)) {
                stats.note("new_leader_endpoint", endpoints[i].clone());
            }
        }
        None => {
            stats.errors += 1;
            stats.first_error = Some(format!("no new leader within {:?}", args.timeout));
        }
    }
    match first_probe_ack {
        Some(first) => stats.note("writes_back_ms", ms(first - kill_at)),
        None => {
            stats.errors += 1;
            stats.first_error.get_or_insert_with(|| {
                format!("no probe put acknowledged within {:?}", args.timeout)
            });
        }
    }
    match writes.acks.iter().find(|&&t| t > kill_at) {
        Some(&first) => stats.note("writer_back_ms", ms(first - kill_at)),
        None => {
            stats.errors += 1;
            stats.first_error.get_or_insert_with(|| {
                format!("the writer got no put through within {:?}", args.timeout)
            });
        }
    }
    // The longest stretch without an acknowledged put, over the whole run.
    let gap = writes
        .acks
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    stats.note("max_write_gap_ms", ms(gap));
    Ok(stats)
}
