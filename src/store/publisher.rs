//! Publishes committed revisions to the watch hub, strictly in revision order.
//!
//! On a database only this instance writes (SQLite), the writer's own
//! commits are all there is. When several instances share a database, other
//! instances' revisions interleave with ours: before publishing its own
//! commit, the writer fills any gap from the log, and a poller (woken by
//! Postgres notifications or a MySQL poll interval) publishes whatever other
//! instances committed meanwhile. One lock keeps the two from racing.

use std::sync::Arc;

use tokio::sync::{Mutex, watch};

use super::history;
use crate::backend::{Backend, ReadTxn, Revisions};
use crate::store::hub::{RevisionEvents, WatchHub};

/// Revisions read from the log per step when filling a gap.
const FILL_STEP: i64 = 1000;

/// Feeds the watch hub and the store's view of its counters.
pub struct Publisher<B> {
    backend: Arc<B>,
    hub: Arc<WatchHub>,
    revisions: watch::Sender<Revisions>,
    /// Counts the auth changes this instance's writer applied.
    auth_changes: watch::Sender<u64>,
    order: Mutex<()>,
}

impl<B: Backend> Publisher<B> {
    /// A publisher for a store whose counters start at `revisions`.
    pub fn new(backend: Arc<B>, hub: Arc<WatchHub>, revisions: watch::Sender<Revisions>) -> Self {
        Publisher {
            backend,
            hub,
            revisions,
            auth_changes: watch::Sender::new(0),
            order: Mutex::new(()),
        }
    }

    /// The hub this publisher feeds.
    pub fn hub(&self) -> &Arc<WatchHub> {
        &self.hub
    }

    /// The counters as this instance last saw them.
    pub fn subscribe(&self) -> watch::Receiver<Revisions> {
        self.revisions.subscribe()
    }

    /// Follows the auth changes this instance's writer applies: in a
    /// replicated cluster, those other members made.
    pub fn auth_changes(&self) -> watch::Receiver<u64> {
        self.auth_changes.subscribe()
    }

    /// Tells followers of `auth_changes` that users, roles or the auth
    /// switch changed.
    pub fn auth_changed(&self) {
        self.auth_changes.send_modify(|n| *n += 1);
    }

    /// Publishes this instance's commit: the revisions it made, and the
    /// counters after it.
    pub async fn committed(&self, committed: Vec<RevisionEvents>, revisions: Revisions) {
        let _order = self.order.lock().await;
        if let Some(first) = committed.first().map(|r| r.revision)
            && first > self.hub.latest() + 1
            && let Err(error) = self.fill(first - 1).await
        {
            // The poller publishes the rest once the database answers again.
            tracing::error!("cannot read other instances' revisions: {error:#}");
            self.advance(revisions);
            return;
        }
        let through = committed.last().map_or(0, |r| r.revision);
        self.hub.publish(committed, through);
        self.advance(revisions);
    }

    /// Publishes what other instances committed since the last look.
    pub async fn poll(&self) -> anyhow::Result<()> {
        let _order = self.order.lock().await;
        let revisions = self.backend.read().await?.revisions().await?;
        self.fill(revisions.current).await?;
        self.advance(revisions);
        Ok(())
    }

    /// Publishes what the database holds after its contents were replaced
    /// wholesale (a replicated-mode snapshot): revisions the new contents
    /// compacted away count as seen, without events.
    pub async fn replaced(&self) -> anyhow::Result<()> {
        let _order = self.order.lock().await;
        let revisions = self.backend.read().await?.revisions().await?;
        if self.hub.latest() < revisions.compact {
            self.hub.publish(Vec::new(), revisions.compact);
        }
        self.fill(revisions.current).await?;
        self.advance(revisions);
        // The new contents have their own users and roles.
        self.auth_changed();
        Ok(())
    }

    /// Publishes the log's revisions after the hub's latest, through `through`.
    /// Unless nothing follows the hub: then they are only marked seen, so
    /// that an instance no one watches does not read every other
    /// instance's writes back.
    async fn fill(&self, through: i64) -> anyhow::Result<()> {
        if !self.hub.is_followed() {
            self.hub.skip(through);
            return Ok(());
        }
        while self.hub.latest() < through {
            let after = self.hub.latest();
            let step = through.min(after + FILL_STEP);
            let revisions = history::read(&*self.backend, after, step, true).await?;
            // Revisions with no rows left (compacted away) still count as seen.
            self.hub.publish(revisions, step);
        }
        Ok(())
    }

    /// Moves the counters forward; never back, whoever reports first.
    fn advance(&self, now: Revisions) {
        self.revisions.send_if_modified(|seen| {
            let newer = Revisions {
                current: seen.current.max(now.current),
                compact: seen.compact.max(now.compact),
                compacted_through: seen.compacted_through.max(now.compacted_through),
            };
            std::mem::replace(seen, newer) != newer
        });
    }
}
