//! Asking the leader: the one loop (`Node::ask_leader`) by which a member
//! has the leader do something for it, here when it leads, else over the
//! peer network, waiting out an election for up to LEADER_WAIT. Writes
//! (`Write`), linearizable reads (`ReadIndex`) and lease calls
//! (`leases::LeaseCallToLeader`) go through it; each says what its tries
//! come to (`LeaderCall`), for what may be sent again differs: a write that
//! may have been applied must not be, a read index and a lease call always
//! may.

use std::time::{Duration, Instant};

use openraft::error::{CheckIsLeaderError, RaftError};

use super::forwarder::Forwarder;
use super::network::Method;
use super::node::Node;
use super::peer_error::PeerError;
use super::proposal::Proposal;
use super::refusal::Refusal;
use crate::store::{StoreError, StoreResult};

/// How long a write or a linearizable read may take before it fails with
/// etcd's "request timed out".
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits for an election to end before "no leader".
pub(super) const LEADER_WAIT: Duration = Duration::from_secs(3);
/// The pause between two tries.
const PAUSE: Duration = Duration::from_millis(50);

/// What became of one try of a call.
pub(super) enum Tried<T> {
    /// The call is over: answered, or failed for good.
    Over(StoreResult<T>),
    /// Not taken: tried here, `NotLeader` naming another member sends the
    /// call to it; anything else is tried again after a pause, as is any
    /// refusal from the leader.
    Refused(Refusal),
}

/// Something a member has the leader do, with its own rules of what each
/// try comes to.
pub(super) trait LeaderCall {
    /// The leader's answer.
    type Answer;

    /// Tries the call on this member, as leader.
    async fn here(&self, node: &Node) -> Tried<Self::Answer>;

    /// Sends the call to the leader at peer URL `leader`; the whole call
    /// gives up on a leader at `deadline`.
    async fn there(&self, node: &Node, leader: &str, deadline: Instant) -> Tried<Self::Answer>;
}

impl Node {
    /// Has the leader do `call`: this member when it leads, else the leader
    /// it knows. Waits out an election for up to LEADER_WAIT, trying again
    /// as `call` says, then fails with "no leader".
    pub(super) async fn ask_leader<C: LeaderCall>(&self, call: C) -> StoreResult<C::Answer> {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let refusal = match call.here(self).await {
                Tried::Over(outcome) => return outcome,
                Tried::Refused(refusal) => refusal,
            };
            if let Refusal::NotLeader(Some((leader, member))) = refusal
                && leader != self.id()
                && let Tried::Over(outcome) = call.there(self, &member.peer_url, deadline).await
            {
                return outcome;
            }
            if Instant::now() > deadline {
                return Err(StoreError::NoLeader);
            }
            tokio::time::sleep(PAUSE).await;
        }
    }
}

/// A write: `proposal` into the log, through `forwarder` when another
/// member leads. Sent again only when it surely did not reach the leader:
/// one that may have been applied would apply twice.
pub(super) struct Write<'a> {
    /// The write.
    pub proposal: &'a Proposal,
    /// How it reaches the leader from a follower.
    pub forwarder: &'a Forwarder,
}

impl LeaderCall for Write<'_> {
    type Answer = ();

    /// Raft names another leader: straight to it (if it no longer leads,
    /// it says so, and the next try asks Raft here).
    async fn here(&self, node: &Node) -> Tried<()> {
        if let Some((leader, member)) = node.leader()
            && leader != node.id()
        {
            return Tried::Refused(Refusal::NotLeader(Some((leader, member))));
        }
        match node.lead_write(self.proposal.clone()).await {
            Ok(()) => Tried::Over(Ok(())),
            Err(refusal @ (Refusal::NotLeader(_) | Refusal::Busy)) => Tried::Refused(refusal),
            // This member's Raft failed: it is stopping.
            Err(refusal) => {
                tracing::warn!("cannot propose a write: {refusal:?}");
                Tried::Over(Err(StoreError::Stopped))
            }
        }
    }

    async fn there(&self, _: &Node, leader: &str, deadline: Instant) -> Tried<()> {
        match self.forwarder.forward(leader, self.proposal.clone()).await {
            Ok(Ok(())) => Tried::Over(Ok(())),
            Ok(Err(refusal @ (Refusal::NotLeader(_) | Refusal::Busy))) => Tried::Refused(refusal),
            Ok(Err(refusal)) => {
                // The leader's Raft failed (it is stopping): a new leader
                // takes over, as after a change.
                tracing::warn!("the leader refused a forwarded write: {refusal:?}");
                Tried::Over(Err(StoreError::LeaderChanged))
            }
            // Not delivered: safe to send again.
            Err(PeerError::Unreachable { .. }) if Instant::now() < deadline => {
                Tried::Refused(Refusal::NotLeader(None))
            }
            // Maybe applied: sending it again could apply it twice.
            Err(PeerError::TimedOut { .. }) => Tried::Over(Err(StoreError::Timeout)),
            Err(error) => {
                tracing::warn!("cannot forward a write to the leader: {error}");
                Tried::Over(Err(StoreError::NoLeader))
            }
        }
    }
}

/// A linearizable read's wait: until this member has applied everything
/// committed before now. The leader confirms its leadership (here) or
/// gives its read index (there); asking again is always safe.
pub(super) struct ReadIndex;

impl LeaderCall for ReadIndex {
    type Answer = ();

    async fn here(&self, node: &Node) -> Tried<()> {
        if node
            .handing_over()
            .load(std::sync::atomic::Ordering::Acquire)
        {
            // Confirming leadership would renew the followers' leases,
            // which the handover waits out (see `leadership`).
            return Tried::Refused(Refusal::Busy);
        }
        match node.raft().ensure_linearizable().await {
            Ok(_) => Tried::Over(Ok(())),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Tried::Refused(Refusal::NotLeader(f.leader_id.zip(f.leader_node)))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                Tried::Refused(Refusal::NotLeader(None))
            }
            Err(RaftError::Fatal(_)) => Tried::Over(Err(StoreError::Stopped)),
        }
    }

    async fn there(&self, node: &Node, leader: &str, _: Instant) -> Tried<()> {
        let answer: Result<Result<u64, Refusal>, PeerError> = node
            .peers()
            .call(leader, Method::ReadIndex, &(), REQUEST_TIMEOUT)
            .await;
        match answer {
            Ok(Ok(index)) => Tried::Over(
                node.raft()
                    .wait(Some(REQUEST_TIMEOUT))
                    .applied_index_at_least(Some(index), "read index")
                    .await
                    .map(|_| ())
                    .map_err(|_| StoreError::Timeout),
            ),
            Ok(Err(refusal)) => Tried::Refused(refusal),
            Err(_) => Tried::Refused(Refusal::NotLeader(None)),
        }
    }
}
