//! The ways an etcd request can fail in the store, one variant per etcd error.
//! The API layer turns them into etcd's gRPC codes and messages.

use thiserror::Error;

use crate::backend::{Compacted, DiskFull, Unavailable};

/// A failed store operation.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The requested revision is below the compact revision.
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    /// The requested revision is above the current revision.
    #[error("mvcc: required revision is a future revision")]
    FutureRevision,
    /// ignore_value or ignore_lease on a key that does not exist.
    #[error("key not found")]
    KeyNotFound,
    /// A Put names a lease that does not exist.
    #[error("requested lease not found")]
    LeaseNotFound,
    /// LeaseGrant with an id in use.
    #[error("lease already exists")]
    LeaseExists,
    /// LeaseGrant with a TTL above the maximum.
    #[error("too large lease TTL")]
    LeaseTtlTooLarge,
    /// A key longer than the datastore can index.
    #[error("key is longer than the {0} bytes this datastore can store")]
    KeyTooLong(usize),
    /// The write would take the database past its quota, or the NOSPACE alarm is raised.
    #[error("mvcc: database space exceeded")]
    NoSpace,
    /// The CORRUPT alarm is raised.
    #[error("corrupt cluster")]
    Corrupt,
    /// Alarm ACTIVATE of an alarm type etcd does not know.
    #[error("unknown alarm type {0}")]
    UnknownAlarm(i32),
    /// An auth change was computed from a state that changed meanwhile.
    #[error("the auth state changed meanwhile")]
    AuthChanged,
    /// Replicated mode: the cluster has no leader (no quorum) to order the request.
    #[error("no leader")]
    NoLeader,
    /// Replicated mode: the request was not known to be applied in time.
    #[error("request timed out")]
    Timeout,
    /// Replicated mode: the leader stopped or changed before it took the
    /// request; it was not applied.
    #[error("leader changed")]
    LeaderChanged,
    /// The server is shutting down or its writer stopped.
    #[error("server stopped")]
    Stopped,
    /// A fault of cetera's own, not of the request or the database.
    #[error("internal error: {0}")]
    Internal(String),
    /// The database failed.
    #[error("database error: {0:#}")]
    Backend(anyhow::Error),
}

impl From<anyhow::Error> for StoreError {
    fn from(error: anyhow::Error) -> Self {
        if Compacted::is(&error) {
            return StoreError::Compacted;
        }
        if DiskFull::is(&error) {
            tracing::warn!("the datastore is out of space: {error:#}");
            return StoreError::NoSpace;
        }
        StoreError::Backend(error)
    }
}

impl StoreError {
    /// Whether a write failed on its way rather than by its own terms: no
    /// leader, a timeout, a lost leader, the database or cetera itself
    /// (etcd counts those as failed proposals).
    pub fn is_failed_proposal(&self) -> bool {
        matches!(
            self,
            StoreError::NoLeader
                | StoreError::Timeout
                | StoreError::LeaderChanged
                | StoreError::Internal(_)
                | StoreError::Backend(_)
        )
    }

    /// Whether a database error says the database was out of reach (down,
    /// unreachable, not answering in time): a condition etcd clients retry
    /// on, as they do on a member without quorum.
    pub fn is_database_unavailable(error: &anyhow::Error) -> bool {
        Unavailable::is(error)
    }
}

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;
