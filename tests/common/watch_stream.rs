//! A Watch stream over the raw generated client, with requests that can be
//! queued before the server answers and responses read with a timeout.

use std::time::Duration;

use cetera::proto::etcdserverpb::{
    WatchCreateRequest, WatchRequest, WatchResponse, watch_request::RequestUnion,
};

/// One Watch stream over the raw generated client.
///
/// A Go gRPC server sends the response headers of a stream only with its first message,
/// and tonic's `watch()` waits for those headers, so the call runs in a task of its own:
/// requests can be queued before the server has answered anything. Responses pass through
/// a small bounded channel, so a test that stops reading still pushes back on the server.
/// Dropping a `WatchStream` cancels the call (RST_STREAM), as a Go client's cancel does.
pub struct WatchStream {
    /// `None` once the client has half-closed its side.
    requests: Option<tokio::sync::mpsc::UnboundedSender<cetera::proto::etcdserverpb::WatchRequest>>,
    responses: tokio::sync::mpsc::Receiver<Result<WatchResponse, tonic::Status>>,
    call: tokio::task::JoinHandle<()>,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        // Dropping the call's response stream resets the HTTP/2 stream.
        self.call.abort();
    }
}

impl WatchStream {
    /// Opens a stream on `channel`. With `has_leader`, sends the `hasleader=true` metadata
    /// that the Kubernetes apiserver (through clientv3's `WithRequireLeader`) attaches.
    pub fn open(channel: tonic::transport::Channel, has_leader: bool) -> WatchStream {
        let metadata = if has_leader {
            vec![("hasleader", "true".to_string())]
        } else {
            Vec::new()
        };
        WatchStream::open_with_metadata(channel, metadata, None)
    }

    /// Opens a stream whose call has a deadline (the `grpc-timeout` header).
    pub fn open_with_deadline(
        channel: tonic::transport::Channel,
        deadline: Duration,
    ) -> WatchStream {
        WatchStream::open_with_metadata(channel, Vec::new(), Some(deadline))
    }

    /// Opens a stream that carries an auth token (the `token` metadata).
    pub fn open_with_token(channel: tonic::transport::Channel, token: &str) -> WatchStream {
        WatchStream::open_with_metadata(channel, vec![("token", token.to_string())], None)
    }

    fn open_with_metadata(
        channel: tonic::transport::Channel,
        metadata: Vec<(&'static str, String)>,
        deadline: Option<Duration>,
    ) -> WatchStream {
        let (requests, rx) = tokio::sync::mpsc::unbounded_channel();
        let (tx, responses) = tokio::sync::mpsc::channel(4);
        let call = tokio::spawn(async move {
            // Like etcd's Go client (MaxCallRecvMsgSize = MaxInt32): a catching-up
            // watcher's batch can exceed tonic's 4 MiB default.
            let mut client = cetera::proto::etcdserverpb::watch_client::WatchClient::new(channel)
                .max_decoding_message_size(i32::MAX as usize);
            let mut request =
                tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
            for (name, value) in metadata {
                request
                    .metadata_mut()
                    .insert(name, value.parse().expect("ascii metadata"));
            }
            if let Some(deadline) = deadline {
                request.set_timeout(deadline);
            }
            let mut stream = match client.watch(request).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            loop {
                let item = match stream.message().await {
                    Ok(Some(response)) => Ok(response),
                    Ok(None) => Err(tonic::Status::unknown("watch stream ended")),
                    Err(status) => Err(status),
                };
                let end = item.is_err();
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        WatchStream {
            requests: Some(requests),
            responses,
            call,
        }
    }

    fn send(&self, request: RequestUnion) {
        self.send_request(WatchRequest {
            request_union: Some(request),
        });
    }

    fn send_request(&self, request: WatchRequest) {
        let requests = self.requests.as_ref().expect("send after close_send");
        // A closed request channel means the stream ended; `recv` reports why.
        let _ = requests.send(request);
    }

    /// Sends a WatchRequest with no request in it.
    pub fn send_empty(&self) {
        self.send_request(WatchRequest {
            request_union: None,
        });
    }

    /// Half-closes the stream: the client sends nothing more but goes on reading.
    pub fn close_send(&mut self) {
        self.requests = None;
    }

    /// Sends a WatchCreateRequest.
    pub fn create(&self, create: WatchCreateRequest) {
        self.send(RequestUnion::CreateRequest(create));
    }

    /// Sends a WatchCancelRequest for `watch_id`.
    pub fn cancel(&self, watch_id: i64) {
        self.send(RequestUnion::CancelRequest(
            cetera::proto::etcdserverpb::WatchCancelRequest { watch_id },
        ));
    }

    /// Sends a WatchProgressRequest.
    pub fn request_progress(&self) {
        self.send(RequestUnion::ProgressRequest(
            cetera::proto::etcdserverpb::WatchProgressRequest {},
        ));
    }

    /// The next response; Err describes a timeout, a gRPC error or the end of the stream.
    pub async fn recv(&mut self, timeout: Duration) -> Result<WatchResponse, String> {
        match tokio::time::timeout(timeout, self.responses.recv()).await {
            Err(_) => Err(format!("no response within {timeout:?}")),
            Ok(None) => Err("watch stream ended".to_string()),
            Ok(Some(Err(status))) => Err(format!(
                "stream error {:?}: {}",
                status.code(),
                status.message()
            )),
            Ok(Some(Ok(response))) => Ok(response),
        }
    }
}
