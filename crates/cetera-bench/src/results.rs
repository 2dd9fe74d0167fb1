//! The results file of a side-by-side run (`results.json`, written by
//! `scripts/bench.sh`): the machine, the peers, and every step each peer ran, with
//! what cetera-bench measured and what was sampled of the server. The report and the
//! charts are both read from it, so that they never disagree.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

/// A whole run.
#[derive(Deserialize, Debug)]
pub struct Results {
    /// The machine and the command: `date`, `command`, `settings`, `machine`,
    /// `backend`, `fsync_counter`, `load_start`, `load_end`, `minutes`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The servers compared, in the order the report shows them.
    pub peers: Vec<Peer>,
    /// Every step on every peer, in the order they ran.
    pub steps: Vec<StepRun>,
}

/// One server compared.
#[derive(Deserialize, Debug)]
pub struct Peer {
    /// Its id in the run (`etcd35`, `etcd37`, `kine`, `cetera`).
    pub name: String,
    /// What the report calls it, e.g. `etcd 3.7.3`.
    pub label: String,
    /// The binary and its settings.
    #[serde(default)]
    pub desc: String,
}

/// One step on one peer (the file holds more than the report reads: the case, the
/// growth samples of a soak, p90 and max, misses, kernel CPU).
#[derive(Deserialize, Debug)]
pub struct StepRun {
    /// The step's label (`put-64`, `list-10k-stream`, ...).
    pub step: String,
    /// The peer's id.
    pub server: String,
    /// What cetera-bench printed with `--json`.
    #[serde(default)]
    pub bench: BenchOutput,
    /// What was sampled of the server around the step (none when it was not run).
    pub sample: Option<Sample>,
    /// Why the peer could not do the step, if it could not.
    pub na: Option<String>,
}

/// cetera-bench's JSON output.
#[derive(Deserialize, Debug, Default)]
pub struct BenchOutput {
    /// The scenario's settings (`rate`, `clients`, ...).
    #[serde(default)]
    pub settings: Value,
    #[serde(default)]
    pub results: Vec<Row>,
}

/// One row of a scenario (a scenario may report several, e.g. lease grant and
/// keep-alive, or the k8s mix's writes, lists and watch events).
#[derive(Deserialize, Debug)]
pub struct Row {
    pub name: String,
    /// What one operation is: `op`, `list`, `event`.
    pub unit: String,
    pub count: u64,
    pub errors: u64,
    pub per_sec: f64,
    pub latency_ms: Latency,
    pub first_error: Option<String>,
    #[serde(default)]
    pub extra: BTreeMap<String, Value>,
}

/// Latency percentiles of a row, milliseconds.
#[derive(Deserialize, Debug, Default)]
pub struct Latency {
    #[serde(default)]
    pub p50: f64,
    #[serde(default)]
    pub p99: f64,
}

/// What was sampled of a server during a step (of the server's process and, on a
/// database server, of that server's processes too).
#[derive(Deserialize, Debug, Default)]
pub struct Sample {
    /// fsync + fdatasync calls, when a counter worked.
    pub fsyncs: Option<f64>,
    pub write_bytes: f64,
    /// User + system CPU seconds.
    pub cpu_s: f64,
    pub wall_s: f64,
    pub vmhwm_kb: f64,
    pub vmrss_kb: f64,
    /// The data dir and the database at the step's end (on a database server: no data
    /// dir, and the size of the peer's database there).
    #[serde(default)]
    pub dir_bytes: f64,
    #[serde(default)]
    pub db_bytes: f64,
    /// Bytes the database server appended to its write-ahead log during the step
    /// (PostgreSQL's WAL, InnoDB's redo log): None on SQLite, and where peers shared
    /// the database server at once.
    #[serde(default)]
    pub db_log_bytes: Option<f64>,
}

impl Results {
    /// Reads a results file.
    pub fn load(path: &Path) -> anyhow::Result<Results> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// The step labels, in the order they first ran.
    pub fn step_labels(&self) -> Vec<&str> {
        let mut labels: Vec<&str> = Vec::new();
        for run in &self.steps {
            if !labels.contains(&run.step.as_str()) {
                labels.push(&run.step);
            }
        }
        labels
    }

    /// What PEER did in STEP, if it ran it.
    pub fn run(&self, step: &str, peer: &str) -> Option<&StepRun> {
        self.steps
            .iter()
            .find(|r| r.step == step && r.server == peer)
    }

    /// The peer's label, or its id if it has none.
    pub fn label<'a>(&'a self, peer: &'a str) -> &'a str {
        self.peers
            .iter()
            .find(|p| p.name == peer)
            .map_or(peer, |p| p.label.as_str())
    }

    /// Whether any step counted a database server's log (a PostgreSQL or MySQL run).
    pub fn has_db_log(&self) -> bool {
        self.steps
            .iter()
            .any(|r| r.sample.as_ref().is_some_and(|s| s.db_log_bytes.is_some()))
    }

    /// The newest etcd of the run (the one the targets are judged against).
    pub fn reference_etcd(&self) -> Option<&str> {
        ["etcd37", "etcd35"]
            .into_iter()
            .find(|name| self.peers.iter().any(|p| p.name == *name))
    }
}

impl StepRun {
    /// The figures of the step, or why there are none.
    pub fn outcome(&self) -> Result<&Self, &str> {
        match &self.na {
            Some(reason) => Err(reason),
            None if self.bench.results.is_empty() && self.step != "idle" => Err("no results"),
            None => Ok(self),
        }
    }

    /// The row named NAME, or the step's headline row when NAME is None.
    pub fn row(&self, name: Option<&str>) -> Option<&Row> {
        match name {
            Some(name) => self.bench.results.iter().find(|r| r.name == name),
            None => self.headline(),
        }
    }

    /// The row that stands for the step in charts: the watch events of a watch
    /// step, else its first row.
    pub fn headline(&self) -> Option<&Row> {
        let rows = &self.bench.results;
        rows.iter().find(|r| r.unit == "event").or(rows.first())
    }

    /// Operations the step's resource use is divided by: its "op" rows, else its
    /// first row.
    pub fn ops(&self) -> u64 {
        let rows = &self.bench.results;
        let n: u64 = rows
            .iter()
            .filter(|r| r.unit == "op")
            .map(|r| r.count)
            .sum();
        if n > 0 {
            n
        } else {
            rows.first().map_or(0, |r| r.count)
        }
    }

    /// A sampled quantity per operation (per minute for the idle step), once
    /// scaled by SCALE.
    pub fn per_op(&self, value: impl Fn(&Sample) -> Option<f64>, scale: f64) -> Option<f64> {
        let sample = self.sample.as_ref()?;
        let v = value(sample)? * scale;
        if self.step == "idle" {
            return (sample.wall_s > 0.0).then(|| v * 60.0 / sample.wall_s);
        }
        let ops = self.ops();
        (ops > 0).then(|| v / ops as f64)
    }

    /// Server CPU (user + system) per operation, milliseconds.
    pub fn cpu_ms_per_op(&self) -> Option<f64> {
        self.per_op(|s| Some(s.cpu_s), 1000.0)
    }

    /// fsync + fdatasync calls per operation.
    pub fn fsyncs_per_op(&self) -> Option<f64> {
        self.per_op(|s| s.fsyncs, 1.0)
    }

    /// KiB written to storage per operation.
    pub fn kib_per_op(&self) -> Option<f64> {
        self.per_op(|s| Some(s.write_bytes), 1.0 / 1024.0)
    }

    /// KiB of the database server's write-ahead log per operation.
    pub fn db_log_kib_per_op(&self) -> Option<f64> {
        self.per_op(|s| s.db_log_bytes, 1.0 / 1024.0)
    }
}
