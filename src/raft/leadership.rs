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
//! handover wait for the new leader.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::cluster::{Cluster, REQUEST_TIMEOUT};
use super::network::{Method, PeerError};
use super::peer::Refusal;

/// How long a handover may take, as etcd's MoveLeader allows about that.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the leader waits for the transferee to win before asking again:
/// longer than a follower's lease (openraft's, the longest election timeout).
const CAMPAIGN_WAIT: Duration = Duration::from_millis(700);

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
struct Paused<'a>(&'a Cluster);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let cluster = self.0;
        cluster.raft().runtime_config().heartbeat(true);
        cluster.handing_over().store(false, Ordering::SeqCst);
    }
}

impl Cluster {
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
        let _paused = Paused(self);
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

    /// Stands for leader at once, as the leader handing over asks.
    pub(super) async fn campaign(&self) -> Result<(), Refusal> {
        self.raft()
            .trigger()
            .elect()
            .await
            .map_err(|error| Refusal::Failed(error.to_string()))
    }
}
