//! One Watch stream: its watchers and etcd's rules for them.
//!
//! A session reads create, cancel and progress requests and writes watch
//! responses, in order, to one channel. Watchers that start in the past catch
//! up in batches of up to 1000 revisions (from the hub's window, or from the
//! log when the window no longer reaches back); synced watchers then get one
//! response per revision, as etcd sends them. Everything happens on the
//! session's own task, so a created response always precedes its watcher's
//! events, and a progress response follows every event it covers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use crate::backend::{Backend, KeyRange};
use crate::metrics::{GaugeGuard, metrics};
use crate::proto::etcdserverpb::watch_create_request::FilterType;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse};
use crate::proto::mvccpb::{Event, event::EventType};
use crate::store::hub::RevisionEvents;
use crate::store::range::key_range;
use crate::store::{Store, StoreError};

/// Revisions in one catch-up response, as in etcd.
const CATCH_UP_REVISIONS: i64 = 1000;
/// The watch id of responses that belong to no watcher (progress).
const NO_WATCHER: i64 = -1;

/// etcd's cancel reasons.
const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// Settings of a watch session.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// How often watchers that asked for it get a progress notification.
    pub progress_interval: Duration,
    /// Responses of fragmenting watchers are cut to stay under this size.
    pub max_response_bytes: usize,
    /// Refuse a watch from a negative revision, as etcd 3.5.24, 3.6.6 and
    /// later do (as compacted); earlier ones take it.
    pub refuse_negative_start: bool,
    /// Answer a progress request on a stream without watchers, as etcd 3.5
    /// does; etcd 3.7 sends its progress through a watcher, so a stream
    /// without one gets no answer (progressIfSync in
    /// server/storage/mvcc/watchable_store.go).
    pub progress_without_watchers: bool,
}

struct Watcher {
    /// Counts this watcher in etcd_debugging_mvcc_watcher_total while it lives.
    _counted: GaugeGuard,
    range: KeyRange,
    /// The next revision this watcher has not yet been given.
    next: i64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    fragment: bool,
    progress_notify: bool,
    /// Events went out since the last progress tick.
    active: bool,
    /// Still behind: gets batched responses until it reaches the latest revision.
    catching_up: bool,
}

impl Watcher {
    /// The events of `revision` this watcher wants, with prev_kv only if
    /// asked and, as etcd reads it at revision - 1, not below `compact`.
    fn select(&self, revision: &RevisionEvents, compact: i64, into: &mut Vec<Event>) {
        for event in &revision.events {
            let Some(kv) = &event.kv else { continue };
            let is_put = event.r#type == EventType::Put as i32;
            if !self.range.contains(&kv.key)
                || (is_put && self.no_put)
                || (!is_put && self.no_delete)
            {
                continue;
            }
            let mut event = event.clone();
            if !self.prev_kv || revision.revision - 1 < compact {
                event.prev_kv = None;
            }
            into.push(event);
        }
    }
}

/// The client went away; the session ends.
struct Closed;

/// What a session writes: responses, and last the error that ended the stream, if one did.
pub type Outbound = Result<WatchResponse, Status>;

/// The watchers of one Watch stream.
pub struct WatchSession<B: Backend> {
    store: Arc<Store<B>>,
    out: mpsc::Sender<Outbound>,
    options: SessionOptions,
    latest: watch::Receiver<i64>,
    watchers: BTreeMap<i64, Watcher>,
    next_id: i64,
    create_check: Option<CreateCheck>,
}

/// Decides whether a watch on `(key, range_end)`, as the client sent them,
/// may be created: `Some(reason)` refuses it with that cancel reason.
pub type CreateCheck = Box<dyn Fn(&[u8], &[u8]) -> Option<String> + Send + Sync>;

impl<B: Backend> WatchSession<B> {
    /// A session that writes its responses to `out`.
    pub fn new(store: Arc<Store<B>>, out: mpsc::Sender<Outbound>, options: SessionOptions) -> Self {
        let latest = store.hub().subscribe();
        WatchSession {
            store,
            out,
            options,
            latest,
            watchers: BTreeMap::new(),
            next_id: 0,
            create_check: None,
        }
    }

    /// Runs `check` before creating each watcher (the permission check).
    pub fn with_create_check(mut self, check: CreateCheck) -> Self {
        self.create_check = Some(check);
        self
    }

    /// Serves `requests` until the client goes away (the response stream is
    /// dropped), a request fails to arrive (its error ends the stream), or
    /// `stop` changes (server shutdown). A client that closes its sending
    /// side keeps its watchers, as in etcd.
    pub async fn run(
        mut self,
        mut requests: impl Stream<Item = Result<WatchRequest, Status>> + Unpin,
        mut stop: watch::Receiver<bool>,
    ) {
        let start = tokio::time::Instant::now() + self.options.progress_interval;
        let mut progress = tokio::time::interval_at(start, self.options.progress_interval);
        let mut sending = true;
        loop {
            let step = tokio::select! {
                request = requests.next(), if sending => match request {
                    Some(Ok(request)) => self.handle(request).await,
                    Some(Err(status)) => {
                        let _ = self.out.send(Err(status)).await;
                        return;
                    }
                    None => {
                        sending = false;
                        Ok(())
                    }
                },
                _ = self.out.closed() => return,
                changed = self.latest.changed() => match changed {
                    Ok(()) => self.deliver().await.map(|_| ()),
                    Err(_) => return,
                },
                _ = progress.tick() => self.progress_tick().await,
                _ = stop.changed() => return,
            };
            if step.is_err() {
                return;
            }
        }
    }

    async fn handle(&mut self, request: WatchRequest) -> Result<(), Closed> {
        match request.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
            Some(RequestUnion::CancelRequest(cancel)) => {
                if self.watchers.remove(&cancel.watch_id).is_some() {
                    let latest = self.store.hub().latest();
                    self.send(response(latest, cancel.watch_id, |r| r.canceled = true))
                        .await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_))
                if self.watchers.is_empty() && !self.options.progress_without_watchers =>
            {
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // Bring every watcher up to date first, so that the revision
                // reported covers every event sent before it.
                let revision = self.deliver().await?;
                self.send(response(revision, NO_WATCHER, |_| {})).await
            }
            None => Ok(()),
        }
    }

    async fn create(&mut self, create: WatchCreateRequest) -> Result<(), Closed> {
        let latest = self.store.hub().latest();
        let key = if create.key.is_empty() {
            vec![0]
        } else {
            create.key
        };
        let range = key_range(&key, &create.range_end);
        let refuse = |reason: &str| {
            response(latest, NO_WATCHER, |r| {
                r.created = true;
                r.canceled = true;
                r.cancel_reason = reason.to_string();
            })
        };
        // Before the permission check, as in etcd.
        if create.start_revision < 0 && self.options.refuse_negative_start {
            return self.send(refuse(COMPACTED)).await;
        }
        if let Some(reason) = self
            .create_check
            .as_ref()
            .and_then(|check| check(&key, &create.range_end))
        {
            return self.send(refuse(&reason)).await;
        }
        if range.is_empty() {
            return self.send(refuse(EMPTY_RANGE)).await;
        }
        let id = if create.watch_id != 0 {
            if self.watchers.contains_key(&create.watch_id) {
                return self.send(refuse(DUPLICATE_ID)).await;
            }
            create.watch_id
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        };
        let start = if create.start_revision == 0 {
            latest + 1
        } else {
            create.start_revision
        };
        let has_filter = |f: FilterType| create.filters.contains(&(f as i32));
        self.watchers.insert(
            id,
            Watcher {
                _counted: GaugeGuard::new(&metrics().watchers),
                range,
                next: start,
                no_put: has_filter(FilterType::Noput),
                no_delete: has_filter(FilterType::Nodelete),
                prev_kv: create.prev_kv,
                fragment: create.fragment,
                progress_notify: create.progress_notify,
                active: false,
                catching_up: start <= latest,
            },
        );
        self.send(response(latest, id, |r| r.created = true))
            .await?;
        self.deliver().await.map(|_| ())
    }

    /// Sends every watcher what it has not seen up to the latest revision;
    /// returns that revision.
    async fn deliver(&mut self) -> Result<i64, Closed> {
        let latest = *self.latest.borrow_and_update();
        let covers_from = self.store.hub().covers_from();
        // A watcher the window no longer covers falls back to catching up.
        for watcher in self.watchers.values_mut() {
            if watcher.next <= latest && !watcher.catching_up && watcher.next < covers_from {
                watcher.catching_up = true;
            }
        }
        let behind: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.catching_up)
            .map(|(id, _)| *id)
            .collect();
        for id in behind {
            self.catch_up(id, latest).await?;
        }

        // Synced watchers: one response per revision, in revision order.
        let Some(oldest) = self.watchers.values().map(|w| w.next).min() else {
            return Ok(latest);
        };
        if oldest > latest {
            return Ok(latest);
        }
        let Some(revisions) = self.store.hub().since(oldest - 1, usize::MAX) else {
            // The window moved on meanwhile; the next wake-up catches up.
            return Ok(latest);
        };
        let compact = self.store.revisions().compact;
        for revision in revisions.iter().take_while(|r| r.revision <= latest) {
            let ids: Vec<i64> = self.watchers.keys().copied().collect();
            for id in ids {
                let Some(watcher) = self.watchers.get_mut(&id) else {
                    continue;
                };
                if watcher.next > revision.revision {
                    continue;
                }
                let mut events = Vec::new();
                watcher.select(revision, compact, &mut events);
                watcher.next = revision.revision + 1;
                if !events.is_empty() {
                    self.send_events(id, revision.revision, events).await?;
                }
            }
        }
        Ok(latest)
    }

    /// Brings watcher `id` up to `latest` in batched responses whose header
    /// carries `latest`, or cancels it if its history was compacted away.
    async fn catch_up(&mut self, id: i64, latest: i64) -> Result<(), Closed> {
        loop {
            let Some(watcher) = self.watchers.get(&id) else {
                return Ok(());
            };
            let after = watcher.next - 1;
            if after >= latest {
                if let Some(watcher) = self.watchers.get_mut(&id) {
                    watcher.catching_up = false;
                }
                return Ok(());
            }
            let through = latest.min(after.saturating_add(CATCH_UP_REVISIONS));
            let compact = self.store.revisions().compact;
            let batch = if watcher.next < compact {
                Err(StoreError::Compacted)
            } else {
                self.store
                    .revisions_after(after, through, watcher.prev_kv)
                    .await
            };
            let revisions = match batch {
                Ok(revisions) => revisions,
                Err(StoreError::Compacted) => {
                    self.watchers.remove(&id);
                    // The read saw the database's compaction, which this
                    // member's counters take in only once it is published.
                    let stored = self.store.stored_compact_revision().await;
                    let compact = stored.unwrap_or(-1).max(self.store.revisions().compact);
                    // etcd sends this one with a zero header revision.
                    return self
                        .send(response(0, id, |r| {
                            r.compact_revision = compact;
                            r.canceled = true;
                        }))
                        .await;
                }
                Err(error) => {
                    tracing::warn!("watch catch-up failed, retrying: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let watcher = self.watchers.get_mut(&id).expect("checked above");
            let mut events = Vec::new();
            for revision in revisions.iter().filter(|r| r.revision <= through) {
                watcher.select(revision, compact, &mut events);
            }
            watcher.next = through + 1;
            if !events.is_empty() {
                self.send_events(id, latest, events).await?;
            }
        }
    }

    async fn progress_tick(&mut self) -> Result<(), Closed> {
        let latest = self.store.hub().latest();
        let mut due = Vec::new();
        for (id, watcher) in &mut self.watchers {
            if watcher.progress_notify {
                // Only a watcher that is up to date and heard nothing since the last tick.
                if !watcher.active && !watcher.catching_up && watcher.next > latest {
                    due.push(*id);
                }
                watcher.active = false;
            }
        }
        for id in due {
            self.send(response(latest, id, |_| {})).await?;
        }
        Ok(())
    }

    async fn send_events(
        &mut self,
        id: i64,
        revision: i64,
        events: Vec<Event>,
    ) -> Result<(), Closed> {
        let Some(watcher) = self.watchers.get_mut(&id) else {
            return Ok(());
        };
        watcher.active = true;
        let fragment = watcher.fragment;
        let whole = response(revision, id, |r| r.events = events);
        if !fragment {
            return self.send(whole).await;
        }
        for piece in fragments(whole, self.options.max_response_bytes) {
            self.send(piece).await?;
        }
        Ok(())
    }

    async fn send(&self, response: WatchResponse) -> Result<(), Closed> {
        self.out.send(Ok(response)).await.map_err(|_| Closed)
    }
}

fn response(revision: i64, watch_id: i64, fill: impl FnOnce(&mut WatchResponse)) -> WatchResponse {
    let mut response = WatchResponse {
        header: Some(ResponseHeader {
            revision,
            ..Default::default()
        }),
        watch_id,
        ..Default::default()
    };
    fill(&mut response);
    response
}

/// etcd's fragmentation: a response of at least `max` bytes with two or more
/// events is cut into pieces that stay under `max` (a single event may exceed
/// it); all pieces but the last are marked `fragment`.
fn fragments(whole: WatchResponse, max: usize) -> Vec<WatchResponse> {
    if whole.encoded_len() < max || whole.events.len() < 2 {
        return vec![whole];
    }
    let mut template = whole.clone();
    template.events.clear();
    template.fragment = true;
    let mut pieces = Vec::new();
    let mut current = template.clone();
    for event in whole.events {
        current.events.push(event);
        if current.events.len() > 1 && current.encoded_len() >= max {
            let overflow = current.events.pop().expect("just pushed");
            pieces.push(std::mem::replace(&mut current, template.clone()));
            current.events.push(overflow);
        }
    }
    current.fragment = false;
    pieces.push(current);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mvccpb::KeyValue;

    fn event(key: &str, value_len: usize) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue {
                key: key.into(),
                value: vec![b'x'; value_len],
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    #[test]
    fn fragments_stay_under_the_limit_and_only_the_last_is_final() {
        let whole = response(5, 1, |r| {
            r.events = (0..10).map(|i| event(&format!("k{i}"), 100)).collect()
        });
        let pieces = fragments(whole.clone(), 350);
        assert!(pieces.len() > 1);
        assert!(
            pieces[..pieces.len() - 1]
                .iter()
                .all(|p| p.fragment && p.encoded_len() < 350)
        );
        assert!(!pieces.last().unwrap().fragment);
        let events: Vec<Event> = pieces.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(events, whole.events);
    }

    #[test]
    fn small_or_single_event_responses_are_not_cut() {
        let single = response(5, 1, |r| r.events = vec![event("k", 1000)]);
        assert_eq!(fragments(single, 10).len(), 1);
        let small = response(5, 1, |r| r.events = vec![event("a", 1), event("b", 1)]);
        assert_eq!(fragments(small, 1 << 20).len(), 1);
    }
}
