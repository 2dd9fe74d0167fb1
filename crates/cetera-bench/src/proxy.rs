//! A TCP proxy that delays every byte by a fixed time in each direction,
//! standing for the network between cetera and a managed database: with
//! 0.5 ms each way, each round trip cetera makes costs 1 ms more. It also
//! counts round trips: a flight is a run of bytes from the client that
//! follows bytes from the server (or opens the connection), so a pipeline of
//! statements sent together counts once.

use std::io::{Read, Write};
use std::net::{self, Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use tokio::net::{TcpListener, TcpStream};

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
                if let (Ok(client), Ok(server)) = (blocking(client), blocking(server)) {
                    std::thread::spawn(move || relay(client, server, delay, counts));
                }
            }
        });
    }
}

/// `stream` as a blocking std stream: the relay runs on threads, whose
/// sleeps are accurate to tens of microseconds where tokio's timer rounds a
/// delay up to whole milliseconds (0.5 ms each way became 1-2 ms).
fn blocking(stream: TcpStream) -> std::io::Result<net::TcpStream> {
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Forwards both ways until either side closes.
fn relay(client: net::TcpStream, server: net::TcpStream, delay: Duration, counts: Arc<Counts>) {
    let (Ok(client_write), Ok(server_write)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let client_read = client;
    // True once the server has sent something since the client last did.
    let answered = Arc::new(AtomicBool::new(true));
    let up = {
        let Ok(client_read) = client_read.try_clone() else {
            return;
        };
        let direction = Direction::Up(answered.clone(), counts.clone());
        std::thread::spawn(move || one_way(client_read, server_write, delay, direction))
    };
    one_way(
        server,
        client_write,
        delay,
        Direction::Down(answered, counts),
    );
    // The server closed: end the client's side too, which ends `up`.
    let _ = client_read.shutdown(Shutdown::Both);
    let _ = up.join();
}

enum Direction {
    Up(Arc<AtomicBool>, Arc<Counts>),
    Down(Arc<AtomicBool>, Arc<Counts>),
}

/// A woken thread runs some tens of microseconds after its timer fires
/// (more on a busy machine): sleeping to within this of the due time and
/// spinning the rest keeps that out of the delay.
const SPIN: Duration = Duration::from_micros(40);

/// Returns at `due`, or at once if it has passed.
fn wait_until(due: Instant) {
    let now = Instant::now();
    if due > now + SPIN {
        std::thread::sleep(due - now - SPIN);
    }
    while Instant::now() < due {
        std::hint::spin_loop();
    }
}

/// Reads from `from` and writes each chunk to `to` `delay` after it came:
/// a delay line, so chunks in flight do not wait for one another.
fn one_way(
    mut from: net::TcpStream,
    mut to: net::TcpStream,
    delay: Duration,
    direction: Direction,
) {
    let (sender, receiver) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        // Linux lets a sleep end up to 50 us late by default (the timer
        // slack): one each way would add 0.1 ms to every round trip.
        // SAFETY: prctl with PR_SET_TIMERSLACK only changes this thread's slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1) };
        for (due, chunk) in receiver {
            wait_until(due);
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
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
    let _ = writer.join();
}
