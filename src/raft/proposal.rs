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

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::{LogId, StoredMembership};
use crate::store::StoreResult;
pub use crate::store::command::Command;
use crate::store::writer::WriteResponse;

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
