//! Handing leadership to another member: etcd's MoveLeader.
//!
//! openraft 0.9 has no leadership transfer, so the leader builds one from
//! what it has. It stops taking writes, confirming linearizable reads and
//! sending heartbeats (all of which renew the followers' leases), waits
//! until the transferee holds its whole log, and asks it to stand. A
//! leader's own vote ages past its lease (the longest election timeout)
//! after its election, so usually it grants the transferee's vote at once
//! and steps down. Otherwise, or in a larger cluster, the leader asks again
//! once the followers' leases, no longer renewed, have run out. The old
//! leader does not stand meanwhile; writes and reads sent during the
//! handover wait for the new leader. Its silence must not look like a
//! failure to the other voters, or one of them would stand after a pre-vote
//! (see `election`) and win the election meant for the transferee: so the
//! leader tells them it is handing over, `NOTICE_INTERVAL` apart, which
//! keeps their pre-votes quiet without renewing openraft's leases.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::leader_call::REQUEST_TIMEOUT;
use super::network::Method;
use super::node::Node;
use super::peer_error::PeerError;
use super::refusal::Refusal;

/// How long a handover may take, as etcd's MoveLeader allows about that.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the leader waits for the transferee to win before asking again:
/// longer than a follower's lease (openraft's, the longest election timeout).
const CAMPAIGN_WAIT: Duration = Duration::from_millis(700);
/// How often the leader tells the other voters it is handing over: well
/// within their lease on it (`election::LEADER_LEASE`).
const NOTICE_INTERVAL: Duration = Duration::from_millis(150);

/// Why MoveLeader failed.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// etcd's ErrNotLeader: MoveLeader goes to the leader.
    #[error("not leader")]
    NotLeader,
    /// etcd's ErrBadLeaderTransferee: no voter has that id.
    #[error("bad leader transferee")]
    BadTransferee,
    /// etcd's ErrTimeoutLeaderTransfer.
    #[error("request timed out, leader transfer took too long")]
    TimedOut,
}

/// Undoes a handover's pause however it ends.
struct Paused<'a> {
    node: &'a Node,
    notices: tokio::task::JoinHandle<()>,
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.notices.abort();
        self.node.raft().runtime_config().heartbeat(true);
        self.node.handing_over().store(false, Ordering::SeqCst);
    }
}

impl Node {
    /// As leader: makes `target` the leader, as etcd's MoveLeader does, and
    /// returns once it leads.
    pub async fn move_leader(&self, target: u64) -> Result<(), HandoverError> {
        let _changing = self.changing().lock().await;
        if self.check_leading().is_err() {
            return Err(HandoverError::NotLeader);
        }
        if target == self.id() {
            return Ok(());
        }
        let transferee = self
            .members()
            .into_iter()
            .find(|m| m.id == target && !m.is_learner)
            .ok_or(HandoverError::BadTransferee)?;
        tracing::info!(to = %transferee.member, "handing over leadership");
        let deadline = Instant::now() + HANDOVER_TIMEOUT;
        self.handing_over().store(true, Ordering::SeqCst);
        self.raft().runtime_config().heartbeat(false);
        let _paused = Paused {
            node: self,
            notices: tokio::spawn(self.notify_handover()),
        };
        // A write already on its way would lengthen the log after the
        // transferee caught up, and the transferee would lose the vote.
        while self.writes_in_flight() > 0 {
            if Instant::now() > deadline {
                return Err(HandoverError::TimedOut);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.raft()
            .wait(Some(deadline.saturating_duration_since(Instant::now())))
            .metrics(
                |m| {
                    let matched = m.replication.as_ref().and_then(|r| r.get(&target).copied());
                    matched.flatten().map(|l| l.index) == m.last_log_index
                },
                "the transferee holds the whole log",
            )
            .await
            .map_err(|_| HandoverError::TimedOut)?;
        loop {
            let asked: Result<Result<(), Refusal>, PeerError> = self
                .peers()
                .call(
                    &transferee.member.peer_url,
                    Method::Campaign,
                    &(),
                    REQUEST_TIMEOUT,
                )
                .await;
            if let Err(error) = asked {
                tracing::warn!("cannot ask {} to stand: {error}", transferee.member);
            }
            let won = self
                .raft()
                .wait(Some(CAMPAIGN_WAIT))
                .metrics(|m| m.current_leader == Some(target), "the transferee leads")
                .await;
            if won.is_ok() {
                tracing::info!(to = %transferee.member, "handed over leadership");
                return Ok(());
            }
            // Another member won the election this handover caused.
            let leader = self.metrics().borrow().current_leader;
            if leader.is_some_and(|l| l != self.id() && l != target) {
                return Err(HandoverError::TimedOut);
            }
            if Instant::now() > deadline {
                return Err(HandoverError::TimedOut);
            }
        }
    }

    /// Tells the other voters, `NOTICE_INTERVAL` apart until aborted, that
    /// this leader is alive and handing over.
    fn notify_handover(&self) -> impl std::future::Future<Output = ()> + 'static {
        let (peers, leader) = (self.peers().clone(), self.id());
        let voters: Vec<String> = self
            .members()
            .into_iter()
            .filter(|m| !m.is_learner && m.id != leader)
            .map(|m| m.member.peer_url)
            .collect();
        async move {
            loop {
                for url in &voters {
                    let peers = peers.clone();
                    let url = url.clone();
                    tokio::spawn(async move {
                        let told: Result<(), PeerError> = peers
                            .call(&url, Method::HandingOver, &leader, NOTICE_INTERVAL)
                            .await;
                        if let Err(error) = told {
                            tracing::debug!("cannot tell {url} of the handover: {error}");
                        }
                    });
                }
                tokio::time::sleep(NOTICE_INTERVAL).await;
            }
        }
    }

    /// Takes the leader's notice that it is handing over as word from it:
    /// this member then neither stands nor grants a pre-vote meanwhile.
    pub(super) fn hear_handover(&self, leader: u64) {
        if self.metrics().borrow().current_leader == Some(leader) {
            self.heard_from_leader();
        }
    }

    /// Stands for leader at once, as the leader handing over asks.
    pub(super) async fn campaign(&self) -> Result<(), Refusal> {
        self.raft()
            .trigger()
            .elect()
            .await
            .map_err(|error| Refusal::Failed(error.to_string()))
    }
}
