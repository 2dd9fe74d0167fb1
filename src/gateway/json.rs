//! The JSON side of etcd's grpc-gateway (v1 as etcd 3.5 embeds it, v2 as
//! etcd 3.6 and later do): request bodies decoded into the protos' messages,
//! answers and errors written as its runtime writes them, and streams as one
//! `{"result": ...}` object a line.

use std::convert::Infallible;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};

/// The grpc-gateway runtime the emulated etcd embeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// v1, etcd 3.5's: errors carry an `error` field beside `code` and
    /// `message`, a stream's error chunk is `{"error":{"grpc_code":...}}`,
    /// an unknown route or method is answered in plain text, an enum value
    /// the proto does not name is refused.
    V1,
    /// v2, etcd 3.6's and 3.7's: errors are the gRPC status as JSON
    /// (`code`, `message`), on unknown routes and methods too (404 and 501),
    /// a stream's error chunk is `{"error":{"code":...,"message":...}}` and
    /// a line end, an enum value the proto does not name is ignored, and a
    /// body of `null` is refused.
    V2,
}

impl Runtime {
    /// The runtime of an etcd of version `major.minor.patch`.
    pub fn of(version: (u64, u64, u64)) -> Runtime {
        if version >= (3, 6, 0) {
            Runtime::V2
        } else {
            Runtime::V1
        }
    }
}

/// grpc-gateway's HTTP status for a gRPC code (its runtime's
/// HTTPStatusFromCode; FailedPrecondition is 400 there, not 412; v2 answers
/// Cancelled with 499, v1 with 408).
pub fn http_status(code: tonic::Code, runtime: Runtime) -> StatusCode {
    use tonic::Code;
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled if runtime == Runtime::V2 => {
            StatusCode::from_u16(499).expect("499 is a valid status code")
        }
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// A unary call's error with the code's HTTP status (the gateway's
/// DefaultHTTPError): `{"error":..., "code":..., "message":...}` from v1,
/// `{"code":..., "message":...}` from v2 (code 0 would be left out, as a
/// default value, but no error has it).
pub fn error_response(status: &Status, runtime: Runtime) -> Response<Body> {
    let body = ErrorBody {
        error: (runtime == Runtime::V1).then_some(status.message()),
        code: status.code() as i32,
        message: status.message(),
    };
    json_response(http_status(status.code(), runtime), to_json(&body), false)
}

/// The gateway's answer to a path it has no route for: v1's plain text,
/// v2's NotFound status.
pub fn no_route(runtime: Runtime) -> Response<Body> {
    match runtime {
        Runtime::V1 => text_error(StatusCode::NOT_FOUND, "Not Found"),
        Runtime::V2 => error_response(&Status::not_found("Not Found"), runtime),
    }
}

/// The gateway's answer to a route's path with a method other than POST:
/// v1's plain 405, v2's Unimplemented status (501).
pub fn wrong_method(runtime: Runtime) -> Response<Body> {
    match runtime {
        Runtime::V1 => text_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
        Runtime::V2 => error_response(&Status::unimplemented("Method Not Allowed"), runtime),
    }
}

/// The gateway's error body, its fields in its order.
#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    code: i32,
    message: &'a str,
}

/// The v1 gateway's error chunk of a stream, its fields in its order.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

#[derive(Serialize)]
struct ErrorChunk<T> {
    error: T,
}

/// The error that ends a stream: v1's `{"error":{"grpc_code":...,...}}`
/// without a line end, v2's `{"error":{"code":...,"message":...}}` and a
/// line end.
pub fn stream_error(status: &Status, runtime: Runtime) -> Bytes {
    let http = http_status(status.code(), runtime);
    match runtime {
        Runtime::V1 => Bytes::from(to_json(&ErrorChunk {
            error: StreamError {
                grpc_code: status.code() as i32,
                http_code: http.as_u16(),
                message: status.message(),
                http_status: http.canonical_reason().unwrap_or(""),
            },
        })),
        Runtime::V2 => {
            let mut chunk = to_json(&ErrorChunk {
                error: ErrorBody {
                    error: None,
                    code: status.code() as i32,
                    message: status.message(),
                },
            });
            chunk.push(b'\n');
            Bytes::from(chunk)
        }
    }
}

/// A JSON answer; a successful call's carries the gRPC content type as
/// response metadata, as the gateway forwards it.
pub fn json_response(status: StatusCode, body: impl Into<Body>, call_ok: bool) -> Response<Body> {
    let mut response = Response::new(body.into());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if call_ok {
        headers.insert(
            "grpc-metadata-content-type",
            HeaderValue::from_static("application/grpc"),
        );
    }
    response
}

/// A plain-text answer as Go's http.Error writes it.
pub fn text_error(status: StatusCode, text: &str) -> Response<Body> {
    plain_text(status, format!("{text}\n"))
}

/// `body` as text, with the headers Go's http.Error sets (etcd's /livez and
/// /readyz answer that way too).
pub fn plain_text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// One message as JSON (the gateway's JSONPb: the protos' field names,
/// defaults left out).
pub fn to_json<M: Serialize>(message: &M) -> Vec<u8> {
    serde_json::to_vec(message).expect("messages serialize")
}

/// The call's metadata from the HTTP headers, as the gateway passes them:
/// `Authorization` as `authorization` (etcd's token), and every
/// `Grpc-Metadata-<key>` header as `<key>`.
pub fn metadata(headers: &HeaderMap) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    for (name, value) in headers {
        let key = if name == header::AUTHORIZATION {
            "authorization"
        } else if let Some(key) = name.as_str().strip_prefix("grpc-metadata-") {
            key
        } else {
            continue;
        };
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_bytes()),
        ) {
            metadata.append(key, value);
        }
    }
    metadata
}

/// The message a request body holds. An empty body is the empty message, and
/// so is `null` for v1 (v2 refuses it); what follows the first JSON value is
/// ignored, as Go's decoder does; a body that does not decode is
/// InvalidArgument.
pub fn decode<M: DeserializeOwned + Default>(body: &[u8], runtime: Runtime) -> Result<M, Status> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Value>();
    match values.next() {
        None => Ok(M::default()),
        Some(Ok(Value::Null)) if runtime == Runtime::V2 => Err(Status::invalid_argument(
            "proto: syntax error (line 1:1): unexpected token null",
        )),
        Some(Ok(value)) => from_value(value, runtime),
        Some(Err(error)) if error.is_eof() => Err(Status::invalid_argument("unexpected EOF")),
        Some(Err(error)) => Err(Status::invalid_argument(error.to_string())),
    }
}

/// One decoded JSON value as a message. A `null` field is an unset one, as
/// the gateway's decoder takes it (pbjson refuses it for most types); for
/// v2, so is an enum field whose value names no member of the enum.
pub fn from_value<M: DeserializeOwned + Default>(
    mut value: Value,
    runtime: Runtime,
) -> Result<M, Status> {
    fn drop_nulls(value: &mut Value) {
        match value {
            Value::Object(fields) => {
                fields.retain(|_, v| !v.is_null());
                fields.values_mut().for_each(drop_nulls);
            }
            Value::Array(items) => items.iter_mut().for_each(drop_nulls),
            _ => {}
        }
    }
    if value.is_null() {
        return Ok(M::default());
    }
    drop_nulls(&mut value);
    loop {
        let error = match serde_path_to_error::deserialize::<_, M>(value.clone()) {
            Ok(message) => return Ok(message),
            Err(error) => error,
        };
        // protojson's DiscardUnknown drops a field whose enum name is
        // unknown; pbjson says `unknown variant` of the field at the path.
        let unknown_enum = error.inner().to_string().starts_with("unknown variant");
        if runtime == Runtime::V1 || !unknown_enum || !remove_at(&mut value, error.path()) {
            return Err(Status::invalid_argument(error.into_inner().to_string()));
        }
    }
}

/// Removes the field or item at `path` from `value`; whether it was there.
fn remove_at(value: &mut Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut node = value;
    for segment in parents {
        let next = match (segment, node) {
            (Segment::Map { key }, Value::Object(fields)) => fields.get_mut(key),
            (Segment::Seq { index }, Value::Array(items)) => items.get_mut(*index),
            _ => None,
        };
        match next {
            Some(next) => node = next,
            None => return false,
        }
    }
    match (last, node) {
        (Segment::Map { key }, Value::Object(fields)) => fields.remove(key).is_some(),
        (Segment::Seq { index }, Value::Array(items)) if *index < items.len() => {
            items.remove(*index);
            true
        }
        _ => false,
    }
}

/// grpc-go's refusal of a message over the server's limit, as etcd's
/// gateway passes it on.
pub fn too_large(size: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: received message larger than max ({size} vs. {limit})"
    ))
}

/// The whole body of a unary request, at most `limit` bytes.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, Status> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(too_large(limit + 1, limit))
        }
        Err(error) => Err(Status::unknown(error.to_string())),
    }
}

/// A server stream as the gateway forwards it: nothing is written until
/// the first message (or error) comes; then `{"result": ...}` lines, or,
/// if the stream fails first, the error's status and error chunk.
pub async fn stream_response<M, S>(mut messages: S, runtime: Runtime) -> Response<Body>
where
    M: Serialize + Send + 'static,
    S: Stream<Item = Result<M, Status>> + Send + Unpin + 'static,
{
    let first = messages.next().await;
    let (status, first_chunk, ok) = match first {
        None => (StatusCode::OK, None, true),
        Some(Ok(message)) => (StatusCode::OK, Some(result_line(&message)), true),
        Some(Err(error)) => return stream_failed(&error, runtime),
    };

    // The stream ends at its first error, which is written last.
    let rest = futures_util::stream::unfold(Some(messages), move |messages| async move {
        let mut messages = messages?;
        match messages.next().await? {
            Ok(message) => Some((result_line(&message), Some(messages))),
            Err(error) => Some((stream_error(&error, runtime), None)),
        }
    });
    let chunks = tokio_stream::iter(first_chunk)
        .chain(rest)
        .map(Ok::<_, Infallible>);
    json_response(status, Body::from_stream(chunks), ok)
}

/// A stream that failed before its first message: the code's status and
/// the error chunk, as the gateway writes them (a failed streaming call is
/// seen only when its first message is awaited).
pub fn stream_failed(error: &Status, runtime: Runtime) -> Response<Body> {
    let mut response = Response::new(Body::from(stream_error(error, runtime)));
    *response.status_mut() = http_status(error.code(), runtime);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn result_line<M: Serialize>(message: &M) -> Bytes {
    let mut line = BytesMut::from(&b"{\"result\":"[..]);
    line.extend_from_slice(&to_json(message));
    line.extend_from_slice(b"}\n");
    line.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
    use crate::proto::etcdserverpb::{RangeRequest, TxnRequest, compare};

    #[test]
    fn decodes_as_the_gateway_does() {
        for runtime in [Runtime::V1, Runtime::V2] {
            let req: RangeRequest = decode(
                br#"{"key":"Zm9v","sort_order":"DESCEND","x":1} rest"#,
                runtime,
            )
            .expect("a request");
            assert_eq!(req.key, b"foo");
            assert_eq!(req.sort_order, SortOrder::Descend as i32);
            assert_eq!(
                decode::<RangeRequest>(b"", runtime).unwrap(),
                RangeRequest::default()
            );
            let bad = decode::<RangeRequest>(br#"{"key":1}"#, runtime).unwrap_err();
            assert_eq!(bad.code(), tonic::Code::InvalidArgument);
            let cut = decode::<RangeRequest>(br#"{"key":"#, runtime).unwrap_err();
            assert_eq!(cut.message(), "unexpected EOF");
        }
        assert_eq!(
            decode::<RangeRequest>(b"null", Runtime::V1).unwrap(),
            RangeRequest::default()
        );
        let null = decode::<RangeRequest>(b"null", Runtime::V2).unwrap_err();
        assert_eq!(null.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn an_unknown_enum_name_is_refused_by_v1_and_ignored_by_v2() {
        let body = br#"{"key":"Zm9v","sort_order":"NOPE","sort_target":"MOD"}"#;
        let refused = decode::<RangeRequest>(body, Runtime::V1).unwrap_err();
        assert!(refused.message().contains("unknown variant"), "{refused:?}");
        let req: RangeRequest = decode(body, Runtime::V2).unwrap();
        assert_eq!(req.sort_order, SortOrder::None as i32);
        assert_eq!(req.sort_target, SortTarget::Mod as i32);
        // Nested, in a list: the compare's result only.
        let txn: TxnRequest = decode(
            br#"{"compare":[{"key":"Zm9v","result":"NOPE","target":"VALUE"}]}"#,
            Runtime::V2,
        )
        .unwrap();
        assert_eq!(txn.compare[0].key, b"foo");
        assert_eq!(txn.compare[0].result, 0);
        assert_eq!(txn.compare[0].target, compare::CompareTarget::Value as i32);
    }

    #[test]
    fn writes_the_protos_field_names_and_64_bit_strings() {
        let req = RangeRequest {
            key: b"foo".to_vec(),
            range_end: vec![0],
            limit: 5,
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(to_json(&req)).unwrap(),
            r#"{"key":"Zm9v","range_end":"AA==","limit":"5"}"#
        );
    }

    #[test]
    fn errors_carry_the_gateways_status() {
        for runtime in [Runtime::V1, Runtime::V2] {
            let lost = Status::not_found("etcdserver: requested lease not found");
            assert_eq!(
                error_response(&lost, runtime).status(),
                StatusCode::NOT_FOUND
            );
            assert_eq!(
                http_status(tonic::Code::FailedPrecondition, runtime),
                StatusCode::BAD_REQUEST
            );
        }
        assert_eq!(
            http_status(tonic::Code::Cancelled, Runtime::V2).as_u16(),
            499
        );
        let invalid = Status::unknown("auth: invalid auth token");
        assert_eq!(
            stream_error(&invalid, Runtime::V1),
            Bytes::from_static(
                br#"{"error":{"grpc_code":2,"http_code":500,"message":"auth: invalid auth token","http_status":"Internal Server Error"}}"#
            )
        );
        assert_eq!(
            stream_error(&invalid, Runtime::V2),
            Bytes::from_static(
                b"{\"error\":{\"code\":2,\"message\":\"auth: invalid auth token\"}}\n"
            )
        );
    }
}
