//! Output: a readable table (default) or JSON (`--json`) of the scenario's results.

use serde_json::{Value, json};

use crate::Common;
use crate::driver::Stats;

/// Everything one invocation measured, with the settings that shaped it.
pub struct Report {
    pub settings: Value,
    pub results: Vec<Stats>,
    pub json: bool,
    /// Print nothing (the `wait` command).
    pub quiet: bool,
}

impl Report {
    pub fn new(common: &Common) -> Report {
        Report {
            settings: json!({
                "endpoints": common.endpoints,
                "conns": common.conns,
                "clients": common.clients,
                "total": common.total,
                "duration_s": common.duration.map(|d| d.as_secs_f64()),
                "rate": common.rate,
                "key_size": common.key_size,
                "val_size": common.val_size,
                "key_space": common.key_space,
                "seq": common.seq,
            }),
            results: Vec::new(),
            json: common.json,
            quiet: false,
        }
    }

    /// True when a scenario had errors or did nothing.
    pub fn failed(&self) -> bool {
        self.results.iter().any(|r| r.errors > 0 || r.ops == 0)
    }

    pub fn print(&self) {
        if self.quiet {
            return;
        }
        if self.json {
            let results: Vec<Value> = self.results.iter().map(to_json).collect();
            let out = json!({ "settings": self.settings, "results": results });
            println!("{}", serde_json::to_string_pretty(&out).expect("json"));
            return;
        }
        println!(
            "{:<18} {:>5} {:>9} {:>6} {:>7} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "scenario",
            "unit",
            "count",
            "errors",
            "misses",
            "secs",
            "per sec",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms"
        );
        for r in &self.results {
            println!(
                "{:<18} {:>5} {:>9} {:>6} {:>7} {:>7.2} {:>10.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                r.name,
                r.unit,
                r.ops,
                r.errors,
                r.misses,
                r.elapsed.as_secs_f64(),
                r.throughput(),
                ms(r.hist.value_at_quantile(0.50)),
                ms(r.hist.value_at_quantile(0.90)),
                ms(r.hist.value_at_quantile(0.99)),
                ms(r.hist.max()),
            );
        }
        for r in &self.results {
            if !r.extra.is_empty() {
                let notes: Vec<String> = r.extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!("  {}: {}", r.name, notes.join(" "));
            }
            if let Some(error) = &r.first_error {
                println!("  {}: first error: {error}", r.name);
            }
        }
    }
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn to_json(r: &Stats) -> Value {
    let count = r.hist.len();
    let q = |q: f64| {
        if count > 0 {
            ms(r.hist.value_at_quantile(q))
        } else {
            0.0
        }
    };
    json!({
        "name": r.name,
        "unit": r.unit,
        "count": r.ops,
        "errors": r.errors,
        "misses": r.misses,
        "seconds": r.elapsed.as_secs_f64(),
        "per_sec": r.throughput(),
        "latency_ms": {
            "mean": if count > 0 { r.hist.mean() / 1000.0 } else { 0.0 },
            "p50": q(0.50),
            "p90": q(0.90),
            "p99": q(0.99),
            "p999": q(0.999),
            "max": ms(r.hist.max()),
        },
        "first_error": r.first_error,
        "extra": r.extra,
    })
}
