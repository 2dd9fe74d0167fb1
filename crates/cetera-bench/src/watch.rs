//! Watch: `--watchers` watchers on one prefix (each on its own stream unless
//! `--streams` says otherwise, the streams spread over the connections) while
//! `--clients` put to that prefix. The latency is from the put's acknowledgement to
//! the event's arrival at each watcher; an event that beats the acknowledgement counts
//! as 0 (and in `before_ack`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cetera_proto::etcdserverpb::watch_request::RequestUnion;
use cetera_proto::etcdserverpb::{
    PutRequest, WatchCreateRequest, WatchRequest, kv_client::KvClient, watch_client::WatchClient,
};
use clap::Args;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Outcome, Stats, Worker};
use crate::keys::{self, Keys, prefix_end};
use crate::net;

/// The Watch scenario's default prefix.
pub const DEFAULT_PREFIX: &str = "watch/";

/// How long watchers may take, after the last put, to deliver every event.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Args, Debug, Clone)]
pub struct WatchArgs {
    /// Watchers on the prefix.
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Watch streams to spread the watchers over (0: one stream per watcher).
    #[arg(long, default_value_t = 0)]
    pub streams: usize,
}

/// An event's revision and the moment its response arrived.
pub type Arrival = (i64, Instant);

/// Open watchers, each stream read by a task of its own that records every arrival.
pub struct Watchers {
    readers: Vec<JoinHandle<anyhow::Result<Vec<Arrival>>>>,
    /// The last revision the readers must see before they stop (i64::MAX: keep going).
    target: watch::Sender<i64>,
}

impl Watchers {
    /// Opens `count` watchers on `prefix` (from now on) over `streams` streams
    /// (0: one each), and waits until every one is created.
    pub async fn open(
        channels: &[Channel],
        prefix: &[u8],
        count: usize,
        streams: usize,
        prev_kv: bool,
    ) -> anyhow::Result<Watchers> {
        let streams = if streams == 0 {
            count
        } else {
            streams.min(count)
        }
        .max(1);
        let (target, target_rx) = watch::channel(i64::MAX);
        let mut readers = Vec::with_capacity(streams);
        for s in 0..streams {
            // Watchers s, s + streams, ... go on stream s.
            let here = (s..count).step_by(streams).count();
            let (tx, rx) = mpsc::channel(here + 4);
            for _ in 0..here {
                let create = WatchCreateRequest {
                    key: prefix.to_vec(),
                    range_end: prefix_end(prefix),
                    prev_kv,
                    ..Default::default()
                };
                tx.send(WatchRequest {
                    request_union: Some(RequestUnion::CreateRequest(create)),
                })
                .await
                .expect("receiver alive");
            }
            let mut client = WatchClient::new(net::pick(channels, s).clone())
                .max_decoding_message_size(net::MAX_MESSAGE);
            let mut responses = client
                .watch(ReceiverStream::new(rx))
                .await
                .context("open watch stream")?
                .into_inner();
            let mut ids = Vec::with_capacity(here);
            while ids.len() < here {
                let r = responses
                    .message()
                    .await?
                    .context("watch stream ended while creating watchers")?;
                if !r.created || r.canceled {
                    bail!("watch not created: {}", r.cancel_reason);
                }
                ids.push(r.watch_id);
            }
            readers.push(tokio::spawn(read(responses, tx, ids, target_rx.clone())));
        }
        Ok(Watchers { readers, target })
    }

    /// Tells the readers the last revision to wait for and collects their arrivals
    /// (per stream); readers give up `DRAIN_TIMEOUT` after this call.
    pub async fn finish(self, last_revision: i64) -> anyhow::Result<Vec<Arrival>> {
        let _ = self.target.send(last_revision);
        let mut all = Vec::new();
        for reader in self.readers {
            all.extend(reader.await.expect("watch reader panicked")?);
        }
        Ok(all)
    }
}

/// Reads one stream until every watcher on it has seen the target revision.
async fn read(
    mut responses: tonic::Streaming<cetera_proto::etcdserverpb::WatchResponse>,
    // Held until done, as a Go client holds its request side open.
    _requests: mpsc::Sender<WatchRequest>,
    ids: Vec<i64>,
    mut target: watch::Receiver<i64>,
) -> anyhow::Result<Vec<Arrival>> {
    let mut arrivals = Vec::new();
    let mut seen: HashMap<i64, i64> = ids.iter().map(|&id| (id, 0)).collect();
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let goal = *target.borrow();
        if goal != i64::MAX {
            if seen.values().all(|&rev| rev >= goal) {
                return Ok(arrivals);
            }
            deadline.get_or_insert_with(|| tokio::time::Instant::now() + DRAIN_TIMEOUT);
        }
        let sleep = tokio::time::sleep_until(
            deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600)),
        );
        tokio::select! {
            message = responses.message() => {
                let Some(r) = message? else { return Ok(arrivals) };
                let now = Instant::now();
                if r.canceled {
                    bail!("watch {} canceled: {}", r.watch_id, r.cancel_reason);
                }
                for event in &r.events {
                    let rev = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                    arrivals.push((rev, now));
                    if let Some(s) = seen.get_mut(&r.watch_id) {
                        *s = (*s).max(rev);
                    }
                }
            }
            _ = target.changed() => {}
            _ = sleep => return Ok(arrivals),
        }
    }
}

/// When a write was sent and when its acknowledgement came back.
pub type Ack = (Instant, Instant);

/// Delivery latencies of every arrival of an acknowledged revision.
pub struct Delivery {
    /// From the write's acknowledgement to the arrival (0 if the event came first).
    pub from_ack: Histogram<u64>,
    /// From the moment the write was sent to the arrival.
    pub from_send: Histogram<u64>,
    /// Arrivals of acknowledged revisions.
    pub matched: u64,
    /// Arrivals that beat their acknowledgement.
    pub early: u64,
}

impl Delivery {
    pub fn measure(acks: &HashMap<i64, Ack>, arrivals: &[Arrival]) -> Delivery {
        let mut d = Delivery {
            from_ack: driver::histogram(),
            from_send: driver::histogram(),
            matched: 0,
            early: 0,
        };
        for (rev, at) in arrivals {
            if let Some((sent, acked)) = acks.get(rev) {
                d.matched += 1;
                if at < acked {
                    d.early += 1;
                }
                driver::record(&mut d.from_ack, at.saturating_duration_since(*acked));
                driver::record(&mut d.from_send, at.saturating_duration_since(*sent));
            }
        }
        d
    }

    /// The watch row: events delivered and their latency from acknowledgement, with
    /// the latency from send in the notes.
    pub fn stats(
        self,
        name: &str,
        watchers: usize,
        writes: usize,
        elapsed: std::time::Duration,
    ) -> Stats {
        let mut events = Stats::new(name, "event");
        events.ops = self.matched;
        events.misses = (writes as u64 * watchers as u64).saturating_sub(self.matched);
        events.elapsed = elapsed;
        events.note("watchers", watchers as u64);
        events.note("before_ack", self.early);
        let ms = |q: f64| (self.from_send.value_at_quantile(q) as f64 / 1000.0).into();
        events.extra.insert("from_send_p50_ms".into(), ms(0.5));
        events.extra.insert("from_send_p99_ms".into(), ms(0.99));
        events.hist = self.from_ack;
        events
    }
}

/// A put client that remembers when each of its revisions was acknowledged.
struct Putter {
    kv: KvClient<Channel>,
    keys: Keys,
    rng: StdRng,
    acks: Vec<(i64, Ack)>,
}

impl Worker for Putter {
    async fn op(&mut self, op: u64) -> Result<Outcome, tonic::Status> {
        let request = PutRequest {
            key: self.keys.key(self.keys.pick(op, &mut self.rng)),
            value: self.keys.value(),
            ..Default::default()
        };
        let sent = Instant::now();
        let response = self.kv.put(request).await?.into_inner();
        let rev = response.header.map_or(0, |h| h.revision);
        self.acks.push((rev, (sent, Instant::now())));
        Ok(Outcome::Done)
    }
}

pub async fn run(
    common: &Common,
    args: &WatchArgs,
    channels: &[Channel],
) -> anyhow::Result<Vec<Stats>> {
    let keys = Keys::new(common, common.prefix_or(DEFAULT_PREFIX));
    let opened = Instant::now();
    let watchers = Watchers::open(
        channels,
        keys.prefix.as_bytes(),
        args.watchers,
        args.streams,
        false,
    )
    .await?;
    let open_time = opened.elapsed();
    let workers = (0..common.clients.max(1))
        .map(|c| Putter {
            kv: net::kv(net::pick(channels, c)),
            keys: keys.clone(),
            rng: keys::rng(common.seed, c),
            acks: Vec::new(),
        })
        .collect();
    let (mut puts, workers) = driver::run("watch-put", &common.load(), workers).await;
    let acks: HashMap<i64, Ack> = workers.into_iter().flat_map(|w| w.acks).collect();
    let last = acks.keys().copied().max().unwrap_or(0);
    let arrivals = watchers.finish(last).await?;
    let mut events =
        Delivery::measure(&acks, &arrivals).stats("watch", args.watchers, acks.len(), puts.elapsed);
    events.note("puts", acks.len() as u64);
    events.note("open_ms", open_time.as_millis() as u64);
    puts.note("watchers", args.watchers as u64);
    Ok(vec![events, puts])
}
