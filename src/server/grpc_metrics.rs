//! A tower layer on the gRPC server that counts every call of the etcd API
//! by service, method and final gRPC code, and times it, under the names
//! etcd's go-grpc-prometheus interceptors use (`grpc_server_started_total`,
//! `grpc_server_handled_total`, `grpc_server_handling_seconds`).
//!
//! A call's code is in the response headers when it failed before answering
//! (a "trailers-only" response), and otherwise in the trailers after the
//! body, so the body is wrapped to see them. A call whose response is dropped
//! before its trailers (the client went away) counts as Canceled.
//!
//! The bodies' bytes are counted too, as etcd's
//! `etcd_network_client_grpc_received_bytes_total` and `..._sent_bytes_total`
//! (etcd counts each message in its codec; here each message comes with its
//! 5-byte gRPC frame header).
//!
//! Each method's counters and histogram are looked up in their vectors once,
//! at the method's first call, and kept (`MethodMetrics`): a lookup by
//! label values hashes the labels and takes the vector's lock, twice per
//! call, about 1.3 % of the server's CPU under single-key reads (issue 51).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{LazyLock, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus::{Histogram, IntCounter};
use tower::{Layer, Service};

use crate::metrics::metrics;

/// Counts and times the gRPC calls of the service it wraps.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> GrpcMetrics<S> {
        GrpcMetrics { inner }
    }
}

/// The service made by `GrpcMetricsLayer`.
#[derive(Clone, Debug)]
pub struct GrpcMetrics<S> {
    inner: S,
}

impl<S, RequestBody, ResponseBody> Service<http::Request<RequestBody>> for GrpcMetrics<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResponseBody>>,
    S::Future: Send + 'static,
    RequestBody: Body<Data = Bytes> + Unpin + Send + 'static,
    RequestBody::Error: Into<tonic::codegen::StdError>,
    ResponseBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResponseBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let call = Call::start(request.uri().path());
        let request = match call {
            Some(_) => request.map(|body| {
                tonic::body::Body::new(MeteredBody {
                    inner: body,
                    bytes: &metrics().grpc_received_bytes,
                    call: None,
                })
            }),
            // Not an etcd API call (the HTTP gateway, an unknown method).
            None => request.map(tonic::body::Body::new),
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let Some(mut call) = call else {
                return Ok(response.map(tonic::body::Body::new));
            };
            if let Some(status) = response.headers().get("grpc-status") {
                call.finish(code(status.as_bytes()));
                return Ok(response.map(tonic::body::Body::new));
            }
            Ok(response.map(|body| {
                tonic::body::Body::new(MeteredBody {
                    inner: body,
                    bytes: &metrics().grpc_sent_bytes,
                    call: Some(call),
                })
            }))
        })
    }
}

/// The etcd API's methods and their gRPC types, as go-grpc-prometheus labels
/// them. Calls to any other path are not counted, so that a client cannot
/// create label values at will.
const METHODS: &[(&str, &[&str], &str)] = &[
    (
        "etcdserverpb.KV",
        &["Range", "Put", "DeleteRange", "Txn", "Compact"],
        "unary",
    ),
    ("etcdserverpb.Watch", &["Watch"], "bidi_stream"),
    (
        "etcdserverpb.Lease",
        &[
            "LeaseGrant",
            "LeaseRevoke",
            "LeaseTimeToLive",
            "LeaseLeases",
        ],
        "unary",
    ),
    ("etcdserverpb.Lease", &["LeaseKeepAlive"], "bidi_stream"),
    (
        "etcdserverpb.Cluster",
        &[
            "MemberAdd",
            "MemberRemove",
            "MemberUpdate",
            "MemberList",
            "MemberPromote",
        ],
        "unary",
    ),
    (
        "etcdserverpb.Maintenance",
        &[
            "Alarm",
            "Status",
            "Defragment",
            "Hash",
            "HashKV",
            "MoveLeader",
            "Downgrade",
        ],
        "unary",
    ),
    ("etcdserverpb.Maintenance", &["Snapshot"], "server_stream"),
    (
        "etcdserverpb.Auth",
        &[
            "AuthEnable",
            "AuthDisable",
            "AuthStatus",
            "Authenticate",
            "UserAdd",
            "UserGet",
            "UserList",
            "UserDelete",
            "UserChangePassword",
            "UserGrantRole",
            "UserRevokeRole",
            "RoleAdd",
            "RoleGet",
            "RoleList",
            "RoleDelete",
            "RoleGrantPermission",
            "RoleRevokePermission",
        ],
        "unary",
    ),
    ("v3lockpb.Lock", &["Lock", "Unlock"], "unary"),
    (
        "v3electionpb.Election",
        &["Campaign", "Proclaim", "Leader", "Resign"],
        "unary",
    ),
    ("v3electionpb.Election", &["Observe"], "server_stream"),
];

/// One etcd API method's metrics, each taken from its vector at its first
/// use and kept: until then it has no series, as before any call.
struct MethodMetrics {
    /// `(grpc_type, grpc_service, grpc_method)`.
    labels: [&'static str; 3],
    started: OnceLock<IntCounter>,
    handling_seconds: OnceLock<Histogram>,
    /// `grpc_server_handled_total`, by gRPC code.
    handled: [OnceLock<IntCounter>; CODE_NAMES.len()],
}

impl MethodMetrics {
    fn new(labels: [&'static str; 3]) -> MethodMetrics {
        MethodMetrics {
            labels,
            started: OnceLock::new(),
            handling_seconds: OnceLock::new(),
            handled: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    fn started(&self) -> &IntCounter {
        self.started
            .get_or_init(|| metrics().grpc_started.with_label_values(&self.labels))
    }

    fn handling_seconds(&self) -> &Histogram {
        self.handling_seconds.get_or_init(|| {
            metrics()
                .grpc_handling_seconds
                .with_label_values(&self.labels)
        })
    }

    fn handled(&self, code: usize) -> &IntCounter {
        self.handled[code].get_or_init(|| {
            let [kind, service, method] = self.labels;
            metrics()
                .grpc_handled
                .with_label_values(&[kind, service, method, CODE_NAMES[code]])
        })
    }
}

/// The metrics of the etcd API method at `path`, such as
/// `/etcdserverpb.KV/Range`.
fn method_metrics(path: &str) -> Option<&'static MethodMetrics> {
    static BY_PATH: LazyLock<HashMap<String, MethodMetrics>> = LazyLock::new(|| {
        METHODS
            .iter()
            .flat_map(|&(service, methods, kind)| {
                methods.iter().map(move |&method| {
                    (
                        format!("/{service}/{method}"),
                        MethodMetrics::new([kind, service, method]),
                    )
                })
            })
            .collect()
    });
    BY_PATH.get(path)
}

/// grpc-go's names of the gRPC codes, as etcd's metrics show them.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The code `Canceled`.
const CANCELED: usize = 1;

/// The code `Unknown`.
const UNKNOWN: usize = 2;

/// The gRPC code of a `grpc-status` value (`Unknown` if it is none).
fn code(status: &[u8]) -> usize {
    std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&code| code < CODE_NAMES.len())
        .unwrap_or(UNKNOWN)
}

/// One counted call, from its request to its final code.
struct Call {
    metrics: &'static MethodMetrics,
    started: Instant,
    finished: bool,
}

impl Call {
    /// Counts the start of a call to `path`, if it is an etcd API method.
    fn start(path: &str) -> Option<Call> {
        let metrics = method_metrics(path)?;
        metrics.started().inc();
        Some(Call {
            metrics,
            started: Instant::now(),
            finished: false,
        })
    }

    /// Counts the call's end with gRPC code `code`.
    fn finish(&mut self, code: usize) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.metrics.handled(code).inc();
        self.metrics
            .handling_seconds()
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Call {
    /// Dropped unfinished: the response never reached its trailers.
    fn drop(&mut self) {
        self.finish(CANCELED);
    }
}

/// A body whose data bytes count in `bytes`: a request's, or a response's,
/// which also finishes its call when the trailers go out.
struct MeteredBody<B> {
    inner: B,
    bytes: &'static IntCounter,
    call: Option<Call>,
}

impl<B: Body<Data = Bytes> + Unpin> Body for MeteredBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            this.bytes.inc_by(data.len() as u64);
        }
        let code = match &frame {
            Some(Ok(frame)) => frame.trailers_ref().map(|trailers| {
                trailers
                    .get("grpc-status")
                    .map_or(UNKNOWN, |status| code(status.as_bytes()))
            }),
            // A broken body, or one that ended without trailers.
            Some(Err(_)) | None => Some(UNKNOWN),
        };
        if let Some(code) = code
            && let Some(mut call) = this.call.take()
        {
            call.finish(code);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(grpc_type, grpc_service, grpc_method)` of `path`.
    fn labels(path: &str) -> Option<[&'static str; 3]> {
        method_metrics(path).map(|m| m.labels)
    }

    /// grpc-go's name of the code of a `grpc-status` value.
    fn code_name(status: &[u8]) -> &'static str {
        CODE_NAMES[code(status)]
    }

    #[test]
    fn labels_of_etcd_paths() {
        assert_eq!(
            labels("/etcdserverpb.KV/Range"),
            Some(["unary", "etcdserverpb.KV", "Range"])
        );
        assert_eq!(
            labels("/etcdserverpb.Watch/Watch"),
            Some(["bidi_stream", "etcdserverpb.Watch", "Watch"])
        );
        assert_eq!(
            labels("/etcdserverpb.Lease/LeaseKeepAlive"),
            Some(["bidi_stream", "etcdserverpb.Lease", "LeaseKeepAlive"])
        );
        assert_eq!(labels("/etcdserverpb.KV/Nope"), None);
        assert_eq!(labels("/other.Service/Range"), None);
        assert_eq!(labels("garbage"), None);
    }

    /// A call counts in its method's series, those the vectors render,
    /// each time, and a call dropped unfinished as Canceled.
    #[test]
    fn calls_count_in_their_methods_series() {
        let labels = ["unary", "etcdserverpb.Maintenance", "MoveLeader"];
        let m = metrics();
        let handled = |code: &str| {
            m.grpc_handled
                .with_label_values(&[labels[0], labels[1], labels[2], code])
                .get()
        };
        let started = m.grpc_started.with_label_values(&labels).get();
        let timed = m
            .grpc_handling_seconds
            .with_label_values(&labels)
            .get_sample_count();
        let (not_found, canceled) = (handled("NotFound"), handled("Canceled"));
        for _ in 0..2 {
            let mut call = Call::start("/etcdserverpb.Maintenance/MoveLeader").unwrap();
            call.finish(code(b"5"));
        }
        drop(Call::start("/etcdserverpb.Maintenance/MoveLeader").unwrap());
        assert_eq!(m.grpc_started.with_label_values(&labels).get(), started + 3);
        assert_eq!(handled("NotFound"), not_found + 2);
        assert_eq!(handled("Canceled"), canceled + 1);
        assert_eq!(
            m.grpc_handling_seconds
                .with_label_values(&labels)
                .get_sample_count(),
            timed + 3
        );
    }

    #[test]
    fn code_names_as_grpc_go() {
        assert_eq!(code_name(b"0"), "OK");
        assert_eq!(code_name(b"3"), "InvalidArgument");
        assert_eq!(code_name(b"11"), "OutOfRange");
        assert_eq!(code_name(b"16"), "Unauthenticated");
        assert_eq!(code_name(b"99"), "Unknown");
        assert_eq!(code_name(b"x"), "Unknown");
    }
}
