//! Whether each peer answers, as the log tells it: a peer that stops
//! answering is logged once when it becomes unreachable and once when it
//! answers again, with how many calls failed meanwhile, as etcd logs a lost
//! peer and its return. Raft calls a silent peer many times a second (every
//! heartbeat, every append, every leadership check); one line each would
//! flood the log, and on an SD card a log line is a write too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::peer_error::PeerError;

/// Calls that time out only make a peer unreachable once they have gone
/// unanswered this long: an append can miss its heartbeat-length timeout
/// while the peer is busy, and one such miss is no news. A call that cannot
/// connect at all makes it unreachable at once.
const SILENT_FOR: Duration = Duration::from_secs(1);

/// The calls to one peer since it last answered.
struct Failing {
    since: Instant,
    failures: u64,
    /// Whether the log said it became unreachable.
    reported: bool,
}

/// Each peer whose latest calls failed, by peer URL.
#[derive(Default)]
pub(super) struct Reachability {
    failing: Mutex<HashMap<String, Failing>>,
}

impl Reachability {
    /// Notes the outcome of a call to the peer at `url`: an answer (any
    /// answer, also a refusal: the peer is there), or why none came.
    pub(super) fn note(&self, url: &str, outcome: Result<(), &PeerError>) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(()) => {
                if let Some(ended) = failing.remove(url)
                    && ended.reported
                {
                    tracing::info!(
                        peer = url,
                        failed_calls = ended.failures,
                        "peer answers again after {:.1?} unreachable ({} calls failed)",
                        ended.since.elapsed(),
                        ended.failures,
                    );
                }
            }
            Err(error) => {
                let now = Instant::now();
                let state = failing.entry(url.to_string()).or_insert(Failing {
                    since: now,
                    failures: 0,
                    reported: false,
                });
                state.failures += 1;
                let lost = matches!(error, PeerError::Unreachable { .. })
                    || now.duration_since(state.since) >= SILENT_FOR;
                if lost && !state.reported {
                    state.reported = true;
                    tracing::warn!(
                        peer = url,
                        "peer is unreachable: {error}; logged again once it answers"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> PeerError {
        PeerError::Unreachable {
            url: "http://127.0.0.1:1".into(),
            message: "connection refused".into(),
        }
    }

    #[test]
    fn failures_are_counted_until_the_peer_answers() {
        let peers = Reachability::default();
        for _ in 0..5 {
            peers.note("http://127.0.0.1:1", Err(&refused()));
        }
        {
            let failing = peers.failing.lock().unwrap();
            let state = &failing["http://127.0.0.1:1"];
            assert_eq!(state.failures, 5);
            assert!(state.reported);
        }
        peers.note("http://127.0.0.1:1", Ok(()));
        assert!(peers.failing.lock().unwrap().is_empty());
    }

    #[test]
    fn a_single_timeout_is_no_news() {
        let peers = Reachability::default();
        let timed_out = PeerError::TimedOut {
            url: "http://127.0.0.1:2".into(),
            message: "deadline".into(),
        };
        peers.note("http://127.0.0.1:2", Err(&timed_out));
        assert!(!peers.failing.lock().unwrap()["http://127.0.0.1:2"].reported);
        peers.note("http://127.0.0.1:2", Ok(()));
        assert!(peers.failing.lock().unwrap().is_empty());
    }
}
