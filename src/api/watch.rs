//! The Watch service: each stream gets a `WatchSession` on its own task; this
//! layer only moves requests in and responses out, completing their headers.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::ServerInfo;
use crate::backend::Backend;
use crate::metrics::{GaugeGuard, metrics};
use crate::proto::etcdserverpb::watch_server::Watch;
use crate::proto::etcdserverpb::{WatchRequest, WatchResponse};
use crate::store::Store;
use crate::watch::session::{SessionOptions, WatchSession};

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

#[tonic::async_trait]
impl<B: Backend> Watch for WatchService<B> {
    type WatchStream = ResponseStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let (metadata, _, requests) = request.into_parts();
        // A broken request stream ends the session like a closed one.
        let requests = requests.map_while(Result::ok);
        let (out, responses) = mpsc::channel(OUTBOUND_RESPONSES);
        let auth = self.info.auth.clone();
        let session =
            WatchSession::new(self.store.clone(), out, self.options).with_create_check(Box::new(
                move |key, range_end| auth.watch_refusal(&auth.caller(&metadata), key, range_end),
            ));
        let stream_counted = GaugeGuard::new(&metrics().watch_streams);
        let run = session.run(Box::pin(requests), self.stop.clone());
        tokio::spawn(async move {
            run.await;
            drop(stream_counted);
        });

        let info = self.info.clone();
        let responses = ReceiverStream::new(responses).map(move |mut response| {
            let revision = response.header.as_ref().map_or(0, |h| h.revision);
            info.fill(&mut response.header, revision);
            Ok(response)
        });
        Ok(Response::new(Box::pin(responses)))
    }
}
