//! Ranges of one key at the current revision, gathered: while a statement
//! of them is running, the next ones wait and then go out together, as one
//! statement (`KeyReads`).
//!
//! MariaDB spends most of a one-key Range's cost on the statement, not on
//! the key: planning it again at every execution and scheduling its thread
//! per connection (BENCHMARKS.md, issue 30). Sixteen keys in one statement
//! cost it about a fifth of sixteen statements per key. Every gathered read
//! arrived before its statement was sent, and the statement reads the
//! counters and all its keys from one snapshot, so each answer is a state
//! the store was in after its request came: as linearizable as a statement
//! of its own.
//!
//! A statement is run by one of the reads it answers, on a connection that
//! read takes from the pool then (a read answered by another's statement
//! never takes one: with a connection each, 64 clients' reads queued for
//! the pool's 16 instead of gathering); when it ends, the read that has
//! waited longest runs the next. A read alone when it comes goes out at
//! once, as a statement of one key.

use std::mem;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::queries::{KeyRead, query_current_keys};
use super::txn::Session;

/// Statements of gathered reads that may run at once. One gathered a little
/// more (24.3-24.8k Ranges/s at 64 clients against 22.6-23.1k with two,
/// BENCHMARKS.md, issue 30); two, so that one slow statement (a large
/// value) does not hold every one-key read behind it.
const STATEMENTS_AT_ONCE: usize = 2;

/// Keys in one statement, at most.
const KEYS_PER_STATEMENT: usize = 256;

/// What a waiting read is told.
enum Turn {
    Answer(KeyRead),
    /// Run the next statement.
    Lead,
}

struct Waiting {
    key: Vec<u8>,
    turn: oneshot::Sender<Turn>,
}

#[derive(Default)]
struct State {
    waiting: Vec<Waiting>,
    running: usize,
}

/// The one-key reads of an instance, gathered into few statements.
#[derive(Default)]
pub(super) struct KeyReads {
    state: Mutex<State>,
}

impl KeyReads {
    /// `key`'s row and the counters at the current revision, on the
    /// session's connection or in another read's statement. Errors are the
    /// driver's, so that the caller can tell a dead connection.
    pub(super) async fn read(
        &self,
        session: &mut Session,
        key: &[u8],
    ) -> mysql_async::Result<KeyRead> {
        let (turn, waited) = oneshot::channel();
        let leads = {
            let mut state = self.state.lock().expect("key reads lock");
            let leads = state.running < STATEMENTS_AT_ONCE;
            if leads {
                state.running += 1;
            } else {
                state.waiting.push(Waiting {
                    key: key.to_vec(),
                    turn,
                });
            }
            leads
        };
        if leads {
            return self.lead(session, key).await;
        }
        match waited.await {
            Ok(Turn::Answer(read)) => Ok(read),
            Ok(Turn::Lead) => self.lead(session, key).await,
            // The statement that was to answer failed or was cancelled: this
            // read goes alone, with an error of its own if it has one.
            Err(_) => query_current_keys(session.connection().await?, &[key])
                .await
                .map(|mut reads| reads.remove(0)),
        }
    }

    /// Runs one statement for `key` and the reads waiting now, answers
    /// them, then hands the turn on.
    async fn lead(&self, session: &mut Session, key: &[u8]) -> mysql_async::Result<KeyRead> {
        let handover = Handover(self);
        let conn = session.connection().await?;
        let others = {
            let mut state = self.state.lock().expect("key reads lock");
            let take = state.waiting.len().min(KEYS_PER_STATEMENT - 1);
            let rest = state.waiting.split_off(take);
            mem::replace(&mut state.waiting, rest)
        };
        let mut keys: Vec<&[u8]> = Vec::with_capacity(1 + others.len());
        keys.push(key);
        keys.extend(others.iter().map(|other| other.key.as_slice()));
        let mut reads = query_current_keys(conn, &keys).await?.into_iter();
        let own = reads.next().expect("one read per key");
        for (other, read) in others.into_iter().zip(reads) {
            // A read whose caller has gone needs no answer.
            let _ = other.turn.send(Turn::Answer(read));
        }
        drop(handover);
        Ok(own)
    }
}

/// Hands the turn to the read that has waited longest, or frees it. On
/// drop, so that a statement that fails or is cancelled hands it on too
/// (the reads it was to answer then go alone).
struct Handover<'a>(&'a KeyReads);

impl Drop for Handover<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().expect("key reads lock");
        while !state.waiting.is_empty() {
            let next = state.waiting.remove(0);
            if next.turn.send(Turn::Lead).is_ok() {
                return;
            }
        }
        state.running -= 1;
    }
}
