//! openraft's types for cetera: what goes in an entry, who the members are,
//! and the names the folder uses for openraft's log positions, membership
//! and storage errors.

use std::io::Cursor;

use super::member::Member;
use super::proposal;

openraft::declare_raft_types!(
    /// openraft's types for cetera: proposals in, nothing out (answers travel
    /// through `proposal::Waiters`), members with peer and client URLs.
    pub TypeConfig:
        D = proposal::Proposals,
        R = (),
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A running Raft member.
pub(super) type Raft = openraft::Raft<TypeConfig>;

/// Log position of an entry.
pub(super) type LogId = openraft::LogId<u64>;

/// Membership as of an applied entry.
pub(super) type StoredMembership = openraft::StoredMembership<u64, Member>;

/// A storage failure, as openraft takes it.
pub(super) type StorageError = openraft::StorageError<u64>;

/// Wraps any error for openraft.
pub(super) fn any_error(error: impl std::fmt::Display) -> openraft::AnyError {
    openraft::AnyError::error(error.to_string())
}
