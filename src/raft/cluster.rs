//! One member of a replicated cluster: starts Raft on the store, serves the
//! peer service, joins or founds the cluster, and carries this member's
//! writes, linearizable reads and lease calls to the leader (`Replication`).
//! What it is made of lies below it in the folder: its Raft node and the
//! state its parts share (`node`), the loop that asks the leader
//! (`leader_call`), and the parts that work on the node (`election`,
//! `leadership`, `membership`, `leases`, `prober`, the peer service `peer`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, bail};
use openraft::{RaftMetrics, SnapshotPolicy};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::election::{campaign_when_leaderless, monitor_leader};
use super::forwarder::Forwarder;
use super::leader_call::{REQUEST_TIMEOUT, ReadIndex, Write};
use super::leadership::HandoverError;
use super::leases::LeaseCallToLeader;
use super::log_store::LogStore;
use super::member::Member;
use super::membership::{JoinRequest, Joined, MembershipChange, ask_to_join};
use super::network::{Method, Peers};
use super::node::{LeadingSince, MemberStatus, Node, clock_ns};
use super::openraft_types::Raft;
use super::peer::PeerService;
use super::prober::probe_members;
use super::proposal::{Proposal, Waiters};
use super::refusal::MembershipError;
use super::state_machine::StateMachine;
use crate::backend::Backend;
use crate::proto::ceterapb::peer_server::PeerServer;
use crate::store::request::{WriteRequest, WriteResponse};
use crate::store::{
    BoxFuture, Leadership, LeaseCall, Lessor, Replication, Store, StoreError, StoreResult,
};

/// How long a new member may take to apply the log it holds once the
/// leader promoted it, before it serves clients.
const JOIN_APPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// How this member comes to be in a cluster.
#[derive(Clone, Debug)]
pub enum JoinMode {
    /// Found one (`--cluster-init`), with this store's data.
    Init,
    /// Join the cluster whose member's peer service is at `url` (`--join`).
    Join {
        /// Peer URL of any member.
        url: String,
    },
}

/// Settings of a member.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Found or join.
    pub mode: JoinMode,
    /// The cluster token; founding without one makes one up.
    pub token: Option<String>,
    /// Where the peer service listens.
    pub peer_listen_address: SocketAddr,
    /// This member's name and addresses, as others reach it.
    pub member: Member,
    /// The replicated log's directory.
    pub log_dir: PathBuf,
    /// The replicated log's SQLite file of an older cetera, carried over
    /// into `log_dir` if found.
    pub old_log_path: PathBuf,
    /// Where a made-up token is written for the other members to use.
    pub token_path: PathBuf,
    /// Folder for snapshot files in transit.
    pub scratch: PathBuf,
    /// TLS for peer traffic, both ways, if configured.
    pub tls: Option<PeerTls>,
}

/// The certificates of mutual TLS between members (PEM).
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// This member's certificate, as server and as client.
    pub cert: Vec<u8>,
    /// Its key.
    pub key: Vec<u8>,
    /// The CA every member's certificate chains to.
    pub ca: Vec<u8>,
}

impl PeerTls {
    fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert, &self.key)
    }

    fn ca(&self) -> tonic::transport::Certificate {
        tonic::transport::Certificate::from_pem(&self.ca)
    }
}

/// This member's view of leadership and the log, for Status and headers.
#[derive(Clone, Copy, Debug, Default)]
pub struct RaftStatus {
    /// The leader's id, if there is one.
    pub leader: Option<u64>,
    /// The current term.
    pub term: u64,
    /// Index of the last entry in this member's log.
    pub last_log_index: u64,
    /// Index of the last entry applied here.
    pub applied_index: u64,
}

/// A running member of a replicated cluster.
pub struct Cluster {
    /// Its Raft node, which the peer service and the background tasks share.
    node: Arc<Node>,
    waiters: Arc<Waiters>,
    /// Sends this member's proposals to the leader while it follows.
    forwarder: Forwarder,
    /// Numbers this member's proposals; starts at the clock so that entries
    /// proposed before a restart never answer a waiter after it.
    next_seq: AtomicU64,
    peer_server: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Cluster {
    /// Starts this member on `store` and joins or founds the cluster; from
    /// then on the store's writes go through the log.
    pub async fn start<B: Backend>(
        options: ClusterOptions,
        store: Arc<Store<B>>,
    ) -> anyhow::Result<Arc<Cluster>> {
        // First, so that a port in use fails the start before anything
        // changes (a single server founding a cluster keeps serving alone).
        let peer_listener = tokio::net::TcpListener::bind(options.peer_listen_address)
            .await
            .with_context(|| {
                format!("cannot listen for peers on {}", options.peer_listen_address)
            })?;
        let log = LogStore::open(&options.log_dir, &options.old_log_path)
            .with_context(|| format!("cannot open the Raft log {}", options.log_dir.display()))?;
        let was_member = !log.is_empty();
        let token = cluster_token(&options, was_member)?;
        if matches!(options.mode, JoinMode::Join { .. }) && !was_member && holds_data(&store) {
            bail!(
                "this datastore already holds data (revision {}); a joining member starts \
                 empty and gets the cluster's data from its leader",
                store.revisions().current
            );
        }
        // Every entry is in the fsynced Raft log until a snapshot covers it:
        // the store's own commits need not sync (one fsync per write, not
        // two) and reach its file in batches, and a snapshot makes the store
        // durable before the log is purged. After a crash or a power loss
        // the store may be behind its log; Raft applies the rest again,
        // exactly once thanks to the marks.
        store.replica().defer_durability().await?;
        let listen_ip = options.peer_listen_address.ip();
        let client_tls = options.tls.as_ref().map(|tls| {
            tonic::transport::ClientTlsConfig::new()
                .identity(tls.identity())
                .ca_certificate(tls.ca())
        });
        let peers = Peers::new(
            &token,
            client_tls,
            (!listen_ip.is_unspecified()).then_some(listen_ip),
        );
        if let JoinMode::Join { url } = &options.mode
            && !was_member
        {
            // A member MemberAdd made for this peer URL: this server is it.
            let reserved: Option<u64> =
                ask_to_join(&peers, url, Method::Reserved, &options.member.peer_url).await?;
            if let Some(id) = reserved {
                store.adopt_member_id(id).await?;
            }
        }
        let id = store.identity().member_id;
        // After the id is final: the state machine answers the writes
        // proposed with it.
        let waiters = Arc::new(Waiters::default());
        let state_machine =
            StateMachine::new(store.clone(), waiters.clone(), options.scratch.clone());
        // A follower that stops hearing from its leader waits the leader's
        // lease (the longest election timeout) plus a random election timeout
        // before it stands: 0.95 to 1.2 s, so that a new leader follows a
        // crash within 2 s. openraft 0.9 also gives every AppendEntries one
        // heartbeat interval to answer, so that cannot be much shorter.
        let config = openraft::Config {
            cluster_name: "cetera".to_string(),
            heartbeat_interval: 100,
            election_timeout_min: 350,
            election_timeout_max: 600,
            // Snapshots are whole databases: chunks of 1 MiB, each with time
            // to be written on a busy member.
            snapshot_max_chunk_size: 1 << 20,
            install_snapshot_timeout: 10_000,
            // Bounded appends, so that a batch of large values still answers
            // within a heartbeat.
            max_payload_entries: 64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(10_000),
            max_in_snapshot_log_to_keep: 1000,
            // Elections follow a pre-vote of cetera's own (see `election`).
            enable_elect: false,
            ..Default::default()
        }
        .validate()?;
        let raft = Raft::new(
            id,
            Arc::new(config),
            peers.clone(),
            log.clone(),
            state_machine,
        )
        .await
        .context("cannot start Raft")?;
        // The id is final: the peer metrics count from here on.
        peers.count_as(id, raft.metrics());
        let node = Arc::new(Node::new(
            id,
            store.identity().cluster_id,
            token,
            raft,
            peers.clone(),
            log,
            Arc::downgrade(&store) as Weak<dyn Lessor>,
        ));
        let cluster = Arc::new(Cluster {
            node: node.clone(),
            waiters,
            forwarder: Forwarder::new(peers, REQUEST_TIMEOUT),
            next_seq: AtomicU64::new(clock_ns()),
            peer_server: std::sync::Mutex::new(None),
        });
        tokio::spawn(report_leadership(
            id,
            node.metrics().clone(),
            node.leading_since(),
        ));
        tokio::spawn(campaign_when_leaderless(Arc::downgrade(&node)));
        tokio::spawn(monitor_leader(Arc::downgrade(&node)));
        tokio::spawn(probe_members(Arc::downgrade(&node)));
        // From here on, no write of this member's own (lease expiry,
        // compaction) may bypass the log, even while it is still joining.
        store.replicate_through(cluster.clone());
        cluster.serve_peers(peer_listener, options.tls.as_ref())?;
        match &options.mode {
            JoinMode::Init => {
                if !node.raft().is_initialized().await? {
                    let members = BTreeMap::from([(id, options.member.clone())]);
                    node.raft().initialize(members).await?;
                    cluster.start_log_after_the_data().await?;
                    tracing::info!(member_id = format_args!("{id:x}"), "founded a cluster");
                }
            }
            JoinMode::Join { url } => {
                if !was_member {
                    let request = JoinRequest {
                        id,
                        member: options.member.clone(),
                    };
                    let joined: Joined =
                        ask_to_join(node.peers(), url, Method::Join, &request).await?;
                    node.set_cluster_id(joined.cluster_id);
                    store.replica().adopt_cluster_id(joined.cluster_id).await?;
                    node.raft()
                        .wait(Some(JOIN_APPLY_TIMEOUT))
                        .applied_index_at_least(Some(joined.caught_up_to), "caught up")
                        .await
                        .with_context(|| {
                            format!(
                                "joined, but did not apply the leader's log up to index {} \
                                 within {JOIN_APPLY_TIMEOUT:?}",
                                joined.caught_up_to
                            )
                        })?;
                    tracing::info!(
                        member_id = format_args!("{id:x}"),
                        applied = joined.caught_up_to,
                        "joined the cluster"
                    );
                }
            }
        }
        Ok(cluster)
    }

    /// The cluster id, as response headers report it.
    pub fn cluster_id(&self) -> u64 {
        self.node.cluster_id()
    }

    /// The members, voters and learners, by id.
    pub fn members(&self) -> Vec<MemberStatus> {
        self.node.members()
    }

    /// Whether the etcd API counts this member as having a leader (see
    /// `election`).
    pub fn has_leader(&self) -> bool {
        self.node.has_leader()
    }

    /// Changes each time the streams that require a leader must end for the
    /// lack of one: etcd's monitorLeader cancelling them.
    pub fn leader_lost(&self) -> watch::Receiver<u64> {
        self.node.leader_lost()
    }

    /// Adds, updates, removes or promotes a member (see `membership`).
    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), MembershipError> {
        self.node.change_membership(change).await
    }

    /// Makes `target` the leader, as etcd's MoveLeader does (see
    /// `leadership`).
    pub async fn move_leader(&self, target: u64) -> Result<(), HandoverError> {
        self.node.move_leader(target).await
    }

    /// Leader, term and log positions as this member sees them. The leader
    /// is named only while this member has one as far as the etcd API goes
    /// (`has_leader`): Raft keeps naming a leader it no longer hears from,
    /// where etcd's raft forgets it once it stands for election, an
    /// election timeout after the leader fell silent.
    pub fn status(&self) -> RaftStatus {
        let has_leader = self.node.has_leader();
        let metrics = self.node.metrics().borrow();
        RaftStatus {
            leader: metrics.current_leader.filter(|_| has_leader),
            term: metrics.current_term,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            applied_index: metrics.last_applied.map_or(0, |l| l.index),
        }
    }

    /// Stops Raft and the peer service.
    pub async fn shutdown(&self) {
        if let Err(error) = self.node.raft().shutdown().await {
            tracing::warn!("Raft did not stop cleanly: {error}");
        }
        if let Some(server) = self
            .peer_server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            server.abort();
        }
    }

    fn serve_peers(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: Option<&PeerTls>,
    ) -> anyhow::Result<()> {
        let address = listener.local_addr()?;
        let service = PeerServer::new(PeerService::new(self.node.clone()))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        // Raft messages are small writes; Nagle's algorithm would hold them back.
        let connections = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |accepted| {
                let socket = accepted?;
                socket.set_nodelay(true)?;
                Ok::<_, std::io::Error>(socket)
            },
        );
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            // Both ways: members show certificates from the same CA.
            let config = tonic::transport::ServerTlsConfig::new()
                .identity(tls.identity())
                .client_ca_root(tls.ca());
            builder = builder.tls_config(config).context("peer TLS settings")?;
        }
        let server = builder
            .add_service(service)
            .serve_with_incoming(connections);
        let task = tokio::spawn(async move {
            if let Err(error) = server.await {
                tracing::error!("peer service failed: {error}");
            }
        });
        *self.peer_server.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        tracing::info!(%address, tls = tls.is_some(), "serving peers");
        Ok(())
    }

    /// Right after founding: snapshots the store and purges the log before
    /// it, so that members joining later start from a copy of the data the
    /// store held before it was a cluster (a converted single node's keys
    /// are not in the log).
    async fn start_log_after_the_data(&self) -> anyhow::Result<()> {
        let id = self.node.id();
        let leading = self
            .node
            .raft()
            .wait(Some(Duration::from_secs(30)))
            .metrics(
                |m| m.current_leader == Some(id) && m.last_applied.is_some(),
                "the founding member leads",
            )
            .await?;
        let applied = leading.last_applied.map_or(0, |l| l.index);
        self.node.raft().trigger().snapshot().await?;
        self.node
            .raft()
            .wait(Some(Duration::from_secs(30)))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= applied),
                "the founding snapshot",
            )
            .await?;
        self.node.raft().trigger().purge_log(applied).await?;
        Ok(())
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cluster(member {:x})", self.node.id())
    }
}

impl Replication for Cluster {
    fn propose(
        &self,
        request: WriteRequest,
        at_ms: i64,
    ) -> BoxFuture<'_, StoreResult<WriteResponse>> {
        Box::pin(async move {
            if !request.is_replicated() {
                // Local housekeeping is never proposed (see Writes).
                return Err(StoreError::Internal(
                    "a local write was proposed to the cluster".to_string(),
                ));
            }
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            let proposal = Proposal {
                origin: self.node.id(),
                seq,
                at_ms,
                request,
            };
            let answer = self.waiters.wait(seq);
            let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let forwarder = &self.forwarder;
                let write = Write {
                    proposal: &proposal,
                    forwarder,
                };
                self.node.ask_leader(write).await?;
                answer.await.map_err(|_| StoreError::Stopped)?
            })
            .await;
            let outcome = outcome.unwrap_or(Err(StoreError::Timeout));
            if outcome.is_err() {
                self.waiters.forget(seq);
            }
            outcome
        })
    }

    fn read_barrier(&self) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(async move {
            tokio::time::timeout(REQUEST_TIMEOUT, self.node.ask_leader(ReadIndex))
                .await
                .unwrap_or(Err(StoreError::Timeout))
        })
    }

    fn leadership(&self) -> Option<Leadership> {
        self.node.current_leadership()
    }

    fn ask_lessor(&self, call: LeaseCall) -> BoxFuture<'_, StoreResult<Option<i64>>> {
        Box::pin(async move {
            let call = self.node.ask_leader(LeaseCallToLeader(call));
            tokio::time::timeout(REQUEST_TIMEOUT, call)
                .await
                .unwrap_or(Err(StoreError::Timeout))
        })
    }
}

/// Keeps the leader and Raft index gauges of `/metrics` in step with Raft,
/// and notes when this member begins to lead, until Raft stops.
async fn report_leadership(
    id: u64,
    mut raft: watch::Receiver<RaftMetrics<u64, Member>>,
    leading: Arc<LeadingSince>,
) {
    let metrics = crate::metrics::metrics();
    let mut known = None;
    loop {
        let (leader, term) = {
            let raft = raft.borrow_and_update();
            metrics
                .proposals_committed
                .set(raft.last_log_index.unwrap_or(0) as i64);
            metrics
                .proposals_applied
                .set(raft.last_applied.map_or(0, |l| l.index) as i64);
            (raft.current_leader, raft.current_term)
        };
        if leader == Some(id) {
            leading.note(term);
        }
        metrics.has_leader.set(leader.is_some() as i64);
        metrics.is_leader.set((leader == Some(id)) as i64);
        if leader.is_some() && leader != known {
            metrics.leader_changes.inc();
        }
        known = leader.or(known);
        if raft.changed().await.is_err() {
            return;
        }
    }
}

/// Whether a store holds anything a joining member would lose.
fn holds_data<B: Backend>(store: &Store<B>) -> bool {
    store.revisions().current > 1
}

/// The token: given, or kept from before, or (when founding) made up and
/// written down for the other members.
fn cluster_token(options: &ClusterOptions, was_member: bool) -> anyhow::Result<String> {
    if let Some(token) = &options.token {
        if token.is_empty() {
            bail!("--token must not be empty");
        }
        return Ok(token.clone());
    }
    if let Ok(token) = std::fs::read_to_string(&options.token_path) {
        return Ok(token.trim().to_string());
    }
    match options.mode {
        JoinMode::Join { .. } => bail!("--join needs the cluster's --token"),
        JoinMode::Init if was_member => bail!(
            "the cluster token file {} is gone; give the token with --token",
            options.token_path.display()
        ),
        JoinMode::Init => {
            let token = format!("{:032x}", rand::random::<u128>());
            write_private(&options.token_path, &token)?;
            tracing::info!(
                path = %options.token_path.display(),
                "made up a cluster token; other members join with --token (it is in that file)"
            );
            Ok(token)
        }
    }
}

/// Writes `text` to a new file only its owner can read.
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write the cluster token to {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    Ok(())
}
