//! The client side of the peer service: how this member reaches the others,
//! for openraft (append, vote, snapshot chunks) and for cetera's own calls
//! (forwarded writes, read index, join). Every call carries the cluster
//! token; payloads are postcard-encoded. Once this member knows its id
//! (`Peers::count_as`), calls carry it too, and each call to a member is
//! counted in etcd's peer metrics under that member's id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use openraft::RaftMetrics;
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
use tokio::sync::watch;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::member::Member;
use super::openraft_types::TypeConfig;
use super::peer_error::PeerError;
use super::reachability::Reachability;
use crate::metrics::{member_label, metrics};
use crate::proto::ceterapb::Payload;
use crate::proto::ceterapb::peer_client::PeerClient;

/// Metadata key of the cluster token.
pub const TOKEN_HEADER: &str = "cetera-token";

/// Metadata key of the calling member's id, as etcd writes ids: the peer
/// metrics the callee keeps are labelled with it (etcd's X-Server-From).
pub const MEMBER_HEADER: &str = "cetera-member";

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
    /// Which peers stopped answering, for the log.
    reachability: Arc<Reachability>,
    /// Set once this member's id is final: until then (a joining member
    /// asking for its id) calls are not counted.
    counting: Arc<OnceLock<Counting>>,
}

/// What the peer metrics need beyond a peer's URL.
struct Counting {
    /// This member's id, as a label.
    local: String,
    /// Raft's view, whose membership maps peer URLs to member ids.
    raft: watch::Receiver<RaftMetrics<u64, Member>>,
    /// Whether each member answered this one's latest call (etcd's
    /// peerStatus): a member never answered has no active_peers series.
    active: Mutex<HashMap<u64, bool>>,
}

impl Counting {
    /// The id of the member at `url`, if it is one.
    fn member_at(&self, url: &str) -> Option<u64> {
        let raft = self.raft.borrow();
        raft.membership_config
            .membership()
            .nodes()
            .find(|(_, member)| member.peer_url == url)
            .map(|(id, _)| *id)
    }

    /// Notes whether member `id` answered: active_peers follows, and a
    /// member that stops answering counts as disconnected once.
    fn mark(&self, id: u64, answered: bool) {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        let was = active.insert(id, answered).unwrap_or(false);
        if was == answered {
            return;
        }
        let remote = member_label(id);
        let labels = [self.local.as_str(), remote.as_str()];
        let metrics = metrics();
        metrics
            .active_peers
            .with_label_values(&labels)
            .set(answered as i64);
        if !answered {
            metrics.disconnected_peers.with_label_values(&labels).inc();
        }
    }
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
            reachability: Arc::default(),
            counting: Arc::default(),
        }
    }

    /// From now on, sends `local` as this member's id with every call and
    /// counts the calls to the members of `raft`'s membership in the peer
    /// metrics. Takes effect once.
    pub fn count_as(&self, local: u64, raft: watch::Receiver<RaftMetrics<u64, Member>>) {
        let _ = self.counting.set(Counting {
            local: member_label(local),
            raft,
            active: Mutex::default(),
        });
    }

    /// The id of the member at `url`, when calls are counted and it is one.
    fn counted(&self, url: &str) -> Option<(&Counting, u64)> {
        let counting = self.counting.get()?;
        Some((counting, counting.member_at(url)?))
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
        if let Some(local) = self.counting.get().and_then(|c| c.local.parse().ok()) {
            request.metadata_mut().insert(MEMBER_HEADER, local);
        }
        let sent = request.get_ref().data.len();
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
        let answer = answer.map_err(|status| {
            let (url, message) = (url.to_string(), status.message().to_string());
            match status.code() {
                tonic::Code::Unavailable => PeerError::Unreachable { url, message },
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                    PeerError::TimedOut { url, message }
                }
                _ => PeerError::Refused { url, status },
            }
        });
        let counted = self.counted(url);
        if let Some((counting, id)) = counted {
            count_call(counting, id, sent, &answer);
        }
        // A refusal is an answer, unless it is the transport's own (tonic's
        // Unknown `transport error`: the connection broke mid-call).
        match &answer {
            Ok(_) => self.reachability.note(url, Ok(())),
            Err(PeerError::Refused { status, .. }) if status.code() != tonic::Code::Unknown => {
                self.reachability.note(url, Ok(()))
            }
            Err(error) => self.reachability.note(url, Err(error)),
        }
        let payload = answer?;
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(url.to_string(), Instant::now());
        let data = &payload.get_ref().data;
        let answer = postcard::from_bytes(data);
        if let Some((_, id)) = counted {
            count_received(&member_label(id), data.len(), answer.is_ok());
        }
        answer.map_err(|e| PeerError::Garbled {
            url: url.to_string(),
            message: e.to_string(),
        })
    }

    /// Asks the member at `url` for the cheapest answer the peer service
    /// gives (its entry format: neither Raft nor the store is involved),
    /// as etcd's prober does, and returns how long the answer took. A probe
    /// that times out, unlike other calls, makes the member inactive: its
    /// timeout is as long as etcd waits on a silent connection.
    pub async fn probe(&self, url: &str) -> Result<Duration, PeerError> {
        let started = Instant::now();
        let answer: Result<u32, PeerError> = self
            .call(url, Method::EntryFormat, &(), PROBE_TIMEOUT)
            .await;
        match answer {
            Ok(_) => Ok(started.elapsed()),
            Err(error) => {
                if let (PeerError::TimedOut { .. }, Some((counting, id))) =
                    (&error, self.counted(url))
                {
                    counting.mark(id, false);
                }
                Err(error)
            }
        }
    }
}

/// How long a probe waits for its answer: etcd's ConnReadTimeout, after
/// which it gives up on a silent peer connection.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Counts one call to member `id` of `sent` bytes in the peer metrics: its
/// bytes once answered, else a failure. Any answer makes the member active;
/// a call that could not reach it or that it refused makes it inactive, as
/// etcd's failed sends do. A timeout alone does not, since Raft's appends
/// have timeouts of a heartbeat interval that a member busy syncing its log
/// can miss (see `probe`). A call the member does not know (an older cetera
/// answers `Unimplemented`, as to `ForwardSeveral`) is neither: the member
/// answered, so it is active, but nothing was delivered.
fn count_call(
    counting: &Counting,
    id: u64,
    sent: usize,
    answer: &Result<tonic::Response<Payload>, PeerError>,
) {
    let to = member_label(id);
    match answer {
        Err(PeerError::Refused { status, .. }) if status.code() == tonic::Code::Unimplemented => {
            counting.mark(id, true);
        }
        Ok(_) => {
            metrics()
                .peer_sent_bytes
                .with_label_values(&[&to])
                .inc_by(sent as u64);
            counting.mark(id, true);
        }
        Err(error) => {
            metrics().peer_sent_failures.with_label_values(&[&to]).inc();
            if !matches!(error, PeerError::TimedOut { .. }) {
                counting.mark(id, false);
            }
        }
    }
}

/// Counts a message of `bytes` from the member labelled `from` (a call it
/// made, or its answer to one of this member's): as received if it `read`
/// (decoded), else as a receive failure, as etcd counts the bytes of the
/// messages it could unmarshal.
pub(super) fn count_received(from: &str, bytes: usize, read: bool) {
    let metrics = metrics();
    if read {
        metrics
            .peer_received_bytes
            .with_label_values(&[from])
            .inc_by(bytes as u64);
    } else {
        metrics
            .peer_received_failures
            .with_label_values(&[from])
            .inc();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a call's outcome does to the member's peer metrics: an answer
    /// makes it active, a refusal inactive (a disconnection, a failure), and
    /// `Unimplemented` (an older cetera that does not know the call, as
    /// `ForwardSeveral`) counts as an answer, not as a failure.
    #[test]
    fn an_unknown_call_is_an_answer_and_a_refusal_a_failure() {
        let (local, remote) = (0xc0ffee_u64, 0xbeef_u64);
        let (_, raft) = watch::channel(RaftMetrics::new_initial(local));
        let counting = Counting {
            local: member_label(local),
            raft,
            active: Mutex::default(),
        };
        let labels = [member_label(local), member_label(remote)];
        let labels = [labels[0].as_str(), labels[1].as_str()];
        let to = [labels[1]];
        let refused = |status: tonic::Status| {
            Err(PeerError::Refused {
                url: "http://127.0.0.1:1".to_string(),
                status,
            })
        };
        let metrics = metrics();
        let active = || metrics.active_peers.with_label_values(&labels).get();
        let failures = || metrics.peer_sent_failures.with_label_values(&to).get();
        let disconnected = || metrics.disconnected_peers.with_label_values(&labels).get();

        count_call(
            &counting,
            remote,
            7,
            &Ok(tonic::Response::new(Payload::default())),
        );
        assert_eq!((active(), failures(), disconnected()), (1, 0, 0));
        assert_eq!(metrics.peer_sent_bytes.with_label_values(&to).get(), 7);

        let unknown = refused(tonic::Status::unimplemented("unknown method"));
        count_call(&counting, remote, 7, &unknown);
        assert_eq!((active(), failures(), disconnected()), (1, 0, 0));

        let wrong_token = refused(tonic::Status::unauthenticated("token"));
        count_call(&counting, remote, 7, &wrong_token);
        assert_eq!((active(), failures(), disconnected()), (0, 1, 1));
        assert_eq!(metrics.peer_sent_bytes.with_label_values(&to).get(), 7);
    }
}
