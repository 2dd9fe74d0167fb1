//! The Lease service: grant, revoke, keep-alive (a stream), time-to-live and
//! listing. Expiry runs in the store; this layer checks requests and fills
//! headers.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::ServerInfo;
use super::require_leader::end_without_leader;
use crate::backend::Backend;
use crate::proto::etcdserverpb::lease_server::Lease;
use crate::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use crate::store::Store;

/// The Lease service on a store.
pub struct LeaseService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
}

impl<B: Backend> LeaseService<B> {
    /// The service managing the leases of `store`.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>) -> Self {
        LeaseService { store, info }
    }

    fn current_revision(&self) -> i64 {
        self.store.revisions().current
    }
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend> Lease for LeaseService<B> {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        self.info
            .require_user(request.metadata(), request.extensions())?;
        let mut resp = self.store.lease_grant(request.into_inner()).await?;
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        self.info
            .auth
            .authorize_lease_revoke(
                &self.info.caller(&metadata, &extensions)?,
                req.id,
                &self.store,
            )
            .await?;
        let mut resp = self.store.lease_revoke(req.id).await?;
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let store = self.store.clone();
        let info = self.info.clone();
        let (metadata, extensions, requests) = request.into_parts();
        let require_leader = metadata.clone();
        let credentials = Arc::new((metadata, extensions));
        // Answered one at a time, in order; the stream ends with the client's side.
        let responses = requests.map_while(Result::ok).then(move |req| {
            let store = store.clone();
            let info = info.clone();
            let credentials = credentials.clone();
            async move {
                let (metadata, extensions) = &*credentials;
                // A keep-alive needs what a revoke needs (etcd's checkLeaseRenew).
                info.auth
                    .authorize_lease_revoke(&info.caller(metadata, extensions)?, req.id, &store)
                    .await?;
                let mut resp = store.lease_keep_alive(req.id).await?;
                info.fill(&mut resp.header, store.revisions().current);
                Ok(resp)
            }
        });
        Ok(Response::new(Box::pin(end_without_leader(
            self.info.cluster(),
            &require_leader,
            Box::pin(responses),
        ))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        self.info
            .auth
            .authorize_lease_time_to_live(
                &self.info.caller(&metadata, &extensions)?,
                req.id,
                req.keys,
                &self.store,
            )
            .await?;
        let mut resp = self.store.lease_time_to_live(&req).await?;
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        self.info
            .auth
            .authorize_lease_leases(
                &self.info.caller(request.metadata(), request.extensions())?,
                &self.store,
            )
            .await?;
        let mut resp = self.store.leases().await?;
        self.info.fill(&mut resp.header, self.current_revision());
        Ok(Response::new(resp))
    }
}
