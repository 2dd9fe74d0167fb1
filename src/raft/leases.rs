//! Lease calls in a cluster: the leader alone holds the leases' deadlines
//! (the store's `leader_leases`, etcd's lessor), so a follower forwards a
//! keep-alive or a TimeToLive's deadline to it, as etcd's followers do.
//! Neither is a write: no entry in the log, no fsync.

use std::time::Instant;

use super::election::LEADER_LEASE;
use super::leader_call::{LeaderCall, REQUEST_TIMEOUT, Tried};
use super::network::Method;
use super::node::Node;
use super::peer_error::PeerError;
use super::refusal::Refusal;
use crate::store::{LeaseCall, StoreError};

impl Node {
    /// As leader: answers `call` with the store's lessor. Only while a
    /// quorum answered this leader within its lease (no other can have been
    /// elected since, so no other answers the same lease), and once it
    /// applied everything committed (etcd's waitAppliedIndex: a lease just
    /// granted through another member is known here).
    pub(super) async fn lead_lease_call(&self, call: LeaseCall) -> Result<Option<i64>, Refusal> {
        let Some(leadership) = self.current_leadership() else {
            return Err(Refusal::NotLeader(self.leader()));
        };
        if !self.leader_alive(LEADER_LEASE) {
            return Err(Refusal::NotLeader(None));
        }
        let index = self.lead_read_index().await?;
        self.raft()
            .wait(Some(REQUEST_TIMEOUT))
            .applied_index_at_least(Some(index), "lease call")
            .await
            .map_err(|error| Refusal::Failed(error.to_string()))?;
        let lessor = self
            .lessor()
            .ok_or_else(|| Refusal::Failed("the store stopped".to_string()))?;
        lessor
            .answer(leadership, call)
            .await
            .map_err(|error| Refusal::Failed(error.to_string()))
    }
}

/// A lease call, for `Node::ask_leader`. It is safe to send again, so any
/// failure to reach the leader is tried again; a lessor that fails, here
/// or at the leader, ends it.
pub(super) struct LeaseCallToLeader(pub LeaseCall);

impl LeaderCall for LeaseCallToLeader {
    type Answer = Option<i64>;

    async fn here(&self, node: &Node) -> Tried<Option<i64>> {
        match node.lead_lease_call(self.0).await {
            Ok(answer) => Tried::Over(Ok(answer)),
            Err(refusal) => lessor_refused(refusal),
        }
    }

    async fn there(&self, node: &Node, leader: &str, _: Instant) -> Tried<Option<i64>> {
        let answer: Result<Result<Option<i64>, Refusal>, PeerError> = node
            .peers()
            .call(leader, Method::Lease, &self.0, REQUEST_TIMEOUT)
            .await;
        match answer {
            Ok(Ok(answer)) => Tried::Over(Ok(answer)),
            Ok(Err(refusal)) => lessor_refused(refusal),
            Err(error) => {
                tracing::debug!("cannot ask the leader's lessor: {error}");
                Tried::Refused(Refusal::NotLeader(None))
            }
        }
    }
}

/// A lessor's refusal: no leader or not now is tried again; anything else
/// is the lessor failing.
fn lessor_refused(refusal: Refusal) -> Tried<Option<i64>> {
    match refusal {
        Refusal::NotLeader(_) | Refusal::Busy => Tried::Refused(refusal),
        refusal => Tried::Over(Err(StoreError::Internal(format!(
            "the leader's lessor failed: {refusal:?}"
        )))),
    }
}
