//! Reading revisions back from the log as watch events, with the previous
//! state of each key, for watchers that catch up and for revisions that
//! other instances committed.

use super::error::{StoreError, StoreResult};
use crate::backend::{Backend, KeyRange, ReadAt, ReadTxn};
use crate::proto::mvccpb::{Event, event::EventType};
use crate::store::hub::RevisionEvents;

/// The revisions in `(after, through]` (capped at the current revision).
/// With `with_prev_kv`, each event carries the key's state at revision - 1,
/// unless that is below the compact revision or the event creates the key.
pub async fn read<B: Backend>(
    backend: &B,
    after: i64,
    through: i64,
    with_prev_kv: bool,
) -> StoreResult<Vec<RevisionEvents>> {
    let mut txn = backend.read().await?;
    let revs = txn.revisions().await?;
    if after + 1 < revs.compact {
        return Err(StoreError::Compacted);
    }
    let through = revs.current.min(through);
    let mut history: Vec<RevisionEvents> = Vec::new();
    for entry in txn.log_entries(after, through).await? {
        let revision = entry.kv.mod_revision;
        let is_create = !entry.deleted && entry.kv.create_revision == revision;
        let prev_kv = if with_prev_kv && !is_create && revision > revs.compact {
            let key = KeyRange::single(&entry.kv.key);
            txn.range(&key, ReadAt::Revision(revision - 1), 1, false)
                .await?
                .pop()
        } else {
            None
        };
        let kind = if entry.deleted {
            EventType::Delete
        } else {
            EventType::Put
        };
        let event = Event {
            r#type: kind as i32,
            kv: Some(entry.kv),
            prev_kv,
        };
        match history.last_mut() {
            Some(last) if last.revision == revision => last.events.push(event),
            _ => history.push(RevisionEvents {
                revision,
                events: vec![event],
            }),
        }
    }
    Ok(history)
}
