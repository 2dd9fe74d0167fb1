//! Txn compare-and-swap, the apiserver's Update: `Txn{[MOD(key) = rev], success =
//! [Put], failure = [Range key]}`. Each client owns a share of the key space and knows
//! each key's mod revision (from an initial List, then from its own answers), as the
//! apiserver's cache does; a failed compare (a miss) reads the current revision back.

use std::collections::HashMap;

use cetera_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cetera_proto::etcdserverpb::response_op::Response as OpResponse;
use cetera_proto::etcdserverpb::{
    Compare, PutRequest, TxnRequest, TxnResponse, kv_client::KvClient,
};
use cetera_proto::ops;
use rand::Rng;
use rand::rngs::StdRng;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Outcome, Stats, Worker};
use crate::keys::{self, Keys};
use crate::{list, net, populate};

/// `MOD(key) = revision` (0: the key does not exist).
pub fn compare_mod(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Mod as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::ModRevision(revision)),
        ..Default::default()
    }
}

/// The apiserver's Create: `Txn{[MOD(key)=0], success=[Put{key,value,lease}]}`.
pub fn create(key: &[u8], value: Vec<u8>, lease: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![compare_mod(key, 0)],
        success: vec![
            PutRequest {
                key: key.to_vec(),
                value,
                lease,
                ..Default::default()
            }
            .into(),
        ],
        failure: vec![],
    }
}

/// The apiserver's Update: `Txn{[MOD(key)=rev], success=[Put], failure=[Range{key}]}`.
pub fn update(key: &[u8], value: Vec<u8>, lease: i64, revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![compare_mod(key, revision)],
        success: vec![
            PutRequest {
                key: key.to_vec(),
                value,
                lease,
                ..Default::default()
            }
            .into(),
        ],
        failure: vec![ops::get(key)],
    }
}

/// The apiserver's Delete: `Txn{[MOD(key)=rev], success=[DeleteRange], failure=[Range]}`.
pub fn delete(key: &[u8], revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![compare_mod(key, revision)],
        success: vec![ops::delete(key)],
        failure: vec![ops::get(key)],
    }
}

/// The current mod revision a failed Update/Delete read back (0: the key is gone).
pub fn failure_revision(response: &TxnResponse) -> i64 {
    match response.responses.first().and_then(|r| r.response.as_ref()) {
        Some(OpResponse::ResponseRange(r)) => r.kvs.first().map_or(0, |kv| kv.mod_revision),
        _ => 0,
    }
}

/// The revision of a response header.
pub fn revision(response: &TxnResponse) -> i64 {
    response.header.as_ref().map_or(0, |h| h.revision)
}

/// Learns the mod revision of every key under `prefix` with one paginated List.
pub async fn known_revisions(
    channels: &[Channel],
    prefix: &str,
) -> anyhow::Result<HashMap<Vec<u8>, i64>> {
    let mut kv = net::kv(&channels[0]);
    let listing = list::list_all(&mut kv, prefix.as_bytes(), 500, true).await?;
    Ok(listing.mod_revisions.into_iter().collect())
}

struct Swapper {
    kv: KvClient<Channel>,
    keys: Keys,
    rng: StdRng,
    /// This client's key indexes (a share of the key space).
    own: Vec<u64>,
    /// Mod revision per own key index; absent = believed not to exist.
    known: HashMap<u64, i64>,
}

impl Worker for Swapper {
    async fn op(&mut self, op: u64) -> Result<Outcome, tonic::Status> {
        let slot = if self.keys.seq {
            op as usize % self.own.len()
        } else {
            self.rng.random_range(0..self.own.len())
        };
        let index = self.own[slot];
        let key = self.keys.key(index);
        let revision = self.known.get(&index).copied().unwrap_or(0);
        let response = self
            .kv
            .txn(update(&key, self.keys.value(), 0, revision))
            .await?
            .into_inner();
        if response.succeeded {
            self.known.insert(index, self::revision(&response));
            Ok(Outcome::Done)
        } else {
            self.known.insert(index, failure_revision(&response));
            Ok(Outcome::Miss)
        }
    }
}

pub async fn run(common: &Common, channels: &[Channel]) -> anyhow::Result<Stats> {
    let keys = Keys::new(common, common.prefix_or(keys::DEFAULT_PREFIX));
    populate::before(common, channels, &keys).await?;
    let known = known_revisions(channels, &keys.prefix).await?;
    let clients = common.clients.max(1);
    let workers = (0..clients)
        .map(|c| {
            // Client c owns indexes c, c + clients, ...; with fewer keys than clients,
            // clients share keys (and race).
            let own: Vec<u64> = if keys.space as usize >= clients {
                (c as u64..keys.space).step_by(clients).collect()
            } else {
                vec![c as u64 % keys.space]
            };
            let known = own
                .iter()
                .filter_map(|&i| known.get(&keys.key(i)).map(|&rev| (i, rev)))
                .collect();
            Swapper {
                kv: net::kv(net::pick(channels, c)),
                keys: keys.clone(),
                rng: keys::rng(common.seed, c),
                own,
                known,
            }
        })
        .collect();
    let (mut stats, _) = driver::run("txn-cas", &common.load(), workers).await;
    stats.note("conflicts", stats.misses);
    Ok(stats)
}
