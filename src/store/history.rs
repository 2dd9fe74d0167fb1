//! Reading revisions back from the log as watch events, with the previous
//! state of each key, for watchers that catch up and for revisions that
//! other instances committed; and reads of the whole history (digests, a
//! snapshot) on a thread of their own.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::{StoreError, StoreResult};
use crate::backend::{Backend, KeyRange, LogEntry, ReadAt, ReadTxn};
use crate::proto::mvccpb::{Event, KeyValue, event::EventType};
use crate::store::hub::RevisionEvents;

/// Runs `read`, a read of the whole history (a digest, a snapshot), in a
/// read transaction on a blocking thread. SQLite's calls run inline: on a
/// runtime worker such a read would hold up the tasks queued behind it,
/// a write's answer among them, for as long as it takes (up to a second
/// for the history between two of the apiserver's compactions).
pub async fn read_whole<B, T, E, F, Fut>(backend: Arc<B>, read: F) -> Result<T, E>
where
    B: Backend,
    T: Send + 'static,
    E: From<anyhow::Error> + Send + 'static,
    F: FnOnce(B::Read) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>>,
{
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        runtime.block_on(async move { read(backend.read().await?).await })
    })
    .await
    .map_err(|e| E::from(anyhow::anyhow!("history read failed: {e}")))?
}

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
    let entries = txn.log_entries(after, through).await?;
    let mut previous = match with_prev_kv {
        true => PreviousStates::read(&mut txn, &entries, after, revs.compact).await?,
        false => PreviousStates::default(),
    };
    let mut history: Vec<RevisionEvents> = Vec::new();
    for entry in entries {
        let revision = entry.kv.mod_revision;
        let is_create = !entry.deleted && entry.kv.create_revision == revision;
        let prev_kv = if with_prev_kv && !is_create && revision > revs.compact {
            previous.before(&mut txn, &entry.kv.key, revision).await?
        } else {
            None
        };
        let kind = if entry.deleted {
            EventType::Delete
        } else {
            EventType::Put
        };
        let kv = entry.kv;
        previous.changed(&kv, entry.deleted);
        let event = Event {
            r#type: kind as i32,
            kv: Some(kv),
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

/// The state of the window's keys as the events go by: read for all of them
/// at once before the first event (one statement on a server database,
/// where a read per event made each instance's cost grow with the others'
/// writes), then moved on by each event.
#[derive(Default)]
struct PreviousStates {
    /// Each key's state after the last event seen (None: absent).
    latest: HashMap<Vec<u8>, Option<KeyValue>>,
    /// The revision of each key's last event seen.
    changed_at: HashMap<Vec<u8>, i64>,
}

impl PreviousStates {
    /// The window's keys at `after`, or at the compact revision if that is
    /// later: no key of the window changes between the two, or its first
    /// event is at or below the compact revision and gets no previous state.
    async fn read<T: ReadTxn>(
        txn: &mut T,
        entries: &[LogEntry],
        after: i64,
        compact: i64,
    ) -> StoreResult<Self> {
        let mut keys: Vec<Vec<u8>> = entries.iter().map(|e| e.kv.key.clone()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut latest: HashMap<Vec<u8>, Option<KeyValue>> =
            keys.iter().map(|key| (key.clone(), None)).collect();
        if !keys.is_empty() {
            for kv in txn.keys_at(&keys, after.max(compact)).await? {
                latest.insert(kv.key.clone(), Some(kv));
            }
        }
        Ok(PreviousStates {
            latest,
            changed_at: HashMap::new(),
        })
    }

    /// `key`'s state at `revision` - 1. Read again when the key already
    /// changed in `revision` itself (twice in one revision).
    async fn before<T: ReadTxn>(
        &mut self,
        txn: &mut T,
        key: &[u8],
        revision: i64,
    ) -> StoreResult<Option<KeyValue>> {
        if self.changed_at.get(key) == Some(&revision) {
            let range = KeyRange::single(key);
            return Ok(txn
                .range(&range, ReadAt::Revision(revision - 1), 1, false)
                .await?
                .pop());
        }
        Ok(self.latest.get(key).cloned().flatten())
    }

    /// Moves `kv`'s key on to its state after this event.
    fn changed(&mut self, kv: &KeyValue, deleted: bool) {
        if self.latest.is_empty() {
            return; // not following (no previous states asked for)
        }
        let state = (!deleted).then(|| kv.clone());
        self.latest.insert(kv.key.clone(), state);
        self.changed_at.insert(kv.key.clone(), kv.mod_revision);
    }
}
