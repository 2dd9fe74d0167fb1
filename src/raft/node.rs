//! This member's Raft node and the state the cluster's parts share: its id,
//! Raft, peers and log, and what they must agree on (who leads, whether this
//! member is handing over, the writes on their way in, when the leader was
//! last heard from). Every part of the folder under `cluster` works on a
//! `Node`: elections (`election`), handovers (`leadership`), membership
//! (`membership`), lease calls (`leases`), the peer service (`peer`). As
//! leader, a node puts writes in the log (`lead_write`) and gives read
//! indexes (`lead_read_index`); how a member has the leader do either is
//! `leader_call`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use openraft::RaftMetrics;
use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::watch;

use super::log_store::LogStore;
use super::member::Member;
use super::network::Peers;
use super::openraft_types::Raft;
use super::proposal::Proposal;
use super::proposer::Proposer;
use super::refusal::Refusal;
use crate::store::{Leadership, Lessor};

/// A member as MemberList shows it.
#[derive(Clone, Debug)]
pub struct MemberStatus {
    /// Its id.
    pub id: u64,
    /// Its addresses.
    pub member: Member,
    /// Whether it only follows the log without a vote.
    pub is_learner: bool,
}

/// A running Raft node and the state this member's parts share.
pub(super) struct Node {
    id: u64,
    cluster_id: AtomicU64,
    token: String,
    raft: Raft,
    metrics: watch::Receiver<RaftMetrics<u64, Member>>,
    peers: Peers,
    /// Puts this member's proposals in the log while it leads.
    proposer: Proposer,
    /// Held while the leader changes the membership or hands over its
    /// leadership: one change at a time.
    changing: tokio::sync::Mutex<()>,
    /// Set while the leader hands over: it takes no writes and confirms no
    /// reads meanwhile.
    handing_over: AtomicBool,
    /// Writes on their way into the log through this member as leader.
    writing: AtomicUsize,
    /// When this member last heard from a leader (see `election`).
    leader_heard: LeaderHeard,
    /// Counts the times streams that require a leader were ended for the
    /// lack of one (see `election::monitor_leader`).
    leader_streams_ended: watch::Sender<u64>,
    /// The replicated log, as openraft keeps it.
    log: LogStore,
    /// The store's lessor, which answers lease calls while this member
    /// leads (see `leases`).
    lessor: Weak<dyn Lessor>,
    /// This member's latest leadership, noted as soon as Raft reports it
    /// (see `cluster::report_leadership`): the leases' deadlines count from
    /// it.
    leading: Arc<LeadingSince>,
}

/// When this member began to lead, per term.
#[derive(Debug, Default)]
pub(super) struct LeadingSince(std::sync::Mutex<Option<Leadership>>);

impl LeadingSince {
    /// This member's leadership in `term`, begun now unless already noted.
    pub(super) fn note(&self, term: u64) -> Leadership {
        let mut leading = self.0.lock().expect("leadership poisoned");
        match *leading {
            Some(known) if known.term == term => known,
            _ => *leading.insert(Leadership {
                term,
                since_ms: (clock_ns() / 1_000_000) as i64,
            }),
        }
    }
}

/// Counts one write in `Node::writing` while it lives.
struct Writing<'a>(&'a AtomicUsize);

impl<'a> Writing<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Writing(count)
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Node {
    /// Member `id`'s node on `raft`, in the cluster `cluster_id` (0 until a
    /// joining member learns it), reaching the others through `peers`.
    pub(super) fn new(
        id: u64,
        cluster_id: u64,
        token: String,
        raft: Raft,
        peers: Peers,
        log: LogStore,
        lessor: Weak<dyn Lessor>,
    ) -> Node {
        Node {
            id,
            cluster_id: AtomicU64::new(cluster_id),
            token,
            metrics: raft.metrics(),
            proposer: Proposer::start(id, raft.clone(), peers.clone()),
            raft,
            peers,
            changing: tokio::sync::Mutex::new(()),
            handing_over: AtomicBool::new(false),
            writing: AtomicUsize::new(0),
            leader_heard: LeaderHeard::default(),
            leader_streams_ended: watch::Sender::new(0),
            log,
            lessor,
            leading: Arc::default(),
        }
    }

    /// The cluster id, as response headers report it.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id.load(Ordering::Relaxed)
    }

    /// Takes the cluster id a joining member was told.
    pub(super) fn set_cluster_id(&self, cluster_id: u64) {
        self.cluster_id.store(cluster_id, Ordering::Relaxed);
    }

    /// The Raft member.
    pub(super) fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The cluster token peers must present.
    pub(super) fn token(&self) -> &str {
        &self.token
    }

    /// This member's id.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Connections to the other members.
    pub(super) fn peers(&self) -> &Peers {
        &self.peers
    }

    /// Raft's view of this member, kept current.
    pub(super) fn metrics(&self) -> &watch::Receiver<RaftMetrics<u64, Member>> {
        &self.metrics
    }

    /// Held for a membership change or a handover.
    pub(super) fn changing(&self) -> &tokio::sync::Mutex<()> {
        &self.changing
    }

    /// While set, this member takes no writes and confirms no linearizable
    /// reads as leader (see `leadership`).
    pub(super) fn handing_over(&self) -> &AtomicBool {
        &self.handing_over
    }

    /// The store's lessor, unless the store is gone.
    pub(super) fn lessor(&self) -> Option<Arc<dyn Lessor>> {
        self.lessor.upgrade()
    }

    /// The replicated log.
    pub(super) fn log(&self) -> &LogStore {
        &self.log
    }

    /// Notes that the leader was heard from just now.
    pub(super) fn heard_from_leader(&self) {
        self.leader_heard.touch();
    }

    /// Whether the leader was heard from within `within`.
    pub(super) fn heard_from_leader_within(&self, within: Duration) -> bool {
        self.leader_heard.within(within)
    }

    /// Changes each time the streams that require a leader must end for the
    /// lack of one: etcd's monitorLeader cancelling them.
    pub fn leader_lost(&self) -> watch::Receiver<u64> {
        self.leader_streams_ended.subscribe()
    }

    /// Ends the streams that require a leader (see `leader_lost`).
    pub(super) fn end_leader_streams(&self) {
        self.leader_streams_ended.send_modify(|ended| *ended += 1);
    }

    /// Writes on their way into the log through this member as leader.
    pub(super) fn writes_in_flight(&self) -> usize {
        self.writing.load(Ordering::SeqCst)
    }

    /// Fails unless this member leads, naming the leader it knows.
    pub(super) fn check_leading(&self) -> Result<(), Refusal> {
        match self.leader() {
            Some((leader, _)) if leader == self.id => Ok(()),
            other => Err(Refusal::NotLeader(other)),
        }
    }

    /// The members, voters and learners, by id.
    pub fn members(&self) -> Vec<MemberStatus> {
        let metrics = self.metrics.borrow();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, member)| MemberStatus {
                id: *id,
                member: member.clone(),
                is_learner: !voters.contains(id),
            })
            .collect()
    }

    /// This member's leadership, if it leads.
    pub(super) fn current_leadership(&self) -> Option<Leadership> {
        let term = {
            let metrics = self.metrics.borrow();
            (metrics.current_leader == Some(self.id)).then_some(metrics.current_term)?
        };
        Some(self.leading.note(term))
    }

    /// The leader and its addresses, if this member knows one.
    pub(super) fn leader(&self) -> Option<(u64, Member)> {
        let metrics = self.metrics.borrow();
        let leader = metrics.current_leader?;
        let member = metrics
            .membership_config
            .membership()
            .get_node(&leader)?
            .clone();
        Some((leader, member))
    }

    /// As leader: puts `proposal` in the log and returns once it is applied here.
    pub(super) async fn lead_write(&self, proposal: Proposal) -> Result<(), Refusal> {
        // Counted before the handover flag is looked at: a handover sets the
        // flag and then waits for the count to drop to zero, so no write it
        // did not wait for can reach the log after it (SeqCst both ways).
        let _writing = Writing::enter(&self.writing);
        if self.handing_over.load(Ordering::SeqCst) {
            return Err(Refusal::Busy);
        }
        self.proposer.propose(proposal).await
    }

    /// As leader: the index a linearizable read must wait for.
    pub(super) async fn lead_read_index(&self) -> Result<u64, Refusal> {
        if self.handing_over.load(Ordering::Acquire) {
            return Err(Refusal::Busy);
        }
        match self.raft.get_read_log_id().await {
            Ok((read, _)) => Ok(read.map_or(0, |l| l.index)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(Refusal::NotLeader(f.leader_id.zip(f.leader_node)))
            }
            Err(error) => Err(Refusal::Failed(error.to_string())),
        }
    }

    /// When this member began to lead, for the task that notes it.
    pub(super) fn leading_since(&self) -> Arc<LeadingSince> {
        self.leading.clone()
    }
}

/// When a leader was last heard of, for `Node::heard_from_leader_within`.
#[derive(Debug)]
pub(super) struct LeaderHeard {
    since: Instant,
    /// Milliseconds after `since`, plus one; 0: never.
    at_ms: std::sync::atomic::AtomicU64,
}

impl Default for LeaderHeard {
    fn default() -> Self {
        LeaderHeard {
            since: Instant::now(),
            at_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl LeaderHeard {
    /// Now.
    pub(super) fn touch(&self) {
        let ms = self.since.elapsed().as_millis() as u64 + 1;
        self.at_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Whether a leader was heard of within `within`.
    pub(super) fn within(&self, within: Duration) -> bool {
        match self.at_ms.load(Ordering::Relaxed) {
            0 => false,
            at => {
                let now = self.since.elapsed().as_millis() as u64 + 1;
                now.saturating_sub(at) <= within.as_millis() as u64
            }
        }
    }
}

/// Nanoseconds since the Unix epoch.
pub(super) fn clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
