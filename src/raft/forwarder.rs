//! A follower's forwarder: how this member's proposals reach the leader.
//!
//! A follower used to forward each write in a peer call of its own, so at
//! many clients it made a call per write where the leader, gathering them,
//! wrote one entry per many (docs/benchmarks/replicated.md, "Replicated mode: proposals
//! gathered into entries": 1.1x etcd's puts through a follower against 1.4x
//! through the leader). The forwarder sends the proposals that wait for a
//! leader in one `ForwardSeveral` call, gathered as the leader's proposer
//! gathers entries, one call at a time per leader: what comes while a call
//! is out goes in the next (docs/benchmarks/replicated.md, "A follower's writes forwarded
//! together": one call in flight did better than four). A leader that does
//! not know the call (an older cetera answers `Unimplemented`, having
//! delivered nothing) gets each proposal in a `Forward` call of its own, as
//! before, and is asked again after a while.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};

use super::network::{Method, Peers};
use super::peer_error::PeerError;
use super::proposal::Proposal;
use super::proposer::Gathering;
use super::refusal::Refusal;

/// How long a leader that did not know `ForwardSeveral` goes before it is
/// asked again (it may have been upgraded meanwhile).
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(3);

/// The leader's answer to a forwarded proposal, or why there was none.
pub(super) type Forwarded = Result<Result<(), Refusal>, PeerError>;

/// A proposal on its way to the leader, and where its answer goes.
type Forwarding = (Proposal, oneshot::Sender<Forwarded>);

/// Sends this member's proposals to the leader while it follows.
pub(super) struct Forwarder {
    peers: Peers,
    timeout: Duration,
    /// One lane per leader (by peer URL): a call that hangs on a leader
    /// that is gone holds up no proposal for the next one.
    lanes: Mutex<HashMap<String, mpsc::UnboundedSender<Forwarding>>>,
}

impl Forwarder {
    /// Forwards through `peers`, each call within `timeout`.
    pub(super) fn new(peers: Peers, timeout: Duration) -> Forwarder {
        Forwarder {
            peers,
            timeout,
            lanes: Mutex::default(),
        }
    }

    /// Sends `proposal` to the leader at peer URL `leader` and returns its
    /// answer: once the leader has applied it, or why not.
    pub(super) async fn forward(&self, leader: &str, proposal: Proposal) -> Forwarded {
        let stopped = || PeerError::Unreachable {
            url: leader.to_string(),
            message: "the forwarder stopped".to_string(),
        };
        let (reply, answer) = oneshot::channel();
        self.lane(leader)
            .send((proposal, reply))
            .map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// The lane to `leader`, started on first use.
    fn lane(&self, leader: &str) -> mpsc::UnboundedSender<Forwarding> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let lane = lanes.entry(leader.to_string()).or_insert_with(|| {
            let (lane, waiting) = mpsc::unbounded_channel();
            let (peers, leader) = (self.peers.clone(), leader.to_string());
            tokio::spawn(forward_all(peers, leader, self.timeout, waiting));
            lane
        });
        lane.clone()
    }
}

/// Runs one leader's lane until the `Forwarder` is gone.
async fn forward_all(
    peers: Peers,
    leader: String,
    timeout: Duration,
    waiting: mpsc::UnboundedReceiver<Forwarding>,
) {
    // When the leader last answered `ForwardSeveral` with Unimplemented.
    let mut older: Option<Instant> = None;
    let mut gathering = Gathering::new(waiting);
    while let Some(gathered) = gathering.next().await {
        // Until the leader answers, the next proposals gather.
        send(&peers, &leader, timeout, &mut older, gathered).await;
    }
}

/// Sends `gathered` to `leader` in one call, or in a call each when it does
/// not know the call for several, and hands out the answers.
async fn send(
    peers: &Peers,
    leader: &str,
    timeout: Duration,
    older: &mut Option<Instant>,
    gathered: Vec<Forwarding>,
) {
    let forwarded = &crate::metrics::metrics().forwarded_writes;
    let known_older = older.is_some_and(|at| at.elapsed() < ASK_AGAIN_AFTER);
    if gathered.len() > 1 && !known_older {
        let proposals: Vec<&Proposal> = gathered.iter().map(|(p, _)| p).collect();
        let answer: Result<Vec<Result<(), Refusal>>, PeerError> = peers
            .call(leader, Method::ForwardSeveral, &proposals, timeout)
            .await;
        // An older leader: nothing was delivered, so each goes on its own.
        if let Err(PeerError::Refused { status, .. }) = &answer
            && status.code() == tonic::Code::Unimplemented
        {
            *older = Some(Instant::now());
            return send_each(peers, leader, timeout, gathered).await;
        }
        forwarded.observe(gathered.len() as f64);
        let error = match answer {
            Ok(answers) if answers.len() == gathered.len() => {
                for ((_, reply), answer) in gathered.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
                return;
            }
            Ok(answers) => PeerError::Garbled {
                url: leader.to_string(),
                message: format!(
                    "{} answers to {} forwarded proposals",
                    answers.len(),
                    gathered.len()
                ),
            },
            Err(error) => error,
        };
        for (_, reply) in gathered {
            let _ = reply.send(Err(error.clone()));
        }
        return;
    }
    send_each(peers, leader, timeout, gathered).await;
}

/// Sends each of `gathered` to `leader` in a `Forward` call of its own.
async fn send_each(peers: &Peers, leader: &str, timeout: Duration, gathered: Vec<Forwarding>) {
    let forwarded = &crate::metrics::metrics().forwarded_writes;
    join_all(gathered.into_iter().map(|(proposal, reply)| async move {
        forwarded.observe(1.0);
        let answer = peers
            .call(leader, Method::Forward, &proposal, timeout)
            .await;
        let _ = reply.send(answer);
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
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

    impl Leader {
        fn new(knows_several: bool) -> Arc<Leader> {
            Arc::new(Leader {
                knows_several,
                forward_calls: AtomicUsize::new(0),
                several_calls: AtomicUsize::new(0),
            })
        }
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

    /// A follower's put numbered `seq`.
    fn proposal(seq: u64) -> Proposal {
        Proposal {
            origin: 2,
            seq,
            at_ms: 0,
            request: WriteRequest::Put(PutRequest::default()),
        }
    }

    /// Forwards 8 proposals at once, seqs 0..8, and checks each one's answer.
    async fn forward_eight(forwarder: &Forwarder, url: &str) {
        let answers = join_all((0..8).map(|seq| forwarder.forward(url, proposal(seq)))).await;
        for (seq, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Ok(())) => assert_eq!(seq % 2, 0, "seq {seq}"),
                Ok(Err(Refusal::Busy)) => assert_eq!(seq % 2, 1, "seq {seq}"),
                other => panic!("seq {seq}: {other:?}"),
            }
        }
    }

    /// `leader` served, its URL, and a forwarder that calls within 5 s.
    async fn forwarding_to(leader: Arc<Leader>) -> (Arc<Leader>, String, Forwarder) {
        let url = serve(leader.clone()).await;
        let forwarder = Forwarder::new(Peers::new("token", None, None), Duration::from_secs(5));
        (leader, url, forwarder)
    }

    #[tokio::test]
    async fn proposals_at_once_go_in_one_call_each_with_its_answer() {
        let (leader, url, forwarder) = forwarding_to(Leader::new(true)).await;
        forward_eight(&forwarder, &url).await;
        assert_eq!(leader.several_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader.forward_calls.load(Ordering::SeqCst), 0);
    }

    /// An older leader answers `ForwardSeveral` with Unimplemented, having
    /// done nothing: each proposal goes in a `Forward` of its own, and the
    /// leader is not asked again for a while.
    #[tokio::test]
    async fn an_older_leader_gets_a_call_per_proposal() {
        let (leader, url, forwarder) = forwarding_to(Leader::new(false)).await;
        forward_eight(&forwarder, &url).await;
        forward_eight(&forwarder, &url).await;
        assert_eq!(leader.several_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader.forward_calls.load(Ordering::SeqCst), 16);
    }

    /// A call that hangs on a leader that is gone (its port takes the
    /// connection and never answers) holds up no proposal for another.
    #[tokio::test]
    async fn a_hung_leader_holds_up_no_other() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_url = format!("http://{}", silent.local_addr().unwrap());
        let leader = Leader::new(true);
        let url = serve(leader.clone()).await;
        let forwarder = Arc::new(Forwarder::new(
            Peers::new("token", None, None),
            Duration::from_secs(60),
        ));
        let hung = {
            let (forwarder, silent_url) = (forwarder.clone(), silent_url.clone());
            tokio::spawn(async move { forwarder.forward(&silent_url, proposal(0)).await })
        };
        // Its call is out once it has connected.
        let (_connection, _) = silent.accept().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), forward_eight(&forwarder, &url))
            .await
            .expect("the other leader's answers while the first hangs");
        assert!(!hung.is_finished());
        hung.abort();
        drop(silent);
    }
}
