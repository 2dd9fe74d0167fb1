//! Lease calls in a cluster: the leader alone holds the leases' deadlines
//! (the store's `leader_leases`, etcd's lessor), so a follower forwards a
//! keep-alive or a TimeToLive's deadline to it, as etcd's followers do.
//! Neither is a write: no entry in the log, no fsync.

use std::time::{Duration, Instant};

use super::cluster::{Cluster, LEADER_WAIT, REQUEST_TIMEOUT};
use super::election::LEADER_LEASE;
use super::network::{Method, PeerError};
use super::peer::Refusal;
use crate::store::{LeaseCall, StoreError, StoreResult};

impl Cluster {
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

    /// Has the leader answer `call`: this member when it leads, else the
    /// leader over the peer network. Waits out an election for up to
    /// LEADER_WAIT; a call is safe to send again, so any failure to reach
    /// the leader is retried until then.
    pub(super) async fn lease_call(&self, call: LeaseCall) -> StoreResult<Option<i64>> {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let refusal = match self.lead_lease_call(call).await {
                Ok(answer) => return Ok(answer),
                Err(refusal) => refusal,
            };
            let refusal = match refusal {
                Refusal::NotLeader(Some((leader, member))) if leader != self.id() => {
                    let answer: Result<Result<Option<i64>, Refusal>, PeerError> = self
                        .peers()
                        .call(&member.peer_url, Method::Lease, &call, REQUEST_TIMEOUT)
                        .await;
                    match answer {
                        Ok(Ok(answer)) => return Ok(answer),
                        Ok(Err(refusal)) => refusal,
                        Err(error) => {
                            tracing::debug!("cannot ask the leader's lessor: {error}");
                            Refusal::NotLeader(None)
                        }
                    }
                }
                refusal => refusal,
            };
            match refusal {
                Refusal::NotLeader(_) | Refusal::Busy => {}
                refusal => {
                    return Err(StoreError::Internal(format!(
                        "the leader's lessor failed: {refusal:?}"
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(StoreError::NoLeader);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
