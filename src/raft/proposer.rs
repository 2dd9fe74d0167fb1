//! The leader's proposer: how this member's proposals become log entries.
//!
//! openraft 0.9 appends and syncs each client write as an entry of its own
//! before it takes the next (`RaftCore::append_to_log` awaits the flush), so
//! at many clients a member synced its log about once per write, where
//! etcd's members sync once per many. The proposer writes one entry at a
//! time and puts the proposals that came meanwhile into the next one
//! together (`Proposals`), as etcd's raft appends every proposal that came
//! since its last Ready at once. (Two entries in flight did no better in
//! the run of docs/benchmarks/replicated.md, "Replicated mode: proposals gathered into entries",
//! and synced more often.) Entries of several go into the log only once
//! every member has said it reads them (`ENTRY_FORMAT`); until then each
//! proposal is an entry of its own, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use super::network::{Method, Peers};
use super::openraft_types::Raft;
use super::proposal::{ENTRY_FORMAT, Proposal, Proposals};
use super::refusal::{Refusal, refusal_of};
use crate::store::request::WriteRequest;

/// At most this many proposals in one entry.
const MOST_PER_ENTRY: usize = 256;

/// An entry stops gathering at about this many bytes of requests (one
/// larger request is an entry of its own), so that entries stay the size
/// of etcd's largest request rather than hundreds of them.
const ENTRY_BYTES: usize = 1536 * 1024;

/// How long a member that did not say which entries it reads (an older
/// cetera, or out of reach) goes before it is asked again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(3);

/// How long asking a member may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// A proposal waiting for its entry, and where the outcome goes.
type Waiting = (Proposal, oneshot::Sender<Result<(), Refusal>>);

/// Turns this member's proposals into log entries while it leads.
pub(super) struct Proposer {
    queue: mpsc::UnboundedSender<Waiting>,
}

impl Proposer {
    /// Starts proposing into `raft` as member `id`, asking the members
    /// through `peers` which entries they read.
    pub(super) fn start(id: u64, raft: Raft, peers: Peers) -> Proposer {
        let (queue, waiting) = mpsc::unbounded_channel();
        let formats = Arc::new(EntryFormats {
            id,
            peers,
            known: Mutex::default(),
        });
        tokio::spawn(propose(raft, waiting, formats));
        Proposer { queue }
    }

    /// Puts `proposal` in the log and returns once it is applied here.
    pub(super) async fn propose(&self, proposal: Proposal) -> Result<(), Refusal> {
        let stopped = || Refusal::Failed("the proposer stopped".to_string());
        let (reply, outcome) = oneshot::channel();
        self.queue.send((proposal, reply)).map_err(|_| stopped())?;
        outcome.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// Runs until every `Proposer` handle is gone.
async fn propose(
    raft: Raft,
    waiting: mpsc::UnboundedReceiver<Waiting>,
    formats: Arc<EntryFormats>,
) {
    let mut gathering = Gathering::new(waiting);
    while let Some(gathered) = gathering.next().await {
        let entries = match gathered.len() > 1 && formats.all_read_several(&raft) {
            true => vec![gathered],
            false => gathered.into_iter().map(|one| vec![one]).collect(),
        };
        // Until these are applied here, the next proposals gather.
        join_all(entries.into_iter().map(|entry| write(&raft, entry))).await;
    }
}

/// Proposals (each with where its outcome goes) taken from a queue as many
/// at a time as one entry takes. The forwarder gathers its calls to the
/// leader the same way.
pub(super) struct Gathering<R> {
    waiting: mpsc::UnboundedReceiver<(Proposal, R)>,
    /// A proposal that did not fit in the last gathering starts the next.
    left_over: Option<(Proposal, R)>,
}

impl<R> Gathering<R> {
    pub(super) fn new(waiting: mpsc::UnboundedReceiver<(Proposal, R)>) -> Self {
        Gathering {
            waiting,
            left_over: None,
        }
    }

    /// The next proposal (waiting for one if none is there) and those
    /// already waiting after it, up to an entry's count and size; None
    /// once every sender is gone and nothing is left.
    pub(super) async fn next(&mut self) -> Option<Vec<(Proposal, R)>> {
        let first = match self.left_over.take() {
            Some(first) => first,
            None => self.waiting.recv().await?,
        };
        let mut bytes = request_bytes(&first.0.request);
        let mut gathered = vec![first];
        while gathered.len() < MOST_PER_ENTRY
            && let Ok(next) = self.waiting.try_recv()
        {
            bytes += request_bytes(&next.0.request);
            if bytes > ENTRY_BYTES {
                self.left_over = Some(next);
                break;
            }
            gathered.push(next);
        }
        Some(gathered)
    }
}

/// About the size of `request` in an entry: its etcd message's.
fn request_bytes(request: &WriteRequest) -> usize {
    match request {
        WriteRequest::Put(put) => put.encoded_len(),
        WriteRequest::DeleteRange(delete) => delete.encoded_len(),
        WriteRequest::Txn(txn) => txn.encoded_len(),
        // Leases, compactions, alarms and auth changes are small.
        _ => 16,
    }
}

/// Writes one entry and tells each of its proposals the outcome.
async fn write(raft: &Raft, entry: Vec<Waiting>) {
    let (proposals, replies): (Vec<_>, Vec<_>) = entry.into_iter().unzip();
    let outcome = raft
        .client_write(Proposals(proposals))
        .await
        .map(|_| ())
        .map_err(refusal_of);
    for reply in replies {
        let _ = reply.send(outcome.clone());
    }
}

/// What the leader knows of the entry formats the members read.
struct EntryFormats {
    id: u64,
    peers: Peers,
    known: Mutex<HashMap<u64, Known>>,
}

enum Known {
    /// The member said it reads entries up to this format.
    Reads(u32),
    /// Asked at this time, no answer yet (or none that said).
    Asked(Instant),
}

impl EntryFormats {
    /// Whether every member of the current membership reads entries of
    /// several proposals. Asks, without waiting, the members it does not
    /// know of yet.
    fn all_read_several(self: &Arc<Self>, raft: &Raft) -> bool {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = true;
        for (id, member) in metrics.membership_config.membership().nodes() {
            match known.get(id) {
                _ if *id == self.id => continue,
                Some(Known::Reads(format)) if *format >= ENTRY_FORMAT => continue,
                Some(Known::Asked(at)) if at.elapsed() < ASK_AGAIN_AFTER => {}
                _ => {
                    known.insert(*id, Known::Asked(Instant::now()));
                    tokio::spawn(self.clone().ask(*id, member.peer_url.clone()));
                }
            }
            all = false;
        }
        all
    }

    /// Asks member `id` which entries it reads.
    async fn ask(self: Arc<Self>, id: u64, peer_url: String) {
        let answer: Result<u32, _> = self
            .peers
            .call(&peer_url, Method::EntryFormat, &(), ASK_TIMEOUT)
            .await;
        match answer {
            Ok(format) => {
                let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
                known.insert(id, Known::Reads(format));
            }
            Err(error) => tracing::debug!(
                member_id = format_args!("{id:x}"),
                "no entry format from the member: {error}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::PutRequest;

    fn put_of(value_bytes: usize) -> Waiting {
        let put = PutRequest {
            key: b"k".to_vec(),
            value: vec![b'v'; value_bytes],
            ..Default::default()
        };
        let proposal = Proposal {
            origin: 1,
            seq: 1,
            at_ms: 0,
            request: WriteRequest::Put(put),
        };
        (proposal, oneshot::channel().0)
    }

    /// Entries, each as its proposals' value sizes, of what is waiting.
    async fn entries(sizes: &[usize]) -> Vec<Vec<usize>> {
        let (send, waiting) = mpsc::unbounded_channel();
        for size in sizes {
            send.send(put_of(*size)).unwrap();
        }
        drop(send);
        let mut gathering = Gathering::new(waiting);
        let mut entries = Vec::new();
        while let Some(gathered) = gathering.next().await {
            entries.push(gathered.iter().map(|(p, _)| value_bytes(p)).collect());
        }
        entries
    }

    fn value_bytes(proposal: &Proposal) -> usize {
        match &proposal.request {
            WriteRequest::Put(put) => put.value.len(),
            _ => unreachable!(),
        }
    }

    #[tokio::test]
    async fn entries_take_what_waits_up_to_their_count_and_size() {
        let small = vec![100; MOST_PER_ENTRY + 10];
        let sizes: Vec<usize> = entries(&small).await.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![MOST_PER_ENTRY, 10]);

        let mib = 1 << 20;
        assert_eq!(
            entries(&[100, mib, mib, 100, 2 * mib, 100]).await,
            vec![vec![100, mib], vec![mib, 100], vec![2 * mib], vec![100]],
        );
    }
}
