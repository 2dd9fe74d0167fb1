//! The JSON side of etcd's grpc-gateway (v1, as etcd 3.5 embeds it): request
//! bodies decoded into the protos' messages, answers and errors written as
//! its runtime writes them, and streams as one `{"result": ...}` object a line.

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

/// grpc-gateway's HTTP status for a gRPC code (its v1 runtime's
/// HTTPStatusFromCode; FailedPrecondition is 400 there, not 412).
pub fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::Ok => StatusCode::OK,
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

/// A unary call's error: `{"error":..., "code":..., "message":...}` with the
/// code's HTTP status (the gateway's DefaultHTTPError; code 0 would be left
/// out, as a default value, but no error has it).
pub fn error_response(status: &Status) -> Response<Body> {
    let body = ErrorBody {
        error: status.message(),
        code: status.code() as i32,
        message: status.message(),
    };
    json_response(http_status(status.code()), to_json(&body), false)
}

/// The gateway's error body, its fields in its order.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    code: i32,
    message: &'a str,
}

/// The gateway's error chunk of a stream, its fields in its order.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

#[derive(Serialize)]
struct ErrorChunk<'a> {
    error: StreamError<'a>,
}

/// The error that ends a stream: `{"error":{"grpc_code":...,...}}`, no line end.
pub fn stream_error(status: &Status) -> Bytes {
    let http = http_status(status.code());
    let chunk = ErrorChunk {
        error: StreamError {
            grpc_code: status.code() as i32,
            http_code: http.as_u16(),
            message: status.message(),
            http_status: http.canonical_reason().unwrap_or(""),
        },
    };
    Bytes::from(to_json(&chunk))
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

/// The message a request body holds. An empty body (or `null`) is the
/// empty message; what follows the first JSON value is ignored, as Go's
/// decoder does; a body that does not decode is InvalidArgument.
pub fn decode<M: DeserializeOwned + Default>(body: &[u8]) -> Result<M, Status> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Value>();
    match values.next() {
        None => Ok(M::default()),
        Some(Ok(value)) => from_value(value),
        Some(Err(error)) if error.is_eof() => Err(Status::invalid_argument("unexpected EOF")),
        Some(Err(error)) => Err(Status::invalid_argument(error.to_string())),
    }
}

/// One decoded JSON value as a message. A `null` field is an unset one, as
/// the gateway's decoder takes it (pbjson refuses it for most types).
pub fn from_value<M: DeserializeOwned + Default>(mut value: Value) -> Result<M, Status> {
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
    serde_json::from_value(value).map_err(|error| Status::invalid_argument(error.to_string()))
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
pub async fn stream_response<M, S>(mut messages: S) -> Response<Body>
where
    M: Serialize + Send + 'static,
    S: Stream<Item = Result<M, Status>> + Send + Unpin + 'static,
{
    let first = messages.next().await;
    let (status, first_chunk, ok) = match first {
        None => (StatusCode::OK, None, true),
        Some(Ok(message)) => (StatusCode::OK, Some(result_line(&message)), true),
        Some(Err(error)) => return stream_failed(&error),
    };

    // The stream ends at its first error, which is written last.
    let rest = futures_util::stream::unfold(Some(messages), |messages| async move {
        let mut messages = messages?;
        match messages.next().await? {
            Ok(message) => Some((result_line(&message), Some(messages))),
            Err(error) => Some((stream_error(&error), None)),
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
pub fn stream_failed(error: &Status) -> Response<Body> {
    let mut response = Response::new(Body::from(stream_error(error)));
    *response.status_mut() = http_status(error.code());
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
    use crate::proto::etcdserverpb::{RangeRequest, range_request::SortOrder};

    #[test]
    fn decodes_as_the_gateway_does() {
        let req: RangeRequest =
            decode(br#"{"key":"Zm9v","sort_order":"DESCEND","x":1} rest"#).expect("a request");
        assert_eq!(req.key, b"foo");
        assert_eq!(req.sort_order, SortOrder::Descend as i32);
        assert_eq!(
            decode::<RangeRequest>(b"").unwrap(),
            RangeRequest::default()
        );
        assert_eq!(
            decode::<RangeRequest>(b"null").unwrap(),
            RangeRequest::default()
        );
        let bad = decode::<RangeRequest>(br#"{"key":1}"#).unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        let cut = decode::<RangeRequest>(br#"{"key":"#).unwrap_err();
        assert_eq!(cut.message(), "unexpected EOF");
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
        let response = error_response(&Status::not_found("etcdserver: requested lease not found"));
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            http_status(tonic::Code::FailedPrecondition),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            stream_error(&Status::unknown("auth: invalid auth token")),
            Bytes::from_static(
                br#"{"error":{"grpc_code":2,"http_code":500,"message":"auth: invalid auth token","http_status":"Internal Server Error"}}"#
            )
        );
    }
}
