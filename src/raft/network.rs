//! The client side of the peer service: how this member reaches the others,
//! for openraft (append, vote, snapshot chunks) and for cetera's own calls
//! (forwarded writes, read index, join). Every call carries the cluster
//! token; payloads are postcard-encoded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::{Member, TypeConfig};
use crate::proto::ceterapb::Payload;
use crate::proto::ceterapb::peer_client::PeerClient;

/// Metadata key of the cluster token.
pub const TOKEN_HEADER: &str = "cetera-token";

/// A failed peer call.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer could not be reached: nothing was delivered.
    #[error("cannot reach {url}: {message}")]
    Unreachable {
        /// The peer.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The peer did not answer in time: the call may or may not have
    /// taken effect.
    #[error("{url} did not answer in time: {message}")]
    TimedOut {
        /// The peer.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The peer answered with an error status.
    #[error("{url} refused: {status}")]
    Refused {
        /// The peer.
        url: String,
        /// Its answer.
        status: tonic::Status,
    },
    /// The answer did not decode.
    #[error("{url} answered something unreadable: {message}")]
    Garbled {
        /// The peer.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// Connections to the other members, by peer URL.
#[derive(Clone)]
pub struct Peers {
    token: Arc<str>,
    tls: Option<ClientTlsConfig>,
    /// The address peer connections are made from: the peer service's own,
    /// so that other members see this one at one address.
    source: Option<std::net::IpAddr>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// When each peer last answered a call, by peer URL.
    answered: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Peers {
    /// Peers reached with `token` (and TLS, when configured) from `source`.
    pub fn new(
        token: &str,
        tls: Option<ClientTlsConfig>,
        source: Option<std::net::IpAddr>,
    ) -> Self {
        Peers {
            token: token.into(),
            tls,
            source,
            channels: Arc::default(),
            answered: Arc::default(),
        }
    }

    fn channel(&self, url: &str) -> Result<Channel, PeerError> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(url) {
            return Ok(channel.clone());
        }
        let unreachable = |message: String| PeerError::Unreachable {
            url: url.to_string(),
            message,
        };
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .local_address(self.source);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| unreachable(e.to_string()))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(url.to_string(), channel.clone());
        Ok(channel)
    }

    /// When the peer at `url` last answered a call of this member's.
    pub fn answered_at(&self, url: &str) -> Option<Instant> {
        let answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        answered.get(url).copied()
    }

    /// Calls `method` of the peer at `url` with `message`, within `timeout`.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        url: &str,
        method: Method,
        message: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        let data = postcard::to_stdvec(message).map_err(|e| PeerError::Garbled {
            url: url.to_string(),
            message: e.to_string(),
        })?;
        let mut client = PeerClient::new(self.channel(url)?)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let mut request = tonic::Request::new(Payload { data });
        request.set_timeout(timeout);
        if let Ok(token) = self.token.parse() {
            request.metadata_mut().insert(TOKEN_HEADER, token);
        }
        let answer = match method {
            Method::AppendEntries => client.append_entries(request).await,
            Method::Vote => client.vote(request).await,
            Method::InstallSnapshot => client.install_snapshot(request).await,
            Method::Forward => client.forward(request).await,
            Method::ForwardSeveral => client.forward_several(request).await,
            Method::ReadIndex => client.read_index(request).await,
            Method::Join => client.join(request).await,
            Method::ChangeMembers => client.change_members(request).await,
            Method::Reserved => client.reserved(request).await,
            Method::Campaign => client.campaign(request).await,
            Method::PreVote => client.pre_vote(request).await,
            Method::HandingOver => client.handing_over(request).await,
            Method::Lease => client.lease(request).await,
            Method::EntryFormat => client.entry_format(request).await,
        };
        let payload = answer.map_err(|status| {
            let (url, message) = (url.to_string(), status.message().to_string());
            match status.code() {
                tonic::Code::Unavailable => PeerError::Unreachable { url, message },
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                    PeerError::TimedOut { url, message }
                }
                _ => PeerError::Refused { url, status },
            }
        })?;
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(url.to_string(), Instant::now());
        postcard::from_bytes(&payload.get_ref().data).map_err(|e| PeerError::Garbled {
            url: url.to_string(),
            message: e.to_string(),
        })
    }
}

/// The peer service's methods.
#[derive(Clone, Copy, Debug)]
pub enum Method {
    /// openraft AppendEntries.
    AppendEntries,
    /// openraft Vote.
    Vote,
    /// openraft InstallSnapshot (one chunk).
    InstallSnapshot,
    /// A write for the leader.
    Forward,
    /// Writes for the leader, each answered on its own.
    ForwardSeveral,
    /// The leader's read index.
    ReadIndex,
    /// Adding a member.
    Join,
    /// Adding, updating, removing or promoting a member.
    ChangeMembers,
    /// The id reserved for a new member.
    Reserved,
    /// Standing for leader, as MoveLeader asks.
    Campaign,
    /// Whether a member would vote for this one.
    PreVote,
    /// The leader is alive, handing over leadership.
    HandingOver,
    /// A lease call for the leader's lessor.
    Lease,
    /// The newest log entry format the member reads.
    EntryFormat,
}

impl RaftNetworkFactory<TypeConfig> for Peers {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: u64, node: &Member) -> PeerConnection {
        PeerConnection {
            peers: self.clone(),
            target,
            url: node.peer_url.clone(),
        }
    }
}

/// openraft's connection to one member.
pub struct PeerConnection {
    peers: Peers,
    target: u64,
    url: String,
}

impl PeerConnection {
    async fn raft_call<
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    >(
        &self,
        method: Method,
        message: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, Member, E>> {
        let answer: Result<Resp, E> = self
            .peers
            .call(&self.url, method, message, option.hard_ttl())
            .await
            .map_err(|error| match error {
                // openraft backs off from an unreachable member; a slow
                // answer is only retried.
                PeerError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&error)),
                _ => RPCError::Network(NetworkError::new(&error)),
            })?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, Member, RaftError<u64>>> {
        self.raft_call(Method::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, Member, RaftError<u64, InstallSnapshotError>>,
    > {
        self.raft_call(Method::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, Member, RaftError<u64>>> {
        self.raft_call(Method::Vote, &rpc, &option).await
    }
}
