//! A TCP proxy that stands in for a network link between cluster nodes in tests: it
//! forwards connections to a target until `cut()`, which kills every live connection and
//! closes new ones at once, until `heal()`.
//!
//! `block(ip)` cuts only the connections coming from one source address: cluster nodes
//! that send from addresses of their own (127.0.0.x) can so be partitioned one from
//! another.
//!
//! `start_slowed(target, delay)` holds every chunk of bytes back by `delay` in each
//! direction: a slow network path to a database, say.
//!
//! `cut()` shuts the sockets down synchronously (through duplicated file descriptors), so
//! the link is down when it returns, whatever the runtime is doing: on a current-thread
//! runtime the forwarding tasks only run when the test awaits.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A proxy listening on 127.0.0.1 that forwards to one target; dropping it stops it.
pub struct FaultProxy {
    addr: SocketAddr,
    links: Arc<Mutex<Links>>,
    accept: JoinHandle<()>,
}

/// The cut flag and a duplicate of every live socket, kept to shut them down from `cut()`.
#[derive(Default)]
struct Links {
    cut: bool,
    next_id: u64,
    live: HashMap<u64, Vec<std::net::TcpStream>>,
    /// Source addresses whose connections are refused, and each live connection's source.
    blocked: HashSet<IpAddr>,
    sources: HashMap<u64, IpAddr>,
}

impl Links {
    fn kill_all(&mut self) {
        for socket in self.live.drain().flat_map(|(_, s)| s) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    fn kill_from(&mut self, source: IpAddr) {
        let ids: Vec<u64> = self
            .sources
            .iter()
            .filter(|(_, ip)| **ip == source)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            for socket in self.live.remove(&id).unwrap_or_default() {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

impl FaultProxy {
    /// Starts forwarding 127.0.0.1:<free port> to `target`. Must run inside a tokio runtime.
    pub fn start(target: SocketAddr) -> FaultProxy {
        FaultProxy::start_slowed(target, Duration::ZERO)
    }

    /// Like `start`, but every chunk of bytes reaches the other side `delay` late.
    pub fn start_slowed(target: SocketAddr, delay: Duration) -> FaultProxy {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("proxy address");
        let listener = TcpListener::from_std(std_listener).expect("register proxy listener");
        let links = Arc::new(Mutex::new(Links::default()));
        let accept = tokio::spawn(accept_loop(listener, target, delay, links.clone()));
        FaultProxy {
            addr,
            links,
            accept,
        }
    }

    /// The address clients connect to instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every live connection now and closes new ones until `heal()`.
    pub fn cut(&self) {
        let mut links = self.links.lock().unwrap();
        links.cut = true;
        links.kill_all();
    }

    /// Forwards new connections again (connections killed by `cut()` stay closed).
    pub fn heal(&self) {
        self.links.lock().unwrap().cut = false;
    }

    /// Drops the live connections from `source` now and closes its new ones until
    /// `unblock(source)`.
    pub fn block(&self, source: IpAddr) {
        let mut links = self.links.lock().unwrap();
        links.blocked.insert(source);
        links.kill_from(source);
    }

    /// Forwards new connections from `source` again.
    pub fn unblock(&self, source: IpAddr) {
        self.links.lock().unwrap().blocked.remove(&source);
    }

    /// True between `cut()` and `heal()`.
    pub fn is_cut(&self) -> bool {
        self.links.lock().unwrap().cut
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.links.lock().unwrap().kill_all();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    delay: Duration,
    links: Arc<Mutex<Links>>,
) {
    loop {
        let Ok((inbound, source)) = listener.accept().await else {
            // Out of file descriptors or similar: retry without spinning.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let Some((inbound, id)) = register(&links, None, source.ip(), inbound) else {
            continue; // cut: dropping the socket closes it
        };
        tokio::spawn(forward(
            inbound,
            id,
            source.ip(),
            target,
            delay,
            links.clone(),
        ));
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read, until either side closes.
async fn copy_slowed(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    delay: Duration,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read @ 1..) = from.read(&mut buffer).await {
        tokio::time::sleep(delay).await;
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Keeps a duplicate of `socket` under connection `id` (a new id when `None`), unless the
/// link is cut or that connection was killed meanwhile; then the socket is dropped.
fn register(
    links: &Mutex<Links>,
    id: Option<u64>,
    source: IpAddr,
    socket: TcpStream,
) -> Option<(TcpStream, u64)> {
    let socket = socket.into_std().ok()?;
    let dup = socket.try_clone().ok()?;
    let mut links = links.lock().unwrap();
    if links.cut || links.blocked.contains(&source) {
        return None;
    }
    let id = id.unwrap_or_else(|| {
        links.next_id += 1;
        let id = links.next_id;
        links.live.insert(id, Vec::new());
        links.sources.insert(id, source);
        id
    });
    links.live.get_mut(&id)?.push(dup);
    drop(links);
    Some((TcpStream::from_std(socket).ok()?, id))
}

async fn forward(
    mut inbound: TcpStream,
    id: u64,
    source: IpAddr,
    target: SocketAddr,
    delay: Duration,
    links: Arc<Mutex<Links>>,
) {
    if let Ok(outbound) = TcpStream::connect(target).await
        && let Some((mut outbound, _)) = register(&links, Some(id), source, outbound)
    {
        if delay.is_zero() {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        } else {
            let (in_read, in_write) = inbound.split();
            let (out_read, out_write) = outbound.split();
            tokio::join!(
                copy_slowed(in_read, out_write, delay),
                copy_slowed(out_read, in_write, delay)
            );
        }
    }
    // Closing one side leaves the other open until the copy ends; shut both down together.
    let mut links = links.lock().unwrap();
    links.sources.remove(&id);
    if let Some(sockets) = links.live.remove(&id) {
        for socket in sockets {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}
