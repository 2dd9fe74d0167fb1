//! etcd's HTTP face on the client port: the grpc-gateway JSON API (every
//! route etcd serves under `/v3/`, and `/v3beta/` as its alias) and the
//! plain endpoints (`/version`, `/health`, `/metrics`, `/livez`, `/readyz`).
//!
//! It is the fallback route of the gRPC server, so one listener and its TLS
//! serve both. A JSON call is decoded into the proto message and handed to
//! the very service implementation gRPC calls, in process (etcd's gateway
//! dials its own gRPC port instead), with the `Authorization` header as the
//! token; so no etcd rule is written twice. Answers and errors are written
//! as the emulated etcd's gateway writes them (v1 up to 3.5, v2 from 3.6;
//! see `json`).

mod endpoints;
mod json;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::Codec;
use tonic::{Status, Streaming};

use self::endpoints::Endpoints;
pub use self::endpoints::RenderMetrics;
use self::json::{Runtime, error_response, json_response, text_error, to_json};
use crate::api::ServerInfo;
use crate::api::auth::AuthService;
use crate::api::cluster::ClusterService;
use crate::api::election::ElectionService;
use crate::api::kv::KvService;
use crate::api::lease::LeaseService;
use crate::api::lock::LockService;
use crate::api::maintenance::MaintenanceService;
use crate::api::watch::WatchService;
use crate::backend::Backend;
use crate::proto::etcdserverpb::auth_server::Auth;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::kv_server::Kv;
use crate::proto::etcdserverpb::lease_server::Lease;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::v3electionpb::election_server::Election;
use crate::proto::v3lockpb::lock_server::Lock;
use crate::store::Store;

/// Request messages a streamed call (Watch, LeaseKeepAlive) may have
/// waiting for the service.
const QUEUED_REQUESTS: usize = 16;

/// The service implementations the gateway calls: the ones gRPC serves.
pub struct Services<B: Backend> {
    /// KV.
    pub kv: Arc<KvService<B>>,
    /// Watch.
    pub watch: Arc<WatchService<B>>,
    /// Lease.
    pub lease: Arc<LeaseService<B>>,
    /// Cluster.
    pub cluster: Arc<ClusterService>,
    /// Maintenance.
    pub maintenance: Arc<MaintenanceService<B>>,
    /// Auth.
    pub auth: Arc<AuthService<B>>,
    /// Lock.
    pub lock: Arc<LockService<B>>,
    /// Election.
    pub election: Arc<ElectionService<B>>,
}

struct Inner<B: Backend> {
    services: Services<B>,
    endpoints: Endpoints<B>,
    /// The largest message gRPC accepts (and so the gateway passes on).
    max_message: usize,
    /// The gateway runtime of the emulated etcd.
    runtime: Runtime,
}

/// The gateway as a tower service of HTTP requests; cheap to clone.
pub struct Gateway<B: Backend>(Arc<Inner<B>>);

impl<B: Backend> Clone for Gateway<B> {
    fn clone(&self) -> Self {
        Gateway(self.0.clone())
    }
}

impl<B: Backend> Gateway<B> {
    /// The gateway over `services`, taking messages of up to `max_message`
    /// bytes, as gRPC does.
    pub fn new(
        services: Services<B>,
        store: Arc<Store<B>>,
        info: Arc<ServerInfo>,
        render_metrics: RenderMetrics,
        max_message: usize,
    ) -> Self {
        let runtime = Runtime::of(endpoints::version_numbers(&info.version));
        Gateway(Arc::new(Inner {
            services,
            runtime,
            endpoints: Endpoints {
                store,
                info,
                render_metrics,
            },
            max_message,
        }))
    }

    /// The service `--listen-metrics-urls` listeners serve: /metrics and
    /// the health checks only.
    pub fn metrics_only(&self) -> MetricsEndpoints<B> {
        MetricsEndpoints(self.0.clone())
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<B: Backend> tower::Service<Request<Body>> for Gateway<B> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Answer {
        let inner = self.0.clone();
        Box::pin(async move { Ok(inner.answer(request).await) })
    }
}

/// The endpoints of a `--listen-metrics-urls` listener.
pub struct MetricsEndpoints<B: Backend>(Arc<Inner<B>>);

impl<B: Backend> Clone for MetricsEndpoints<B> {
    fn clone(&self) -> Self {
        MetricsEndpoints(self.0.clone())
    }
}

impl<B: Backend> MetricsEndpoints<B> {
    /// Answers one request.
    pub async fn answer<T>(&self, request: Request<T>) -> Response<Body> {
        let query = request.uri().query().unwrap_or("").to_string();
        let answer = self
            .0
            .endpoints
            .answer(request.method(), request.uri().path(), &query, false)
            .await;
        answer.unwrap_or_else(|| text_error(StatusCode::NOT_FOUND, "404 page not found"))
    }
}

/// etcd's default CORS answer (`--cors=*`) on every HTTP response.
fn add_cors(headers: &mut HeaderMap) {
    headers.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    headers.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("accept, content-type, authorization"),
    );
}

fn is_grpc<T>(request: &Request<T>) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl<B: Backend> Inner<B> {
    async fn answer(self: Arc<Self>, request: Request<Body>) -> Response<Body> {
        if is_grpc(&request) {
            // A gRPC call to a service this server does not have.
            return Status::unimplemented("").into_http();
        }
        let mut response = if request.method() == Method::OPTIONS {
            Response::new(Body::empty())
        } else {
            self.route(request).await
        };
        add_cors(response.headers_mut());
        response
    }

    async fn route(self: Arc<Self>, request: Request<Body>) -> Response<Body> {
        let raw_path = request.uri().path();
        // etcd rewrites the first /v3beta/ of a path to /v3/.
        let path = match raw_path.strip_prefix("/v3beta/") {
            Some(rest) => format!("/v3/{rest}"),
            None => raw_path.to_string(),
        };
        if path.starts_with("/v3/") {
            return self.v3(&path, request).await;
        }
        let query = request.uri().query().unwrap_or("");
        let answer = self
            .endpoints
            .answer(request.method(), &path, query, true)
            .await;
        answer.unwrap_or_else(|| text_error(StatusCode::NOT_FOUND, "404 page not found"))
    }

    /// The JSON API: each route is a POST of the request message.
    async fn v3(self: Arc<Self>, path: &str, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let call = Call {
            post: parts.method == Method::POST,
            headers: parts.headers,
            body,
            max_message: self.max_message,
            runtime: self.runtime,
        };
        let s = &self.services;
        match path {
            "/v3/kv/range" => call.unary(|r| s.kv.range(r)).await,
            "/v3/kv/put" => call.unary(|r| s.kv.put(r)).await,
            "/v3/kv/deleterange" => call.unary(|r| s.kv.delete_range(r)).await,
            "/v3/kv/txn" => call.unary(|r| s.kv.txn(r)).await,
            "/v3/kv/compaction" => call.unary(|r| s.kv.compact(r)).await,
            "/v3/watch" => call.bidi(|r| s.watch.watch(r)).await,
            "/v3/lease/grant" => call.unary(|r| s.lease.lease_grant(r)).await,
            // etcd's protos bind three lease calls under /v3/kv/lease/ too
            // (etcd3gw, OpenStack's client, uses those paths).
            "/v3/lease/revoke" | "/v3/kv/lease/revoke" => {
                call.unary(|r| s.lease.lease_revoke(r)).await
            }
            "/v3/lease/keepalive" => call.bidi(|r| s.lease.lease_keep_alive(r)).await,
            "/v3/lease/timetolive" | "/v3/kv/lease/timetolive" => {
                call.unary(|r| s.lease.lease_time_to_live(r)).await
            }
            "/v3/lease/leases" | "/v3/kv/lease/leases" => {
                call.unary(|r| s.lease.lease_leases(r)).await
            }
            "/v3/cluster/member/add" => call.unary(|r| s.cluster.member_add(r)).await,
            "/v3/cluster/member/remove" => call.unary(|r| s.cluster.member_remove(r)).await,
            "/v3/cluster/member/update" => call.unary(|r| s.cluster.member_update(r)).await,
            "/v3/cluster/member/list" => call.unary(|r| s.cluster.member_list(r)).await,
            "/v3/cluster/member/promote" => call.unary(|r| s.cluster.member_promote(r)).await,
            "/v3/maintenance/alarm" => call.unary(|r| s.maintenance.alarm(r)).await,
            "/v3/maintenance/status" => call.unary(|r| s.maintenance.status(r)).await,
            "/v3/maintenance/defragment" => call.unary(|r| s.maintenance.defragment(r)).await,
            // Hash and HashKV share this path; etcd's gateway matches Hash,
            // registered first.
            "/v3/maintenance/hash" => call.unary(|r| s.maintenance.hash(r)).await,
            "/v3/maintenance/snapshot" => call.server_stream(|r| s.maintenance.snapshot(r)).await,
            "/v3/maintenance/transfer-leadership" => {
                call.unary(|r| s.maintenance.move_leader(r)).await
            }
            "/v3/maintenance/downgrade" => call.unary(|r| s.maintenance.downgrade(r)).await,
            "/v3/auth/enable" => call.unary(|r| s.auth.auth_enable(r)).await,
            "/v3/auth/disable" => call.unary(|r| s.auth.auth_disable(r)).await,
            "/v3/auth/status" => call.unary(|r| s.auth.auth_status(r)).await,
            "/v3/auth/authenticate" => call.unary(|r| s.auth.authenticate(r)).await,
            "/v3/auth/user/add" => call.unary(|r| s.auth.user_add(r)).await,
            "/v3/auth/user/get" => call.unary(|r| s.auth.user_get(r)).await,
            "/v3/auth/user/list" => call.unary(|r| s.auth.user_list(r)).await,
            "/v3/auth/user/delete" => call.unary(|r| s.auth.user_delete(r)).await,
            "/v3/auth/user/changepw" => call.unary(|r| s.auth.user_change_password(r)).await,
            "/v3/auth/user/grant" => call.unary(|r| s.auth.user_grant_role(r)).await,
            "/v3/auth/user/revoke" => call.unary(|r| s.auth.user_revoke_role(r)).await,
            "/v3/auth/role/add" => call.unary(|r| s.auth.role_add(r)).await,
            "/v3/auth/role/get" => call.unary(|r| s.auth.role_get(r)).await,
            "/v3/auth/role/list" => call.unary(|r| s.auth.role_list(r)).await,
            "/v3/auth/role/delete" => call.unary(|r| s.auth.role_delete(r)).await,
            "/v3/auth/role/grant" => call.unary(|r| s.auth.role_grant_permission(r)).await,
            "/v3/auth/role/revoke" => call.unary(|r| s.auth.role_revoke_permission(r)).await,
            "/v3/lock/lock" => call.unary(|r| s.lock.lock(r)).await,
            "/v3/lock/unlock" => call.unary(|r| s.lock.unlock(r)).await,
            "/v3/election/campaign" => call.unary(|r| s.election.campaign(r)).await,
            "/v3/election/proclaim" => call.unary(|r| s.election.proclaim(r)).await,
            "/v3/election/leader" => call.unary(|r| s.election.leader(r)).await,
            "/v3/election/observe" => call.server_stream(|r| s.election.observe(r)).await,
            "/v3/election/resign" => call.unary(|r| s.election.resign(r)).await,
            _ => json::no_route(self.runtime),
        }
    }
}

/// One JSON call on its way to a service method.
struct Call {
    post: bool,
    headers: HeaderMap,
    body: Body,
    max_message: usize,
    runtime: Runtime,
}

/// A body may be this much larger than the message it carries (JSON,
/// base64) before it is refused unread.
const JSON_OVERHEAD: usize = 4;

impl Call {
    /// The request message of a unary or server-streamed call.
    async fn message<Req>(self) -> Result<tonic::Request<Req>, Status>
    where
        Req: DeserializeOwned + prost::Message + Default,
    {
        let bytes = json::read_body(self.body, self.max_message * JSON_OVERHEAD).await?;
        let message: Req = json::decode(&bytes, self.runtime)?;
        let size = message.encoded_len();
        if size > self.max_message {
            return Err(json::too_large(size, self.max_message));
        }
        let mut request = tonic::Request::new(message);
        *request.metadata_mut() = json::metadata(&self.headers);
        Ok(request)
    }

    async fn unary<Req, Resp, F, Fut>(self, call: F) -> Response<Body>
    where
        Req: DeserializeOwned + prost::Message + Default,
        Resp: Serialize,
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        if !self.post {
            return json::wrong_method(self.runtime);
        }
        let runtime = self.runtime;
        let answer = match self.message().await {
            Ok(request) => call(request).await,
            Err(status) => Err(status),
        };
        match answer {
            Ok(response) => json_response(StatusCode::OK, to_json(response.get_ref()), true),
            Err(status) => error_response(&status, runtime),
        }
    }

    async fn server_stream<Req, Resp, S, F, Fut>(self, call: F) -> Response<Body>
    where
        Req: DeserializeOwned + prost::Message + Default,
        Resp: Serialize + Send + 'static,
        S: Stream<Item = Result<Resp, Status>> + Send + Unpin + 'static,
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<S>, Status>>,
    {
        if !self.post {
            return json::wrong_method(self.runtime);
        }
        let runtime = self.runtime;
        let request = match self.message().await {
            Ok(request) => request,
            Err(status) => return error_response(&status, runtime),
        };
        match call(request).await {
            Ok(response) => json::stream_response(response.into_inner(), runtime).await,
            Err(status) => json::stream_failed(&status, runtime),
        }
    }

    /// A bidirectional stream (Watch, LeaseKeepAlive): the body is read as a
    /// sequence of JSON messages, each passed on as it arrives; the end of
    /// the body is the end of the client's stream. A message that does not
    /// decode ends the client's stream, except that v1 fails the call when
    /// it is the first (500, as etcd 3.5's gateway answers).
    async fn bidi<Req, Resp, S, F, Fut>(self, call: F) -> Response<Body>
    where
        Req: DeserializeOwned + prost::Message + Default + Send + 'static,
        Resp: Serialize + Send + 'static,
        S: Stream<Item = Result<Resp, Status>> + Send + Unpin + 'static,
        F: FnOnce(tonic::Request<Streaming<Req>>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<S>, Status>>,
    {
        if !self.post {
            return json::wrong_method(self.runtime);
        }
        let (frames, queued) = mpsc::channel(QUEUED_REQUESTS);
        let (first_tx, first) = oneshot::channel();
        let runtime = self.runtime;
        tokio::spawn(pump_requests::<Req>(
            self.body,
            frames,
            first_tx,
            self.max_message,
            runtime,
        ));
        if let Ok(Err(status)) = first.await
            && runtime == Runtime::V1
        {
            return error_response(&Status::unknown(status.message()), runtime);
        }
        let body = http_body_util::StreamBody::new(ReceiverStream::new(queued));
        let decoder = tonic_prost::ProstCodec::<Req, Req>::default().decoder();
        let requests = Streaming::new_request(decoder, body, None, Some(self.max_message));
        let mut request = tonic::Request::new(requests);
        *request.metadata_mut() = json::metadata(&self.headers);
        match call(request).await {
            Ok(response) => json::stream_response(response.into_inner(), runtime).await,
            Err(status) => json::stream_failed(&status, runtime),
        }
    }
}

type Frame = Result<http_body::Frame<Bytes>, Infallible>;

/// Reads a streamed call's body, decodes each JSON message in it and sends
/// it on gRPC-framed; says through `first` whether the first one decoded.
async fn pump_requests<Req>(
    mut body: Body,
    frames: mpsc::Sender<Frame>,
    first: oneshot::Sender<Result<(), Status>>,
    max_message: usize,
    runtime: Runtime,
) where
    Req: DeserializeOwned + prost::Message + Default,
{
    let mut first = Some(first);
    let fail = |first: &mut Option<oneshot::Sender<Result<(), Status>>>, status: Status| {
        if let Some(first) = first.take() {
            let _ = first.send(Err(status));
        }
    };
    let mut buffer = BytesMut::new();
    let mut ended = false;
    loop {
        // Every complete message in the buffer.
        let mut values =
            serde_json::Deserializer::from_slice(&buffer).into_iter::<serde_json::Value>();
        let mut decoded = Vec::new();
        let mut failure = None;
        for value in values.by_ref() {
            match value {
                Ok(value) => match json::from_value::<Req>(value, runtime) {
                    Ok(message) => decoded.push(message),
                    Err(status) => {
                        failure = Some(status);
                        break;
                    }
                },
                Err(error) if error.is_eof() && !ended => break,
                Err(error) if error.is_eof() => {
                    failure = Some(Status::invalid_argument("unexpected EOF"));
                    break;
                }
                Err(error) => {
                    failure = Some(Status::invalid_argument(error.to_string()));
                    break;
                }
            }
        }
        let consumed = values.byte_offset();
        buffer.advance(consumed);
        for message in decoded {
            if let Some(first) = first.take() {
                let _ = first.send(Ok(()));
            }
            let mut frame = BytesMut::with_capacity(5 + message.encoded_len());
            frame.extend_from_slice(&[0]);
            frame.extend_from_slice(&(message.encoded_len() as u32).to_be_bytes());
            message
                .encode(&mut frame)
                .expect("the frame has room for the message");
            if frames
                .send(Ok(http_body::Frame::data(frame.freeze())))
                .await
                .is_err()
            {
                return;
            }
        }
        if let Some(status) = failure {
            fail(&mut first, status);
            return;
        }
        if ended {
            break;
        }
        if buffer.len() > max_message * JSON_OVERHEAD {
            fail(&mut first, json::too_large(buffer.len(), max_message));
            return;
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
            }
            Some(Err(_)) => return,
            None => ended = true,
        }
    }
    // The client's stream ends here: dropping `frames` is its half-close.
    if let Some(first) = first.take() {
        let _ = first.send(Ok(()));
    }
}
