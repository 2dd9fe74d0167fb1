//! The watch hub: a bounded window of recently committed revisions in memory.
//!
//! The writer publishes each commit's revisions here before it answers the
//! writes, so a watcher sees a change right after its commit with no polling.
//! Watchers pull from the window at their own pace; a watcher that falls
//! behind the window reads from the revision log instead. So a slow watcher
//! never blocks the writer or other watchers, and memory stays bounded.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use prost::Message;
use tokio::sync::watch;

use crate::proto::mvccpb::Event;

/// Most revisions kept in memory.
const WINDOW_REVISIONS: usize = 20_000;
/// Most bytes of events kept in memory.
const WINDOW_BYTES: usize = 64 << 20;

/// The events of one revision, in the order they happened, each with the
/// key's previous state.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionEvents {
    /// The revision.
    pub revision: i64,
    /// Its changes.
    pub events: Vec<Event>,
}

impl RevisionEvents {
    fn size(&self) -> usize {
        self.events.iter().map(Message::encoded_len).sum::<usize>() + 16
    }
}

#[derive(Default)]
struct Window {
    revisions: VecDeque<Arc<RevisionEvents>>,
    bytes: usize,
}

/// Recently committed revisions, and the latest revision for wake-ups.
pub struct WatchHub {
    window: RwLock<Window>,
    latest: watch::Sender<i64>,
}

impl WatchHub {
    /// A hub for a store at revision `current`.
    pub fn new(current: i64) -> Self {
        WatchHub {
            window: RwLock::default(),
            latest: watch::Sender::new(current),
        }
    }

    /// The latest revision published.
    pub fn latest(&self) -> i64 {
        *self.latest.borrow()
    }

    /// A receiver that wakes whenever a revision is published.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.latest.subscribe()
    }

    /// Adds newly committed revisions (ascending, following the latest) and wakes watchers.
    pub fn publish(&self, committed: Vec<RevisionEvents>) {
        let Some(last) = committed.last().map(|r| r.revision) else {
            return;
        };
        {
            let mut window = self.window.write().expect("watch window poisoned");
            for revision in committed {
                window.bytes += revision.size();
                window.revisions.push_back(Arc::new(revision));
            }
            while window.revisions.len() > WINDOW_REVISIONS
                || (window.bytes > WINDOW_BYTES && window.revisions.len() > 1)
            {
                if let Some(old) = window.revisions.pop_front() {
                    window.bytes -= old.size();
                }
            }
        }
        self.latest.send_replace(last);
    }

    /// The revisions after `after` (at most `max`), if the window still holds
    /// the first of them; None means the caller must read the log.
    pub fn since(&self, after: i64, max: usize) -> Option<Vec<Arc<RevisionEvents>>> {
        let window = self.window.read().expect("watch window poisoned");
        let Some(first) = window.revisions.front() else {
            // Nothing in memory: fine only if nothing is missing.
            return (after >= self.latest()).then(Vec::new);
        };
        if after + 1 < first.revision {
            return None;
        }
        let skip = usize::try_from(after + 1 - first.revision).unwrap_or(0);
        Some(
            window
                .revisions
                .iter()
                .skip(skip)
                .take(max)
                .cloned()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(revision: i64) -> RevisionEvents {
        RevisionEvents {
            revision,
            events: vec![Event::default()],
        }
    }

    #[test]
    fn serves_what_the_window_holds_and_refuses_older() {
        let hub = WatchHub::new(5);
        assert_eq!(hub.since(5, 10), Some(vec![]));
        assert_eq!(
            hub.since(3, 10),
            None,
            "revisions 4 and 5 were never in memory"
        );
        hub.publish(vec![revision(6), revision(7)]);
        hub.publish(vec![revision(8)]);
        assert_eq!(hub.latest(), 8);
        let revs: Vec<i64> = hub
            .since(6, 10)
            .unwrap()
            .iter()
            .map(|r| r.revision)
            .collect();
        assert_eq!(revs, vec![7, 8]);
        assert_eq!(hub.since(5, 1).unwrap().len(), 1);
        assert_eq!(hub.since(4, 10), None);
        assert!(hub.since(8, 10).unwrap().is_empty());
    }

    #[test]
    fn window_is_bounded() {
        let hub = WatchHub::new(0);
        for r in 1..=(WINDOW_REVISIONS as i64 + 10) {
            hub.publish(vec![revision(r)]);
        }
        assert_eq!(hub.since(0, 1), None);
        assert!(hub.since(10, 1).is_some());
    }
}
