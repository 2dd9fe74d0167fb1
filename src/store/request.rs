//! The write requests of the store and their answers: what the writer
//! applies (`writer`), what a raised alarm may refuse (`alarm`), what lease
//! keep-alives answered from memory look at (`lease_deadlines`), what auth
//! computes (`AuthWrite`) and what a cluster puts in its replicated log
//! (`crate::raft`). The types alone, so that all of these import them
//! downward.

use tokio::sync::oneshot;

use super::error::StoreResult;
use crate::backend::{AlarmRow, AuthKind};
use crate::proto::etcdserverpb::{
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseRevokeResponse, PutRequest, PutResponse,
    TxnRequest, TxnResponse,
};

/// A write request for the writer.
pub enum WriteRequest {
    /// etcd Put.
    Put(PutRequest),
    /// etcd DeleteRange.
    DeleteRange(DeleteRangeRequest),
    /// etcd Txn.
    Txn(TxnRequest),
    /// etcd LeaseGrant.
    LeaseGrant(LeaseGrantRequest),
    /// etcd LeaseRevoke.
    LeaseRevoke(i64),
    /// One etcd LeaseKeepAlive request.
    LeaseKeepAlive(i64),
    /// Revoke a lease whose deadline passed (unless it was kept alive meanwhile).
    LeaseExpire(i64),
    /// etcd Compact: move the compact revision (the history goes later).
    Compact(i64),
    /// Remove the next stretch of history below the compact revision.
    CompactStep,
    /// etcd Alarm ACTIVATE or DEACTIVATE.
    Alarm {
        /// Raise or disarm.
        change: AlarmChange,
        /// The member the alarm is for.
        member_id: u64,
        /// etcdserverpb.AlarmType number.
        alarm: i32,
    },
    /// etcd Downgrade ENABLE or CANCEL: the stored downgrade target becomes
    /// `target` (see `settings::DOWNGRADE_TARGET`) if it is still `expected`.
    Downgrade {
        /// The target the change was decided on.
        expected: i64,
        /// The target after it.
        target: i64,
    },
    /// A change of users, roles or the auth switch, as `crate::auth`
    /// computed it; made only if the auth state is still as it was read.
    Auth(AuthWrite),
    /// Nothing but the replication mark of its `Queued` (a Raft entry that
    /// changes no key, such as a membership change).
    Nothing,
}

/// Auth records to store, computed by `crate::auth` from the state it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthWrite {
    /// Whether auth was enabled, and the auth revision, in the state the
    /// change was computed from: it applies only if they still are.
    pub read: (bool, u64),
    /// The auth switch after the change.
    pub enabled: bool,
    /// The auth revision after the change.
    pub revision: u64,
    /// Records to store (Some) or remove (None), by kind and name.
    pub records: Vec<(AuthKind, Vec<u8>, Option<Vec<u8>>)>,
}

/// The writer's answer to a `WriteRequest`.
pub enum WriteResponse {
    /// Answer to Put.
    Put(PutResponse),
    /// Answer to DeleteRange.
    DeleteRange(DeleteRangeResponse),
    /// Answer to Txn.
    Txn(TxnResponse),
    /// Answer to LeaseGrant.
    LeaseGrant(LeaseGrantResponse),
    /// Answer to LeaseRevoke.
    LeaseRevoke(LeaseRevokeResponse),
    /// Answer to LeaseKeepAlive.
    LeaseKeepAlive(LeaseKeepAliveResponse),
    /// Answer to LeaseExpire: whether the lease expired (a late keep-alive
    /// may have saved it).
    LeaseExpire(bool),
    /// Answer to Compact.
    Compact(CompactionResponse),
    /// Answer to CompactStep.
    CompactStep,
    /// Answer to Alarm: the alarm concerned, if any.
    Alarm(Vec<AlarmRow>),
    /// Answer to Downgrade: the target stored before (changed only if it
    /// was the one expected).
    Downgrade(i64),
    /// Answer to Auth.
    Auth,
    /// Answer to Nothing.
    Nothing,
}

/// The answer to one kind of write request, as the caller wants it: taken
/// out of the writer's `WriteResponse`, which answers every kind.
pub trait Answer: Sized {
    /// This answer, if `response` is one.
    fn from_response(response: WriteResponse) -> Option<Self>;
}

/// Implements `Answer` for the type a `WriteResponse` variant holds.
macro_rules! answers {
    ($($variant:ident => $answer:ty),* $(,)?) => {$(
        impl Answer for $answer {
            fn from_response(response: WriteResponse) -> Option<Self> {
                match response {
                    WriteResponse::$variant(answer) => Some(answer),
                    _ => None,
                }
            }
        }
    )*};
}

answers! {
    Put => PutResponse,
    DeleteRange => DeleteRangeResponse,
    Txn => TxnResponse,
    LeaseGrant => LeaseGrantResponse,
    LeaseRevoke => LeaseRevokeResponse,
    LeaseKeepAlive => LeaseKeepAliveResponse,
    Compact => CompactionResponse,
    Alarm => Vec<AlarmRow>,
    Downgrade => i64,
}

/// The answer to an Auth write, which has nothing to tell.
impl Answer for () {
    fn from_response(response: WriteResponse) -> Option<Self> {
        matches!(response, WriteResponse::Auth).then_some(())
    }
}

/// A queued request and where its answer goes.
pub struct Queued {
    /// What to do.
    pub request: WriteRequest,
    /// When it was asked for (Unix milliseconds): the time lease deadlines
    /// count from.
    pub at_ms: i64,
    /// In replicated mode, the position in the replicated log this request
    /// brings the store to (see `crate::raft`), stored in the same commit.
    pub mark: Option<Vec<u8>>,
    /// Where to answer.
    pub reply: oneshot::Sender<StoreResult<WriteResponse>>,
}

/// What an Alarm request asks the writer to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlarmChange {
    /// Raise the alarm.
    Activate,
    /// Disarm the alarm.
    Deactivate,
}
