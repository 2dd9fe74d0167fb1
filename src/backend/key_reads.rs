//! Ranges of one key at the current revision, gathered: while a statement
//! of them is running, the next ones wait and then go out together, as one
//! statement (`KeyReads`), on PostgreSQL and MySQL.
//!
//! A database server spends most of a one-key Range's cost on the
//! statement, not on the key (MariaDB plans a statement again at every
//! execution: sixteen keys in one statement cost it about a fifth of
//! sixteen statements of one key), and each statement holds a pooled
//! connection for a round trip. Every gathered read arrived before its
//! statement was sent, and the statement reads the counters and all its
//! keys from one snapshot, so each answer is a state the store was in after
//! its request came: as linearizable as a statement of its own.
//!
//! A statement is run by one of the reads it answers, on a connection that
//! read takes from the pool then (a read answered by another's statement
//! never takes one: with a connection each, 64 clients' reads queued for
//! the pool's 16 instead of gathering); when it ends, the read that has
//! waited longest runs the next. A read alone when it comes goes out at
//! once, as a statement of one key; so does a read that comes when the one
//! statement running has run for a while.

use std::collections::HashMap;
use std::mem;
use std::sync::Mutex;

use tokio::sync::oneshot;
use tokio::time::{Duration, Instant};

use super::rows::{Columns, ColumnsFrom, kv_from_row, revisions_from_row};
use super::{CurrentRange, CurrentRangeQuery, Revisions};
use crate::proto::mvccpb::KeyValue;

/// A read that comes while a statement of gathered reads runs waits for the
/// next statement (one at a time gathers more keys into each:
/// docs/benchmarks/shared-database.md, 24-30% more Ranges at two instances
/// on one PostgreSQL database), unless that statement has run this long: then it starts a
/// second beside it, so that a slow one (a large value, a network hop) does
/// not hold every one-key read behind it. Never more than two run at once.
const SECOND_STATEMENT_AFTER: Duration = Duration::from_millis(1);

/// Keys in one statement, at most.
const KEYS_PER_STATEMENT: usize = 256;

/// A key's row and the counters, read from one snapshot.
#[derive(Clone, Debug)]
pub(crate) struct KeyRead {
    pub(crate) revisions: Revisions,
    /// None: the key does not exist.
    pub(crate) kv: Option<KeyValue>,
}

impl KeyRead {
    /// The answer to `query`, a range of this key.
    pub(crate) fn into_range(self, query: CurrentRangeQuery<'_>) -> CurrentRange {
        let kvs: Vec<KeyValue> = self
            .kv
            .into_iter()
            .map(|mut kv| {
                if query.keys_only {
                    kv.value.clear();
                }
                kv
            })
            .collect();
        CurrentRange {
            revisions: self.revisions,
            count: query.count.then_some(kvs.len() as i64),
            kvs,
        }
    }
}

/// The key of `query` when it is a read that is gathered: one key's row with
/// its value. A count or a keys-only get goes out on its own, so that a
/// statement never moves a value no one asked for.
pub(crate) fn gathered_key<'a>(query: &CurrentRangeQuery<'a>) -> Option<&'a [u8]> {
    query
        .range
        .as_single()
        .filter(|_| query.rows && !query.keys_only)
}

/// The read of each of `keys`, in their order, from the rows of one
/// statement that selects the counters and then a key's columns, null
/// where the counters' row joined no key (`None`: it returned no row, so the
/// counters' row is missing).
pub(crate) fn reads_from_rows<R: Columns>(
    keys: &[&[u8]],
    rows: &[R],
) -> Result<Option<Vec<KeyRead>>, R::Error> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let revisions = revisions_from_row(first)?;
    let mut found = Vec::with_capacity(rows.len());
    for row in rows {
        if row.column::<Option<Vec<u8>>>(3)?.is_some() {
            found.push(kv_from_row(&ColumnsFrom { row, first: 3 })?);
        }
    }
    Ok(Some(reads_of(keys, revisions, found)))
}

/// The read of each of `keys`, in their order, from the counters and the
/// rows one statement found.
fn reads_of(keys: &[&[u8]], revisions: Revisions, found: Vec<KeyValue>) -> Vec<KeyRead> {
    let found: HashMap<&[u8], &KeyValue> = found.iter().map(|kv| (kv.key.as_slice(), kv)).collect();
    keys.iter()
        .map(|key| KeyRead {
            revisions,
            kv: found.get(key).map(|kv| (*kv).clone()),
        })
        .collect()
}

/// What a waiting read is told.
enum Turn {
    Answer(KeyRead),
    /// Run the next statement, counted as started at this instant.
    Lead(Instant),
}

struct Waiting {
    key: Vec<u8>,
    turn: oneshot::Sender<Turn>,
}

#[derive(Default)]
struct State {
    waiting: Vec<Waiting>,
    /// When each statement running now started.
    running: Vec<Instant>,
}

impl State {
    /// Whether a read that comes now runs a statement of its own.
    fn leads(&self) -> bool {
        match self.running.as_slice() {
            [] => true,
            [started] => started.elapsed() >= SECOND_STATEMENT_AFTER,
            _ => false,
        }
    }
}

/// The one-key reads of an instance, gathered into few statements.
#[derive(Default)]
pub(crate) struct KeyReads {
    state: Mutex<State>,
}

impl KeyReads {
    /// `key`'s row and the counters at the current revision, read by
    /// `read_keys` (one statement for the keys given, each key's read in
    /// their order) or in another read's statement. A read whose statement
    /// failed or was cancelled runs its own, so that the error it returns
    /// is its own.
    pub(crate) async fn read<E>(
        &self,
        key: &[u8],
        read_keys: impl AsyncFnOnce(&[&[u8]]) -> Result<Vec<KeyRead>, E>,
    ) -> Result<KeyRead, E> {
        let (turn, waited) = oneshot::channel();
        let started = {
            let mut state = self.state.lock().expect("key reads lock");
            if state.leads() {
                let now = Instant::now();
                state.running.push(now);
                Some(now)
            } else {
                state.waiting.push(Waiting {
                    key: key.to_vec(),
                    turn,
                });
                None
            }
        };
        if let Some(started) = started {
            return self.lead(key, started, read_keys).await;
        }
        let mut wait = Wait {
            reads: self,
            turn: Some(waited),
        };
        let turn = wait.turn.as_mut().expect("still waiting").await;
        wait.turn = None;
        match turn {
            Ok(Turn::Answer(read)) => Ok(read),
            Ok(Turn::Lead(started)) => self.lead(key, started, read_keys).await,
            Err(_) => Ok(read_keys(&[key]).await?.remove(0)),
        }
    }

    /// Runs one statement (counted as running since `started`) for `key`
    /// and the reads waiting now, answers them, then hands the turn on.
    async fn lead<E>(
        &self,
        key: &[u8],
        started: Instant,
        read_keys: impl AsyncFnOnce(&[&[u8]]) -> Result<Vec<KeyRead>, E>,
    ) -> Result<KeyRead, E> {
        let handover = Handover {
            reads: self,
            started,
        };
        let others = {
            let mut state = self.state.lock().expect("key reads lock");
            let take = state.waiting.len().min(KEYS_PER_STATEMENT - 1);
            let rest = state.waiting.split_off(take);
            mem::replace(&mut state.waiting, rest)
        };
        let mut keys: Vec<&[u8]> = Vec::with_capacity(1 + others.len());
        keys.push(key);
        keys.extend(others.iter().map(|other| other.key.as_slice()));
        let mut reads = read_keys(&keys).await?.into_iter();
        let own = reads.next().expect("one read per key");
        for (other, read) in others.into_iter().zip(reads) {
            // A read whose caller has gone needs no answer.
            let _ = other.turn.send(Turn::Answer(read));
        }
        drop(handover);
        Ok(own)
    }
}

/// A waiting read's side of its turn. A read cancelled after it was handed
/// the turn, before it ran, hands the turn on: else its statement would be
/// counted as running for ever, and with two such, every read would wait.
struct Wait<'a> {
    reads: &'a KeyReads,
    turn: Option<oneshot::Receiver<Turn>>,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let Some(mut turn) = self.turn.take() {
            // Closed, it takes no turn after this; one sent already is in it.
            turn.close();
            if let Ok(Turn::Lead(started)) = turn.try_recv() {
                drop(Handover {
                    reads: self.reads,
                    started,
                });
            }
        }
    }
}

/// Hands the turn to the read that has waited longest, or frees it. On
/// drop, so that a statement that fails or is cancelled hands it on too
/// (the reads it was to answer then go alone).
struct Handover<'a> {
    reads: &'a KeyReads,
    /// When the statement handing over started.
    started: Instant,
}

impl Drop for Handover<'_> {
    fn drop(&mut self) {
        let mut state = self.reads.state.lock().expect("key reads lock");
        let slot = state
            .running
            .iter()
            .position(|started| *started == self.started)
            .expect("a running statement is counted");
        while !state.waiting.is_empty() {
            let next = state.waiting.remove(0);
            let now = Instant::now();
            if next.turn.send(Turn::Lead(now)).is_ok() {
                state.running[slot] = now;
                return;
            }
        }
        state.running.swap_remove(slot);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    const REVISIONS: Revisions = Revisions {
        current: 7,
        compact: -1,
        compacted_through: 0,
    };

    /// Every key exists, its value its own name; each statement takes 20 ms
    /// and is counted, and fails if its first key is `fail`.
    async fn read_keys(statements: &AtomicUsize, keys: &[&[u8]]) -> Result<Vec<KeyRead>, String> {
        statements.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        if keys[0] == b"fail" {
            return Err("failed".to_string());
        }
        let found = keys
            .iter()
            .map(|key| KeyValue {
                key: key.to_vec(),
                value: key.to_vec(),
                ..Default::default()
            })
            .collect();
        Ok(reads_of(keys, REVISIONS, found))
    }

    /// Reads `keys` at once, each as its own task; each task's answer.
    async fn read_all(
        reads: &Arc<KeyReads>,
        statements: &Arc<AtomicUsize>,
        keys: &[&str],
    ) -> Vec<Result<Vec<u8>, String>> {
        let tasks: Vec<_> = keys
            .iter()
            .map(|key| {
                let (reads, statements, key) = (reads.clone(), statements.clone(), key.to_string());
                tokio::spawn(async move {
                    let read_keys = async |keys: &[&[u8]]| read_keys(&statements, keys).await;
                    let read = reads.read(key.as_bytes(), read_keys).await?;
                    Ok(read.kv.expect("every key exists").value)
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            let answer = tokio::time::timeout(Duration::from_secs(5), task).await;
            answers.push(answer.expect("every read is answered").unwrap());
        }
        answers
    }

    /// `read_all` on a task of its own.
    fn spawn_read_all(
        reads: &Arc<KeyReads>,
        statements: &Arc<AtomicUsize>,
        keys: &'static [&'static str],
    ) -> tokio::task::JoinHandle<Vec<Result<Vec<u8>, String>>> {
        let (reads, statements) = (reads.clone(), statements.clone());
        tokio::spawn(async move { read_all(&reads, &statements, keys).await })
    }

    // Paused time: a statement takes 20 ms exactly, and reads spawned
    // together come at the same instant.
    #[tokio::test(start_paused = true)]
    async fn reads_that_come_meanwhile_share_a_statement() {
        let (reads, statements) = (Arc::new(KeyReads::default()), Arc::default());
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let answers = read_all(&reads, &statements, &keys).await;
        for (key, answer) in keys.iter().zip(answers) {
            assert_eq!(answer.unwrap(), key.as_bytes());
        }
        // The first alone, then the 19 that waited behind it, together.
        assert_eq!(statements.load(Ordering::SeqCst), 2);
        assert!(reads.state.lock().unwrap().running.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn reads_of_a_failed_statement_run_their_own() {
        let (reads, statements) = (Arc::new(KeyReads::default()), Arc::default());
        // `a` leads; `fail` leads the next statement, with `b` and `c`.
        let answers = read_all(&reads, &statements, &["a", "fail", "b", "c"]).await;
        assert_eq!(answers[0].as_deref(), Ok(&b"a"[..]));
        assert_eq!(answers[1], Err("failed".to_string()));
        assert_eq!(answers[2].as_deref(), Ok(&b"b"[..]));
        assert_eq!(answers[3].as_deref(), Ok(&b"c"[..]));
        // a, fail with b and c, then b and c alone.
        assert_eq!(statements.load(Ordering::SeqCst), 4);
        assert!(reads.state.lock().unwrap().running.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_statement_hands_its_turn_on() {
        let (reads, statements) = (Arc::new(KeyReads::default()), Arc::<AtomicUsize>::default());
        let leader = tokio::spawn({
            let (reads, statements) = (reads.clone(), statements.clone());
            async move {
                let read_keys = async |keys: &[&[u8]]| read_keys(&statements, keys).await;
                reads.read(b"a", read_keys).await
            }
        });
        let waiting = spawn_read_all(&reads, &statements, &["c"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(reads.state.lock().unwrap().waiting.len(), 1, "c waits");
        leader.abort();
        let answers = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("c is answered")
            .unwrap();
        assert_eq!(answers[0].as_deref(), Ok(&b"c"[..]));
        assert!(reads.state.lock().unwrap().running.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_beside_a_slow_statement_starts_a_second() {
        let (reads, statements) = (Arc::new(KeyReads::default()), Arc::<AtomicUsize>::default());
        let slow = spawn_read_all(&reads, &statements, &["a"]);
        // `a`'s statement has run 5 ms of its 20, more than SECOND_STATEMENT_AFTER.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let begun = Instant::now();
        let answers = read_all(&reads, &statements, &["b"]).await;
        assert_eq!(answers[0].as_deref(), Ok(&b"b"[..]));
        // One statement's time (20 ms), not two: b did not wait for a's.
        assert!(
            begun.elapsed() < Duration::from_millis(25),
            "{:?}",
            begun.elapsed()
        );
        assert_eq!(slow.await.unwrap()[0].as_deref(), Ok(&b"a"[..]));
        assert_eq!(statements.load(Ordering::SeqCst), 2);
        assert!(reads.state.lock().unwrap().running.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_cancelled_with_the_turn_hands_it_on() {
        let (reads, statements) = (Arc::new(KeyReads::default()), Arc::<AtomicUsize>::default());
        let leader = spawn_read_all(&reads, &statements, &["a"]);
        tokio::task::yield_now().await;
        // `b` comes while `a` runs, and waits.
        let read_b = async |keys: &[&[u8]]| read_keys(&statements, keys).await;
        let mut b = Box::pin(reads.read(b"b", read_b));
        let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(b.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "b waits");
        // `a` ends and hands `b` the turn; `b` is dropped before it runs.
        leader.await.unwrap();
        drop(b);
        assert!(reads.state.lock().unwrap().running.is_empty());
        let answers = read_all(&reads, &statements, &["c"]).await;
        assert_eq!(answers[0].as_deref(), Ok(&b"c"[..]));
    }
}
