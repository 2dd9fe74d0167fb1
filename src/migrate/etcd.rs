//! `cetera migrate --from http(s)://host:2379`: imports a live etcd (or any
//! etcd v3 API server) through its gRPC API. Everything is read at one
//! revision, pinned by the first response's header, in pages of 1000 keys;
//! each key becomes one log row at its mod revision, with etcd's create
//! revision, version and lease, and the store is compacted at the pinned
//! revision, since etcd's older history cannot be listed through its API.
//! Leases are copied with their granted TTL and remaining time. Users,
//! roles and the cluster id are not (the target gets a new identity).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use anyhow::{Context, bail};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::{Imported, Migrated, progress_bar};
use crate::backend::snapshot::empty_target;
use crate::backend::{Backend, LeaseRow, LogEntry, Revisions, WriteTxn};
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::{LeaseLeasesRequest, LeaseTimeToLiveRequest, RangeRequest};
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
    let mut writer = target.write().await?;
    empty_target(&mut writer, force).await?;

    let mut pinned = 0;
    let mut next_key = vec![0];
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
            range_end: vec![0],
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
        for kv in page.kvs {
            // Keys changed in one transaction share a revision; each gets
            // its own place in it.
            let sub = subs.entry(kv.mod_revision).or_insert(0);
            if kv.lease != 0 {
                attached.insert(kv.lease);
            }
            next_key = kv.key.clone();
            next_key.push(0);
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

    let mut lease = LeaseClient::new(channel);
    let ids = lease
        .lease_leases(LeaseLeasesRequest {})
        .await
        .context("etcd LeaseLeases failed")?
        .into_inner()
        .leases;
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
        let ttl = lease
            .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
            .await
            .context("etcd LeaseTimeToLive failed")?
            .into_inner();
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
