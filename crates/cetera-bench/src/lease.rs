//! Lease: grants leases of `--ttl` seconds, then sends keep-alives for them (one
//! LeaseKeepAlive stream per client, one request and its answer per operation), then
//! revokes them all (unless `--keep`). Each phase is a row of its own and runs for
//! `--total` operations or `--duration`.

use std::sync::Arc;

use anyhow::Context;
use cetera_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    lease_client::LeaseClient,
};
use clap::Args;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::Common;
use crate::driver::{self, Load, Outcome, Stats, Worker};
use crate::net;

#[derive(Args, Debug, Clone)]
pub struct LeaseArgs {
    /// TTL of the granted leases, seconds.
    #[arg(long, default_value_t = 60)]
    pub ttl: i64,
    /// Leave the leases to expire instead of revoking them.
    #[arg(long)]
    pub keep: bool,
}

struct Granter {
    lease: LeaseClient<Channel>,
    ttl: i64,
    ids: Vec<i64>,
}

impl Worker for Granter {
    async fn op(&mut self, _op: u64) -> Result<Outcome, tonic::Status> {
        let request = LeaseGrantRequest {
            ttl: self.ttl,
            id: 0,
        };
        let response = self.lease.lease_grant(request).await?.into_inner();
        self.ids.push(response.id);
        Ok(Outcome::Done)
    }
}

struct KeepAliver {
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    responses: tonic::Streaming<LeaseKeepAliveResponse>,
    ids: Vec<i64>,
}

impl KeepAliver {
    /// Opens a keep-alive stream. The first request goes out before the call is
    /// awaited: a gRPC server need not answer a stream's headers before its first
    /// message.
    async fn open(channel: &Channel, ids: Vec<i64>) -> anyhow::Result<KeepAliver> {
        let (requests, rx) = mpsc::channel(4);
        requests
            .send(LeaseKeepAliveRequest { id: ids[0] })
            .await
            .expect("receiver alive");
        let mut responses = LeaseClient::new(channel.clone())
            .lease_keep_alive(ReceiverStream::new(rx))
            .await
            .context("open keep-alive stream")?
            .into_inner();
        responses
            .message()
            .await?
            .context("keep-alive stream ended")?;
        Ok(KeepAliver {
            requests,
            responses,
            ids,
        })
    }
}

impl Worker for KeepAliver {
    async fn op(&mut self, op: u64) -> Result<Outcome, tonic::Status> {
        let id = self.ids[op as usize % self.ids.len()];
        self.requests
            .send(LeaseKeepAliveRequest { id })
            .await
            .map_err(|_| tonic::Status::unavailable("keep-alive stream closed"))?;
        let response = self
            .responses
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unavailable("keep-alive stream ended"))?;
        Ok(if response.ttl > 0 {
            Outcome::Done
        } else {
            Outcome::Miss
        })
    }
}

struct Revoker {
    lease: LeaseClient<Channel>,
    ids: Arc<Vec<i64>>,
}

impl Worker for Revoker {
    async fn op(&mut self, op: u64) -> Result<Outcome, tonic::Status> {
        let id = self.ids[op as usize];
        self.lease.lease_revoke(LeaseRevokeRequest { id }).await?;
        Ok(Outcome::Done)
    }
}

pub async fn run(
    common: &Common,
    args: &LeaseArgs,
    channels: &[Channel],
) -> anyhow::Result<Vec<Stats>> {
    let clients = common.clients.max(1);
    let load = common.load();

    let granters = (0..clients)
        .map(|c| Granter {
            lease: LeaseClient::new(net::pick(channels, c).clone()),
            ttl: args.ttl,
            ids: Vec::new(),
        })
        .collect();
    let (grant, granters) = driver::run("lease-grant", &load, granters).await;
    let ids: Vec<i64> = granters.into_iter().flat_map(|g| g.ids).collect();
    let mut results = vec![grant];
    if ids.is_empty() {
        return Ok(results);
    }

    let mut keepers = Vec::new();
    for c in 0..clients.min(ids.len()) {
        let own: Vec<i64> = ids.iter().skip(c).step_by(clients).copied().collect();
        keepers.push(KeepAliver::open(net::pick(channels, c), own).await?);
    }
    let (mut keepalive, _) = driver::run("lease-keepalive", &load, keepers).await;
    keepalive.note("leases", ids.len() as u64);
    results.push(keepalive);

    if !args.keep {
        let ids = Arc::new(ids);
        let revokers = (0..clients)
            .map(|c| Revoker {
                lease: LeaseClient::new(net::pick(channels, c).clone()),
                ids: ids.clone(),
            })
            .collect();
        let all = Load {
            total: Some(ids.len() as u64),
            duration: None,
            rate: None,
            progress: load.progress,
        };
        let (revoke, _) = driver::run("lease-revoke", &all, revokers).await;
        results.push(revoke);
    }
    Ok(results)
}
