//! `cetera migrate --from http(s)://host:2379`: imports a live etcd (or any
//! etcd v3 API server) through its gRPC API. Everything is read at one
//! revision, pinned by the first response's header, in pages of 1000 keys;
//! each key becomes one log row at its mod revision, with etcd's create
//! revision, version and lease, and the store is compacted at the pinned
//! revision, since etcd's older history cannot be listed through its API.
//! Leases are copied with their granted TTL and remaining time. Users,
//! roles and the cluster id are not (the target gets a new identity).
//!
//! A server whose lease RPCs answer "not supported" (a running kine, whose
//! LeaseGrant hands out ID = TTL and keeps no leases) is read in kine's
//! terms: keys from 0x01 up to 0x7f (kine lists `name >= key AND name <
//! end`, so etcd's "\0 to \0" for every key would find none, and
//! PostgreSQL refuses NUL bytes), pages continuing at the last key + 0x01;
//! kine's bookkeeping keys are left out (its own `compact_rev_key` row,
//! version 0, and its `/registry/health` key); a key of version 0 (kine
//! counts none) gets version 1; and the leases are derived from the keys'
//! lease fields, one per distinct id, with TTL = id, from the import.
//! (kine on MySQL lists in its column's case-insensitive order, so a
//! kine's keys are held and sorted for the check's hash.)

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use anyhow::{Context, bail};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::{Imported, Migrated, progress_bar};
use crate::backend::snapshot::empty_target;
use crate::backend::{Backend, LeaseRow, LogEntry, Revisions, WriteTxn};
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::{
    LeaseLeasesRequest, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, RangeRequest,
};
use crate::store::hash::LiveKeysHasher;

/// Keys per Range request.
const PAGE: i64 = 1000;

/// TLS files for the connection to etcd, named as etcdctl names them.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// CA certificate (etcdctl --cacert).
    pub cacert: Option<PathBuf>,
    /// Client certificate (etcdctl --cert).
    pub cert: Option<PathBuf>,
    /// Its key (etcdctl --key).
    pub key: Option<PathBuf>,
}

/// Whether `from` names an etcd server rather than a datastore.
pub fn is_etcd_url(from: &str) -> bool {
    from.starts_with("http://") || from.starts_with("https://")
}

/// Connects to the etcd source at `url` (the first of a comma-separated list).
pub async fn connect(url: &str, tls: &EtcdTls) -> anyhow::Result<Channel> {
    connect_as(url, tls, "from").await
}

/// Connects to the etcd at `url`, given with the `--{side}` flag (`from`
/// or `to`, whose TLS flags are `--{side}-cacert` etc.).
pub async fn connect_as(url: &str, tls: &EtcdTls, side: &str) -> anyhow::Result<Channel> {
    let url = url.split(',').next().unwrap_or_default().trim().to_string();
    let mut endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| format!("bad etcd URL {url}"))?
        .connect_timeout(std::time::Duration::from_secs(10));
    if url.starts_with("https://") {
        let mut config = ClientTlsConfig::new();
        let Some(cacert) = &tls.cacert else {
            bail!("an https:// etcd needs --{side}-cacert (the CA its certificate chains to)");
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        config = config.ca_certificate(Certificate::from_pem(read(cacert)?));
        match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            (None, None) => {}
            _ => bail!("--{side}-cert and --{side}-key go together"),
        }
        endpoint = endpoint.tls_config(config)?;
    } else if tls.cacert.is_some() || tls.cert.is_some() {
        bail!("TLS files were given for a plain http:// etcd URL; use https://");
    }
    endpoint
        .connect()
        .await
        .with_context(|| format!("cannot connect to etcd at {url}"))
}

/// Copies what the etcd behind `channel` holds into `target`, in one target
/// transaction, and checks the result.
pub async fn import<T: Backend>(
    channel: Channel,
    target: &T,
    force: bool,
) -> anyhow::Result<Migrated> {
    let mut kv = KvClient::new(channel.clone()).max_decoding_message_size(usize::MAX);
    let mut lease = LeaseClient::new(channel);
    // Listed before the keys: a lease granted meanwhile is still found
    // through the keys that name it.
    let listed = match lease.lease_leases(LeaseLeasesRequest {}).await {
        Ok(listed) => Some(listed.into_inner().leases),
        Err(status) if not_supported(&status) => {
            tracing::warn!(
                "the server answers LeaseLeases with {:?}, as kine does: reading it as a kine \
                 (its keys from 0x01 to 0x7f, without kine's bookkeeping keys), and deriving \
                 the leases from the keys' lease fields (one per id, TTL = id, as kine grants \
                 them)",
                status.message()
            );
            None
        }
        Err(status) => {
            return Err(anyhow::Error::new(status).context("etcd LeaseLeases failed"));
        }
    };
    let like_kine = listed.is_none();
    let mut writer = target.write().await?;
    empty_target(&mut writer, force).await?;

    let mut pinned = 0;
    let (mut next_key, range_end) = if like_kine {
        (vec![1], vec![0x7f])
    } else {
        (vec![0], vec![0])
    };
    let mut copied = 0i64;
    let mut subs: HashMap<i64, i64> = HashMap::new();
    // Leases that copied keys name: each must exist in the target.
    let mut attached: HashSet<i64> = HashSet::new();
    let mut hasher = LiveKeysHasher::default();
    let mut bar = None;
    let mut total = 0;
    let mut logged = 0;
    loop {
        let request = RangeRequest {
            key: next_key.clone(),
            range_end: range_end.clone(),
            limit: PAGE,
            revision: pinned,
            ..Default::default()
        };
        let page = kv
            .range(request)
            .await
            .with_context(|| format!("etcd Range at revision {pinned} failed"))?
            .into_inner();
        if pinned == 0 {
            pinned = page.header.as_ref().map_or(0, |h| h.revision);
            total = page.count;
            tracing::info!("importing {total} keys at etcd revision {pinned}");
            bar = Some(progress_bar(total, "keys"));
        }
        for mut kv in page.kvs {
            next_key = kv.key.clone();
            next_key.push(if like_kine { 1 } else { 0 });
            if like_kine {
                if kine_bookkeeping(&kv) {
                    continue;
                }
                kv.version = kv.version.max(1);
            }
            // Keys changed in one transaction share a revision; each gets
            // its own place in it.
            let sub = subs.entry(kv.mod_revision).or_insert(0);
            if kv.lease != 0 {
                attached.insert(kv.lease);
            }
            let entry = LogEntry {
                kv,
                sub: *sub,
                deleted: false,
            };
            hasher.add(&entry);
            writer.append(&entry).await?;
            *sub += 1;
            copied += 1;
        }
        if let Some(bar) = &bar {
            bar.set_position(copied as u64);
            if bar.is_hidden() && (copied - logged) * 10 >= total.max(1) {
                tracing::info!("copied {copied} of {total} keys");
                logged = copied;
            }
        }
        if !page.more {
            break;
        }
    }

    let ids = listed.unwrap_or_default();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut leases = 0;
    let mut ids: Vec<i64> = ids.iter().map(|status| status.id).collect();
    // A lease that expired or was revoked after the keys were read is gone
    // from the list but still named by keys at the pinned revision.
    ids.extend(
        attached
            .iter()
            .filter(|id| !ids.contains(id))
            .collect::<Vec<_>>(),
    );
    for id in ids {
        let ttl = match lease
            .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
            .await
        {
            Ok(ttl) => ttl.into_inner(),
            // kine's lease ids are their TTLs; the keys keep them for that long.
            Err(status) if not_supported(&status) => LeaseTimeToLiveResponse {
                id,
                ttl: id,
                granted_ttl: id,
                ..Default::default()
            },
            Err(status) => {
                return Err(anyhow::Error::new(status).context("etcd LeaseTimeToLive failed"));
            }
        };
        // Expired (or revoked) since the keys were read: etcd is deleting
        // its keys. Without keys it is dropped; with keys it is copied
        // already expired, so cetera deletes them too.
        if ttl.ttl <= 0 && !attached.contains(&id) {
            continue;
        }
        let row = LeaseRow {
            id,
            ttl: ttl.granted_ttl.max(1),
            expires_at: now_ms + ttl.ttl.max(0) * 1000,
        };
        writer.put_lease(&row).await?;
        leases += 1;
    }
    let revisions = Revisions {
        current: pinned.max(1),
        compact: pinned.max(1),
        compacted_through: pinned.max(1),
    };
    writer.set_revisions(revisions).await?;
    writer.commit().await?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    super::verify_import(
        target,
        Imported {
            revisions,
            hash: hasher.finish(),
            keys: copied as usize,
            leases,
        },
    )
    .await
}

/// Whether a lease RPC failed because the server does not have it: gRPC's
/// Unimplemented, or kine's "lease ... is not supported" (code Unknown).
fn not_supported(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unimplemented || status.message().contains("not supported")
}

/// kine's own keys, as it lists them: its compact revision row (key
/// `compact_rev_key` at version 0; the apiserver's `compact_rev_key`, which
/// kine keeps elsewhere, comes with its version) and its health key.
fn kine_bookkeeping(kv: &crate::proto::mvccpb::KeyValue) -> bool {
    (kv.key == b"compact_rev_key" && kv.version == 0)
        || (kv.key == b"/registry/health" && kv.value == br#"{"health":"true"}"#)
}
