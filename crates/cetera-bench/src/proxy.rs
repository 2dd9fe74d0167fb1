//! A TCP proxy that delays every byte by a fixed time in each direction,
//! standing for the network between cetera and a managed database: with
//! 0.5 ms each way, each round trip cetera makes costs 1 ms more. It also
//! counts round trips: a flight is a run of bytes from the client that
//! follows bytes from the server (or opens the connection), so a pipeline of
//! statements sent together counts once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Options of `cetera-bench proxy`.
#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Address to forward to.
    #[arg(long)]
    pub to: SocketAddr,
    /// Delay added in each direction, e.g. `500us`.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500us")]
    pub delay: Duration,
    /// File rewritten every 100 ms with the counts so far, as JSON:
    /// connections, flights (round trips begun by the client), bytes each way.
    #[arg(long)]
    pub stats: Option<std::path::PathBuf>,
}

/// Counts over all connections.
#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    flights: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

/// Runs until killed.
pub async fn run(args: &ProxyArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let counts = Arc::new(Counts::default());
    if let Some(path) = args.stats.clone() {
        let counts = counts.clone();
        tokio::spawn(async move {
            loop {
                let text = serde_json::json!({
                    "connections": counts.connections.load(Ordering::Relaxed),
                    "flights": counts.flights.load(Ordering::Relaxed),
                    "bytes_up": counts.bytes_up.load(Ordering::Relaxed),
                    "bytes_down": counts.bytes_down.load(Ordering::Relaxed),
                })
                .to_string();
                let partial = path.with_extension("partial");
                if std::fs::write(&partial, text).is_ok() {
                    let _ = std::fs::rename(&partial, &path);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    loop {
        let (client, _) = listener.accept().await?;
        let (to, delay, counts) = (args.to, args.delay, counts.clone());
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(to).await {
                counts.connections.fetch_add(1, Ordering::Relaxed);
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                relay(client, server, delay, counts).await;
            }
        });
    }
}

/// Forwards both ways until either side closes.
async fn relay(client: TcpStream, server: TcpStream, delay: Duration, counts: Arc<Counts>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // True once the server has sent something since the client last did.
    let answered = Arc::new(AtomicBool::new(true));
    let up = tokio::spawn(one_way(
        client_read,
        server_write,
        delay,
        Direction::Up(answered.clone(), counts.clone()),
    ));
    let down = one_way(
        server_read,
        client_write,
        delay,
        Direction::Down(answered, counts),
    );
    down.await;
    up.abort();
}

enum Direction {
    Up(Arc<AtomicBool>, Arc<Counts>),
    Down(Arc<AtomicBool>, Arc<Counts>),
}

/// Reads from `from` and writes each chunk to `to` `delay` after it came:
/// a delay line, so chunks in flight do not wait for one another.
async fn one_way(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    direction: Direction,
) {
    let (sender, mut receiver) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = receiver.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match &direction {
            Direction::Up(answered, counts) => {
                if answered.swap(false, Ordering::Relaxed) {
                    counts.flights.fetch_add(1, Ordering::Relaxed);
                }
                counts.bytes_up.fetch_add(n as u64, Ordering::Relaxed);
            }
            Direction::Down(answered, counts) => {
                answered.store(true, Ordering::Relaxed);
                counts.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        if sender
            .send((Instant::now() + delay, buffer[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(sender);
    let _ = writer.await;
}
