//! Differential tests: one scenario run against a fresh etcd and a fresh
//! cetera at the same time, each step's outcome recorded as text by a
//! [`Side`], and the two transcripts compared step by step.

use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest, WatchResponse,
};

use super::cetera_server::Cetera;
use super::client::channel;
use super::etcd_server::Etcd;
use super::show::{header_rev, outcome, show, show_event, show_kv, show_watch_response};
use super::watch_stream::WatchStream;

/// How long a differential watch/lease test waits for a response it expects.
pub const WAIT: Duration = Duration::from_secs(2);

/// One server of a differential watch/lease test (see [`differential`]): clients, and the
/// transcript of every step's outcome, rendered as text for comparison.
pub struct Side {
    /// "etcd", "cetera", or "etcd #2" in self-check mode.
    pub name: &'static str,
    /// `127.0.0.1:PORT`, for etcdctl.
    pub addr: String,
    pub channel: tonic::transport::Channel,
    pub kv: KvClient<tonic::transport::Channel>,
    transcript: Vec<(String, String)>,
    /// Lease ids the server chose, in grant order; shown as `<lease#N>` when comparing.
    server_leases: Vec<i64>,
    _server: Box<dyn std::any::Any + Send>,
}

impl Side {
    async fn new(name: &'static str, addr: String, server: Box<dyn std::any::Any + Send>) -> Side {
        let channel = channel(&format!("http://{addr}")).await;
        Side {
            name,
            addr,
            kv: KvClient::new(channel.clone()),
            channel,
            transcript: Vec::new(),
            server_leases: Vec::new(),
            _server: server,
        }
    }

    /// Records the outcome of one step. Every step records exactly one entry, so the
    /// two transcripts line up even where the servers disagree.
    pub fn note(&mut self, step: impl Into<String>, outcome: impl Into<String>) {
        self.transcript.push((step.into(), outcome.into()));
    }

    /// Records a write's outcome, as `show` renders it (or the error), and returns the
    /// revision `show` gives with it (0 on error).
    fn note_write<T>(
        &mut self,
        step: impl Into<String>,
        result: Result<tonic::Response<T>, tonic::Status>,
        show: impl FnOnce(&T) -> (i64, String),
    ) -> i64 {
        let mut revision = 0;
        let text = outcome(result, |r| {
            let (rev, text) = show(r);
            revision = rev;
            text
        });
        self.note(step, text);
        revision
    }

    /// Registers a lease id chosen by the server; both servers grant in the same order,
    /// so `<lease#N>` names the same lease on both sides.
    pub fn server_lease(&mut self, id: i64) {
        if !self.server_leases.contains(&id) {
            self.server_leases.push(id);
        }
    }

    /// How a lease id appears in a comparison: `<lease#N>` if the server chose it.
    pub fn lease_name(&self, id: i64) -> String {
        match self.server_leases.iter().position(|&l| l == id) {
            Some(n) => format!("<lease#{n}>"),
            None => id.to_string(),
        }
    }

    /// `text` with server-chosen lease ids (decimal, or hex as etcdctl prints them)
    /// replaced by `<lease#N>`.
    pub fn mask(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (n, id) in self.server_leases.iter().enumerate() {
            text = text
                .replace(&id.to_string(), &format!("<lease#{n}>"))
                .replace(&format!("{id:016x}"), &format!("<lease#{n}>"))
                .replace(&format!("{id:x}"), &format!("<lease#{n}>"));
        }
        text
    }

    /// The transcript with server-chosen lease ids replaced by `<lease#N>`.
    fn masked_transcript(&self) -> Vec<(String, String)> {
        self.transcript
            .iter()
            .map(|(step, outcome)| (self.mask(step), self.mask(outcome)))
            .collect()
    }

    /// Opens a Watch stream.
    pub fn watch(&self) -> WatchStream {
        WatchStream::open(self.channel.clone(), false)
    }

    /// Opens a Watch stream whose call has a deadline.
    pub fn watch_with_deadline(&self, deadline: Duration) -> WatchStream {
        WatchStream::open_with_deadline(self.channel.clone(), deadline)
    }

    /// Puts `key=value`, records the revision (or error) and returns the revision.
    pub async fn put(&mut self, key: &[u8], value: &[u8]) -> i64 {
        self.put_req(PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            ..Default::default()
        })
        .await
    }

    /// Sends a Put, records `put <key> -> rev=N` or the error; returns the revision (0
    /// on error).
    pub async fn put_req(&mut self, put: PutRequest) -> i64 {
        let mut step = format!("put {}={}", show(&put.key), show(&put.value));
        if put.lease != 0 {
            step += &format!(" lease={}", put.lease);
        }
        for (set, flag) in [
            (put.prev_kv, " prev_kv"),
            (put.ignore_value, " ignore_value"),
            (put.ignore_lease, " ignore_lease"),
        ] {
            if set {
                step += flag;
            }
        }
        let result = self.kv.put(put).await;
        self.note_write(step, result, |r| {
            let revision = header_rev(&r.header);
            let text = match &r.prev_kv {
                Some(prev) => format!("rev={revision} prev=[{}]", show_kv(prev)),
                None => format!("rev={revision}"),
            };
            (revision, text)
        })
    }

    /// Deletes `[key, range_end)` (a single key when `range_end` is empty).
    pub async fn delete(&mut self, key: &[u8], range_end: &[u8]) -> i64 {
        let step = format!("delete {}..{}", show(key), show(range_end));
        let result = self
            .kv
            .delete_range(DeleteRangeRequest {
                key: key.to_vec(),
                range_end: range_end.to_vec(),
                ..Default::default()
            })
            .await;
        self.note_write(step, result, |r| {
            let revision = header_rev(&r.header);
            (revision, format!("rev={revision} deleted={}", r.deleted))
        })
    }

    /// Sends a Txn; records the revision and which branch ran.
    pub async fn txn(&mut self, step: &str, txn: TxnRequest) -> i64 {
        let result = self.kv.txn(txn).await;
        self.note_write(step, result, |r| {
            let revision = header_rev(&r.header);
            (
                revision,
                format!("rev={revision} succeeded={}", r.succeeded),
            )
        })
    }

    /// Compacts at `revision`, waiting for the physical compaction.
    pub async fn compact(&mut self, revision: i64) {
        let result = self
            .kv
            .compact(CompactionRequest {
                revision,
                physical: true,
            })
            .await;
        self.note(
            format!("compact {revision}"),
            outcome(result, |r| format!("rev={}", header_rev(&r.header))),
        );
    }

    /// Reads `[key, range_end)` (one key when `range_end` is empty) and records the kvs.
    pub async fn get(&mut self, key: &[u8], range_end: &[u8]) {
        let result = self
            .kv
            .range(RangeRequest {
                key: key.to_vec(),
                range_end: range_end.to_vec(),
                ..Default::default()
            })
            .await;
        self.note(
            format!("get {}..{}", show(key), show(range_end)),
            outcome(result, |r| {
                let kvs: Vec<String> = r.kvs.iter().map(show_kv).collect();
                format!("rev={} kvs=[{}]", header_rev(&r.header), kvs.join("; "))
            }),
        );
    }

    /// Records the next response on `ws` (or that none came within [`WAIT`]).
    pub async fn recv(&mut self, ws: &mut WatchStream, step: &str) -> Option<WatchResponse> {
        let response = ws.recv(WAIT).await;
        self.note(
            step,
            response
                .as_ref()
                .map_or_else(|e| format!("ERROR: {e}"), show_watch_response),
        );
        response.ok()
    }

    /// Records the next `n` responses on `ws`, ordered by watch id: etcd answers the
    /// watchers a write concerns in no particular order.
    pub async fn recv_sorted(&mut self, ws: &mut WatchStream, n: usize, step: &str) {
        let mut responses = Vec::new();
        let mut error = None;
        for _ in 0..n {
            match ws.recv(WAIT).await {
                Ok(r) => responses.push(r),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        responses.sort_by_key(|r| r.watch_id);
        let mut lines: Vec<String> = responses.iter().map(show_watch_response).collect();
        lines.extend(error.map(|e| format!("ERROR after {} responses: {e}", lines.len())));
        self.note(step, lines.join("\n"));
    }

    /// Reads until `controls` responses without events and `events` events have arrived,
    /// and records them with response boundaries erased: the created responses in arrival
    /// order, the other control responses (e.g. compaction cancels, which etcd sends in no
    /// particular order) by watch id, then each watch id's events in order, each with its
    /// response's header revision. For catching-up watchers, whose batching depends on
    /// timing.
    pub async fn recv_flat(
        &mut self,
        ws: &mut WatchStream,
        controls: usize,
        events: usize,
        step: &str,
    ) {
        let deadline = Instant::now() + WAIT * 2;
        let (mut seen_controls, mut seen_events) = (Vec::new(), Vec::new());
        let mut error = None;
        while seen_controls.len() < controls || seen_events.len() < events {
            let left = deadline.saturating_duration_since(Instant::now());
            match ws.recv(left).await {
                Ok(r) if r.events.is_empty() => seen_controls.push(r),
                Ok(r) => {
                    let rev = header_rev(&r.header);
                    for event in &r.events {
                        seen_events.push((r.watch_id, format!("rev={rev} {}", show_event(event))));
                    }
                }
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        // Stable sorts: created responses and each watcher's events keep arrival order.
        seen_controls.sort_by_key(|r| if r.created { i64::MIN } else { r.watch_id });
        seen_events.sort_by_key(|(id, _)| *id);
        let mut lines: Vec<String> = seen_controls.iter().map(show_watch_response).collect();
        lines.extend(
            seen_events
                .into_iter()
                .map(|(id, e)| format!("id={id} {e}")),
        );
        lines.extend(error.map(|e| format!("ERROR: {e}")));
        self.note(step, lines.join("\n"));
    }

    /// Records whether `ws` stays silent for `wait`, listing anything that arrives.
    pub async fn quiet(&mut self, ws: &mut WatchStream, wait: Duration, step: &str) {
        let deadline = Instant::now() + wait;
        let mut extra = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match ws.recv(left).await {
                Ok(r) => extra.push(format!("unexpected: {}", show_watch_response(&r))),
                Err(e) if e.starts_with("no response") => break,
                Err(e) => {
                    extra.push(format!("ERROR: {e}"));
                    break;
                }
            }
        }
        let outcome = if extra.is_empty() {
            "quiet".to_string()
        } else {
            extra.join("\n")
        };
        self.note(step, outcome);
    }
}

/// True when env `CETERA_DIFF_SELF_CHECK=1`: differential tests then compare etcd with a
/// second etcd instead of cetera, which must pass and shows the tests are deterministic.
pub fn self_check() -> bool {
    std::env::var("CETERA_DIFF_SELF_CHECK").is_ok_and(|v| v == "1" || v == "true")
}

/// Runs `scenario` against a fresh etcd (started with `etcd_args`) and a fresh cetera
/// (with `cetera_args`) at the same time, then compares the two transcripts step by step
/// and panics listing every step where they differ. Skips when etcd is not installed
/// outside CI. `CETERA_DIFF_VERBOSE=1` prints etcd's transcript.
pub async fn differential(
    etcd_args: &[&str],
    cetera_args: &[&str],
    scenario: impl AsyncFn(&mut Side),
) {
    // The subject's name, its address and the server process (kept alive by the Side).
    type Subject = (&'static str, String, Box<dyn std::any::Any + Send>);
    let (etcd, subject): (Option<Etcd>, Option<Subject>) = if self_check() {
        let (a, b) = tokio::join!(Etcd::start_with(etcd_args), Etcd::start_with(etcd_args));
        (a, b.map(|b| ("etcd #2", b.addr(), Box::new(b) as _)))
    } else {
        let (a, b) = tokio::join!(Etcd::start_with(etcd_args), Cetera::start_with(cetera_args));
        (a, Some(("cetera", b.addr(), Box::new(b) as _)))
    };
    let (Some(etcd), Some((name, addr, server))) = (etcd, subject) else {
        return;
    };
    let mut expected = Side::new("etcd", etcd.addr(), Box::new(etcd)).await;
    let mut actual = Side::new(name, addr, server).await;
    tokio::join!(scenario(&mut expected), scenario(&mut actual));
    let (want, got) = (expected.masked_transcript(), actual.masked_transcript());
    if std::env::var_os("CETERA_DIFF_VERBOSE").is_some() {
        for (i, (step, outcome)) in want.iter().enumerate() {
            eprintln!(
                "step {i}: {step}\n    etcd: {}",
                outcome.replace('\n', "\n          ")
            );
        }
    }
    let mut report = String::new();
    for i in 0..want.len().max(got.len()) {
        let (w, g) = (want.get(i), got.get(i));
        if w.map(|x| &x.1) == g.map(|x| &x.1) {
            continue;
        }
        let step = w.or(g).map_or("", |x| x.0.as_str());
        let indent = |o: Option<&(String, String)>| {
            o.map_or("<no such step>".to_string(), |x| {
                x.1.replace('\n', "\n            ")
            })
        };
        report += &format!(
            "\n  step {i}: {step}\n    etcd:   {}\n    {name}: {}",
            indent(w),
            indent(g)
        );
    }
    if !report.is_empty() {
        panic!("etcd and {name} disagree:{report}");
    }
}
