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

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus::IntCounter;
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
                call.finish(code_name(status.as_bytes()));
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

/// `(grpc_type, grpc_service, grpc_method)` of an etcd API path such as
/// `/etcdserverpb.KV/Range`.
fn labels(path: &str) -> Option<[&'static str; 3]> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    METHODS.iter().find_map(|&(known_service, methods, kind)| {
        if known_service != service {
            return None;
        }
        let method = methods.iter().find(|&&m| m == method)?;
        Some([kind, known_service, *method])
    })
}

/// grpc-go's name of a `grpc-status` value, as etcd's metrics show it.
fn code_name(status: &[u8]) -> &'static str {
    const NAMES: [&str; 17] = [
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
    std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .and_then(|code| NAMES.get(code).copied())
        .unwrap_or("Unknown")
}

/// One counted call, from its request to its final code.
struct Call {
    labels: [&'static str; 3],
    started: Instant,
    finished: bool,
}

impl Call {
    /// Counts the start of a call to `path`, if it is an etcd API method.
    fn start(path: &str) -> Option<Call> {
        let labels = labels(path)?;
        metrics().grpc_started.with_label_values(&labels).inc();
        Some(Call {
            labels,
            started: Instant::now(),
            finished: false,
        })
    }

    fn finish(&mut self, code: &str) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let [kind, service, method] = self.labels;
        let metrics = metrics();
        metrics
            .grpc_handled
            .with_label_values(&[kind, service, method, code])
            .inc();
        metrics
            .grpc_handling_seconds
            .with_label_values(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Call {
    /// Dropped unfinished: the response never reached its trailers.
    fn drop(&mut self) {
        self.finish("Canceled");
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
                    .map_or("Unknown", |status| code_name(status.as_bytes()))
            }),
            // A broken body, or one that ended without trailers.
            Some(Err(_)) | None => Some("Unknown"),
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
