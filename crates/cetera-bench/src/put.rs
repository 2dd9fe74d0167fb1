//! Put: each operation writes one key (random, or sequential with `--seq`) with a
//! `--val-size` value.

use cetera_proto::etcdserverpb::{PutRequest, kv_client::KvClient};
use rand::rngs::StdRng;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Outcome, Stats, Worker};
use crate::keys::{self, Keys};
use crate::net;

struct Putter {
    kv: KvClient<Channel>,
    keys: Keys,
    rng: StdRng,
}

impl Worker for Putter {
    async fn op(&mut self, op: u64) -> Result<Outcome, tonic::Status> {
        let index = self.keys.pick(op, &mut self.rng);
        let request = PutRequest {
            key: self.keys.key(index),
            value: self.keys.value(),
            ..Default::default()
        };
        self.kv.put(request).await?;
        Ok(Outcome::Done)
    }
}

pub async fn run(common: &Common, channels: &[Channel]) -> anyhow::Result<Stats> {
    let keys = Keys::new(common, common.prefix_or(keys::DEFAULT_PREFIX));
    let workers = (0..common.clients.max(1))
        .map(|c| Putter {
            kv: net::kv(net::pick(channels, c)),
            keys: keys.clone(),
            rng: keys::rng(common.seed, c),
        })
        .collect();
    let (stats, _) = driver::run("put", &common.load(), workers).await;
    Ok(stats)
}
