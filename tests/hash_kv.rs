//! HashKV equal to etcd's: the same random history (puts with and without
//! leases, deletes, range deletes, txns, lease revokes, compactions) sent to
//! real etcd 3.5.1 and to cetera, and HashKV asked at several revisions
//! after every few steps, before and after each compaction.

mod common;

use cetera::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cetera::proto::etcdserverpb::lease_client::LeaseClient;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cetera::proto::etcdserverpb::request_op::Request as Op;
use cetera::proto::etcdserverpb::{
    Compare, DeleteRangeRequest, HashKvRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest,
    RequestOp, TxnRequest,
};
use common::differential::Side;
use common::{differential, etcdctl_35, outcome, run_etcdctl};

/// A small deterministic generator (xorshift), the same on both sides.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const LEASES: [i64; 3] = [7001, 7002, 7003];

fn key(rng: &mut Rng) -> Vec<u8> {
    format!("k{}", rng.below(12)).into_bytes()
}

fn put(rng: &mut Rng, granted: &[i64]) -> PutRequest {
    let lease = match rng.below(4) {
        0 if !granted.is_empty() => granted[rng.below(granted.len() as u64) as usize],
        _ => 0,
    };
    // An empty value now and then: its field is left out of the record.
    let value = match rng.below(8) {
        0 => Vec::new(),
        n => format!("v{n}-{}", rng.below(1000)).into_bytes(),
    };
    PutRequest {
        key: key(rng),
        value,
        lease,
        ..Default::default()
    }
}

/// HashKV at the current revision, the compact revision, one just above
/// it, and a few in between; each answer with its header revision.
async fn note_hashes(side: &mut Side, rng: &mut Rng, current: i64, compact: i64) {
    let mut maintenance = MaintenanceClient::new(side.channel.clone());
    let low = compact.max(0);
    let mut revisions = vec![0, current, compact, compact + 1];
    for _ in 0..3 {
        revisions.push(low + 1 + rng.below((current - low).max(1) as u64) as i64);
    }
    for revision in revisions {
        let result = maintenance.hash_kv(HashKvRequest { revision }).await;
        let shown = outcome(result, |r| {
            format!(
                "hash {} compact {} header rev {}",
                r.hash,
                r.compact_revision,
                r.header.as_ref().map_or(0, |h| h.revision)
            )
        });
        side.note(format!("hashkv {revision}"), shown);
    }
}

async fn random_history(side: &mut Side, seed: u64) {
    let mut rng = Rng(seed);
    let mut lease = LeaseClient::new(side.channel.clone());
    let mut granted = Vec::new();
    let (mut current, mut compact) = (1, -1);
    for step in 0..160 {
        let rev = match rng.below(20) {
            0..=7 => {
                let request = put(&mut rng, &granted);
                side.put_req(request).await
            }
            8 | 9 => side.delete(&key(&mut rng), b"").await,
            10 => {
                let from = key(&mut rng);
                let mut to = from.clone();
                to.push(b'~');
                side.delete(&from, &to).await
            }
            11..=14 => {
                // Distinct keys: etcd refuses a txn that writes one key twice.
                let mut keys: Vec<Vec<u8>> = (0..1 + rng.below(4)).map(|_| key(&mut rng)).collect();
                keys.sort();
                keys.dedup();
                let ops = |rng: &mut Rng, granted: &[i64]| -> Vec<RequestOp> {
                    keys.iter()
                        .map(|k| RequestOp {
                            request: Some(if rng.below(3) == 0 {
                                Op::RequestDeleteRange(DeleteRangeRequest {
                                    key: k.clone(),
                                    ..Default::default()
                                })
                            } else {
                                Op::RequestPut(PutRequest {
                                    key: k.clone(),
                                    ..put(rng, granted)
                                })
                            }),
                        })
                        .rev()
                        .collect()
                };
                let txn = TxnRequest {
                    compare: vec![Compare {
                        result: CompareResult::Greater as i32,
                        target: CompareTarget::Version as i32,
                        key: key(&mut rng),
                        target_union: Some(TargetUnion::Version(0)),
                        ..Default::default()
                    }],
                    success: ops(&mut rng, &granted),
                    failure: ops(&mut rng, &granted),
                };
                side.txn(&format!("txn {step}"), txn).await
            }
            15 | 16 if granted.len() < LEASES.len() => {
                let id = LEASES[granted.len()];
                let result = lease.lease_grant(LeaseGrantRequest { ttl: 600, id }).await;
                side.note(format!("grant {id}"), outcome(result, |r| r.id.to_string()));
                granted.push(id);
                0
            }
            15 | 16 => {
                let id = granted.remove(rng.below(granted.len() as u64) as usize);
                let result = lease.lease_revoke(LeaseRevokeRequest { id }).await;
                side.note(format!("revoke {id}"), outcome(result, |_| "ok".into()));
                // A revoke that deleted keys took a revision; ask the server.
                side.kv
                    .range(common::kv_fixtures::range_all(0))
                    .await
                    .map_or(0, |r| r.into_inner().header.map_or(0, |h| h.revision))
            }
            _ if current > compact + 2 => {
                note_hashes(side, &mut rng, current, compact).await;
                let at = compact.max(1) + 1 + rng.below((current - compact.max(1)) as u64) as i64;
                side.compact(at.min(current)).await;
                compact = at.min(current);
                note_hashes(side, &mut rng, current, compact).await;
                0
            }
            _ => 0,
        };
        current = current.max(rev);
        if step % 10 == 9 {
            note_hashes(side, &mut rng, current, compact).await;
        }
    }
    // No key alive: etcd then hashes every row its compaction kept.
    current = current.max(side.delete(b"\0", b"\0").await);
    note_hashes(side, &mut rng, current, compact).await;
    side.compact(current - 1).await;
    note_hashes(side, &mut rng, current, current - 1).await;
    side.compact(current).await;
    note_hashes(side, &mut rng, current, current).await;
    let rev = side.put(b"again", b"x").await;
    note_hashes(side, &mut rng, rev, current).await;
    // What an operator compares: etcdctl's own view of it.
    if let Some(etcdctl) = etcdctl_35() {
        let out = run_etcdctl(&etcdctl, &side.addr, &["endpoint", "hashkv", "-w", "json"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let hash = &json[0]["HashKV"];
        side.note(
            "etcdctl endpoint hashkv",
            format!("{} compact {}", hash["hash"], hash["compact_revision"]),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_equals_etcds_after_a_random_history() {
    differential(&[], &[], async |side| {
        random_history(side, 0x9e37_79b9_7f4a_7c15).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_equals_etcds_after_another_random_history() {
    differential(&[], &[], async |side| {
        random_history(side, 0x2545_f491_4f6c_dd1d).await;
    })
    .await;
}
