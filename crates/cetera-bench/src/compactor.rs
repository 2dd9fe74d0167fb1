//! The kube-apiserver's compactor (k8s.io/apiserver storage/etcd3 `compact.go`):
//! every interval, a Txn on `compact_rev_key` that elects one compactor among the
//! apiservers, then `Compact` (not physical) to the revision seen one interval
//! earlier. Each compaction starts a window; the K8s scenario reports the longest
//! write of every window, for the soak step of the benchmark.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cetera_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cetera_proto::etcdserverpb::response_op::Response as OpResponse;
use cetera_proto::etcdserverpb::{CompactionRequest, Compare, TxnRequest};
use cetera_proto::ops;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// The key the apiservers agree on the last compaction through.
const COMPACT_REV_KEY: &[u8] = b"compact_rev_key";

/// One compaction made.
pub struct Compaction {
    /// When its Txn was sent.
    pub at: Instant,
    /// The revision compacted to.
    pub revision: i64,
    /// How long the Txn and the Compact call took together.
    pub took: Duration,
}

/// Runs the compactor until `stop`; returns the compactions it made.
pub fn spawn(
    channel: &Channel,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<Compaction>>> {
    let mut kv = crate::net::kv(channel);
    tokio::spawn(async move {
        let mut made = Vec::new();
        // `version`: compact_rev_key's version as last seen (the apiserver's `t`);
        // `seen`: the revision at the previous tick, compacted to at this one.
        let (mut version, mut seen) = (0i64, 0i64);
        // The apiserver waits one interval before its first tick.
        let mut next = Instant::now() + every;
        loop {
            // Waits for the tick in short sleeps, to end soon after `stop`.
            while Instant::now() < next {
                if stop.load(Ordering::Relaxed) {
                    return Ok(made);
                }
                let left = next.saturating_duration_since(Instant::now());
                tokio::time::sleep(left.min(Duration::from_millis(100))).await;
            }
            next += every;
            let at = Instant::now();
            let response = kv.txn(elect(version, seen)).await?.into_inner();
            let current = response.header.as_ref().map_or(0, |h| h.revision);
            if !response.succeeded {
                // Another compactor won: learn its version, as the apiserver does.
                version = match response.responses.first().and_then(|r| r.response.as_ref()) {
                    Some(OpResponse::ResponseRange(r)) => r.kvs.first().map_or(0, |kv| kv.version),
                    _ => version,
                };
                seen = current;
                continue;
            }
            version += 1;
            if seen != 0 {
                let request = CompactionRequest {
                    revision: seen,
                    physical: false,
                };
                kv.compact(request).await?;
                made.push(Compaction {
                    at,
                    revision: seen,
                    took: at.elapsed(),
                });
            }
            seen = current;
        }
    })
}

/// `Txn{[VERSION(compact_rev_key) = version], success = [Put(compact_rev_key,
/// revision)], failure = [Get(compact_rev_key)]}`.
fn elect(version: i64, revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Version as i32,
            key: COMPACT_REV_KEY.to_vec(),
            target_union: Some(TargetUnion::Version(version)),
            ..Default::default()
        }],
        success: vec![ops::put(
            COMPACT_REV_KEY,
            revision.to_string().as_bytes(),
            0,
        )],
        failure: vec![ops::get(COMPACT_REV_KEY)],
    }
}

/// The longest write sent in each window between compactions: the first from
/// `start` to the first compaction, then one from each compaction to the next (or
/// `end`). `writes` are (sent, acknowledged) pairs; times are seconds from `start`.
pub fn windows(
    start: Instant,
    compactions: &[Compaction],
    writes: &[(Instant, Instant)],
    end: Instant,
) -> Value {
    let bounds: Vec<Instant> = std::iter::once(start)
        .chain(compactions.iter().map(|c| c.at))
        .chain(std::iter::once(end))
        .collect();
    let windows: Vec<Value> = bounds
        .windows(2)
        .enumerate()
        .map(|(i, bound)| {
            let longest = writes
                .iter()
                .filter(|(sent, _)| *sent >= bound[0] && *sent < bound[1])
                .map(|(sent, acked)| *acked - *sent)
                .max()
                .unwrap_or_default();
            // Window 0 is before the first compaction.
            let compaction = i.checked_sub(1).map(|c| &compactions[c]);
            json!({
                "from_s": (bound[0] - start).as_secs(),
                "to_s": (bound[1] - start).as_secs(),
                "compacted_to": compaction.map(|c| c.revision),
                "compact_ms": compaction.map(|c| ms(c.took)),
                "longest_write_ms": ms(longest),
            })
        })
        .collect();
    Value::from(windows)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}
