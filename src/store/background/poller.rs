//! The poller: publishes the commits of other instances sharing the
//! database.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::backend::Backend;
use crate::store::publisher::Publisher;

/// Publishes other instances' commits whenever the backend says there may be
/// some, and within the poll interval at the latest. Never wakes on a
/// database only this instance writes.
pub(super) async fn run<B: Backend>(backend: Arc<B>, publisher: Weak<Publisher<B>>) {
    let mut changes = backend.change_feed();
    loop {
        changes.next().await;
        let Some(publisher) = publisher.upgrade() else {
            return;
        };
        if let Err(error) = publisher.poll().await {
            tracing::warn!("cannot read other instances' revisions: {error:#}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
