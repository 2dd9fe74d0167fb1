//! When a member stands for leader, and when it counts as having none.
//!
//! openraft 0.9 has no pre-vote: a follower whose leader falls silent raises
//! its term and stands at once. Cut off from the others it keeps doing so,
//! and when it comes back its higher term unseats the leader, which was
//! alive all along (the cluster stalls for an election). etcd runs Raft with
//! pre-vote; cetera builds it on openraft: openraft's own elections are off
//! (`enable_elect = false`) and `campaign_when_leaderless` stands for this
//! member only after a majority of the voters said they would vote for it,
//! which a voter does only when its own leader is silent too and the
//! asker's log is at least as long as its own. A member cut off from the
//! others is told nothing, so it never raises its term.
//!
//! The same silence tells the etcd API that a member has no leader: watches
//! and keep-alives that require one (etcd's `hasleader` metadata) end after
//! `NO_LEADER_CHECKS` checks, one election timeout apart, without a leader
//! (`monitor_leader`), as etcd's monitorLeader ends them.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::network::Method;
use super::node::Node;
use super::openraft_types::LogId;
use super::peer_error::PeerError;

/// A follower's lease on its leader: it votes for no one else while it heard
/// from its leader this recently (openraft's leader lease, the longest
/// election timeout).
pub(super) const LEADER_LEASE: Duration = Duration::from_millis(600);
/// A member stands after its leader was silent this long (the lease) and a
/// random election timeout more.
const ELECTION_TIMEOUT: std::ops::Range<u64> = 350..600;
/// How long a member waits for another's answer to a pre-vote.
const PRE_VOTE_TIMEOUT: Duration = Duration::from_millis(300);
/// etcd's election timeout (1 s by default): a member that has not heard
/// from a leader for this long has none, as far as the etcd API goes.
pub(super) const NO_LEADER_AFTER: Duration = Duration::from_secs(1);
/// etcd's maxNoLeaderCnt: streams that require a leader end after this many
/// checks in a row, NO_LEADER_AFTER apart, found none.
const NO_LEADER_CHECKS: u32 = 3;

/// A pre-vote: would the member vote for `candidate`, whose log ends at
/// `last_log_id`?
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PreVote {
    /// The member asking.
    pub candidate: u64,
    /// Where its log ends.
    pub last_log_id: Option<LogId>,
}

impl Node {
    /// Answers a pre-vote: yes when this member's leader is silent (or it
    /// leads without a quorum's recent answer) and the asker's log is as
    /// long as this member's.
    pub(super) async fn answer_pre_vote(&self, pre_vote: PreVote) -> bool {
        if self.leader_alive(LEADER_LEASE) {
            return false;
        }
        pre_vote.last_log_id >= self.last_log_id().await
    }

    /// Where this member's log ends.
    async fn last_log_id(&self) -> Option<LogId> {
        let mut log = self.log().clone();
        match log.get_log_state().await {
            Ok(state) => state.last_log_id,
            Err(error) => {
                tracing::warn!("cannot read the Raft log's state: {error}");
                None
            }
        }
    }

    /// Whether this member leads with a quorum's answer within `within` (or
    /// is handing over), or follows a leader it heard from within `within`.
    pub(super) fn leader_alive(&self, within: Duration) -> bool {
        let metrics = self.metrics().borrow();
        match metrics.current_leader {
            None => false,
            // A leader handing over sends no heartbeats, so hears no acks.
            Some(leader) if leader == self.id() => {
                self.handing_over().load(Ordering::SeqCst)
                    || metrics
                        .millis_since_quorum_ack
                        .is_some_and(|ms| Duration::from_millis(ms) <= within)
            }
            Some(_) => self.heard_from_leader_within(within),
        }
    }

    /// Whether the etcd API counts this member as having a leader: it leads,
    /// or heard from its leader within etcd's election timeout.
    pub fn has_leader(&self) -> bool {
        self.leader_alive(NO_LEADER_AFTER)
    }

    /// Asks the other voters whether they would vote for this member, and
    /// whether a majority of all voters (this one included) would.
    async fn majority_would_vote(&self) -> bool {
        let voters: Vec<_> = self
            .members()
            .into_iter()
            .filter(|m| !m.is_learner && m.id != self.id())
            .collect();
        let all_voters = voters.len() + 1;
        let needed = all_voters / 2 + 1;
        let pre_vote = PreVote {
            candidate: self.id(),
            last_log_id: self.last_log_id().await,
        };
        let mut asked = tokio::task::JoinSet::new();
        for voter in voters {
            let peers = self.peers().clone();
            let pre_vote = pre_vote.clone();
            asked.spawn(async move {
                let answer: Result<bool, PeerError> = peers
                    .call(
                        &voter.member.peer_url,
                        Method::PreVote,
                        &pre_vote,
                        PRE_VOTE_TIMEOUT,
                    )
                    .await;
                answer.ok()
            });
        }
        let mut granted = 1;
        while let Some(answer) = asked.join_next().await {
            if matches!(answer, Ok(Some(true))) {
                granted += 1;
                if granted >= needed {
                    return true;
                }
            }
        }
        granted >= needed
    }
}

/// Stands for leader, after a pre-vote, whenever this voter's leader has
/// been silent for its lease and an election timeout; ends with Raft.
pub(super) async fn campaign_when_leaderless(node: Weak<Node>) {
    loop {
        let timeout = rand::rng().random_range(ELECTION_TIMEOUT);
        tokio::time::sleep(Duration::from_millis(timeout)).await;
        let Some(node) = node.upgrade() else {
            return;
        };
        if node.metrics().borrow().running_state.is_err() {
            return;
        }
        if node.check_leading().is_ok() || node.handing_over().load(Ordering::SeqCst) {
            // A leader hears from itself; once it steps down, its silence
            // counts from then.
            node.heard_from_leader();
            continue;
        }
        let voter = node
            .members()
            .iter()
            .any(|m| m.id == node.id() && !m.is_learner);
        if !voter || node.heard_from_leader_within(LEADER_LEASE) {
            continue;
        }
        if !node.majority_would_vote().await {
            tracing::debug!("no leader, and no majority would vote for this member");
            continue;
        }
        tracing::info!("no leader: standing for election");
        if let Err(error) = node.raft().trigger().elect().await {
            tracing::warn!("cannot stand for election: {error}");
        }
    }
}

/// Ends the streams that require a leader (see `Node::leader_lost`) each
/// time NO_LEADER_CHECKS checks in a row found none, as etcd's monitorLeader
/// does; ends with Raft.
pub(super) async fn monitor_leader(node: Weak<Node>) {
    let mut leaderless_checks = 0;
    loop {
        tokio::time::sleep(NO_LEADER_AFTER).await;
        let Some(node) = node.upgrade() else {
            return;
        };
        if node.metrics().borrow().running_state.is_err() {
            return;
        }
        let in_a_cluster = node.members().iter().any(|m| m.id == node.id());
        let has_leader = node.has_leader();
        // etcd_server_has_leader follows too: Raft's own view, which the
        // gauge follows on each change, keeps a leader that fell silent.
        if in_a_cluster {
            crate::metrics::metrics()
                .has_leader
                .set(i64::from(has_leader));
        }
        if has_leader || !in_a_cluster {
            leaderless_checks = 0;
            continue;
        }
        leaderless_checks += 1;
        if leaderless_checks >= NO_LEADER_CHECKS {
            if leaderless_checks == NO_LEADER_CHECKS {
                tracing::warn!(
                    "no leader for {NO_LEADER_CHECKS} election timeouts: ending the streams that \
                     require one"
                );
            }
            node.end_leader_streams();
        }
    }
}
