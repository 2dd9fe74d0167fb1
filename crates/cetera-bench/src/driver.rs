//! The closed-loop driver every scenario uses: `--clients` workers claim operation
//! numbers until `--total` or `--duration` is reached (paced by `--rate` if given), time
//! each operation into an HDR histogram, and show a progress line on stderr.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Map, Value};

/// After this many failed operations a run stops (the server is likely gone).
const MAX_ERRORS: u64 = 100;

/// How much work to do: a number of operations, a duration, or both (whichever ends
/// first), optionally at a fixed rate.
#[derive(Clone, Debug)]
pub struct Load {
    pub total: Option<u64>,
    pub duration: Option<Duration>,
    pub rate: Option<f64>,
    pub progress: bool,
}

/// What an operation found, besides an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Did what it was meant to.
    Done,
    /// Answered, but a compare failed or the key was absent (counted as a miss).
    Miss,
}

/// One client's operation loop body. `op` gets the operation's sequence number.
pub trait Worker: Send + 'static {
    fn op(&mut self, op: u64) -> impl Future<Output = Result<Outcome, tonic::Status>> + Send;
}

/// Latency histogram in microseconds, 1 µs to 1 h, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// Records `latency` in µs.
pub fn record(hist: &mut Histogram<u64>, latency: Duration) {
    hist.saturating_record((latency.as_micros() as u64).max(1));
}

/// The outcome of one measured scenario (or phase of one).
#[derive(Debug, Clone)]
pub struct Stats {
    pub name: String,
    /// What one operation is ("op", "list", "event").
    pub unit: &'static str,
    pub ops: u64,
    pub errors: u64,
    pub misses: u64,
    pub elapsed: Duration,
    /// Latency per operation, µs.
    pub hist: Histogram<u64>,
    pub first_error: Option<String>,
    /// Scenario-specific figures, shown in the notes and the JSON.
    pub extra: Map<String, Value>,
}

impl Stats {
    pub fn new(name: &str, unit: &'static str) -> Stats {
        Stats {
            name: name.to_string(),
            unit,
            ops: 0,
            errors: 0,
            misses: 0,
            elapsed: Duration::ZERO,
            hist: histogram(),
            first_error: None,
            extra: Map::new(),
        }
    }

    pub fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ops as f64 / secs
        } else {
            0.0
        }
    }

    /// Adds a scenario-specific figure.
    pub fn note(&mut self, key: &str, value: impl Into<Value>) {
        self.extra.insert(key.to_string(), value.into());
    }
}

/// State the workers share.
struct Shared {
    next: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
    start: Instant,
    deadline: Option<Instant>,
    total: Option<u64>,
    rate: Option<f64>,
}

impl Shared {
    /// Claims the next operation number, waiting for its slot when rate-limited.
    /// None when the run is over.
    async fn claim(&self) -> Option<u64> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let op = self.next.fetch_add(1, Ordering::Relaxed);
        if self.total.is_some_and(|total| op >= total) {
            return None;
        }
        if let Some(rate) = self.rate {
            let at = self.start + Duration::from_secs_f64(op as f64 / rate);
            if self.deadline.is_some_and(|deadline| at >= deadline) {
                return None;
            }
            tokio::time::sleep_until(at.into()).await;
        }
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return None;
        }
        Some(op)
    }
}

/// Runs `workers` (one task each) under `load`; returns the merged statistics and the
/// workers, whose state (e.g. granted lease ids) a later phase may need.
pub async fn run<W: Worker>(name: &str, load: &Load, workers: Vec<W>) -> (Stats, Vec<W>) {
    let start = Instant::now();
    let shared = Arc::new(Shared {
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        start,
        deadline: load.duration.map(|d| start + d),
        total: load.total,
        rate: load.rate,
    });
    let progress = load.progress.then(|| {
        let shared = shared.clone();
        let (name, load) = (name.to_string(), load.clone());
        Progress::spawn(name, load, move || shared.done.load(Ordering::Relaxed))
    });

    let tasks: Vec<_> = workers
        .into_iter()
        .map(|mut worker| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut stats = Stats::new("", "op");
                while let Some(op) = shared.claim().await {
                    let began = Instant::now();
                    let result = worker.op(op).await;
                    record(&mut stats.hist, began.elapsed());
                    match result {
                        Ok(outcome) => {
                            stats.ops += 1;
                            if outcome == Outcome::Miss {
                                stats.misses += 1;
                            }
                            shared.done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(status) => {
                            stats.errors += 1;
                            stats.first_error.get_or_insert_with(|| status.to_string());
                            if shared.errors.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_ERRORS {
                                shared.stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
                (stats, worker)
            })
        })
        .collect();

    let mut total = Stats::new(name, "op");
    let mut workers = Vec::with_capacity(tasks.len());
    for task in tasks {
        let (stats, worker) = task.await.expect("worker task panicked");
        total.merge(&stats);
        workers.push(worker);
    }
    total.elapsed = start.elapsed();
    if let Some(progress) = progress {
        progress.finish();
    }
    (total, workers)
}

impl Stats {
    /// Adds another part's counts and latencies to this one (elapsed is not summed).
    pub fn merge(&mut self, other: &Stats) {
        self.ops += other.ops;
        self.errors += other.errors;
        self.misses += other.misses;
        self.hist.add(&other.hist).expect("same histogram bounds");
        if self.first_error.is_none() {
            self.first_error = other.first_error.clone();
        }
    }
}

/// A progress line on stderr for runs that last more than a couple of seconds: redrawn
/// every second on a terminal, a new line every 5 s otherwise.
pub struct Progress {
    task: tokio::task::JoinHandle<()>,
    shown: Arc<AtomicBool>,
}

impl Progress {
    pub fn spawn(name: String, load: Load, done: impl Fn() -> u64 + Send + 'static) -> Progress {
        let shown = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        let task = {
            let shown = shown.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let every = if tty { 1 } else { 5 };
                let mut tick = 0u64;
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    tick += 1;
                    if tick < 2 || !tick.is_multiple_of(every) {
                        continue;
                    }
                    let elapsed = start.elapsed().as_secs_f64();
                    let n = done();
                    let goal = match (load.duration, load.total) {
                        (Some(d), _) => format!("{elapsed:.0}/{:.0} s", d.as_secs_f64()),
                        (None, Some(t)) => format!("{n}/{t}, {elapsed:.0} s"),
                        (None, None) => format!("{elapsed:.0} s"),
                    };
                    let line = format!("{name}: {n} done, {:.0}/s, {goal}", n as f64 / elapsed);
                    let mut err = std::io::stderr().lock();
                    if tty {
                        let _ = write!(err, "\r\x1b[K{line}");
                    } else {
                        let _ = writeln!(err, "{line}");
                    }
                    let _ = err.flush();
                    shown.store(true, Ordering::Relaxed);
                }
            })
        };
        Progress { task, shown }
    }

    /// Stops the line and clears it from a terminal.
    pub fn finish(self) {
        self.task.abort();
        if self.shown.load(Ordering::Relaxed) && std::io::stderr().is_terminal() {
            eprint!("\r\x1b[K");
        }
    }
}
