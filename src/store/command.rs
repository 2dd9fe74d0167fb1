//! A write request in a form that can be stored and sent: the entries of
//! the replicated log (`crate::raft`) and the records of a single server's
//! journal (`super::journal`) both hold these, and applying one gives the
//! same result on every store in the same state.

use prost::Message;
use serde::{Deserialize, Serialize};

use super::alarm::AlarmChange;
use super::writer::{AuthWrite, WriteRequest};
use crate::backend::AuthKind;

/// A write request, with etcd's messages in their protobuf encoding (kept as
/// byte strings, not sequences of numbers, in the log and on the wire).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Command {
    /// etcd Put.
    Put(#[serde(with = "serde_bytes")] Vec<u8>),
    /// etcd DeleteRange.
    DeleteRange(#[serde(with = "serde_bytes")] Vec<u8>),
    /// etcd Txn.
    Txn(#[serde(with = "serde_bytes")] Vec<u8>),
    /// etcd LeaseGrant (with its id chosen).
    LeaseGrant(#[serde(with = "serde_bytes")] Vec<u8>),
    /// etcd LeaseRevoke.
    LeaseRevoke(i64),
    /// One etcd LeaseKeepAlive.
    LeaseKeepAlive(i64),
    /// The leader found the lease's deadline passed.
    LeaseExpire(i64),
    /// etcd Compact.
    Compact(i64),
    /// A change of users, roles or the auth switch (`AuthWrite`).
    Auth {
        /// The auth switch and revision it was computed from.
        read: (bool, u64),
        /// The auth switch after it.
        enabled: bool,
        /// The auth revision after it.
        revision: u64,
        /// (user: true / role: false, name, record or None to remove).
        records: Vec<(bool, Vec<u8>, Option<Vec<u8>>)>,
    },
    /// etcd Alarm ACTIVATE (or DEACTIVATE).
    Alarm {
        /// Raise (true) or disarm.
        activate: bool,
        /// The member the alarm is for.
        member_id: u64,
        /// etcdserverpb.AlarmType number.
        alarm: i32,
    },
}

impl Command {
    /// The command for `request`; None for the writer's local housekeeping,
    /// which is not replicated.
    pub fn of(request: &WriteRequest) -> Option<Command> {
        Some(match request {
            WriteRequest::Put(req) => Command::Put(req.encode_to_vec()),
            WriteRequest::DeleteRange(req) => Command::DeleteRange(req.encode_to_vec()),
            WriteRequest::Txn(req) => Command::Txn(req.encode_to_vec()),
            WriteRequest::LeaseGrant(req) => Command::LeaseGrant(req.encode_to_vec()),
            WriteRequest::LeaseRevoke(id) => Command::LeaseRevoke(*id),
            WriteRequest::LeaseKeepAlive(id) => Command::LeaseKeepAlive(*id),
            WriteRequest::LeaseExpire(id) => Command::LeaseExpire(*id),
            WriteRequest::Compact(revision) => Command::Compact(*revision),
            WriteRequest::Alarm {
                change,
                member_id,
                alarm,
            } => Command::Alarm {
                activate: *change == AlarmChange::Activate,
                member_id: *member_id,
                alarm: *alarm,
            },
            WriteRequest::Auth(change) => Command::Auth {
                read: change.read,
                enabled: change.enabled,
                revision: change.revision,
                records: change
                    .records
                    .iter()
                    .map(|(kind, name, record)| {
                        (*kind == AuthKind::User, name.clone(), record.clone())
                    })
                    .collect(),
            },
            WriteRequest::CompactStep | WriteRequest::Nothing => return None,
        })
    }

    /// The request to apply. An entry that does not decode (which every
    /// member would see alike) applies as nothing.
    pub fn request(&self) -> WriteRequest {
        let decoded = match self {
            Command::Put(bytes) => Message::decode(&bytes[..]).map(WriteRequest::Put),
            Command::DeleteRange(bytes) => {
                Message::decode(&bytes[..]).map(WriteRequest::DeleteRange)
            }
            Command::Txn(bytes) => Message::decode(&bytes[..]).map(WriteRequest::Txn),
            Command::LeaseGrant(bytes) => Message::decode(&bytes[..]).map(WriteRequest::LeaseGrant),
            Command::LeaseRevoke(id) => Ok(WriteRequest::LeaseRevoke(*id)),
            Command::LeaseKeepAlive(id) => Ok(WriteRequest::LeaseKeepAlive(*id)),
            Command::LeaseExpire(id) => Ok(WriteRequest::LeaseExpire(*id)),
            Command::Compact(revision) => Ok(WriteRequest::Compact(*revision)),
            Command::Auth {
                read,
                enabled,
                revision,
                records,
            } => Ok(WriteRequest::Auth(AuthWrite {
                read: *read,
                enabled: *enabled,
                revision: *revision,
                records: records
                    .iter()
                    .map(|(user, name, record)| {
                        let kind = if *user {
                            AuthKind::User
                        } else {
                            AuthKind::Role
                        };
                        (kind, name.clone(), record.clone())
                    })
                    .collect(),
            })),
            Command::Alarm {
                activate,
                member_id,
                alarm,
            } => Ok(WriteRequest::Alarm {
                change: if *activate {
                    AlarmChange::Activate
                } else {
                    AlarmChange::Deactivate
                },
                member_id: *member_id,
                alarm: *alarm,
            }),
        };
        decoded.unwrap_or_else(|error| {
            tracing::error!("a log entry does not decode, applying it as nothing: {error}");
            WriteRequest::Nothing
        })
    }
}
