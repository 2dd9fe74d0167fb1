//! `cetera-bench report RESULTS.json`: the Markdown report of a side-by-side run, one
//! column per peer: throughput, latency, server CPU per operation, disk and memory,
//! the rate steps' bytes and fsyncs per put, the soak, and the targets of issue 49
//! against the newest etcd and kine. A step a peer could not do reads "n/a (reason)".

use std::fmt::Write;

use serde_json::Value;

use crate::results::{Results, Row, StepRun};

/// The rate steps of issue 28, in the order they are shown.
pub const RATE_STEPS: [&str; 4] = ["rate-10", "rate-100", "rate-400", "rate-max"];

/// A figure as the report prints it: thousands separated, small values with three
/// significant digits, "-" for none.
pub fn fmt(v: Option<f64>, digits: usize) -> String {
    match v {
        None => "-".into(),
        Some(v) if !v.is_finite() => "-".into(),
        Some(v) if v.abs() >= 1000.0 => thousands(v.round() as i64),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 1.0 || v == 0.0 => format!("{v:.digits$}"),
        Some(v) => {
            // Three significant digits.
            let places = (3 - v.abs().log10().floor() as i32 - 1).max(0) as usize;
            format!("{v:.places$}")
        }
    }
}

fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

/// The report of RESULTS, in Markdown.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    header(results, &mut out);
    throughput(results, &mut out);
    latency(results, &mut out);
    resources(results, &mut out);
    rates(results, &mut out);
    soak(results, &mut out);
    targets(results, &mut out);
    notes(results, &mut out);
    out
}

fn env<'a>(results: &'a Results, key: &str) -> &'a str {
    results.env.get(key).map_or("?", String::as_str)
}

fn header(results: &Results, out: &mut String) {
    let _ = writeln!(out, "- date: {}", env(results, "date"));
    let _ = writeln!(
        out,
        "- command: `{}` ({})",
        env(results, "command").trim(),
        env(results, "settings")
    );
    let _ = writeln!(out, "- machine: {}", env(results, "machine"));
    let _ = writeln!(
        out,
        "- load average (1, 5, 15 min) at start: {}, at end: {} (a shared machine: other work ran beside the benchmark)",
        env(results, "load_start"),
        env(results, "load_end")
    );
    let _ = writeln!(
        out,
        "- fsync counter: {}; the run took {} minutes",
        env(results, "fsync_counter"),
        env(results, "minutes")
    );
    for peer in &results.peers {
        let _ = writeln!(out, "- {}: {}", peer.label, peer.desc);
    }
    out.push('\n');
}

/// The table's head: STEP COLUMNS, then one column per peer with SUFFIX, then EXTRA.
fn head(results: &Results, first: &[&str], suffix: &str, extra: &[String], out: &mut String) {
    let mut cols: Vec<String> = first.iter().map(|s| s.to_string()).collect();
    cols.extend(results.peers.iter().map(|p| format!("{}{suffix}", p.label)));
    cols.extend(extra.iter().cloned());
    let _ = writeln!(out, "| {} |", cols.join(" | "));
    let aligns: Vec<&str> = (0..cols.len())
        .map(|i| if i < first.len() { "---" } else { "---:" })
        .collect();
    let _ = writeln!(out, "|{}|", aligns.join("|"));
}

/// Every (step, row name) pair of the run, in order.
fn step_rows(results: &Results) -> Vec<(&str, &str, &str)> {
    let mut rows = Vec::new();
    for step in results.step_labels() {
        if step == "idle" {
            continue;
        }
        for peer in &results.peers {
            let Some(run) = results.run(step, &peer.name) else {
                continue;
            };
            for row in &run.bench.results {
                if !rows
                    .iter()
                    .any(|(s, n, _): &(&str, &str, &str)| *s == step && *n == row.name)
                {
                    rows.push((step, row.name.as_str(), row.unit.as_str()));
                }
            }
        }
        if !rows.iter().any(|(s, _, _)| *s == step) {
            rows.push((step, "", "op")); // no peer could do it: still a row of n/a
        }
    }
    rows
}

/// The cell of PEER in STEP's row NAME: FIGURE of it, or "n/a (reason)" (the reason
/// only when LONG).
fn cell(
    results: &Results,
    step: &str,
    name: &str,
    peer: &str,
    long: bool,
    figure: impl Fn(&StepRun, &Row) -> Option<f64>,
    digits: usize,
) -> String {
    match results.run(step, peer).map(StepRun::outcome) {
        None => "-".into(),
        Some(Err(reason)) if long => format!("n/a ({})", reason.replace('|', "/")),
        Some(Err(_)) => "n/a".into(),
        Some(Ok(run)) => match run.row(Some(name)) {
            Some(row) => fmt(figure(run, row), digits),
            None => "-".into(),
        },
    }
}

fn figure(results: &Results, step: &str, peer: &str, name: Option<&str>) -> Option<f64> {
    let run = results.run(step, peer)?.outcome().ok()?;
    run.row(name).map(|r| r.per_sec)
}

fn throughput(results: &Results, out: &mut String) {
    let cetera = results.peers.iter().any(|p| p.name == "cetera");
    let reference = results.reference_etcd().filter(|_| cetera);
    let mut extra = Vec::new();
    if let Some(etcd) = reference {
        extra.push(format!("cetera / {}", results.label(etcd)));
    }
    let kine = cetera && results.peers.iter().any(|p| p.name == "kine");
    if kine {
        extra.push("cetera / kine".into());
    }
    let _ = writeln!(
        out,
        "### Throughput (operations per second; ratio > 1: cetera does more)\n"
    );
    head(results, &["step", "row", "unit"], " /s", &extra, out);
    for (step, name, unit) in step_rows(results) {
        let mut cols = vec![step.to_string(), name.to_string(), unit.to_string()];
        for peer in &results.peers {
            cols.push(cell(
                results,
                step,
                name,
                &peer.name,
                true,
                |_, r| Some(r.per_sec),
                1,
            ));
        }
        let cetera = figure(results, step, "cetera", Some(name));
        if let Some(etcd) = reference {
            cols.push(fmt(
                ratio(cetera, figure(results, step, etcd, Some(name))),
                2,
            ));
        }
        if kine {
            cols.push(fmt(
                ratio(cetera, figure(results, step, "kine", Some(name))),
                2,
            ));
        }
        let _ = writeln!(out, "| {} |", cols.join(" | "));
    }
    out.push('\n');
}

fn latency(results: &Results, out: &mut String) {
    let _ = writeln!(out, "### Latency p50 / p99 (ms)\n");
    head(results, &["step", "row"], "", &[], out);
    for (step, name, _) in step_rows(results) {
        let mut cols = vec![step.to_string(), name.to_string()];
        for peer in &results.peers {
            let p50 = cell(
                results,
                step,
                name,
                &peer.name,
                false,
                |_, r| Some(r.latency_ms.p50),
                2,
            );
            let p99 = cell(
                results,
                step,
                name,
                &peer.name,
                false,
                |_, r| Some(r.latency_ms.p99),
                2,
            );
            cols.push(if p50 == p99 {
                p50
            } else {
                format!("{p50} / {p99}")
            });
        }
        let _ = writeln!(out, "| {} |", cols.join(" | "));
    }
    out.push('\n');
}

/// A per-step figure of PEER, or "n/a".
fn step_cell(
    results: &Results,
    step: &str,
    peer: &str,
    value: impl Fn(&StepRun) -> Option<f64>,
    digits: usize,
) -> String {
    match results.run(step, peer).map(StepRun::outcome) {
        None => "-".into(),
        Some(Err(_)) => "n/a".into(),
        Some(Ok(run)) => fmt(value(run), digits),
    }
}

fn resources(results: &Results, out: &mut String) {
    let _ = writeln!(
        out,
        "### Server CPU per operation (ms, user + system, of the server's processes)\n"
    );
    head(results, &["step", "ops"], "", &[], out);
    for step in results.step_labels() {
        let ops: Vec<String> = results
            .peers
            .iter()
            .map(|p| match results.run(step, &p.name) {
                Some(_) if step == "idle" => "per minute".into(),
                Some(run) if run.na.is_none() => run.ops().to_string(),
                _ => "-".into(),
            })
            .collect();
        let mut cols = vec![step.to_string(), ops.join("/")];
        for peer in &results.peers {
            cols.push(step_cell(
                results,
                step,
                &peer.name,
                StepRun::cpu_ms_per_op,
                3,
            ));
        }
        let _ = writeln!(out, "| {} |", cols.join(" | "));
    }
    let _ = writeln!(
        out,
        "\nFor idle, CPU ms per minute. With a database server, its processes' CPU counts for cetera and kine.\n"
    );

    let _ = writeln!(
        out,
        "### Disk and memory: fsyncs per op, KB written per op, VmHWM MB\n"
    );
    let vmhwm = |r: &StepRun| r.sample.as_ref().map(|s| s.vmhwm_kb / 1024.0);
    let mut figures: Vec<Figure> = vec![
        ("fsync/op", &StepRun::fsyncs_per_op, 3),
        ("KB/op", &StepRun::kib_per_op, 2),
    ];
    figures.extend(db_log_figure(results, "DB log KB/op"));
    figures.push(("VmHWM MB", &vmhwm, 1));
    per_peer_table(results, &results.step_labels(), &figures, out);
    let _ = writeln!(
        out,
        "\nFor idle, fsyncs and KB per minute. VmHWM is the server's own (not its database server's).\n"
    );
    if results.has_db_log() {
        let _ = writeln!(out, "{DB_LOG_NOTE}\n");
    }
}

/// What the database-log columns count, under the tables that show them.
const DB_LOG_NOTE: &str = "DB log: the bytes the database server appended to its write-ahead \
log during the step (PostgreSQL's WAL, InnoDB's redo log), the write cost of the peer's own \
statements without the server's background work: on PostgreSQL, where the script could read the \
WAL files, only the records of the peer's database and its transactions' commits (pg_waldump), \
else the whole server's (the header's settings say which); n/a where peers shared the server at \
once.";

/// The database-log column, on runs against a database server.
fn db_log_figure<'a>(results: &Results, what: &'a str) -> Option<Figure<'a>> {
    results
        .has_db_log()
        .then_some((what, &StepRun::db_log_kib_per_op, 2))
}

/// A figure of a step: its column name, how it is read, its digits.
type Figure<'a> = (&'a str, &'a dyn Fn(&StepRun) -> Option<f64>, usize);

/// A table of STEPS with, for each figure, one column per peer.
fn per_peer_table(results: &Results, steps: &[&str], figures: &[Figure], out: &mut String) {
    let peers = &results.peers;
    let mut cols: Vec<String> = vec!["step".into()];
    for (what, _, _) in figures {
        cols.extend(peers.iter().map(|p| format!("{} {what}", p.label)));
    }
    let _ = writeln!(out, "| {} |", cols.join(" | "));
    let _ = writeln!(out, "|---|{}|", vec!["---:"; cols.len() - 1].join("|"));
    for step in steps {
        let mut cols = vec![step.to_string()];
        for (_, value, digits) in figures {
            for p in peers {
                cols.push(step_cell(results, step, &p.name, value, *digits));
            }
        }
        let _ = writeln!(out, "| {} |", cols.join(" | "));
    }
}

fn rates(results: &Results, out: &mut String) {
    let steps: Vec<&str> = RATE_STEPS
        .into_iter()
        .filter(|s| results.steps.iter().any(|r| r.step == *s))
        .collect();
    if steps.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### Kubernetes loads (1 KiB values over 5k keys): puts/s, KB written per put, fsyncs per put, database MB at the end\n"
    );
    let puts = |r: &StepRun| r.headline().map(|h| h.per_sec);
    let db = |r: &StepRun| r.sample.as_ref().map(|s| s.db_bytes / 1048576.0);
    let mut figures: Vec<Figure> = vec![("puts/s", &puts, 1), ("KB/put", &StepRun::kib_per_op, 2)];
    figures.extend(db_log_figure(results, "DB log KB/put"));
    figures.push(("fsyncs/put", &StepRun::fsyncs_per_op, 3));
    figures.push(("db MB", &db, 1));
    per_peer_table(results, &steps, &figures, out);
    let _ = writeln!(
        out,
        "\ndb: etcd's member/snap/db, kine's and cetera's SQLite file; on a database server, the peer's database (PostgreSQL's pg_database_size, MariaDB's files of the database).\n"
    );
}

/// The compaction windows of a soak: (compact ms, longest write ms) of each window
/// after the first, which begins before any compaction.
fn windows(run: &StepRun) -> Vec<(Option<f64>, f64)> {
    let Some(row) = run.row(Some("k8s-write")) else {
        return Vec::new();
    };
    let Some(Value::Array(windows)) = row.extra.get("compaction_windows") else {
        return Vec::new();
    };
    windows
        .iter()
        .skip(1)
        .filter(|w| w["to_s"].as_f64() > w["from_s"].as_f64())
        .map(|w| {
            (
                w["compact_ms"].as_f64(),
                w["longest_write_ms"].as_f64().unwrap_or(0.0),
            )
        })
        .collect()
}

fn soak(results: &Results, out: &mut String) {
    if !results.steps.iter().any(|r| r.step == "soak") {
        return;
    }
    let _ = writeln!(
        out,
        "### Soak: the k8s mix at a steady rate with the apiserver's compactor, every peer at once\n"
    );
    let _ = writeln!(
        out,
        "| peer | writes/s | compactions | longest compaction ms | longest write after a compaction ms | KB written per write | db MB at end | data dir MB at end | VmRSS MB at end |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for peer in &results.peers {
        let Some(run) = results.run("soak", &peer.name) else {
            continue;
        };
        let mut cols = vec![peer.label.clone()];
        match run.outcome() {
            Err(reason) => cols.push(format!("n/a ({reason})")),
            Ok(run) => {
                let w = windows(run);
                let s = run.sample.as_ref();
                cols.push(fmt(run.row(Some("k8s-write")).map(|r| r.per_sec), 1));
                cols.push(w.len().to_string());
                cols.push(fmt(w.iter().filter_map(|x| x.0).reduce(f64::max), 1));
                cols.push(fmt(w.iter().map(|x| x.1).reduce(f64::max), 1));
                cols.push(fmt(run.kib_per_op(), 2));
                cols.push(fmt(s.map(|s| s.db_bytes / 1048576.0), 1));
                cols.push(fmt(s.map(|s| s.dir_bytes / 1048576.0), 1));
                cols.push(fmt(s.map(|s| s.vmrss_kb / 1024.0), 1));
            }
        }
        let _ = writeln!(out, "| {} |", cols.join(" | "));
    }
    out.push('\n');
}

/// A step's first row: at a fixed rate, the paced one.
fn first_row(run: &StepRun) -> Option<&Row> {
    run.bench.results.first()
}

/// Whether a step ran at a fixed rate (its throughput is the rate, not a result).
fn rate_limited(run: &StepRun) -> bool {
    run.bench.settings.get("rate").is_some_and(|r| !r.is_null())
}

fn targets(results: &Results, out: &mut String) {
    let mut t: Vec<(String, String, bool)> = Vec::new();
    let ok = |x: Option<f64>, test: &dyn Fn(f64) -> bool| x.is_some_and(test);
    let thr = |step: &str, peer: &str| figure(results, step, peer, None);
    let lat = |step: &str, peer: &str, q: fn(&Row) -> f64| {
        let run = results.run(step, peer)?.outcome().ok()?;
        run.headline().map(q)
    };
    let run = |step: &str, peer: &str| results.run(step, peer).and_then(|r| r.outcome().ok());

    if !results.peers.iter().any(|p| p.name == "cetera") {
        return; // the targets are cetera's
    }
    if let Some(etcd) = results.reference_etcd() {
        let e = results.label(etcd);
        if run("put-1", etcd).is_some() {
            let r = ratio(thr("put-1", "cetera"), thr("put-1", etcd));
            let (c50, e50) = (
                lat("put-1", "cetera", |r| r.latency_ms.p50),
                lat("put-1", etcd, |r| r.latency_ms.p50),
            );
            t.push((
                format!("put, 1 client: >= 1x {e}'s throughput and p50 <= its"),
                format!("{}x, p50 {} vs {} ms", fmt(r, 2), fmt(c50, 2), fmt(e50, 2)),
                ok(r, &|r| r >= 1.0) && c50.zip(e50).is_some_and(|(c, e)| c <= e),
            ));
        }
        for step in ["put-64", "txn-cas-64"] {
            if run(step, etcd).is_none() {
                continue;
            }
            let r = ratio(thr(step, "cetera"), thr(step, etcd));
            let cpu = ratio(
                run(step, "cetera").and_then(StepRun::cpu_ms_per_op),
                run(step, etcd).and_then(StepRun::cpu_ms_per_op),
            );
            t.push((
                format!("{step}: >= 2x {e}'s throughput or server CPU per op <= 0.5x"),
                format!("{}x throughput, {}x CPU per op", fmt(r, 2), fmt(cpu, 2)),
                ok(r, &|r| r >= 2.0) || ok(cpu, &|c| c <= 0.5),
            ));
        }
        for step in RATE_STEPS {
            let kb = |p: &str| run(step, p).and_then(StepRun::kib_per_op);
            if run(step, etcd).is_none() {
                continue;
            }
            let limit = if step == "rate-100" || step == "rate-400" {
                0.75
            } else {
                1.0
            };
            let r = ratio(kb("cetera"), kb(etcd));
            t.push((
                format!("{step}: KB written per put <= {limit}x {e}'s"),
                format!(
                    "{}x ({} vs {} KB)",
                    fmt(r, 2),
                    fmt(kb("cetera"), 2),
                    fmt(kb(etcd), 2)
                ),
                ok(r, &|r| r <= limit),
            ));
        }
        let hwm = |p: &str| {
            results
                .steps
                .iter()
                .filter(|r| r.server == p && r.step != "idle" && r.na.is_none())
                .filter_map(|r| r.sample.as_ref().map(|s| s.vmhwm_kb))
                .reduce(f64::max)
        };
        if let (Some(c), Some(x)) = (hwm("cetera"), hwm(etcd)) {
            t.push((
                format!("RSS: cetera's largest VmHWM <= 0.5x {e}'s"),
                format!(
                    "{} vs {} MB ({}x)",
                    fmt(Some(c / 1024.0), 1),
                    fmt(Some(x / 1024.0), 1),
                    fmt(Some(c / x), 2)
                ),
                c / x <= 0.5,
            ));
        }
    }

    if results.peers.iter().any(|p| p.name == "kine") {
        let mut behind = Vec::new();
        let mut judged = 0;
        for step in results.step_labels() {
            let (Some(k), Some(c)) = (run(step, "kine"), run(step, "cetera")) else {
                continue;
            };
            // At a fixed rate both do the rate: the latency of the paced row (the
            // writes, the first row; not a soak's watch events, which arrive at
            // the writes' pace) judges them.
            let paced = rate_limited(c);
            let row = |r| if paced { first_row(r) } else { r.headline() };
            let (Some(kr), Some(cr)) = (row(k), row(c)) else {
                continue;
            };
            judged += 1;
            let ahead = if paced {
                cr.latency_ms.p50 <= kr.latency_ms.p50
            } else {
                cr.per_sec >= kr.per_sec
            };
            if !ahead {
                behind.push(step);
            }
        }
        if judged > 0 {
            t.push((
                "ahead of kine in every step kine can do (throughput; p50 at a fixed rate)".into(),
                if behind.is_empty() {
                    format!("ahead in all {judged}")
                } else {
                    format!("behind in {}", behind.join(", "))
                },
                behind.is_empty(),
            ));
        }
        // On a database server, the database's log is the peer's own write cost: the
        // bytes its processes wrote include the server's background work.
        let (bytes, what): (fn(&StepRun) -> Option<f64>, &str) = if results.has_db_log() {
            (StepRun::db_log_kib_per_op, "database log KB")
        } else {
            (StepRun::kib_per_op, "KB written")
        };
        for step in RATE_STEPS {
            let kb = |p: &str| run(step, p).and_then(bytes);
            if let (Some(c), Some(k)) = (kb("cetera"), kb("kine")) {
                t.push((
                    format!("{step}: {what} per put <= kine's"),
                    format!("{} vs {} KB", fmt(Some(c), 2), fmt(Some(k), 2)),
                    c <= k,
                ));
            }
        }
        let db = |p: &str| {
            run("soak", p)
                .and_then(|r| r.sample.as_ref())
                .map(|s| s.db_bytes)
                .filter(|b| *b > 0.0)
        };
        if let (Some(c), Some(k)) = (db("cetera"), db("kine")) {
            t.push((
                "soak: database size at the end <= kine's".into(),
                format!(
                    "{} vs {} MB",
                    fmt(Some(c / 1048576.0), 1),
                    fmt(Some(k / 1048576.0), 1)
                ),
                c <= k,
            ));
        }
    }

    if t.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Targets (issue 49)\n");
    let _ = writeln!(out, "| target | measured | |\n|---|---|---|");
    for (what, value, met) in t {
        let _ = writeln!(
            out,
            "| {what} | {value} | {} |",
            if met { "met" } else { "**missed**" }
        );
    }
    out.push('\n');
}

fn notes(results: &Results, out: &mut String) {
    let mut notes = Vec::new();
    for run in &results.steps {
        let label = results.label(&run.server);
        if let Some(reason) = &run.na {
            notes.push(format!("- {} on {label}: n/a ({reason})", run.step));
        }
        for row in &run.bench.results {
            if row.errors > 0 && run.na.is_none() {
                notes.push(format!(
                    "- {} {} on {label}: {} errors of {}; first: {}",
                    run.step,
                    row.name,
                    row.errors,
                    row.count,
                    row.first_error.as_deref().unwrap_or("?")
                ));
            }
            let extra: Vec<String> = row
                .extra
                .iter()
                .filter(|(k, _)| *k != "compaction_windows")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if !extra.is_empty() {
                notes.push(format!(
                    "- {} {} on {label}: {}",
                    run.step,
                    row.name,
                    extra.join(", ")
                ));
            }
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>notes: steps a peer could not do, errors, scenario figures</summary>\n"
        );
        for n in notes {
            let _ = writeln!(out, "{n}");
        }
        let _ = writeln!(out, "\n</details>");
    }
}
