//! Who is in the cluster: a new member joining with `--join`, and etcd's
//! MemberAdd, MemberUpdate, MemberRemove and MemberPromote. The leader makes
//! every change, one at a time, with etcd's rules; other members forward the
//! etcd calls to it.
//!
//! MemberAdd reserves an id for a peer URL, as etcd does: the member appears
//! in MemberList without a name or client URLs, and the server started later
//! with `--join` and that peer URL takes the reserved id.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::bail;
use openraft::ChangeMembers;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::leader_call::{LEADER_WAIT, REQUEST_TIMEOUT};
use super::member::Member;
use super::network::{Method, Peers};
use super::node::{MemberStatus, Node};
use super::peer_error::PeerError;
use super::refusal::{MembershipError, Refusal, refusal_of};

/// How long a new member keeps asking to join.
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);
/// The leader gives up on a joining member whose peer service has answered
/// nothing for this long while it catches up.
const CATCH_UP_SILENCE: Duration = Duration::from_secs(10);
/// The longest a joining member may take to catch up with the leader.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(600);
/// How long a joining member waits for the leader's answer to its join.
const JOIN_CALL_TIMEOUT: Duration = Duration::from_secs(660);
/// How long a member waits to see a change the leader made for it.
const MEMBERSHIP_SEEN: Duration = Duration::from_secs(2);
/// etcd keeps at most this many learners (its MaxLearners).
const MAX_LEARNERS: usize = 1;
/// etcd promotes a learner once it holds this share of the leader's log.
const LEARNER_READY: f64 = 0.9;

/// A membership change asked through the etcd Cluster service.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MembershipChange {
    /// MemberAdd: a member that has not started yet, with the id chosen for
    /// it, reached at `peer_url`.
    Add {
        /// Its id.
        id: u64,
        /// Where the other members will reach it.
        peer_url: String,
        /// Whether it joins as a learner rather than a voter.
        learner: bool,
    },
    /// MemberUpdate: the member is now reached at `peer_url`.
    Update {
        /// The member.
        id: u64,
        /// Its new peer URL.
        peer_url: String,
    },
    /// MemberRemove: the member leaves the cluster.
    Remove(u64),
    /// MemberPromote: the learner becomes a voter.
    Promote(u64),
}

/// A member asking to join.
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinRequest {
    /// Its id (its etcd member id).
    pub id: u64,
    /// Its addresses.
    pub member: Member,
}

/// The answer to a join.
#[derive(Debug, Serialize, Deserialize)]
pub struct Joined {
    /// The cluster's id, which the new member reports from now on.
    pub cluster_id: u64,
    /// The index of the leader's log the new member held when it was
    /// promoted: it serves clients once it has applied that much.
    pub caught_up_to: u64,
}

impl MemberStatus {
    /// Whether a server has ever run as this member: MemberAdd reserves a
    /// member without a name or client URLs, as etcd shows one.
    fn started(&self) -> bool {
        !(self.member.name.is_empty() && self.member.client_urls.is_empty())
    }
}

impl Node {
    /// Adds, updates, removes or promotes a member: here when leading, else
    /// through the leader. Waits out an election or another change for up to
    /// LEADER_WAIT.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), MembershipError> {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let refusal = match self.lead_membership_change(&change).await {
                Ok(()) => {
                    self.see(&change).await;
                    return Ok(());
                }
                Err(Refusal::NotLeader(Some((leader, member)))) if leader != self.id() => {
                    let answer: Result<Result<(), Refusal>, PeerError> = self
                        .peers()
                        .call(
                            &member.peer_url,
                            Method::ChangeMembers,
                            &change,
                            REQUEST_TIMEOUT,
                        )
                        .await;
                    match answer {
                        Ok(Ok(())) => {
                            self.see(&change).await;
                            return Ok(());
                        }
                        Ok(Err(refusal)) => refusal,
                        Err(PeerError::Unreachable { .. }) => Refusal::NotLeader(None),
                        Err(error) => return Err(MembershipError::Failed(error.to_string())),
                    }
                }
                Err(refusal) => refusal,
            };
            match refusal {
                Refusal::Membership(error) => return Err(error),
                Refusal::Failed(message) => return Err(MembershipError::Failed(message)),
                Refusal::NotLeader(_) | Refusal::Busy => {}
            }
            if Instant::now() > deadline {
                return Err(MembershipError::NoLeader);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits a moment until this member's membership shows `change`, so that
    /// the members a response lists include it, as etcd's do.
    async fn see(&self, change: &MembershipChange) {
        let shows = |m: &openraft::RaftMetrics<u64, Member>| {
            let membership = m.membership_config.membership();
            match change {
                MembershipChange::Add { id, .. } => membership.get_node(id).is_some(),
                MembershipChange::Update { id, peer_url } => membership
                    .get_node(id)
                    .is_some_and(|member| member.peer_url == *peer_url),
                MembershipChange::Remove(id) => membership.get_node(id).is_none(),
                MembershipChange::Promote(id) => membership.voter_ids().any(|voter| voter == *id),
            }
        };
        let shown = self
            .raft()
            .wait(Some(MEMBERSHIP_SEEN))
            .metrics(shows, "the changed membership")
            .await;
        if shown.is_err() {
            tracing::warn!(?change, "the membership change is not visible here yet");
        }
    }

    /// As leader: makes a change asked through the etcd API, checking etcd's
    /// rules first.
    pub(super) async fn lead_membership_change(
        &self,
        change: &MembershipChange,
    ) -> Result<(), Refusal> {
        let _changing = self.changing().lock().await;
        self.check_leading()?;
        let members = self.members();
        let find = |id: u64| {
            members
                .iter()
                .find(|m| m.id == id)
                .ok_or(Refusal::Membership(MembershipError::NotFound))
        };
        let url_taken = |url: &str, by_other_than: Option<u64>| {
            members
                .iter()
                .any(|m| m.member.peer_url == url && Some(m.id) != by_other_than)
        };
        let change = match change {
            MembershipChange::Add {
                id,
                peer_url,
                learner,
            } => {
                if url_taken(peer_url, None) {
                    return Err(Refusal::Membership(MembershipError::PeerUrlExists));
                }
                let reserved = BTreeMap::from([(
                    *id,
                    Member {
                        name: String::new(),
                        peer_url: peer_url.clone(),
                        client_urls: Vec::new(),
                    },
                )]);
                if !learner {
                    ChangeMembers::AddVoters(reserved)
                } else if members.iter().filter(|m| m.is_learner).count() >= MAX_LEARNERS {
                    return Err(Refusal::Membership(MembershipError::TooManyLearners));
                } else {
                    ChangeMembers::AddNodes(reserved)
                }
            }
            MembershipChange::Update { id, peer_url } => {
                let mut member = find(*id)?.member.clone();
                if url_taken(peer_url, Some(*id)) {
                    return Err(Refusal::Membership(MembershipError::PeerUrlExists));
                }
                member.peer_url = peer_url.clone();
                ChangeMembers::SetNodes(BTreeMap::from([(*id, member)]))
            }
            MembershipChange::Remove(id) => {
                let ids = BTreeSet::from([*id]);
                if find(*id)?.is_learner {
                    ChangeMembers::RemoveNodes(ids)
                } else {
                    ChangeMembers::RemoveVoters(ids)
                }
            }
            MembershipChange::Promote(id) => {
                if !find(*id)?.is_learner {
                    return Err(Refusal::Membership(MembershipError::NotLearner));
                }
                if !self.in_sync(*id) {
                    return Err(Refusal::Membership(MembershipError::LearnerNotReady));
                }
                ChangeMembers::AddVoterIds(BTreeSet::from([*id]))
            }
        };
        tracing::info!(?change, "changing the membership");
        self.apply_membership(change).await
    }

    /// As leader: adds a server that asked to join. One that MemberAdd
    /// reserved keeps the role it was given and gains its name and client
    /// URLs; any other becomes a learner until it has caught up, then a voter.
    pub(super) async fn lead_join(&self, join: JoinRequest) -> Result<Joined, Refusal> {
        let _changing = self.changing().lock().await;
        self.check_leading()?;
        let members = self.members();
        let known = members.iter().find(|m| m.id == join.id);
        if let Some(other) = members
            .iter()
            .find(|m| m.member.peer_url == join.member.peer_url && m.id != join.id)
        {
            return Err(Refusal::Failed(format!(
                "peer URL {} belongs to member {:x}",
                join.member.peer_url, other.id
            )));
        }
        let joined = Joined {
            cluster_id: self.cluster_id(),
            caught_up_to: 0,
        };
        tracing::info!(member_id = format_args!("{:x}", join.id), member = %join.member, "adding a member");
        if known.is_some_and(|m| !m.started()) {
            let named = BTreeMap::from([(join.id, join.member)]);
            self.apply_membership(ChangeMembers::SetNodes(named))
                .await?;
            return Ok(joined);
        }
        // Again after a retried join: adding a known learner changes nothing.
        let peer_url = join.member.peer_url.clone();
        self.raft()
            .add_learner(join.id, join.member, false)
            .await
            .map_err(refusal_of)?;
        // A voter must hold the log: promoted before it does, it would count
        // towards every quorum while it can confirm nothing.
        let caught_up = match self.catch_up(join.id, &peer_url).await {
            Ok(index) => index,
            Err(reason) => {
                tracing::warn!(
                    member_id = format_args!("{:x}", join.id),
                    "{reason}; removing it"
                );
                let ids = BTreeSet::from([join.id]);
                if let Err(refusal) = self.apply_membership(ChangeMembers::RemoveNodes(ids)).await {
                    tracing::warn!("cannot remove the learner that did not catch up: {refusal:?}");
                }
                return Err(Refusal::Failed(reason));
            }
        };
        self.apply_membership(ChangeMembers::AddVoterIds(BTreeSet::from([join.id])))
            .await?;
        Ok(Joined {
            caught_up_to: caught_up,
            ..joined
        })
    }

    /// As leader: waits until the learner `id` holds this member's log as it
    /// is now (a snapshot installed, or entries appended) and returns that
    /// index; fails when the learner's peer service at `peer_url` stops
    /// answering for CATCH_UP_SILENCE or catching up takes CATCH_UP_LIMIT.
    async fn catch_up(&self, id: u64, peer_url: &str) -> Result<u64, String> {
        let started = Instant::now();
        let target = self.metrics().borrow().last_log_index.unwrap_or(0);
        let holds = |m: &openraft::RaftMetrics<u64, Member>| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).copied().flatten())
                .map_or(0, |log_id| log_id.index)
        };
        loop {
            let waited = self
                .raft()
                .wait(Some(Duration::from_millis(500)))
                .metrics(|m| holds(m) >= target, "the new member holds the log")
                .await;
            if waited.is_ok() {
                tracing::info!(
                    member_id = format_args!("{id:x}"),
                    index = target,
                    "the new member caught up"
                );
                return Ok(target);
            }
            self.check_leading()
                .map_err(|_| "the leader lost its leadership while the member caught up")?;
            let held = holds(&self.metrics().borrow());
            let last_answer = self
                .peers()
                .answered_at(peer_url)
                .filter(|at| *at > started);
            let silent_since = last_answer.unwrap_or(started);
            if silent_since.elapsed() > CATCH_UP_SILENCE {
                return Err(format!(
                    "the leader could not bring this member up to date: its peer URL {peer_url} \
                     {} for {CATCH_UP_SILENCE:?} (it holds the log up to index {held} of \
                     {target}); the other members must reach this member at that URL",
                    if last_answer.is_some() {
                        "stopped answering"
                    } else {
                        "did not answer"
                    },
                ));
            }
            if started.elapsed() > CATCH_UP_LIMIT {
                return Err(format!(
                    "this member did not catch up with the leader within {CATCH_UP_LIMIT:?} (it \
                     holds the log up to index {held} of {target})"
                ));
            }
        }
    }

    /// As leader: the id MemberAdd reserved for `peer_url`, if any. A peer
    /// URL of a member that has run is not for a new server to take: that
    /// member may have voted, and a server starting empty would forget it.
    pub(super) fn lead_reserved(&self, peer_url: &str) -> Result<Option<u64>, Refusal> {
        self.check_leading()?;
        match self
            .members()
            .iter()
            .find(|m| m.member.peer_url == peer_url)
        {
            None => Ok(None),
            Some(member) if !member.started() => Ok(Some(member.id)),
            Some(member) => Err(Refusal::Failed(format!(
                "peer URL {peer_url} belongs to member {:x}, which has run already; remove it \
                 (etcdctl member remove) and add it again to start it empty",
                member.id
            ))),
        }
    }

    /// Whether the learner `id` holds etcd's share of the leader's log.
    fn in_sync(&self, id: u64) -> bool {
        let metrics = self.metrics().borrow();
        let leader_has = metrics.last_log_index.unwrap_or(0);
        let learner_has = metrics
            .replication
            .as_ref()
            .and_then(|replication| replication.get(&id).copied().flatten())
            .map_or(0, |log_id| log_id.index);
        learner_has as f64 >= leader_has as f64 * LEARNER_READY
    }

    async fn apply_membership(&self, change: ChangeMembers<u64, Member>) -> Result<(), Refusal> {
        let changed = self
            .raft()
            .change_membership(change, false)
            .await
            .map_err(refusal_of)?;
        // openraft answers once the change is applied and publishes its
        // metrics after: MemberList, which reads them, must show the change
        // once the call that made it returns, as etcd's does.
        let shown = self
            .raft()
            .wait(Some(REQUEST_TIMEOUT))
            .metrics(
                |m| *m.membership_config.log_id() >= Some(changed.log_id),
                "the membership change in the metrics",
            )
            .await;
        if let Err(error) = shown {
            tracing::warn!("the membership change is applied but not shown yet: {error}");
        }
        Ok(())
    }
}

/// Asks the member at `url`, or the leader it names, to take `request`, for
/// up to JOIN_TIMEOUT: how a new member finds its reserved id and joins.
pub(super) async fn ask_to_join<Req: Serialize, Resp: DeserializeOwned>(
    peers: &Peers,
    url: &str,
    method: Method,
    request: &Req,
) -> anyhow::Result<Resp> {
    let deadline = Instant::now() + JOIN_TIMEOUT;
    let mut url = url.to_string();
    loop {
        let call_timeout = match method {
            Method::Join => JOIN_CALL_TIMEOUT,
            _ => JOIN_TIMEOUT,
        };
        let answer: Result<Result<Resp, Refusal>, PeerError> =
            peers.call(&url, method, request, call_timeout).await;
        match answer {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(Refusal::NotLeader(Some((_, leader))))) => url = leader.peer_url,
            Ok(Err(Refusal::NotLeader(None) | Refusal::Busy)) => {}
            Ok(Err(Refusal::Failed(message))) => {
                bail!("the cluster refused to add this member: {message}")
            }
            Ok(Err(refusal)) => bail!("the cluster refused to add this member: {refusal:?}"),
            Err(PeerError::Refused { status, .. }) => {
                bail!("{url} refused to add this member: {}", status.message())
            }
            Err(error) => tracing::warn!("cannot join yet: {error}"),
        }
        if Instant::now() > deadline {
            bail!("could not join the cluster at {url} within {JOIN_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
