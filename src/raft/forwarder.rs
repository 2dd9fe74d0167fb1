//! A follower's forwarder: how this member's proposals reach the leader.
//!
//! A follower used to forward each write in a peer call of its own, so at
//! many clients it made a call per write where the leader, gathering them,
//! wrote one entry per many (BENCHMARKS.md, "Replicated mode: proposals
//! gathered into entries": 1.1x etcd's puts through a follower against 1.4x
//! through the leader). The forwarder sends the proposals that wait for the
//! same leader in one `ForwardSeveral` call, gathered as the leader's
//! proposer gathers entries, with a few calls in flight. A leader that does
//! not know the call (an older cetera answers `Unimplemented`, having
//! delivered nothing) gets each proposal in a `Forward` call of its own, as
//! before, and is asked again after a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::network::{Method, PeerError, Peers};
use super::peer::Refusal;
use super::proposal::Proposal;
use super::proposer::gather;

/// Calls to the leader in flight at once. With one, the proposals that come
/// during a call wait for its answer, a whole entry's round, before they
/// leave; with a few, they leave as they gather and join the leader's next
/// entry.
const CALLS_AT_ONCE: usize = 4;

/// How long a leader that did not know `ForwardSeveral` goes before it is
/// asked again (it may have been upgraded meanwhile).
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(3);

/// The leader's answer to a forwarded proposal, or why there was none.
pub(super) type Forwarded = Result<Result<(), Refusal>, PeerError>;

/// A proposal on its way to the leader at `leader` (its peer URL).
struct Forwarding {
    leader: String,
    proposal: Proposal,
    reply: oneshot::Sender<Forwarded>,
}

/// Sends this member's proposals to the leader while it follows.
pub(super) struct Forwarder {
    queue: mpsc::UnboundedSender<Forwarding>,
}

impl Forwarder {
    /// Starts forwarding through `peers`, each call within `timeout`.
    pub(super) fn start(peers: Peers, timeout: Duration) -> Forwarder {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(forward_all(peers, timeout, waiting));
        Forwarder { queue }
    }

    /// Sends `proposal` to the leader at peer URL `leader` and returns its
    /// answer: once the leader has applied it, or why not.
    pub(super) async fn forward(&self, leader: &str, proposal: Proposal) -> Forwarded {
        let stopped = || PeerError::Unreachable {
            url: leader.to_string(),
            message: "the forwarder stopped".to_string(),
        };
        let (reply, answer) = oneshot::channel();
        let forwarding = Forwarding {
            leader: leader.to_string(),
            proposal,
            reply,
        };
        self.queue.send(forwarding).map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// Runs until every `Forwarder` handle is gone.
async fn forward_all(
    peers: Peers,
    timeout: Duration,
    mut waiting: mpsc::UnboundedReceiver<Forwarding>,
) {
    let calls = Arc::new(Semaphore::new(CALLS_AT_ONCE));
    // Leaders that answered `ForwardSeveral` with Unimplemented, and when.
    let older: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut left_over = None;
    loop {
        let first = match left_over.take() {
            Some(first) => first,
            None => match waiting.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        // What comes while the calls in flight are answered gathers.
        let Ok(call) = calls.clone().acquire_owned().await else {
            return;
        };
        let gathered;
        (gathered, left_over) = gather(
            first,
            &mut waiting,
            |f: &Forwarding| &f.proposal,
            |first, next| first.leader == next.leader,
        );
        let (peers, older) = (peers.clone(), older.clone());
        tokio::spawn(async move {
            send(&peers, timeout, &older, gathered).await;
            drop(call);
        });
    }
}

/// Sends `gathered` (proposals for one leader) in one call, or in a call
/// each to a leader that does not know the call for several, and hands out
/// the answers.
async fn send(
    peers: &Peers,
    timeout: Duration,
    older: &Mutex<HashMap<String, Instant>>,
    gathered: Vec<Forwarding>,
) {
    let leader = gathered[0].leader.clone();
    let known_older = {
        let mut older = older.lock().unwrap_or_else(|e| e.into_inner());
        older.retain(|_, at| at.elapsed() < ASK_AGAIN_AFTER);
        older.contains_key(&leader)
    };
    let forwarded = &crate::metrics::metrics().forwarded_writes;
    if gathered.len() > 1 && !known_older {
        forwarded.observe(gathered.len() as f64);
        let proposals: Vec<&Proposal> = gathered.iter().map(|f| &f.proposal).collect();
        let answer: Result<Vec<Result<(), Refusal>>, PeerError> = peers
            .call(&leader, Method::ForwardSeveral, &proposals, timeout)
            .await;
        match answer {
            Ok(answers) if answers.len() == gathered.len() => {
                for (forwarding, answer) in gathered.into_iter().zip(answers) {
                    let _ = forwarding.reply.send(Ok(answer));
                }
                return;
            }
            Ok(answers) => {
                let garbled = PeerError::Garbled {
                    url: leader,
                    message: format!(
                        "{} answers to {} forwarded proposals",
                        answers.len(),
                        gathered.len()
                    ),
                };
                for forwarding in gathered {
                    let _ = forwarding.reply.send(Err(garbled.clone()));
                }
                return;
            }
            // An older leader: nothing was delivered, so each goes on its own.
            Err(PeerError::Refused { status, .. })
                if status.code() == tonic::Code::Unimplemented =>
            {
                let mut older = older.lock().unwrap_or_else(|e| e.into_inner());
                older.insert(leader.clone(), Instant::now());
            }
            Err(error) => {
                for forwarding in gathered {
                    let _ = forwarding.reply.send(Err(error.clone()));
                }
                return;
            }
        }
    }
    let leader = &leader;
    join_all(gathered.into_iter().map(|forwarding| async move {
        forwarded.observe(1.0);
        let answer = peers
            .call(leader, Method::Forward, &forwarding.proposal, timeout)
            .await;
        let _ = forwarding.reply.send(answer);
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tonic::{Request, Response, Status};

    use super::*;
    use crate::proto::ceterapb::Payload;
    use crate::proto::ceterapb::peer_server::{Peer, PeerServer};
    use crate::proto::etcdserverpb::PutRequest;
    use crate::store::request::WriteRequest;

    /// A leader that takes forwarded proposals and refuses those with an
    /// odd seq; an older one does not know `ForwardSeveral`.
    struct Leader {
        knows_several: bool,
        forward_calls: AtomicUsize,
        several_calls: AtomicUsize,
    }

    fn outcome(proposal: &Proposal) -> Result<(), Refusal> {
        match proposal.seq % 2 {
            0 => Ok(()),
            _ => Err(Refusal::Busy),
        }
    }

    fn reply<T: serde::Serialize>(value: &T) -> Result<Response<Payload>, Status> {
        let data = postcard::to_stdvec(value).unwrap();
        Ok(Response::new(Payload { data }))
    }

    fn unknown() -> Result<Response<Payload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    #[tonic::async_trait]
    impl Peer for Leader {
        async fn forward(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
            self.forward_calls.fetch_add(1, Ordering::SeqCst);
            let proposal: Proposal = postcard::from_bytes(&request.get_ref().data).unwrap();
            reply(&outcome(&proposal))
        }
        async fn forward_several(
            &self,
            request: Request<Payload>,
        ) -> Result<Response<Payload>, Status> {
            self.several_calls.fetch_add(1, Ordering::SeqCst);
            if !self.knows_several {
                return Err(Status::unimplemented("unknown method ForwardSeveral"));
            }
            let proposals: Vec<Proposal> = postcard::from_bytes(&request.get_ref().data).unwrap();
            reply(&proposals.iter().map(outcome).collect::<Vec<_>>())
        }
        async fn append_entries(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn vote(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn install_snapshot(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn read_index(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn join(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn change_members(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn reserved(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn campaign(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn pre_vote(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn handing_over(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn lease(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
        async fn entry_format(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            unknown()
        }
    }

    /// Serves `leader` on a local port; its peer URL.
    async fn serve(leader: Arc<Leader>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PeerServer::from_arc(leader))
                .serve_with_incoming(incoming),
        );
        url
    }

    /// Forwards 8 proposals at once, seqs 0..8, and checks each one's answer.
    async fn forward_eight(forwarder: &Forwarder, url: &str) {
        let proposals = (0..8).map(|seq| Proposal {
            origin: 2,
            seq,
            at_ms: 0,
            request: WriteRequest::Put(PutRequest::default()),
        });
        let answers = join_all(proposals.map(|p| forwarder.forward(url, p))).await;
        for (seq, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Ok(())) => assert_eq!(seq % 2, 0, "seq {seq}"),
                Ok(Err(Refusal::Busy)) => assert_eq!(seq % 2, 1, "seq {seq}"),
                other => panic!("seq {seq}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn proposals_at_once_go_in_one_call_each_with_its_answer() {
        let leader = Arc::new(Leader {
            knows_several: true,
            forward_calls: AtomicUsize::new(0),
            several_calls: AtomicUsize::new(0),
        });
        let url = serve(leader.clone()).await;
        let forwarder = Forwarder::start(Peers::new("token", None, None), Duration::from_secs(5));
        forward_eight(&forwarder, &url).await;
        assert_eq!(leader.several_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader.forward_calls.load(Ordering::SeqCst), 0);
    }

    /// An older leader answers `ForwardSeveral` with Unimplemented, having
    /// done nothing: each proposal goes in a `Forward` of its own, and the
    /// leader is not asked again for a while.
    #[tokio::test]
    async fn an_older_leader_gets_a_call_per_proposal() {
        let leader = Arc::new(Leader {
            knows_several: false,
            forward_calls: AtomicUsize::new(0),
            several_calls: AtomicUsize::new(0),
        });
        let url = serve(leader.clone()).await;
        let forwarder = Forwarder::start(Peers::new("token", None, None), Duration::from_secs(5));
        forward_eight(&forwarder, &url).await;
        forward_eight(&forwarder, &url).await;
        assert_eq!(leader.several_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader.forward_calls.load(Ordering::SeqCst), 16);
    }
}
