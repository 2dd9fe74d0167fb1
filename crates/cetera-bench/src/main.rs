//! `cetera-bench`: a load generator for any etcd v3 endpoint, cetera or real etcd alike.
//!
//! Each scenario (`put`, `range`, `txn-cas`, `list`, `watch`, `lease`, `k8s`, and the
//! unmeasured `populate`) drives the server through the generated tonic clients over
//! `--conns` HTTP/2 connections with `--clients` concurrent tasks, for `--total`
//! operations or a `--duration`, and prints throughput and latency percentiles as a
//! table or, with `--json`, as JSON. `scripts/bench.sh` runs the scenarios on cetera and
//! on etcd 3.5.1 side by side; BENCHMARKS.md has the results. For clusters, `leader`
//! names the leader's endpoint and `failover` kills the leader under a light write load
//! and times the recovery (`scripts/bench-cluster.sh` runs them). `report` and `chart`
//! turn the results file of a side-by-side run (`scripts/bench.sh`) into its Markdown
//! report and its SVG charts.

mod chart;
mod compactor;
mod driver;
mod failover;
mod k8s;
mod keys;
mod lease;
mod list;
mod markdown;
mod net;
mod populate;
mod proxy;
mod put;
mod range;
mod report;
mod results;
mod txn;
mod watch;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use report::Report;

#[derive(Parser, Debug)]
#[command(
    name = "cetera-bench",
    about = "Benchmarks an etcd v3 endpoint (cetera or etcd): throughput and latency percentiles",
    after_help = "Examples:\n  \
      cetera-bench put --conns 8 --clients 64 --duration 10s\n  \
      cetera-bench range --populate --clients 64 --conns 8 --serializable\n  \
      cetera-bench list --populate --key-space 10000 --clients 4 --duration 10s\n  \
      cetera-bench list --stream --populate --key-space 10000 --clients 4 --duration 10s\n  \
      cetera-bench watch --watchers 100 --rate 100 --duration 10s\n  \
      cetera-bench k8s --populate --key-space 1000 --clients 16 --duration 20s --json\n  \
      cetera-bench --endpoints URL1,URL2,URL3 failover --pids PID1,PID2,PID3"
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    scenario: Scenario,
}

/// Options every scenario shares.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// gRPC endpoints; connections are spread over them round-robin.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,
    /// HTTP/2 connections to open.
    #[arg(long, global = true, default_value_t = 1)]
    pub conns: usize,
    /// Concurrent client tasks (spread over the connections).
    #[arg(long, global = true, default_value_t = 1)]
    pub clients: usize,
    /// Operations to run in all (default 10000 unless --duration is given).
    #[arg(long, global = true)]
    pub total: Option<u64>,
    /// Run for this long instead of a fixed number of operations, e.g. `10s`.
    #[arg(long, global = true, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Limit the operation rate (operations per second over all clients).
    #[arg(long, global = true)]
    pub rate: Option<f64>,
    /// Key size in bytes (prefix + zero-padded index).
    #[arg(long, global = true, default_value_t = 32)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, global = true, default_value_t = 256)]
    pub val_size: usize,
    /// Number of distinct keys.
    #[arg(long, global = true, default_value_t = 10_000)]
    pub key_space: u64,
    /// Sequential keys (0, 1, 2, ... modulo --key-space) instead of random ones.
    #[arg(long, global = true)]
    pub seq: bool,
    /// Key prefix (the scenario's default when not given).
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// Before measuring, write every key of the key space (not measured).
    #[arg(long, global = true)]
    pub populate: bool,
    /// Seed of the random key choice.
    #[arg(long, global = true, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON on stdout instead of the table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Never print the progress line on stderr.
    #[arg(long, global = true)]
    pub no_progress: bool,
}

impl Common {
    /// The scenario's key prefix: `--prefix`, else `default`.
    pub fn prefix_or(&self, default: &str) -> String {
        self.prefix.clone().unwrap_or_else(|| default.to_string())
    }

    /// The load shape: `--total` / `--duration` / `--rate`.
    pub fn load(&self) -> driver::Load {
        driver::Load {
            total: match (self.total, self.duration) {
                (None, None) => Some(10_000),
                (total, _) => total,
            },
            duration: self.duration,
            rate: self.rate,
            progress: !self.no_progress,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// Put: key/value writes, random or sequential keys.
    Put,
    /// Range: single-key reads, or a prefix read with a limit.
    Range(range::RangeArgs),
    /// Txn compare-and-swap on mod_revision: the apiserver's Update.
    TxnCas,
    /// Paginated List of a prefix, the apiserver's way (or one RangeStream with
    /// --stream); one operation = one full list.
    List(list::ListArgs),
    /// Watch: W watchers on one prefix; latency from put acknowledgement to event.
    Watch(watch::WatchArgs),
    /// Lease grant, then keep-alive of the granted leases, then revoke (unless --keep).
    Lease(lease::LeaseArgs),
    /// A Kubernetes-like mix: Update 90 / Delete 5 / Create 5 Txns, List, Watch, leases.
    K8s(k8s::K8sArgs),
    /// Write every key of the key space in Txn batches (what --populate does).
    Populate(populate::PopulateArgs),
    /// Kill the leader (SIGKILL) under a 1-client write load over all endpoints; time
    /// until a survivor reports a new leader and until puts are acknowledged again.
    Failover(failover::FailoverArgs),
    /// Print the endpoint of the member that reports itself leader in Status.
    Leader {
        /// Give up after this long without a leader.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
        timeout: Duration,
    },
    /// A TCP proxy adding a delay each way (the network to a managed
    /// database) and counting round trips; runs until killed.
    Proxy(proxy::ProxyArgs),
    /// Print the Markdown report of a side-by-side run's results file (the
    /// results.json scripts/bench.sh writes).
    Report {
        /// The results file.
        results: PathBuf,
    },
    /// Write the SVG charts of a side-by-side run's results file into a directory.
    Chart {
        /// The results file.
        results: PathBuf,
        /// Where the charts go (created if missing).
        dir: PathBuf,
    },
    /// Wait until the endpoint answers a Range (used by scripts/bench.sh).
    Wait {
        /// Give up after this long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
        timeout: Duration,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(report) => {
            report.print();
            if report.failed() {
                std::process::ExitCode::FAILURE
            } else {
                std::process::ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("cetera-bench: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<Report> {
    let common = cli.common;
    let mut report = Report::new(&common);
    if let Scenario::Wait { timeout } = cli.scenario {
        net::wait_ready(&common.endpoints[0], timeout).await?;
        report.quiet = true;
        return Ok(report);
    }
    if let Scenario::Report { results } = &cli.scenario {
        print!("{}", markdown::render(&results::Results::load(results)?));
        report.quiet = true;
        return Ok(report);
    }
    if let Scenario::Chart { results, dir } = &cli.scenario {
        for path in chart::write_all(&results::Results::load(results)?, dir)? {
            eprintln!("wrote {}", path.display());
        }
        report.quiet = true;
        return Ok(report);
    }
    if let Scenario::Leader { timeout } = cli.scenario {
        failover::print_leader(&common, timeout).await?;
        report.quiet = true;
        return Ok(report);
    }
    if let Scenario::Proxy(args) = &cli.scenario {
        proxy::run(args).await?;
        report.quiet = true;
        return Ok(report);
    }
    if let Scenario::Failover(args) = &cli.scenario {
        report.results = vec![failover::run(&common, args).await?];
        return Ok(report);
    }
    let channels = net::connect(&common.endpoints, common.conns).await?;
    let results = match cli.scenario {
        Scenario::Put => vec![put::run(&common, &channels).await?],
        Scenario::Range(args) => vec![range::run(&common, &args, &channels).await?],
        Scenario::TxnCas => vec![txn::run(&common, &channels).await?],
        Scenario::List(args) => vec![list::run(&common, &args, &channels).await?],
        Scenario::Watch(args) => watch::run(&common, &args, &channels).await?,
        Scenario::Lease(args) => lease::run(&common, &args, &channels).await?,
        Scenario::K8s(args) => k8s::run(&common, &args, &channels).await?,
        Scenario::Populate(args) => {
            let prefix = common.prefix_or(keys::DEFAULT_PREFIX);
            vec![populate::run(&common, &args, &channels, &prefix).await?]
        }
        Scenario::Wait { .. }
        | Scenario::Leader { .. }
        | Scenario::Failover(_)
        | Scenario::Report { .. }
        | Scenario::Chart { .. }
        | Scenario::Proxy(_) => {
            unreachable!()
        }
    };
    report.results = results;
    Ok(report)
}
