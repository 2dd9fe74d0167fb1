//! The HTTP server on `--metrics-address`: `/metrics` (Prometheus text),
//! `/healthz` (the process is alive), `/readyz` (the store is open and the
//! datastore answers) and etcd's `/health` (`{"health":"true"}` JSON, which
//! tools written for etcd probe).
//!
//! It starts before the datastore is reached, so that a supervisor sees a
//! live but not-ready process while the database is still down.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::backend::{Backend, DatabaseSize, Revisions};
use crate::metrics::metrics;
use crate::store::Store;

/// A readiness check or a metrics sample that takes longer than this fails.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a scrape reads from the store.
pub struct StoreSample {
    /// Current and compact revisions.
    pub revisions: Revisions,
    /// Database size.
    pub size: DatabaseSize,
    /// Leases in the database.
    pub leases: usize,
    /// Whether the store is a member of a replicated cluster (which
    /// reports its Raft indexes itself).
    pub replicated: bool,
}

type SampleFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<StoreSample>> + Send + 'a>>;

/// A store seen through its datastore-reading calls, whatever its backend.
pub trait StoreProbe: Send + Sync {
    /// Reads the sample; an error means the datastore did not answer.
    fn sample(&self) -> SampleFuture<'_>;
}

impl<B: Backend> StoreProbe for Store<B> {
    fn sample(&self) -> SampleFuture<'_> {
        Box::pin(async move {
            let size = self.size().await?;
            let leases = self.leases().await?.leases.len();
            Ok(StoreSample {
                revisions: self.revisions(),
                size,
                leases,
                replicated: self.is_replicated(),
            })
        })
    }
}

/// Whether the server is ready to serve: the store is open, the datastore
/// answers, and shutdown has not begun.
#[derive(Default)]
pub struct Readiness {
    store: RwLock<Option<Arc<dyn StoreProbe>>>,
    stopping: AtomicBool,
}

impl Readiness {
    /// The store is open: checks and scrapes read it from now on.
    pub fn store_opened<B: Backend>(&self, store: Arc<Store<B>>) {
        *self.store.write().expect("readiness lock") = Some(store);
    }

    /// The server stopped serving requests; it is no longer ready.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.store.write().expect("readiness lock").take();
    }

    /// Reads a sample from the store, or says why the server is not ready.
    async fn check(&self) -> Result<StoreSample, String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err("shutting down".to_string());
        }
        let store = self.store.read().expect("readiness lock").clone();
        let Some(store) = store else {
            return Err("the datastore is not open yet".to_string());
        };
        match tokio::time::timeout(PROBE_TIMEOUT, store.sample()).await {
            Ok(Ok(sample)) => Ok(sample),
            Ok(Err(error)) => Err(format!("the datastore does not answer: {error:#}")),
            Err(_) => Err(format!(
                "the datastore did not answer within {PROBE_TIMEOUT:?}"
            )),
        }
    }
}

/// Binds `address` and serves the endpoints on it in the background.
pub async fn start(address: SocketAddr) -> anyhow::Result<Arc<Readiness>> {
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on --metrics-address {address}"))?;
    let readiness = Arc::new(Readiness::default());
    let shared = readiness.clone();
    tokio::spawn(async move {
        loop {
            let socket = match listener.accept().await {
                Ok((socket, _)) => socket,
                Err(error) => {
                    tracing::warn!("cannot accept a metrics connection: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let readiness = shared.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let readiness = readiness.clone();
                    async move { Ok::<_, Infallible>(answer(&readiness, request).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service);
                if let Err(error) = connection.await {
                    tracing::debug!("metrics connection ended: {error}");
                }
            });
        }
    });
    tracing::info!(%address, "serving /metrics, /healthz, /readyz and /health");
    Ok(readiness)
}

/// Answers one request.
async fn answer(readiness: &Readiness, request: Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match request.uri().path() {
        "/metrics" => {
            // A scrape while the datastore is down still shows the counters.
            if let Ok(sample) = readiness.check().await {
                record(&sample);
            }
            reply(StatusCode::OK, prometheus::TEXT_FORMAT, metrics().render())
        }
        "/healthz" | "/livez" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => match readiness.check().await {
            Ok(_) => reply(StatusCode::OK, "text/plain", "ok\n"),
            Err(reason) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {reason}\n"),
            ),
        },
        "/health" => {
            let (status, body) = etcd_health(readiness.check().await.err());
            reply(status, "application/json", body)
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// etcd's /health answer: `{"health":"true","reason":""}` when healthy.
fn etcd_health(problem: Option<String>) -> (StatusCode, String) {
    let (status, health, reason) = match problem {
        None => (StatusCode::OK, "true", String::new()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, "false", reason),
    };
    let body = serde_json::json!({ "health": health, "reason": reason });
    (status, body.to_string())
}

/// The Prometheus text of the registry, the store's gauges read first
/// (left as they were if the datastore does not answer in time).
pub async fn scrape(probe: &dyn StoreProbe) -> String {
    if let Ok(Ok(sample)) = tokio::time::timeout(PROBE_TIMEOUT, probe.sample()).await {
        record(&sample);
    }
    metrics().render()
}

/// Sets the gauges that mirror database state.
fn record(sample: &StoreSample) {
    let metrics = metrics();
    metrics.current_revision.set(sample.revisions.current);
    metrics.compact_revision.set(sample.revisions.compact);
    metrics.db_total_size.set(sample.size.total);
    metrics.db_in_use_size.set(sample.size.in_use);
    metrics.leases_active.set(sample.leases as i64);
    if !sample.replicated {
        // A single server has no Raft log; its revision counts its commits,
        // as Status's raft index does.
        metrics.proposals_committed.set(sample.revisions.current);
        metrics.proposals_applied.set(sample.revisions.current);
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_health_json() {
        assert_eq!(
            etcd_health(None),
            (
                StatusCode::OK,
                r#"{"health":"true","reason":""}"#.to_string()
            )
        );
        let (status, body) = etcd_health(Some("down".to_string()));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, r#"{"health":"false","reason":"down"}"#);
    }

    #[tokio::test]
    async fn not_ready_until_the_store_opens_nor_after_stopping() {
        let readiness = Readiness::default();
        assert_eq!(
            readiness.check().await.err().as_deref(),
            Some("the datastore is not open yet")
        );
        let dir = tempfile::tempdir().unwrap();
        let backend = crate::backend::sqlite::Sqlite::open(&dir.path().join("s.db")).unwrap();
        let store = Arc::new(Store::open(backend).await.unwrap());
        readiness.store_opened(store.clone());
        let sample = readiness.check().await.unwrap();
        assert_eq!(sample.revisions.current, 1);
        assert_eq!(sample.leases, 0);
        assert!(sample.size.total > 0);
        readiness.stopping();
        assert_eq!(
            readiness.check().await.err().as_deref(),
            Some("shutting down")
        );
    }
}
