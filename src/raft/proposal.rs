//! What goes in the replicated log, and how answers find their way back.
//!
//! A `Proposal` is one write request (etcd messages kept in their protobuf
//! encoding) with the time it was made, so that every member computes the
//! same lease deadlines, and the id of the member and call that made it. The
//! member that made it waits for its own state machine to apply the entry:
//! the answer is the one its local store gave, so a follower's client also
//! reads its own write afterwards.

use std::collections::HashMap;
use std::sync::Mutex;

use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::{LogId, StoredMembership};
use crate::backend::AuthKind;
use crate::store::StoreResult;
use crate::store::request::{AlarmChange, AuthWrite, WriteRequest, WriteResponse};

/// One write in the replicated log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Proposal {
    /// The member that proposed it.
    pub origin: u64,
    /// Its number among that member's proposals.
    pub seq: u64,
    /// When it was made, in Unix milliseconds: lease deadlines count from it.
    pub at_ms: i64,
    /// The request.
    pub command: Command,
}

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
            // Cluster members do not serve Downgrade (src/api/downgrade.rs).
            WriteRequest::Downgrade { .. } => return None,
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

/// Where the state machine stored up to: the last applied entry and the
/// membership as of it. Kept in the store's own commits (see
/// `Backend::replication_mark`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Mark {
    /// The last applied entry.
    pub applied: Option<LogId>,
    /// The membership as of it.
    pub membership: StoredMembership,
}

impl Mark {
    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a mark always encodes")
    }

    /// Reads a stored mark.
    pub fn decode(bytes: &[u8]) -> anyhow::Result<Mark> {
        Ok(postcard::from_bytes(bytes)?)
    }
}

/// Proposals of this member waiting for their entry to be applied here.
#[derive(Default)]
pub struct Waiters {
    waiting: Mutex<HashMap<u64, oneshot::Sender<StoreResult<WriteResponse>>>>,
}

impl Waiters {
    /// Waits for the answer to proposal `seq`.
    pub fn wait(&self, seq: u64) -> oneshot::Receiver<StoreResult<WriteResponse>> {
        let (send, receive) = oneshot::channel();
        self.lock().insert(seq, send);
        receive
    }

    /// Gives up waiting for proposal `seq`.
    pub fn forget(&self, seq: u64) {
        self.lock().remove(&seq);
    }

    /// Hands the answer of proposal `seq` to its waiter, if there is one.
    pub fn answer(&self, seq: u64, answer: StoreResult<WriteResponse>) {
        if let Some(waiter) = self.lock().remove(&seq) {
            let _ = waiter.send(answer);
        }
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<StoreResult<WriteResponse>>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}
