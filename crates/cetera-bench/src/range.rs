//! Range: single-key reads of random (or sequential) keys, or with `--prefix-limit N`
//! a read of the whole prefix limited to N keys; linearizable unless `--serializable`.

use cetera_proto::etcdserverpb::{RangeRequest, kv_client::KvClient};
use clap::Args;
use rand::rngs::StdRng;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Outcome, Stats, Worker};
use crate::keys::{self, Keys};
use crate::{net, populate};

#[derive(Args, Debug, Clone)]
pub struct RangeArgs {
    /// Serializable reads (no linearizability round).
    #[arg(long)]
    pub serializable: bool,
    /// Read the prefix with this limit instead of single keys (0: single keys).
    #[arg(long, default_value_t = 0)]
    pub prefix_limit: i64,
}

struct Reader {
    kv: KvClient<Channel>,
    keys: Keys,
    rng: StdRng,
    args: RangeArgs,
}

impl Worker for Reader {
    async fn op(&mut self, op: u64) -> Result<Outcome, tonic::Status> {
        let request = if self.args.prefix_limit > 0 {
            RangeRequest {
                key: self.keys.prefix.clone().into_bytes(),
                range_end: self.keys.range_end(),
                limit: self.args.prefix_limit,
                serializable: self.args.serializable,
                ..Default::default()
            }
        } else {
            RangeRequest {
                key: self.keys.key(self.keys.pick(op, &mut self.rng)),
                serializable: self.args.serializable,
                ..Default::default()
            }
        };
        let response = self.kv.range(request).await?.into_inner();
        Ok(if response.kvs.is_empty() {
            Outcome::Miss
        } else {
            Outcome::Done
        })
    }
}

pub async fn run(common: &Common, args: &RangeArgs, channels: &[Channel]) -> anyhow::Result<Stats> {
    let keys = Keys::new(common, common.prefix_or(keys::DEFAULT_PREFIX));
    populate::before(common, channels, &keys).await?;
    let workers = (0..common.clients.max(1))
        .map(|c| Reader {
            kv: net::kv(net::pick(channels, c)),
            keys: keys.clone(),
            rng: keys::rng(common.seed, c),
            args: args.clone(),
        })
        .collect();
    let name = match (args.prefix_limit > 0, args.serializable) {
        (false, false) => "range",
        (false, true) => "range-serial",
        (true, false) => "range-prefix",
        (true, true) => "range-prefix-serial",
    };
    let (mut stats, _) = driver::run(name, &common.load(), workers).await;
    if args.prefix_limit > 0 {
        stats.note("limit", args.prefix_limit);
    }
    Ok(stats)
}
