//! Connections: `--conns` HTTP/2 channels to the endpoints, and a readiness probe.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cetera_proto::etcdserverpb::{RangeRequest, kv_client::KvClient};
use tonic::transport::{Channel, Endpoint};

/// Largest response a client accepts (a List page of big values can pass 4 MiB).
pub const MAX_MESSAGE: usize = 64 << 20;

/// Opens `conns` connections, spread over `endpoints` round-robin. Each channel is one
/// HTTP/2 connection; clients share them like etcd's Go clients share a `grpc.ClientConn`.
pub async fn connect(endpoints: &[String], conns: usize) -> anyhow::Result<Vec<Channel>> {
    if endpoints.is_empty() {
        bail!("no --endpoints");
    }
    let mut channels = Vec::with_capacity(conns.max(1));
    for i in 0..conns.max(1) {
        let url = &endpoints[i % endpoints.len()];
        channels.push(
            endpoint(url)?
                .connect()
                .await
                .with_context(|| format!("connect to {url}"))?,
        );
    }
    Ok(channels)
}

/// The channel settings used for every connection: no Nagle, and flow-control windows
/// large enough that a 500-key List page is never held up by the client.
fn endpoint(url: &str) -> anyhow::Result<Endpoint> {
    let url = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    Ok(Endpoint::from_shared(url.clone())
        .with_context(|| format!("bad endpoint {url}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20)))
}

/// The connection client number `client` uses.
pub fn pick(channels: &[Channel], client: usize) -> &Channel {
    &channels[client % channels.len()]
}

/// A KV client on `channel` that accepts large responses.
pub fn kv(channel: &Channel) -> KvClient<Channel> {
    KvClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE)
}

/// Waits until `url` answers a serializable Range, or fails after `timeout`.
pub async fn wait_ready(url: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("never tried");
    while Instant::now() < deadline {
        match endpoint(url)?.connect().await {
            Ok(channel) => {
                let request = RangeRequest {
                    key: b"cetera-bench-ready".to_vec(),
                    ..Default::default()
                };
                match kv(&channel).range(request).await {
                    Ok(_) => return Ok(()),
                    Err(status) => last = status.to_string(),
                }
            }
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{url} not ready after {timeout:?}: {last}")
}
