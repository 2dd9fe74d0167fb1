//! Why the leader did not do what a member asked (`Refusal`): the answer
//! of cetera's own peer calls when they are not done, and, for a membership
//! change, the rule of etcd's it broke (`MembershipError`).

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};

use super::member::Member;

/// Why the leader did not do what a member asked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Refusal {
    /// This member does not lead; the leader, if it knows one.
    NotLeader(Option<(u64, Member)>),
    /// Another membership change is under way: ask again.
    Busy,
    /// A membership change breaks one of etcd's rules.
    Membership(MembershipError),
    /// It failed.
    Failed(String),
}

/// Why a membership change through the etcd API failed.
#[derive(Clone, Debug, thiserror::Error, Serialize, Deserialize)]
pub enum MembershipError {
    /// etcd's ErrMemberNotFound.
    #[error("member not found")]
    NotFound,
    /// etcd's ErrMemberNotLearner.
    #[error("can only promote a learner member")]
    NotLearner,
    /// etcd's ErrLearnerNotReady.
    #[error("can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    /// etcd's ErrPeerURLexists.
    #[error("Peer URLs already exists")]
    PeerUrlExists,
    /// etcd's ErrTooManyLearners.
    #[error("too many learner members in cluster")]
    TooManyLearners,
    /// No leader to make the change.
    #[error("no leader")]
    NoLeader,
    /// The change failed.
    #[error("{0}")]
    Failed(String),
}

/// A failed client write or membership change, as the member that asked
/// sees it.
pub(super) fn refusal_of(error: RaftError<u64, ClientWriteError<u64, Member>>) -> Refusal {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            Refusal::NotLeader(f.leader_id.zip(f.leader_node))
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_),
        )) => Refusal::Busy,
        error => Refusal::Failed(error.to_string()),
    }
}
