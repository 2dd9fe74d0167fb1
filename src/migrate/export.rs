//! `cetera migrate --from DATASTORE --to http(s)://host:2379`: exports a
//! cetera datastore into a live etcd through its gRPC API, for users who
//! leave. The source is read at one consistent view; its leases are granted
//! first (same id, the remaining TTL rounded up), then every live key is put
//! with its value and lease, in key order, in Txns of at most 128 puts
//! (etcd's default --max-txn-ops). etcd assigns its own revisions, so
//! revisions, create/mod revisions, versions and history are not kept.
//! Nothing in etcd is ever deleted: a non-empty etcd is refused unless
//! --force, which writes over it.

use std::collections::HashSet;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use super::{Check, all_equal, progress_bar};
use crate::backend::{Backend, KeyRange, ReadAt, ReadTxn};
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{
    LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use crate::proto::mvccpb::KeyValue;

/// Puts per Txn: etcd's default --max-txn-ops.
const TXN_OPS: usize = 128;
/// Bytes of keys and values per Txn, under etcd's default 1.5 MiB request limit.
const TXN_BYTES: usize = 1 << 20;
/// Keys per read, from the source and from etcd.
const PAGE: usize = 1000;

/// What is not carried over, printed with every export.
pub const NOT_KEPT: &str = "etcd assigns its own revisions: revisions, create/mod revisions, \
     versions and history are not kept; users, roles and the cluster id are not copied";

/// A digest of live keys fed in key order: of each key, its value and its
/// lease, and nothing etcd renumbers. Both sides of an export are hashed with it.
#[derive(Default)]
pub struct LiveKeyDigest {
    sha: Sha256,
    /// Keys added.
    pub keys: i64,
}

impl LiveKeyDigest {
    /// Adds the next key (length-prefixed, so no two sequences encode the same).
    pub fn add(&mut self, kv: &KeyValue) {
        for bytes in [&kv.key, &kv.value] {
            self.sha.update((bytes.len() as u64).to_be_bytes());
            self.sha.update(bytes);
        }
        self.sha.update(kv.lease.to_be_bytes());
        self.keys += 1;
    }

    /// The first eight bytes of the SHA-256, in hex.
    pub fn finish(self) -> String {
        let digest = self.sha.finalize();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What an export did.
#[derive(Debug)]
pub struct Exported {
    /// Leases granted in etcd.
    pub leases: usize,
    /// etcd's revision at which the result was read back.
    pub etcd_revision: i64,
    /// The verification, every line of which matched.
    pub checks: Vec<Check>,
}

/// The remaining TTL of a lease expiring at `expires_at_ms`, in whole
/// seconds rounded up, at least 1 (etcd raises it to its own minimum).
fn remaining_ttl(expires_at_ms: i64, now_ms: i64) -> i64 {
    let left = (expires_at_ms - now_ms).max(0);
    ((left + 999) / 1000).max(1)
}

/// Copies the live keys and leases of `source` into the etcd behind `channel`.
pub async fn export<S: Backend>(
    source: &S,
    channel: Channel,
    force: bool,
) -> anyhow::Result<Exported> {
    let mut kv = KvClient::new(channel.clone()).max_decoding_message_size(usize::MAX);
    let mut lease = LeaseClient::new(channel);
    let everything = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        count_only: true,
        ..Default::default()
    };
    let held = kv
        .range(everything)
        .await
        .context("etcd Range failed")?
        .into_inner()
        .count;
    if held > 0 {
        if !force {
            bail!("the target etcd holds {held} keys; use --force to write over them");
        }
        tracing::warn!("the target etcd holds {held} keys; --force: writing over them");
    }

    let mut reader = source.read().await?;
    let all = KeyRange {
        start: Vec::new(),
        end: None,
    };
    let total = reader.count(&all, ReadAt::Current).await?;
    let mut leases = reader.leases().await?;
    leases.sort_by_key(|row| row.id);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for row in &leases {
        let ttl = remaining_ttl(row.expires_at, now_ms);
        let granted = lease
            .lease_grant(LeaseGrantRequest { ttl, id: row.id })
            .await;
        match granted {
            Ok(_) => {}
            // Only with --force can etcd hold it; it is left as it is.
            Err(status) if force && status.message().contains("lease already exists") => {
                tracing::warn!("lease {:x} already exists in etcd; kept as it is", row.id);
            }
            Err(status) => {
                return Err(status).with_context(|| format!("etcd LeaseGrant {:x}", row.id));
            }
        }
    }
    tracing::info!("granted {} leases; exporting {total} keys", leases.len());

    let bar = progress_bar(total, "keys");
    let mut logged = 0;
    let mut written = 0i64;
    let mut digest = LiveKeyDigest::default();
    let mut exported = HashSet::new();
    let mut keys = all;
    let mut puts: Vec<RequestOp> = Vec::new();
    let mut bytes = 0;
    loop {
        let page = reader.range(&keys, ReadAt::Current, PAGE, false).await?;
        let full = page.len() == PAGE;
        if let Some(last) = page.last() {
            keys.start = last.key.clone();
            keys.start.push(0);
        }
        for key in page {
            digest.add(&key);
            if held > 0 {
                exported.insert(key.key.clone());
            }
            bytes += key.key.len() + key.value.len();
            puts.push(RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: key.key,
                    value: key.value,
                    lease: key.lease,
                    ..Default::default()
                })),
            });
            if puts.len() == TXN_OPS || bytes >= TXN_BYTES {
                written += flush(&mut kv, &mut puts).await?;
                bytes = 0;
            }
        }
        bar.set_position(written as u64);
        if bar.is_hidden() && (written - logged) * 10 >= total.max(1) {
            tracing::info!("exported {written} of {total} keys");
            logged = written;
        }
        if !full {
            break;
        }
    }
    written += flush(&mut kv, &mut puts).await?;
    bar.finish_and_clear();
    tracing::info!("exported {written} keys; verifying");

    // Keys etcd held before (--force) are not the source's: the read-back
    // skips them, and says how many there were.
    let only = (held > 0).then_some(&exported);
    let (etcd_revision, readback, others) = read_back(&mut kv, only).await?;
    if others > 0 {
        tracing::warn!("etcd also holds {others} keys that the source does not (--force)");
    }
    let source_keys = digest.keys;
    let checks = vec![
        Check {
            what: "live keys".into(),
            source: source_keys.to_string(),
            target: readback.keys.to_string(),
        },
        Check {
            what: "hash of (key, value, lease)".into(),
            source: digest.finish(),
            target: readback.finish(),
        },
    ];
    all_equal(&checks)?;
    Ok(Exported {
        leases: leases.len(),
        etcd_revision,
        checks,
    })
}

/// Sends the pending puts as one Txn; returns how many there were.
async fn flush(kv: &mut KvClient<Channel>, puts: &mut Vec<RequestOp>) -> anyhow::Result<i64> {
    if puts.is_empty() {
        return Ok(0);
    }
    let count = puts.len() as i64;
    let txn = TxnRequest {
        compare: vec![],
        success: std::mem::take(puts),
        failure: vec![],
    };
    kv.txn(txn).await.context("etcd Txn failed")?;
    Ok(count)
}

/// Digests what etcd holds (only the keys in `only`, if given), read in
/// pages at one revision (the first page's); returns that revision and the
/// number of keys left out too.
async fn read_back(
    kv: &mut KvClient<Channel>,
    only: Option<&HashSet<Vec<u8>>>,
) -> anyhow::Result<(i64, LiveKeyDigest, i64)> {
    let mut digest = LiveKeyDigest::default();
    let mut others = 0;
    let mut revision = 0;
    let mut next = vec![0];
    loop {
        let request = RangeRequest {
            key: next.clone(),
            range_end: vec![0],
            limit: PAGE as i64,
            revision,
            ..Default::default()
        };
        let page = kv
            .range(request)
            .await
            .with_context(|| format!("etcd Range at revision {revision} failed"))?
            .into_inner();
        if revision == 0 {
            revision = page.header.as_ref().map_or(0, |h| h.revision);
        }
        for key in &page.kvs {
            if only.is_some_and(|only| !only.contains(&key.key)) {
                others += 1;
            } else {
                digest.add(key);
            }
            next = key.key.clone();
            next.push(0);
        }
        if !page.more {
            return Ok((revision, digest, others));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::remaining_ttl;

    #[test]
    fn remaining_ttl_rounds_up_to_at_least_one_second() {
        assert_eq!(remaining_ttl(10_000, 0), 10);
        assert_eq!(remaining_ttl(10_001, 0), 11);
        assert_eq!(remaining_ttl(500, 0), 1);
        assert_eq!(remaining_ttl(0, 5_000), 1);
    }
}
