//! The watch hub: a bounded window of recently committed revisions in memory.
//!
//! The writer publishes each commit's revisions here before it answers the
//! writes, so a watcher sees a change right after its commit with no polling.
//! Watchers pull from the window at their own pace; a watcher that falls
//! behind the window reads from the revision log instead. So a slow watcher
//! never blocks the writer or other watchers, and memory stays bounded.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use crate::proto::mvccpb::Event;

/// Most revisions kept in memory.
const WINDOW_REVISIONS: usize = 20_000;
/// Most bytes of memory the window's events take. Live watchers take each
/// revision within moments of its commit; this is the slack for a slow one
/// (seconds of a Kubernetes write load) before it reads the log, as every
/// watcher behind etcd's does. 64 MiB of encoded events was most of the
/// server's memory after a burst of writes (issue 51).
const WINDOW_BYTES: usize = 8 << 20;

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
    /// The memory it takes: the events and the keys and values they own.
    fn size(&self) -> usize {
        let owned = |event: &Event| {
            [&event.kv, &event.prev_kv]
                .into_iter()
                .flatten()
                .map(|kv| kv.key.capacity() + kv.value.capacity())
                .sum::<usize>()
        };
        size_of::<Self>()
            + self
                .events
                .iter()
                .map(|event| size_of::<Event>() + owned(event))
                .sum::<usize>()
    }
}

struct Window {
    /// Ascending; a revision with no rows left (compacted away) may be missing.
    revisions: VecDeque<Arc<RevisionEvents>>,
    bytes: usize,
    /// Every revision from this one on is in `revisions` (or has no events).
    covers_from: i64,
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
            window: RwLock::new(Window {
                revisions: VecDeque::new(),
                bytes: 0,
                covers_from: current + 1,
            }),
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

    /// Adds committed revisions (ascending; those not above the latest are
    /// ignored), declares everything through `through` seen, and wakes watchers.
    pub fn publish(&self, committed: Vec<RevisionEvents>, through: i64) {
        let latest = self.latest();
        if through <= latest {
            return;
        }
        {
            let mut window = self.window.write().expect("watch window poisoned");
            for revision in committed.into_iter().filter(|r| r.revision > latest) {
                window.bytes += revision.size();
                window.revisions.push_back(Arc::new(revision));
            }
            while window.revisions.len() > WINDOW_REVISIONS
                || (window.bytes > WINDOW_BYTES && window.revisions.len() > 1)
            {
                if let Some(old) = window.revisions.pop_front() {
                    window.bytes -= old.size();
                    window.covers_from = old.revision + 1;
                }
            }
        }
        self.latest.send_replace(through);
    }

    /// Whether anything follows the hub (a watch stream, a revision feed):
    /// with no one to tell, other instances' revisions need not be read.
    pub fn is_followed(&self) -> bool {
        self.latest.receiver_count() > 0
    }

    /// Declares everything through `through` seen without its events: the
    /// window starts over after it, and whoever wants those revisions later
    /// reads them from the log.
    pub fn skip(&self, through: i64) {
        if through <= self.latest() {
            return;
        }
        {
            let mut window = self.window.write().expect("watch window poisoned");
            window.revisions.clear();
            window.bytes = 0;
            window.covers_from = through + 1;
        }
        self.latest.send_replace(through);
    }

    /// The oldest revision the window answers for: `since(after, ..)` needs
    /// `after + 1 >= covers_from()`.
    pub fn covers_from(&self) -> i64 {
        self.window
            .read()
            .expect("watch window poisoned")
            .covers_from
    }

    /// The revisions after `after` (at most `max`), if the window still
    /// reaches back that far; None means the caller must read the log.
    pub fn since(&self, after: i64, max: usize) -> Option<Vec<Arc<RevisionEvents>>> {
        let window = self.window.read().expect("watch window poisoned");
        if after + 1 < window.covers_from {
            return None;
        }
        let start = window.revisions.partition_point(|r| r.revision <= after);
        Some(window.revisions.range(start..).take(max).cloned().collect())
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
        hub.publish(vec![revision(6), revision(7)], 7);
        hub.publish(vec![revision(8)], 8);
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
    fn revisions_without_events_are_skipped_not_missing() {
        let hub = WatchHub::new(1);
        hub.publish(vec![revision(2), revision(5)], 6);
        assert_eq!(hub.latest(), 6);
        let revs: Vec<i64> = hub
            .since(2, 10)
            .unwrap()
            .iter()
            .map(|r| r.revision)
            .collect();
        assert_eq!(revs, vec![5]);
        assert!(hub.since(6, 10).unwrap().is_empty());
    }

    #[test]
    fn skipped_revisions_are_seen_but_not_served() {
        let hub = WatchHub::new(1);
        hub.publish(vec![revision(2)], 2);
        assert!(!hub.is_followed());
        let follower = hub.subscribe();
        assert!(hub.is_followed());
        hub.skip(5);
        assert_eq!(*follower.borrow(), 5, "followers wake up");
        assert_eq!(hub.latest(), 5);
        assert_eq!(hub.since(1, 10), None, "revision 2 is gone with the window");
        assert_eq!(hub.since(4, 10), None, "revision 5 was never in memory");
        assert_eq!(hub.since(5, 10), Some(vec![]));
        hub.publish(vec![revision(6)], 6);
        assert_eq!(hub.since(5, 10).unwrap().len(), 1);
        hub.skip(6);
        assert_eq!(hub.since(5, 10).unwrap().len(), 1, "nothing new to skip");
    }

    #[test]
    fn window_is_bounded() {
        let hub = WatchHub::new(0);
        for r in 1..=(WINDOW_REVISIONS as i64 + 10) {
            hub.publish(vec![revision(r)], r);
        }
        assert_eq!(hub.since(0, 1), None);
        assert!(hub.since(10, 1).is_some());
    }

    #[test]
    fn window_is_bounded_by_the_memory_its_values_take() {
        let hub = WatchHub::new(0);
        let mib = |r: i64| RevisionEvents {
            revision: r,
            events: vec![Event {
                kv: Some(crate::proto::mvccpb::KeyValue {
                    value: vec![0; 1 << 20],
                    ..Default::default()
                }),
                prev_kv: Some(crate::proto::mvccpb::KeyValue {
                    value: vec![0; 1 << 20],
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        let last = 2 * (WINDOW_BYTES >> 20) as i64;
        for r in 1..=last {
            hub.publish(vec![mib(r)], r);
        }
        // Each revision takes a few bytes more than 2 MiB with its previous
        // value: one fewer than WINDOW_BYTES / 2 MiB of them fit.
        let kept = (WINDOW_BYTES >> 21) as i64 - 1;
        assert_eq!(hub.covers_from(), last - kept + 1);
        assert_eq!(hub.since(last - kept - 1, 100), None);
        assert_eq!(hub.since(last - kept, 100).unwrap().len(), kept as usize);
    }
}
