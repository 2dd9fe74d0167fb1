//! The client listeners (`--listen-address`, or etcd's
//! `--listen-client-urls`), each serving gRPC and the HTTP gateway on one
//! port, and etcd's `--listen-metrics-urls` listeners.
//!
//! Every connection goes through the `:authority` repair (`authority.rs`),
//! after the TLS handshake when there is one, then to one server that speaks
//! HTTP/2 and HTTP/1.1: gRPC calls reach their service by path, anything
//! else the gateway (the router's fallback).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::task::JoinHandle;
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::Connected;

use super::authority::AuthorityRepair;
use super::grpc_metrics;
use super::tls;
use crate::api::require_leader::RequireLeaderLayer;
use crate::backend::Backend;
use crate::config::Config;
use crate::gateway::MetricsEndpoints;

/// A bound client listener.
pub enum ClientListener {
    /// Plain TCP (`http://`, or --listen-address without TLS).
    Tcp(TcpListener, SocketAddr),
    /// TLS over TCP (`https://`, or --listen-address with TLS).
    Tls(TcpListener, SocketAddr, Arc<rustls::ServerConfig>),
    /// A Unix socket (`unix://PATH`).
    Unix(UnixListener, PathBuf),
}

impl fmt::Display for ClientListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientListener::Tcp(_, addr) => write!(f, "http://{addr}"),
            ClientListener::Tls(_, addr, _) => write!(f, "https://{addr}"),
            ClientListener::Unix(_, path) => write!(f, "unix://{}", path.display()),
        }
    }
}

/// What a listen URL names.
#[derive(Debug, PartialEq)]
enum ListenUrl {
    Tcp { addr: SocketAddr, tls: bool },
    Unix(PathBuf),
}

/// Reads one of etcd's listen URLs (a host must be an IP address, as etcd
/// requires of listen URLs).
fn parse_url(url: &str) -> anyhow::Result<ListenUrl> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("URL scheme must be http, https, unix, or unixs: {url}");
    };
    match scheme {
        "http" | "https" => {
            let host_port = rest.trim_end_matches('/');
            // etcd binds "localhost" as the loopback address; other names are refused.
            let host_port = match host_port.strip_prefix("localhost:") {
                Some(port) => format!("127.0.0.1:{port}"),
                None => host_port.to_string(),
            };
            let addr: SocketAddr = host_port
                .parse()
                .with_context(|| format!("listen URL {url}: expected http(s)://IP:PORT"))?;
            Ok(ListenUrl::Tcp {
                addr,
                tls: scheme == "https",
            })
        }
        "unix" if !rest.is_empty() => Ok(ListenUrl::Unix(PathBuf::from(rest))),
        "unixs" => bail!("listen URL {url}: unixs:// (TLS on a Unix socket) is not supported"),
        _ => bail!("URL scheme must be http, https, unix, or unixs: {url}"),
    }
}

/// Binds the client listeners: `--listen-client-urls` if given, else
/// `--listen-address` (TLS when the client TLS settings are).
pub async fn bind(
    config: &Config,
    tls: Option<&Arc<rustls::ServerConfig>>,
) -> anyhow::Result<Vec<ClientListener>> {
    let mut listeners = Vec::new();
    if config.listen_client_urls.is_empty() {
        let addr = config.listen_address;
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let addr = listener.local_addr().unwrap_or(addr);
        listeners.push(match tls {
            Some(tls) => ClientListener::Tls(listener, addr, tls.clone()),
            None => ClientListener::Tcp(listener, addr),
        });
        return Ok(listeners);
    }
    for url in &config.listen_client_urls {
        listeners.push(match parse_url(url)? {
            ListenUrl::Tcp { addr, tls: secure } => {
                let listener = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {url}"))?;
                let addr = listener.local_addr().unwrap_or(addr);
                if secure {
                    let Some(tls) = tls else {
                        bail!("{url}: https needs --cert-file and --key-file");
                    };
                    ClientListener::Tls(listener, addr, tls.clone())
                } else {
                    ClientListener::Tcp(listener, addr)
                }
            }
            ListenUrl::Unix(path) => {
                // As etcd, a socket file left by an earlier run is replaced.
                let _ = std::fs::remove_file(&path);
                let listener =
                    UnixListener::bind(&path).with_context(|| format!("cannot listen on {url}"))?;
                ClientListener::Unix(listener, path)
            }
        });
    }
    Ok(listeners)
}

impl ClientListener {
    /// Serves `routes` (gRPC, with the gateway as fallback) on this listener
    /// until `shutdown` resolves and open calls have drained.
    pub async fn serve(
        self,
        routes: Routes,
        require_leader: RequireLeaderLayer,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let served = match self {
            ClientListener::Tcp(listener, _) => {
                serve_incoming(routes, require_leader, tcp_connections(listener), shutdown).await
            }
            ClientListener::Tls(listener, _, tls) => {
                serve_incoming(
                    routes,
                    require_leader,
                    tls::connections(listener, tls),
                    shutdown,
                )
                .await
            }
            ClientListener::Unix(listener, path) => {
                let served =
                    serve_incoming(routes, require_leader, unix_connections(listener), shutdown)
                        .await;
                let _ = std::fs::remove_file(path);
                served
            }
        };
        served.context("client server failed")
    }
}

async fn serve_incoming<I, IO, IE>(
    routes: Routes,
    require_leader: RequireLeaderLayer,
    incoming: I,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Server::builder()
        // HTTP/1.1 for the gateway; HTTP/2 connections are told apart by
        // their preface and go on exactly as before.
        .accept_http1(true)
        .layer(grpc_metrics::GrpcMetricsLayer)
        .layer(tower::util::MapResponseLayer::new(etcd_message_size_error))
        .layer(require_leader)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Accepted TCP connections, ready for the server.
fn tcp_connections(
    listener: TcpListener,
) -> impl Stream<Item = std::io::Result<AuthorityRepair<TcpStream>>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        let socket = accepted?;
        // gRPC answers are small writes; Nagle's algorithm would hold them back.
        socket.set_nodelay(true)?;
        Ok(AuthorityRepair::new(socket))
    })
}

/// Accepted Unix-socket connections, ready for the server.
fn unix_connections(
    listener: UnixListener,
) -> impl Stream<Item = std::io::Result<AuthorityRepair<tokio::net::UnixStream>>> {
    tokio_stream::wrappers::UnixListenerStream::new(listener)
        .map(|accepted| Ok(AuthorityRepair::new(accepted?)))
}

/// Reports a request over the gRPC size limit as grpc-go (and so etcd) does:
/// ResourceExhausted "grpc: received message larger than max (N vs. M)"
/// instead of tonic's OutOfRange and wording.
fn etcd_message_size_error<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    let Some(message) = headers.get("grpc-message").map(|m| {
        percent_encoding::percent_decode(m.as_bytes())
            .decode_utf8_lossy()
            .into_owned()
    }) else {
        return response;
    };
    if let Some(text) = crate::api::errors::message_too_large(&message)
        && let Ok(value) = http::HeaderValue::from_str(&text)
    {
        headers.insert("grpc-message", value);
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    response
}

/// How long a metrics connection may take to send a request's headers.
const METRICS_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts etcd's `--listen-metrics-urls` listeners (/metrics and the health
/// checks, HTTP/1.1; https ones with the client TLS settings). A task ends
/// once `stopped` turns true, after its connections have ended (they hold
/// the store, which is shut down only once nothing does).
pub async fn serve_metrics<B: Backend>(
    config: &Config,
    tls: Option<&Arc<rustls::ServerConfig>>,
    endpoints: MetricsEndpoints<B>,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for url in &config.listen_metrics_urls {
        let ListenUrl::Tcp { addr, tls: secure } = parse_url(url)? else {
            bail!("--listen-metrics-urls {url}: expected http(s)://IP:PORT");
        };
        let acceptor = match (secure, tls) {
            (false, _) => None,
            (true, Some(tls)) => {
                let mut tls = (**tls).clone();
                tls.alpn_protocols = vec![b"http/1.1".to_vec()];
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls)))
            }
            (true, None) => bail!("{url}: https needs --cert-file and --key-file"),
        };
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {url}"))?;
        tracing::info!(address = %url, "serving metrics");
        let endpoints = endpoints.clone();
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stopped.wait_for(|stop| *stop) => break,
                    // Forget the connections that have ended.
                    Some(_) = connections.join_next() => continue,
                };
                let Ok((socket, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let endpoints = endpoints.clone();
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    match acceptor {
                        None => serve_metrics_connection(socket, endpoints).await,
                        Some(acceptor) => {
                            if let Ok(Ok(stream)) = tokio::time::timeout(
                                METRICS_HEADER_TIMEOUT,
                                acceptor.accept(socket),
                            )
                            .await
                            {
                                serve_metrics_connection(stream, endpoints).await;
                            }
                        }
                    }
                });
            }
            connections.shutdown().await;
        }));
    }
    Ok(tasks)
}

async fn serve_metrics_connection<B: Backend, S>(socket: S, endpoints: MetricsEndpoints<B>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let endpoints = endpoints.clone();
        async move { Ok::<_, Infallible>(endpoints.answer(request).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(METRICS_HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(socket), service);
    if let Err(error) = connection.await {
        tracing::debug!("metrics connection ended: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_etcds_listen_urls() {
        assert_eq!(
            parse_url("http://127.0.0.1:2379").unwrap(),
            ListenUrl::Tcp {
                addr: "127.0.0.1:2379".parse().unwrap(),
                tls: false
            }
        );
        assert_eq!(
            parse_url("https://[::1]:2379/").unwrap(),
            ListenUrl::Tcp {
                addr: "[::1]:2379".parse().unwrap(),
                tls: true
            }
        );
        assert_eq!(
            parse_url("unix:///run/etcd.sock").unwrap(),
            ListenUrl::Unix(PathBuf::from("/run/etcd.sock"))
        );
        assert!(parse_url("ftp://127.0.0.1:1").is_err());
        assert!(parse_url("127.0.0.1:2379").is_err());
    }
}
