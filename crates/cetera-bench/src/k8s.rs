//! K8s: a Kubernetes-apiserver-like mix on one resource prefix.
//!
//! - Writers (`--clients`) change objects only through the apiserver's Txn shapes:
//!   Update 90 % / Delete 5 % / Create 5 %, each with the object's last known mod
//!   revision (from an initial List, then from the answers); a failed compare reads
//!   the object back, as GuaranteedUpdate does. Each writer owns a share of the objects.
//! - Creates attach the current lease (TTL `--lease-ttl`, a new one every
//!   `--lease-every`, like the apiserver's lease reuse for Events); updates keep it.
//! - `--listers` paginated Lists of the prefix (500 per page), one every `--list-interval`.
//! - `--watchers` watchers on the prefix with prev_kv, as the apiserver's watch cache;
//!   their latency is from a write's acknowledgement to the event's arrival.
//! - With `--compact-every`, the apiserver's compactor (`compactor.rs`); the writes'
//!   longest latency is then reported per window between compactions.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use cetera_proto::etcdserverpb::{
    LeaseGrantRequest, kv_client::KvClient, lease_client::LeaseClient,
};
use clap::Args;
use rand::Rng;
use rand::rngs::StdRng;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Outcome, Stats, Worker};
use crate::keys::{self, Keys};
use crate::watch::{Ack, Delivery, Watchers};
use crate::{compactor, list, net, populate, txn};

/// The K8s scenario's default prefix (a namespace's pods).
pub const DEFAULT_PREFIX: &str = "/registry/pods/default/";

/// How many random objects a writer looks at to find one present (or absent).
const PROBES: usize = 16;

#[derive(Args, Debug, Clone)]
pub struct K8sArgs {
    /// Watchers on the prefix (prev_kv).
    #[arg(long, default_value_t = 10)]
    pub watchers: usize,
    /// Concurrent listers.
    #[arg(long, default_value_t = 1)]
    pub listers: usize,
    /// Pause between one lister's Lists.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub list_interval: Duration,
    /// TTL of the leases attached to created objects, seconds.
    #[arg(long, default_value_t = 10)]
    pub lease_ttl: i64,
    /// How often a new lease is granted for creates.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub lease_every: Duration,
    /// Run the apiserver's compactor at this interval (its default is 5m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub compact_every: Option<Duration>,
}

#[derive(Clone, Copy)]
enum Action {
    Create,
    Update,
    Delete,
}

/// One apiserver-like writer.
struct ApiWriter {
    kv: KvClient<Channel>,
    keys: Keys,
    rng: StdRng,
    /// Owned object indexes, and (mod revision, lease) of each one believed present.
    own: Vec<u64>,
    state: Vec<Option<(i64, i64)>>,
    lease: Arc<AtomicI64>,
    acks: Vec<(i64, Ack)>,
    counts: [u64; 3],
}

impl ApiWriter {
    /// A random owned slot that is present (or absent), if a few probes find one.
    fn probe(&mut self, present: bool) -> Option<usize> {
        (0..PROBES)
            .map(|_| self.rng.random_range(0..self.own.len()))
            .find(|&slot| self.state[slot].is_some() == present)
    }
}

impl Worker for ApiWriter {
    async fn op(&mut self, _op: u64) -> Result<Outcome, tonic::Status> {
        let roll = self.rng.random_range(0..100);
        let wanted = match roll {
            0..5 => Action::Create,
            5..10 => Action::Delete,
            _ => Action::Update,
        };
        let (slot, action) = match wanted {
            Action::Create => match self.probe(false) {
                Some(slot) => (slot, Action::Create),
                None => (self.probe(true).unwrap_or(0), Action::Update),
            },
            _ => match self.probe(true) {
                Some(slot) => (slot, wanted),
                None => (self.probe(false).unwrap_or(0), Action::Create),
            },
        };
        let key = self.keys.key(self.own[slot]);
        let (revision, lease) = self.state[slot].unwrap_or((0, 0));
        let request = match action {
            Action::Create => {
                let lease = self.lease.load(Ordering::Relaxed);
                self.state[slot] = Some((0, lease));
                txn::create(&key, self.keys.value(), lease)
            }
            Action::Update => txn::update(&key, self.keys.value(), lease, revision),
            Action::Delete => txn::delete(&key, revision),
        };
        let sent = Instant::now();
        let response = self.kv.txn(request).await?.into_inner();
        let rev = txn::revision(&response);
        if !response.succeeded {
            // Lost a race or the object expired with its lease: read back what is there.
            let current = txn::failure_revision(&response);
            self.state[slot] = (current != 0).then_some((current, lease));
            return Ok(Outcome::Miss);
        }
        self.acks.push((rev, (sent, Instant::now())));
        self.counts[action as usize] += 1;
        self.state[slot] = match action {
            Action::Delete => None,
            Action::Create => self.state[slot].map(|(_, lease)| (rev, lease)),
            Action::Update => Some((rev, lease)),
        };
        Ok(Outcome::Done)
    }
}

pub async fn run(
    common: &Common,
    args: &K8sArgs,
    channels: &[Channel],
) -> anyhow::Result<Vec<Stats>> {
    let keys = Keys::new(common, common.prefix_or(DEFAULT_PREFIX));
    populate::before(common, channels, &keys).await?;
    let known = txn::known_revisions(channels, &keys.prefix).await?;
    let prefix = keys.prefix.clone().into_bytes();
    let watchers = Watchers::open(channels, &prefix, args.watchers, 0, true).await?;
    let stop = Arc::new(AtomicBool::new(false));

    // Leases: a fresh one every `lease_every`, attached to the creates meanwhile.
    let lease = Arc::new(AtomicI64::new(0));
    let mut lease_client = LeaseClient::new(channels[0].clone());
    let grant = LeaseGrantRequest {
        ttl: args.lease_ttl,
        id: 0,
    };
    lease.store(
        lease_client.lease_grant(grant).await?.into_inner().id,
        Ordering::Relaxed,
    );
    let leaser = {
        let (lease, stop, every) = (lease.clone(), stop.clone(), args.lease_every);
        tokio::spawn(async move {
            let mut granted = 1u64;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(every).await;
                if let Ok(r) = lease_client.lease_grant(grant).await {
                    lease.store(r.into_inner().id, Ordering::Relaxed);
                    granted += 1;
                }
            }
            granted
        })
    };

    // Listers: a full paginated List, then a pause.
    let listers: Vec<_> = (0..args.listers)
        .map(|l| {
            let mut kv = net::kv(net::pick(channels, l));
            let (prefix, stop, interval) = (prefix.clone(), stop.clone(), args.list_interval);
            tokio::spawn(async move {
                let mut stats = Stats::new("k8s-list", "list");
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    match list::list_all(&mut kv, &prefix, 500, false).await {
                        Ok(listing) => {
                            driver::record(&mut stats.hist, began.elapsed());
                            stats.ops += 1;
                            stats.note("keys_per_list", listing.keys);
                        }
                        Err(status) => {
                            stats.errors += 1;
                            stats.first_error.get_or_insert_with(|| status.to_string());
                        }
                    }
                    tokio::time::sleep(interval).await;
                }
                stats
            })
        })
        .collect();

    // Writers: each owns every clients-th object.
    let clients = common.clients.max(1);
    let writers = (0..clients)
        .map(|c| {
            let own: Vec<u64> = (c as u64..keys.space).step_by(clients).collect();
            let own = if own.is_empty() {
                vec![c as u64 % keys.space]
            } else {
                own
            };
            let state = own
                .iter()
                .map(|&i| known.get(&keys.key(i)).map(|&rev| (rev, 0)))
                .collect();
            ApiWriter {
                kv: net::kv(net::pick(channels, c)),
                keys: keys.clone(),
                rng: keys::rng(common.seed, c),
                own,
                state,
                lease: lease.clone(),
                acks: Vec::new(),
                counts: [0; 3],
            }
        })
        .collect();
    let compactions = args
        .compact_every
        .map(|every| compactor::spawn(&channels[0], every, stop.clone()));
    let started = Instant::now();
    let (mut writes, writers) = driver::run("k8s-write", &common.load(), writers).await;
    let ended = Instant::now();
    stop.store(true, Ordering::Relaxed);

    let mut counts = [0u64; 3];
    let mut acks: HashMap<i64, Ack> = HashMap::new();
    if let Some(compactions) = compactions {
        let made = compactions.await.expect("compactor panicked")?;
        let sent: Vec<Ack> = writers
            .iter()
            .flat_map(|w| w.acks.iter().map(|a| a.1))
            .collect();
        writes.note("compactions", made.len() as u64);
        writes.note(
            "compaction_windows",
            compactor::windows(started, &made, &sent, ended),
        );
    }
    for w in writers {
        for (i, n) in w.counts.iter().enumerate() {
            counts[i] += n;
        }
        acks.extend(w.acks);
    }
    writes.note("creates", counts[Action::Create as usize]);
    writes.note("updates", counts[Action::Update as usize]);
    writes.note("deletes", counts[Action::Delete as usize]);
    writes.note("conflicts", writes.misses);
    writes.note("leases", leaser.await.unwrap_or(0));

    let mut lists = Stats::new("k8s-list", "list");
    for lister in listers {
        let part = lister.await.expect("lister panicked");
        lists.merge(&part);
        lists.extra.extend(part.extra);
    }
    lists.elapsed = writes.elapsed;

    let last = acks.keys().copied().max().unwrap_or(0);
    let arrivals = watchers.finish(last).await?;
    let events = Delivery::measure(&acks, &arrivals).stats(
        "k8s-watch",
        args.watchers,
        acks.len(),
        writes.elapsed,
    );
    Ok(vec![writes, lists, events])
}
