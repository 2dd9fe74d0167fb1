//! List: the apiserver's paginated List of a prefix. The first page is read at the
//! current revision (revision 0, linearizable); later pages are pinned to the first
//! page's header revision and continue from the last key + "\0". One operation is one
//! full list; `--clients` listers run concurrently. With `--stream` one list is one
//! RangeStream of the prefix (etcd 3.7), its chunks counted as the pages.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cetera_proto::etcdserverpb::{PutRequest, RangeRequest, kv_client::KvClient};
use clap::Args;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Outcome, Stats, Worker};
use crate::keys::{self, Keys, prefix_end};
use crate::{net, populate};

/// The List scenario's default prefix.
pub const DEFAULT_PREFIX: &str = "list/";

#[derive(Args, Debug, Clone)]
pub struct ListArgs {
    /// Keys per page (the apiserver's default chunk is 500).
    #[arg(long, default_value_t = 500)]
    pub page: i64,
    /// Meanwhile, put to random keys of the listed prefix at this rate (puts per
    /// second), so that later pages are read at an older revision, as on a busy cluster.
    #[arg(long, default_value_t = 0.0)]
    pub write_rate: f64,
    /// List with one RangeStream (etcd 3.7) instead of paginated Ranges; `--page`
    /// does not apply (the server sizes the chunks).
    #[arg(long)]
    pub stream: bool,
}

/// What one full list saw.
#[derive(Debug, Default)]
pub struct Listing {
    /// The revision every page was read at.
    pub revision: i64,
    pub keys: u64,
    pub pages: u64,
    /// (key, mod_revision) of every key, when asked for.
    pub mod_revisions: Vec<(Vec<u8>, i64)>,
}

/// Lists every key under `prefix`, `page` keys per request, the apiserver's way.
pub async fn list_all(
    kv: &mut KvClient<Channel>,
    prefix: &[u8],
    page: i64,
    keep_revisions: bool,
) -> Result<Listing, tonic::Status> {
    let end = prefix_end(prefix);
    let mut listing = Listing::default();
    let mut from = prefix.to_vec();
    loop {
        let request = RangeRequest {
            key: from,
            range_end: end.clone(),
            limit: page,
            revision: listing.revision,
            ..Default::default()
        };
        let response = kv.range(request).await?.into_inner();
        if listing.pages == 0 {
            listing.revision = response.header.as_ref().map_or(0, |h| h.revision);
        }
        listing.pages += 1;
        listing.keys += response.kvs.len() as u64;
        if keep_revisions {
            listing.mod_revisions.extend(
                response
                    .kvs
                    .iter()
                    .map(|kv| (kv.key.clone(), kv.mod_revision)),
            );
        }
        let Some(last) = response.kvs.last() else {
            return Ok(listing);
        };
        if !response.more {
            return Ok(listing);
        }
        from = [last.key.as_slice(), b"\0"].concat();
    }
}

/// Lists every key under `prefix` with one RangeStream; each chunk counts as a page.
pub async fn stream_all(
    kv: &mut KvClient<Channel>,
    prefix: &[u8],
) -> Result<Listing, tonic::Status> {
    let request = RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        ..Default::default()
    };
    let mut chunks = kv.range_stream(request).await?.into_inner();
    let mut listing = Listing::default();
    while let Some(chunk) = chunks.message().await? {
        let Some(chunk) = chunk.range_response else {
            continue;
        };
        listing.pages += 1;
        listing.keys += chunk.kvs.len() as u64;
        if let Some(header) = chunk.header {
            listing.revision = header.revision;
        }
    }
    Ok(listing)
}

struct Lister {
    kv: KvClient<Channel>,
    prefix: Vec<u8>,
    page: i64,
    stream: bool,
    last: Listing,
}

impl Worker for Lister {
    async fn op(&mut self, _op: u64) -> Result<Outcome, tonic::Status> {
        self.last = if self.stream {
            stream_all(&mut self.kv, &self.prefix).await?
        } else {
            list_all(&mut self.kv, &self.prefix, self.page, false).await?
        };
        Ok(Outcome::Done)
    }
}

pub async fn run(common: &Common, args: &ListArgs, channels: &[Channel]) -> anyhow::Result<Stats> {
    let keys = Keys::new(common, common.prefix_or(DEFAULT_PREFIX));
    populate::before(common, channels, &keys).await?;
    let workers = (0..common.clients.max(1))
        .map(|c| Lister {
            kv: net::kv(net::pick(channels, c)),
            prefix: keys.prefix.clone().into_bytes(),
            page: args.page,
            stream: args.stream,
            last: Listing::default(),
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = (args.write_rate > 0.0).then(|| {
        let (kv, keys, stop) = (net::kv(&channels[0]), keys.clone(), stop.clone());
        tokio::spawn(background_puts(
            kv,
            keys,
            args.write_rate,
            common.seed,
            stop,
        ))
    });
    let name = match (args.stream, writer.is_some()) {
        (false, false) => "list",
        (false, true) => "list-busy",
        (true, false) => "list-stream",
        (true, true) => "list-stream-busy",
    };
    let (mut stats, workers) = driver::run(name, &common.load(), workers).await;
    stop.store(true, Ordering::Relaxed);
    if let Some(writer) = writer {
        let (puts, errors) = writer.await.expect("writer panicked");
        stats.note("background_puts", puts);
        stats.note("background_put_errors", errors);
    }
    stats.unit = "list";
    if let Some(w) = workers.iter().find(|w| w.last.pages > 0) {
        stats.note("keys_per_list", w.last.keys);
        stats.note("pages_per_list", w.last.pages);
    }
    if !args.stream {
        stats.note("page", args.page);
    }
    Ok(stats)
}

/// Puts to random keys of `keys` at `rate` per second until `stop`; returns the puts
/// done and the errors.
async fn background_puts(
    mut kv: KvClient<Channel>,
    keys: Keys,
    rate: f64,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> (u64, u64) {
    let mut rng = keys::rng(seed, usize::MAX);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut puts, mut errors) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let request = PutRequest {
            key: keys.key(keys.pick(puts, &mut rng)),
            value: keys.value(),
            ..Default::default()
        };
        match kv.put(request).await {
            Ok(_) => puts += 1,
            Err(_) => errors += 1,
        }
    }
    (puts, errors)
}
