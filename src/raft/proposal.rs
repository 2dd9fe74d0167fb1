//! What goes in the replicated log, and how answers find their way back.
//!
//! A `Proposal` is one write request, the store's own `WriteRequest` (its
//! serde form, etcd messages kept in their protobuf encoding, is the log's
//! entry format: see `crate::store::request`), with the time it was made, so
//! that every member computes the same lease deadlines, and the id of the
//! member and call that made it. The member that made it waits for its own
//! state machine to apply the entry: the answer is the one its local store
//! gave, so a follower's client also reads its own write afterwards.
//!
//! An entry holds `Proposals`: one, or several that the leader gathered
//! while earlier entries were in flight (see `raft::proposer`), so that at
//! many clients a member appends and syncs many writes at once, as etcd's
//! members do.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::de::{Error as _, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::oneshot;

use super::member::Member;
use crate::store::StoreResult;
use crate::store::request::{WriteRequest, WriteResponse};

/// One write in the replicated log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Proposal {
    /// The member that proposed it.
    pub origin: u64,
    /// Its number among that member's proposals.
    pub seq: u64,
    /// When it was made, in Unix milliseconds: lease deadlines count from it.
    pub at_ms: i64,
    /// The request (one that `WriteRequest::is_replicated`).
    pub request: WriteRequest,
}

/// The proposals of one log entry, never none. One is written exactly as a
/// `Proposal` always was, so entries of one stay readable by members of an
/// older cetera; several are written as a zero where a proposal's origin
/// would be (no member has id 0) and then the list, which such a member
/// fails to read rather than misreads: it would take the list's length for
/// the seq, the first proposal's origin for the time, and that proposal's
/// seq, a clock reading, for the request's number, which no request has. A
/// leader puts several in an entry only once every member has said it reads
/// them (`ENTRY_FORMAT`).
#[derive(Clone, Debug)]
pub struct Proposals(pub Vec<Proposal>);

/// The entry format this member reads: 2 is `Proposals` of several.
pub const ENTRY_FORMAT: u32 = 2;

/// Where a proposal's origin is, the mark of an entry of several.
const SEVERAL: u64 = 0;

impl Serialize for Proposals {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => one.serialize(serializer),
            several => {
                let mut tuple = serializer.serialize_tuple(2)?;
                tuple.serialize_element(&SEVERAL)?;
                tuple.serialize_element(several)?;
                tuple.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Proposals {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Proposals;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a proposal, or a zero and a list of proposals")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut fields: A) -> Result<Proposals, A::Error> {
                let origin: u64 = field(&mut fields, 0)?;
                if origin == SEVERAL {
                    let several: Vec<Proposal> = field(&mut fields, 1)?;
                    if several.is_empty() {
                        return Err(A::Error::custom("an entry of no proposals"));
                    }
                    return Ok(Proposals(several));
                }
                Ok(Proposals(vec![Proposal {
                    origin,
                    seq: field(&mut fields, 1)?,
                    at_ms: field(&mut fields, 2)?,
                    request: field(&mut fields, 3)?,
                }]))
            }
        }
        fn field<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
            fields: &mut A,
            n: usize,
        ) -> Result<T, A::Error> {
            fields
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(n, &"a proposal's four fields"))
        }
        // A proposal's fields, as postcard writes a struct: a tuple of four.
        deserializer.deserialize_tuple(4, Fields)
    }
}

/// Where the state machine stored up to: the last applied entry and the
/// membership as of it. Kept in the store's own commits (see
/// `Backend::replication_mark`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Mark {
    /// The last applied entry.
    pub applied: Option<openraft::LogId<u64>>,
    /// The membership as of it.
    pub membership: openraft::StoredMembership<u64, Member>,
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

#[cfg(test)]
mod tests {
    //! The log's entries as members before this type wrote them (a mirror
    //! enum, `Command`, frozen here as that format) must read the same, and
    //! new entries must be what those members read.

    use prost::Message;
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::backend::AuthKind;
    use crate::proto::etcdserverpb::{
        Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RequestOp, TxnRequest, compare,
        request_op,
    };
    use crate::store::request::{AlarmChange, AuthWrite};

    /// The proposal as written up to 205a14b.
    #[derive(Serialize, Deserialize)]
    struct OldProposal {
        origin: u64,
        seq: u64,
        at_ms: i64,
        command: Command,
    }

    /// The request as written up to 205a14b.
    #[derive(Serialize, Deserialize)]
    enum Command {
        Put(#[serde(with = "serde_bytes")] Vec<u8>),
        DeleteRange(#[serde(with = "serde_bytes")] Vec<u8>),
        Txn(#[serde(with = "serde_bytes")] Vec<u8>),
        LeaseGrant(#[serde(with = "serde_bytes")] Vec<u8>),
        LeaseRevoke(i64),
        LeaseKeepAlive(i64),
        LeaseExpire(i64),
        Compact(i64),
        Auth {
            read: (bool, u64),
            enabled: bool,
            revision: u64,
            records: Vec<(bool, Vec<u8>, Option<Vec<u8>>)>,
        },
        Alarm {
            activate: bool,
            member_id: u64,
            alarm: i32,
        },
    }

    /// Each replicated request, and the old command it was written as.
    fn pairs() -> Vec<(WriteRequest, Command)> {
        let put = PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            lease: 7,
            prev_kv: true,
            ..Default::default()
        };
        let delete = DeleteRangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            ..Default::default()
        };
        let txn = TxnRequest {
            compare: vec![Compare {
                key: b"k".to_vec(),
                target: compare::CompareTarget::Version as i32,
                target_union: Some(compare::TargetUnion::Version(3)),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(put.clone())),
            }],
            failure: vec![],
        };
        let grant = LeaseGrantRequest { ttl: 60, id: 42 };
        let records = vec![
            (AuthKind::User, b"root".to_vec(), Some(b"user".to_vec())),
            (AuthKind::Role, b"reader".to_vec(), None),
        ];
        vec![
            (
                WriteRequest::Put(put.clone()),
                Command::Put(put.encode_to_vec()),
            ),
            (
                WriteRequest::DeleteRange(delete.clone()),
                Command::DeleteRange(delete.encode_to_vec()),
            ),
            (
                WriteRequest::Txn(txn.clone()),
                Command::Txn(txn.encode_to_vec()),
            ),
            (
                WriteRequest::LeaseGrant(grant),
                Command::LeaseGrant(grant.encode_to_vec()),
            ),
            (WriteRequest::LeaseRevoke(-5), Command::LeaseRevoke(-5)),
            (WriteRequest::LeaseKeepAlive(9), Command::LeaseKeepAlive(9)),
            (WriteRequest::LeaseExpire(11), Command::LeaseExpire(11)),
            (WriteRequest::Compact(300), Command::Compact(300)),
            (
                WriteRequest::Auth(AuthWrite {
                    read: (false, 3),
                    enabled: true,
                    revision: 4,
                    records,
                }),
                Command::Auth {
                    read: (false, 3),
                    enabled: true,
                    revision: 4,
                    records: vec![
                        (true, b"root".to_vec(), Some(b"user".to_vec())),
                        (false, b"reader".to_vec(), None),
                    ],
                },
            ),
            (
                WriteRequest::Alarm {
                    change: AlarmChange::Activate,
                    member_id: 2,
                    alarm: 1,
                },
                Command::Alarm {
                    activate: true,
                    member_id: 2,
                    alarm: 1,
                },
            ),
            (
                WriteRequest::Alarm {
                    change: AlarmChange::Deactivate,
                    member_id: u64::MAX,
                    alarm: 2,
                },
                Command::Alarm {
                    activate: false,
                    member_id: u64::MAX,
                    alarm: 2,
                },
            ),
        ]
    }

    #[test]
    fn entries_keep_the_format_of_the_mirror_enum() {
        for (request, command) in pairs() {
            let old = postcard::to_stdvec(&OldProposal {
                origin: 1,
                seq: 2,
                at_ms: 3,
                command,
            })
            .unwrap();
            let proposal = Proposal {
                origin: 1,
                seq: 2,
                at_ms: 3,
                request,
            };
            let new = postcard::to_stdvec(&proposal).unwrap();
            assert_eq!(new, old, "{proposal:?} is written as before");
            let read: Proposal = postcard::from_bytes(&old).unwrap();
            assert_eq!(
                format!("{read:?}"),
                format!("{proposal:?}"),
                "old entry reads"
            );
            // An entry of one proposal is that proposal's bytes, both ways.
            let one = Proposals(vec![proposal]);
            assert_eq!(postcard::to_stdvec(&one).unwrap(), old, "{one:?}");
            let read: Proposals = postcard::from_bytes(&old).unwrap();
            assert_eq!(format!("{read:?}"), format!("{one:?}"), "old entry reads");
        }
    }

    /// Proposals as a leader makes them: member ids and clock-reading seqs.
    fn proposals(n: u64) -> Vec<Proposal> {
        pairs()
            .into_iter()
            .take(n as usize)
            .enumerate()
            .map(|(i, (request, _))| Proposal {
                origin: 0x8e9e_05c5_2164_694d + i as u64,
                seq: 1_764_900_000_000_000_000 + i as u64,
                at_ms: 1_764_900_000_000,
                request,
            })
            .collect()
    }

    /// An entry as the log and AppendEntries carry it.
    fn entry(proposals: Vec<Proposal>) -> openraft::Entry<crate::raft::openraft_types::TypeConfig> {
        openraft::Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), 7),
            payload: openraft::EntryPayload::Normal(Proposals(proposals)),
        }
    }

    #[test]
    fn entries_of_several_proposals_read_back_inside_an_entry() {
        for n in [1, 2, 11] {
            let written = entry(proposals(n));
            let bytes = postcard::to_stdvec(&written).unwrap();
            let read: openraft::Entry<crate::raft::openraft_types::TypeConfig> =
                postcard::from_bytes(&bytes).unwrap();
            assert_eq!(format!("{read:?}"), format!("{written:?}"), "{n} proposals");
        }
        // Followed by more fields: an entry of several ends where it should.
        let pair = (Proposals(proposals(3)), 42u64);
        let bytes = postcard::to_stdvec(&pair).unwrap();
        let (read, after): (Proposals, u64) = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(read.0.len(), 3);
        assert_eq!(after, 42);
    }

    #[test]
    fn an_older_member_cannot_misread_an_entry_of_several() {
        for n in [2, 3, 11] {
            let bytes = postcard::to_stdvec(&Proposals(proposals(n))).unwrap();
            assert!(
                postcard::from_bytes::<Proposal>(&bytes).is_err(),
                "{n} proposals read as one"
            );
            let entry_bytes = postcard::to_stdvec(&entry(proposals(n))).unwrap();
            assert!(postcard::from_bytes::<OldEntry>(&entry_bytes).is_err());
        }
        let none = postcard::to_stdvec(&(0u64, Vec::<Proposal>::new())).unwrap();
        assert!(postcard::from_bytes::<Proposals>(&none).is_err());
    }

    /// An entry as a member before `Proposals` read it.
    type OldEntry = openraft::Entry<OldTypeConfig>;

    openraft::declare_raft_types!(
        OldTypeConfig:
            D = Proposal,
            R = (),
            NodeId = u64,
            Node = crate::raft::member::Member,
            Entry = openraft::Entry<OldTypeConfig>,
            SnapshotData = std::io::Cursor<Vec<u8>>,
            AsyncRuntime = openraft::TokioRuntime,
    );

    #[test]
    fn local_requests_are_not_replicated() {
        for request in [
            WriteRequest::CompactStep,
            WriteRequest::Nothing,
            WriteRequest::Downgrade {
                expected: 0,
                target: 1,
            },
        ] {
            assert!(!request.is_replicated());
            let proposal = Proposal {
                origin: 1,
                seq: 2,
                at_ms: 3,
                request,
            };
            assert!(postcard::to_stdvec(&proposal).is_err());
        }
        assert!(pairs().iter().all(|(request, _)| request.is_replicated()));
    }
}
