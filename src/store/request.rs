//! The write requests of the store and their answers: what the writer
//! applies (`writer`), what a raised alarm may refuse (`alarm`), what lease
//! keep-alives answered from memory look at (`lease_deadlines`), what auth
//! computes (`AuthWrite`) and what a cluster puts in its replicated log
//! (`crate::raft`). The types alone, so that all of these import them
//! downward.
//!
//! A `WriteRequest` is also what a cluster's replicated log holds (see
//! `crate::raft::proposal`): its serde form is that log's entry format, etcd
//! messages kept in their protobuf encoding as byte strings. The variants
//! that are replicated come first, in the order of that format; their
//! numbers and field order must not change, or members would read each
//! other's entries wrong.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::oneshot;

use super::error::StoreResult;
use crate::backend::{AlarmRow, AuthKind};
use crate::proto::etcdserverpb::{
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseRevokeResponse, PutRequest, PutResponse,
    TxnRequest, TxnResponse,
};

/// A write request for the writer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum WriteRequest {
    /// etcd Put.
    Put(#[serde(with = "protobuf")] PutRequest),
    /// etcd DeleteRange.
    DeleteRange(#[serde(with = "protobuf")] DeleteRangeRequest),
    /// etcd Txn.
    Txn(#[serde(with = "protobuf")] TxnRequest),
    /// etcd LeaseGrant (in a cluster, with its id chosen).
    LeaseGrant(#[serde(with = "protobuf")] LeaseGrantRequest),
    /// etcd LeaseRevoke.
    LeaseRevoke(i64),
    /// One etcd LeaseKeepAlive request.
    LeaseKeepAlive(i64),
    /// Revoke a lease whose deadline passed (unless it was kept alive meanwhile).
    LeaseExpire(i64),
    /// etcd Compact: move the compact revision (the history goes later).
    Compact(i64),
    /// A change of users, roles or the auth switch, as `crate::auth`
    /// computed it; made only if the auth state is still as it was read.
    Auth(AuthWrite),
    /// etcd Alarm ACTIVATE or DEACTIVATE.
    Alarm {
        /// Raise or disarm.
        change: AlarmChange,
        /// The member the alarm is for.
        member_id: u64,
        /// etcdserverpb.AlarmType number.
        alarm: i32,
    },
    // The rest is never replicated: a member's own housekeeping, and what
    // cluster members do not serve (Downgrade, see src/api/downgrade.rs).
    /// Remove the next stretch of history below the compact revision.
    #[serde(skip)]
    CompactStep,
    /// etcd Downgrade ENABLE or CANCEL: the stored downgrade target becomes
    /// `target` (see `settings::DOWNGRADE_TARGET`) if it is still `expected`.
    #[serde(skip)]
    Downgrade {
        /// The target the change was decided on.
        expected: i64,
        /// The target after it.
        target: i64,
    },
    /// Nothing but the replication mark of its `Queued` (a Raft entry that
    /// changes no key, such as a membership change).
    #[serde(skip)]
    Nothing,
}

impl WriteRequest {
    /// Whether this request goes through a cluster's replicated log; the
    /// rest never leaves this member.
    pub fn is_replicated(&self) -> bool {
        !matches!(
            self,
            WriteRequest::CompactStep | WriteRequest::Downgrade { .. } | WriteRequest::Nothing
        )
    }
}

/// Auth records to store, computed by `crate::auth` from the state it read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthWrite {
    /// Whether auth was enabled, and the auth revision, in the state the
    /// change was computed from: it applies only if they still are.
    pub read: (bool, u64),
    /// The auth switch after the change.
    pub enabled: bool,
    /// The auth revision after the change.
    pub revision: u64,
    /// Records to store (Some) or remove (None), by kind and name.
    #[serde(with = "auth_records")]
    pub records: Vec<AuthRecord>,
}

/// One auth record to store or remove: its kind, its name, and the record
/// (None: remove it).
pub type AuthRecord = (AuthKind, Vec<u8>, Option<Vec<u8>>);

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
    /// In replicated mode, whether more requests of the same log entry
    /// follow this one: the writer commits an entry whole, so that the
    /// store never holds part of one (its mark could not say which part).
    pub entry_continues: bool,
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

/// In the log, whether the alarm is raised.
impl Serialize for AlarmChange {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bool(*self == AlarmChange::Activate)
    }
}

impl<'de> Deserialize<'de> for AlarmChange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match bool::deserialize(deserializer)? {
            true => AlarmChange::Activate,
            false => AlarmChange::Deactivate,
        })
    }
}

/// An etcd message in the log: its protobuf encoding, as a byte string.
mod protobuf {
    use prost::Message;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<M: Message, S: Serializer>(
        message: &M,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&message.encode_to_vec())
    }

    pub fn deserialize<'de, M: Message + Default, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<M, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(deserializer)?;
        M::decode(&bytes[..]).map_err(D::Error::custom)
    }
}

/// Auth records in the log: the kind as a bool (user: true, role: false).
mod auth_records {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::AuthRecord;
    use crate::backend::AuthKind;

    /// One record as the log holds it.
    type Logged = (bool, Vec<u8>, Option<Vec<u8>>);

    pub fn serialize<S: Serializer>(
        records: &[AuthRecord],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            records
                .iter()
                .map(|(kind, name, record)| (*kind == AuthKind::User, name, record)),
        )
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<AuthRecord>, D::Error> {
        let logged = Vec::<Logged>::deserialize(deserializer)?;
        let kind = |user| match user {
            true => AuthKind::User,
            false => AuthKind::Role,
        };
        Ok(logged
            .into_iter()
            .map(|(user, name, record)| (kind(user), name, record))
            .collect())
    }
}
