//! The Watch service: each stream gets a `WatchSession` on its own task; this
//! layer only moves requests in and responses out, completing their headers,
//! and ends the call at its deadline. It is routed by hand rather than by the
//! generated `WatchServer`, to decode requests with [`WatchCodec`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::metadata::MetadataMap;
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Code, Request, Response, Status, Streaming};

use super::ServerInfo;
use super::go_decode::{PROTOBUF_GO_ERROR, protobuf_go_watch_request, watch_request_error};
use super::require_leader::end_without_leader;
use crate::backend::Backend;
use crate::metrics::{GaugeGuard, metrics};
use crate::proto::etcdserverpb::{WatchRequest, WatchResponse};
use crate::store::Store;
use crate::watch::session::{Outbound, SessionOptions, WatchSession};

/// Responses a stream may have waiting for a slow client before its session pauses.
const OUTBOUND_RESPONSES: usize = 128;

/// The Watch service on a store.
pub struct WatchService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
    options: SessionOptions,
    stop: watch::Receiver<bool>,
}

impl<B: Backend> WatchService<B> {
    /// The service watching `store`; streams end when `stop` turns true.
    pub fn new(
        store: Arc<Store<B>>,
        info: Arc<ServerInfo>,
        options: SessionOptions,
        stop: watch::Receiver<bool>,
    ) -> Self {
        WatchService {
            store,
            info,
            options,
            stop,
        }
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

impl<B: Backend> WatchService<B> {
    /// The service as a route of the gRPC server, taking requests of up to
    /// `max_message` bytes, read as `decoder` reads them.
    pub fn into_route(self: Arc<Self>, max_message: usize, decoder: GoDecoder) -> WatchRoute<B> {
        WatchRoute {
            service: self,
            max_message,
            codec: WatchCodec { decoder },
        }
    }

    /// One Watch call: gRPC's route and the HTTP gateway both call this.
    pub(crate) async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let (metadata, extensions, requests) = request.into_parts();
        let require_leader = metadata.clone();
        let deadline = grpc_timeout(&metadata).map(|timeout| Instant::now() + timeout);
        let (out, responses) = mpsc::channel(OUTBOUND_RESPONSES);
        let info = self.info.clone();
        let session =
            WatchSession::new(self.store.clone(), out, self.options).with_create_check(Box::new(
                move |key, range_end| watch_refusal(&info, &metadata, &extensions, key, range_end),
            ));
        let stream_counted = GaugeGuard::new(&metrics().watch_streams);
        // A request that fails to arrive ends the call, with etcd's error.
        let requests = requests.map(|request| request.map_err(super::errors::etcd_transport_error));
        let run = session.run(requests, self.stop.clone());
        tokio::spawn(async move {
            run.await;
            drop(stream_counted);
        });

        let info = self.info.clone();
        let responses = ReceiverStream::new(responses).map(move |outbound| {
            outbound.map(|mut response| {
                let revision = response.header.as_ref().map_or(0, |h| h.revision);
                info.fill(&mut response.header, revision);
                response
            })
        });
        let responses = end_without_leader(self.info.cluster(), &require_leader, responses);
        Ok(Response::new(Box::pin(UntilDeadline {
            inner: responses,
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            expired: false,
            code: if self.info.emulates_36() {
                Code::DeadlineExceeded
            } else {
                Code::Unknown
            },
        })))
    }
}

/// The reason a watch on `[key, range_end)` is refused, if it is: the
/// caller's token is resolved at each create, as etcd checks each, and the
/// refusal is the text of the gRPC error, as etcd puts it in cancel_reason.
fn watch_refusal(
    info: &ServerInfo,
    metadata: &MetadataMap,
    extensions: &tonic::Extensions,
    key: &[u8],
    range_end: &[u8],
) -> Option<String> {
    let refusal = info
        .caller(metadata, extensions)
        .and_then(|caller| Ok(info.auth.authorize_watch(&caller, key, range_end)?));
    refusal.err().map(|status| grpc_error_text(&status))
}

/// A gRPC error as grpc-go prints it, the form etcd's cancel reasons take.
fn grpc_error_text(status: &Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

/// The client's deadline for the call, from its `grpc-timeout` header
/// (digits, then a unit: H, M, S, m, u or n).
fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Passes `inner` on until the call's deadline, then ends the call with
/// the error etcd's Go server sends for it (the context's error: Unknown
/// from etcd 3.5, DeadlineExceeded from 3.6's gRPC on).
struct UntilDeadline<S> {
    inner: S,
    deadline: Option<Pin<Box<Sleep>>>,
    expired: bool,
    code: Code,
}

impl<S: Stream<Item = Outbound> + Unpin> Stream for UntilDeadline<S> {
    type Item = Outbound;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Outbound>> {
        if self.expired {
            return Poll::Ready(None);
        }
        if let Some(deadline) = self.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            self.expired = true;
            let code = self.code;
            return Poll::Ready(Some(Err(Status::new(code, "context deadline exceeded"))));
        }
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

/// The Watch service's codec: prost's, except that requests are read as the
/// emulated etcd's Go decoder reads them, and an undecodable one gets the
/// error etcd sends for it.
#[derive(Clone, Copy, Default)]
pub struct WatchCodec {
    decoder: GoDecoder,
}

/// Which Go protobuf library the emulated etcd decodes requests with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GoDecoder {
    /// gogo-protobuf's generated code: etcd 3.5 and 3.6.
    #[default]
    Gogo,
    /// protobuf-go, for the protoc-gen-go messages of etcd 3.7 and later.
    ProtobufGo,
}

impl GoDecoder {
    /// The decoder of the etcd release `version` (such as `3.7.3`).
    pub fn of_etcd(version: &str) -> Self {
        if crate::config::major_minor(version) >= (3, 7) {
            GoDecoder::ProtobufGo
        } else {
            GoDecoder::Gogo
        }
    }
}

impl Codec for WatchCodec {
    type Encode = WatchResponse;
    type Decode = WatchRequest;
    type Encoder = tonic_prost::ProstEncoder<WatchResponse>;
    type Decoder = WatchCodec;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Decoder for WatchCodec {
    type Item = WatchRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<WatchRequest>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        if self.decoder == GoDecoder::ProtobufGo {
            // The fields protobuf-go would set, or its one error text, after
            // the wording of etcd 3.7's gRPC-Go.
            return protobuf_go_watch_request(&bytes)
                .and_then(|kept| WatchRequest::decode(&kept[..]).ok())
                .map(Some)
                .ok_or_else(|| {
                    Status::internal(format!(
                        "grpc: failed to unmarshal the received message: {PROTOBUF_GO_ERROR}"
                    ))
                });
        }
        WatchRequest::decode(bytes.clone())
            .map(Some)
            .map_err(|error| {
                // gRPC-Go's wording, around the Go decoder's error.
                let reason = watch_request_error(&bytes).unwrap_or_else(|| error.to_string());
                Status::internal(format!(
                    "grpc: failed to unmarshal the received message {reason}"
                ))
            })
    }
}

/// The gRPC path of the Watch call.
const WATCH_PATH: &str = "/etcdserverpb.Watch/Watch";

/// The Watch service routed as the generated `WatchServer` would, with
/// [`WatchCodec`].
pub struct WatchRoute<B: Backend> {
    service: Arc<WatchService<B>>,
    max_message: usize,
    codec: WatchCodec,
}

impl<B: Backend> Clone for WatchRoute<B> {
    fn clone(&self) -> Self {
        WatchRoute {
            service: self.service.clone(),
            max_message: self.max_message,
            codec: self.codec,
        }
    }
}

impl<B: Backend> NamedService for WatchRoute<B> {
    const NAME: &'static str = crate::proto::etcdserverpb::watch_server::SERVICE_NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B: Backend> tower::Service<http::Request<tonic::body::Body>> for WatchRoute<B> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != WATCH_PATH {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let method = WatchMethod(self.service.clone());
        let max_message = self.max_message;
        let codec = self.codec;
        Box::pin(async move {
            let mut grpc = Grpc::new(codec).apply_max_message_size_config(Some(max_message), None);
            Ok(grpc.streaming(method, request).await)
        })
    }
}

/// The Watch call, as tonic's server runs it.
struct WatchMethod<B: Backend>(Arc<WatchService<B>>);

impl<B: Backend> StreamingService<WatchRequest> for WatchMethod<B> {
    type Response = WatchResponse;
    type ResponseStream = ResponseStream;
    type Future = BoxFuture<Result<Response<ResponseStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<WatchRequest>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.watch(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", value.parse().unwrap());
        grpc_timeout(&metadata)
    }

    #[test]
    fn grpc_timeouts() {
        assert_eq!(timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(timeout("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(timeout("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(timeout("5"), None);
        assert_eq!(timeout("S"), None);
        assert_eq!(timeout("5x"), None);
        assert_eq!(grpc_timeout(&MetadataMap::new()), None);
    }
}
