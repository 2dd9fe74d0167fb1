//! How an instance learns that another instance sharing its database has
//! committed: the database's notifications where it sends them (Postgres
//! NOTIFY), and a bound after which a follower looks anyway.
//!
//! Every follower (the store's poller, the auth follower) gets a feed of its
//! own. A single shared wake-up was tried first and lost wake-ups: whichever
//! follower was waiting took the signal, and the other slept until the next
//! commit (issue 15). Notifications only bump a counter here, which each feed
//! compares with the last value it saw, so none can be taken by another.

use std::time::Duration;

use tokio::sync::watch;

/// How often a follower looks for other instances' commits when no
/// notification told it to (`--poll-interval`).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The database's side: counts the notifications it sent.
#[derive(Debug)]
pub struct Notifications(watch::Sender<u64>);

impl Notifications {
    /// No notification yet.
    pub fn new() -> Self {
        Notifications(watch::Sender::new(0))
    }

    /// Another instance may have committed: every feed wakes once.
    pub fn notify(&self) {
        self.0.send_modify(|count| *count = count.wrapping_add(1));
    }

    /// A feed of these notifications that also wakes after `bound` without one.
    pub fn feed(&self, bound: Duration) -> ChangeFeed {
        ChangeFeed {
            notifications: Some(self.0.subscribe()),
            bound: Some(bound),
        }
    }
}

impl Default for Notifications {
    fn default() -> Self {
        Notifications::new()
    }
}

/// One follower's view of other instances' commits.
#[derive(Debug)]
pub struct ChangeFeed {
    notifications: Option<watch::Receiver<u64>>,
    /// Longest wait without a notification; none: wait for one for ever.
    bound: Option<Duration>,
}

impl ChangeFeed {
    /// A database no other instance writes: never wakes.
    pub fn never() -> Self {
        ChangeFeed {
            notifications: None,
            bound: None,
        }
    }

    /// A database that sends no notifications: wakes every `interval`.
    pub fn every(interval: Duration) -> Self {
        ChangeFeed {
            notifications: None,
            bound: Some(interval),
        }
    }

    /// Resolves when another instance may have committed since the last
    /// call: a notification came, or the bound passed without one.
    pub async fn next(&mut self) {
        match self.bound {
            Some(bound) => {
                let _ = tokio::time::timeout(bound, self.notified()).await;
            }
            None => self.notified().await,
        }
    }

    /// Resolves on the next notification only (never, for a database that
    /// sends none): for tests of the notifications themselves.
    pub async fn notified(&mut self) {
        match &mut self.notifications {
            Some(notifications) => {
                if notifications.changed().await.is_err() {
                    // The database's side is gone: nothing more will come.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_feed_sees_every_notification() {
        let notifications = Notifications::new();
        let mut first = notifications.feed(Duration::from_secs(3600));
        let mut second = notifications.feed(Duration::from_secs(3600));
        notifications.notify();
        // The first follower takes its wake-up and is busy when the next
        // notification comes; the second must not lose its own.
        first.notified().await;
        notifications.notify();
        second.notified().await;
        first.notified().await;
        let quiet = tokio::time::timeout(Duration::from_secs(1), second.notified()).await;
        assert!(
            quiet.is_err(),
            "both notifications count as one for a late follower"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_feed_wakes_after_its_bound_without_a_notification() {
        let notifications = Notifications::new();
        let mut feed = notifications.feed(Duration::from_millis(100));
        let started = tokio::time::Instant::now();
        feed.next().await;
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        let mut polled = ChangeFeed::every(Duration::from_millis(250));
        polled.next().await;
        assert_eq!(started.elapsed(), Duration::from_millis(350));
        let mut never = ChangeFeed::never();
        let woke = tokio::time::timeout(Duration::from_secs(3600), never.next()).await;
        assert!(woke.is_err(), "a database no one else writes never wakes");
    }
}
