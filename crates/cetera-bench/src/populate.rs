//! Populate: writes every key of the key space, `--batch` puts per Txn, with the
//! `--clients` workers. Scenarios that read call it first under `--populate`. A server
//! that refuses a Txn of puts (kine accepts only the apiserver's four Txn shapes) is
//! filled with one Put per key instead.

use cetera_proto::etcdserverpb::{PutRequest, TxnRequest, kv_client::KvClient};
use clap::Args;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Load, Outcome, Stats, Worker};
use crate::keys::Keys;
use crate::net;

#[derive(Args, Debug, Clone)]
pub struct PopulateArgs {
    /// Puts per Txn (etcd's default --max-txn-ops is 128).
    #[arg(long, default_value_t = 100)]
    pub batch: u64,
}

struct Filler {
    kv: KvClient<Channel>,
    keys: Keys,
    batch: u64,
    /// One Put per key instead of a Txn per batch.
    plain: bool,
}

impl Worker for Filler {
    async fn op(&mut self, op: u64) -> Result<Outcome, tonic::Status> {
        let first = op * self.batch;
        let last = (first + self.batch).min(self.keys.space);
        if self.plain {
            for i in first..last {
                let put = PutRequest {
                    key: self.keys.key(i),
                    value: self.keys.value(),
                    ..Default::default()
                };
                self.kv.put(put).await?;
            }
            return Ok(Outcome::Done);
        }
        let success = (first..last)
            .map(|i| {
                PutRequest {
                    key: self.keys.key(i),
                    value: self.keys.value(),
                    ..Default::default()
                }
                .into()
            })
            .collect();
        let txn = TxnRequest {
            success,
            ..Default::default()
        };
        self.kv.txn(txn).await?;
        Ok(Outcome::Done)
    }
}

/// The `populate` command.
pub async fn run(
    common: &Common,
    args: &PopulateArgs,
    channels: &[Channel],
    prefix: &str,
) -> anyhow::Result<Stats> {
    let keys = Keys::new(common, prefix.to_string());
    Ok(fill(common, channels, &keys, args.batch).await)
}

/// Writes keys 0..space of `keys` (not part of any measurement but its own).
pub async fn fill(common: &Common, channels: &[Channel], keys: &Keys, batch: u64) -> Stats {
    let batch = batch.max(1);
    let batches = keys.space.div_ceil(batch);
    let plain = refuses_txn(channels, keys, batch).await;
    let workers = (0..common.clients.max(1))
        .map(|c| Filler {
            kv: net::kv(net::pick(channels, c)),
            keys: keys.clone(),
            batch,
            plain,
        })
        .collect();
    let load = Load {
        total: Some(batches),
        duration: None,
        rate: None,
        progress: !common.no_progress,
    };
    let (mut stats, _) = driver::run("populate", &load, workers).await;
    stats.unit = "batch";
    if plain {
        stats.note("puts_instead_of_txns", true);
    }
    stats.note("keys", keys.space);
    stats.note(
        "keys_per_sec",
        (keys.space as f64 / stats.elapsed.as_secs_f64()).round(),
    );
    stats
}

/// Whether the server refuses a Txn of puts as unsupported (kine), found by sending
/// the first batch (written again by the fill: puts of the same values).
async fn refuses_txn(channels: &[Channel], keys: &Keys, batch: u64) -> bool {
    let mut probe = Filler {
        kv: net::kv(net::pick(channels, 0)),
        keys: keys.clone(),
        batch,
        plain: false,
    };
    match probe.op(0).await {
        Err(status) => status.message().contains("unsupported"),
        Ok(_) => false,
    }
}

/// `--populate`: fills the key space before a scenario, telling the user on stderr.
pub async fn before(common: &Common, channels: &[Channel], keys: &Keys) -> anyhow::Result<()> {
    if !common.populate {
        return Ok(());
    }
    let stats = fill(common, channels, keys, 100).await;
    if stats.errors > 0 {
        anyhow::bail!("populate failed: {}", stats.first_error.unwrap_or_default());
    }
    eprintln!(
        "populated {} keys under {:?} in {:.1} s",
        keys.space,
        keys.prefix,
        stats.elapsed.as_secs_f64()
    );
    Ok(())
}
