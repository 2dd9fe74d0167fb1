//! `cetera-bench report` and `cetera-bench chart` on a small results file
//! (tests/fixtures/results.json: four peers, a step kine could not do because it
//! exited, a RangeStream etcd 3.5.1 does not have, and a rate step): the figures the
//! report and the charts show are the ones the file holds, per operation where the
//! report divides.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results.json")
}

fn bench(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cetera-bench"))
        .args(args)
        .output()
        .expect("run cetera-bench");
    assert!(
        out.status.success(),
        "cetera-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn assert_has(text: &str, line: &str) {
    assert!(text.contains(line), "missing {line:?} in:\n{text}");
}

#[test]
fn report_shows_every_peer_and_why_one_could_not() {
    let report = bench(&["report".as_ref(), fixture().as_os_str()]);
    assert_has(
        &report,
        "- load average (1, 5, 15 min) at start: 3.10 2.50 2.00",
    );
    // Throughput, one column per peer, then cetera against etcd 3.7.3 and kine.
    assert_has(
        &report,
        "| step | row | unit | etcd 3.5.1 /s | etcd 3.7.3 /s | kine v0.17.5 /s | cetera /s | cetera / etcd 3.7.3 | cetera / kine |",
    );
    assert_has(
        &report,
        "| put-64 | put | op | 15,000 | 12,500 | n/a (server exited during the step: panic: runtime error: index out of range) | 20,000 | 1.60 | - |",
    );
    assert_has(
        &report,
        "| list-10k-stream | list-stream | list | n/a (list-stream: Unimplemented: unknown method RangeStream) | 50.0 | 20.0 | 100 | 2.00 | 5.00 |",
    );
    assert_has(
        &report,
        "| put-64 | put | 1.00 / 5.00 | 1.00 / 5.00 | n/a | 1.00 / 2.50 |",
    );
    // Server CPU per operation: CPU seconds over the step's operations.
    assert_has(
        &report,
        "| put-64 | 60000/50000/-/80000 | 0.0500 | 0.0500 | n/a | 0.0250 |",
    );
    // The rate step: KB written and fsyncs per put, database size.
    assert_has(
        &report,
        "| rate-100 | 100 | 100 | 100 | 100 | 9.00 | 8.00 | 12.00 | 2.00 | 1.000 | 1.000 | 2.000 | 0.500 | 20.0 | 20.0 | 30.0 | 6.0 |",
    );
    // Targets judged from the same figures.
    assert_has(
        &report,
        "| put-64: >= 2x etcd 3.7.3's throughput or server CPU per op <= 0.5x | 1.60x throughput, 0.500x CPU per op | met |",
    );
    assert_has(
        &report,
        "| rate-100: KB written per put <= 0.75x etcd 3.7.3's | 0.250x (2.00 vs 8.00 KB) | met |",
    );
    assert_has(
        &report,
        "| rate-100: KB written per put <= kine's | 2.00 vs 12.00 KB | met |",
    );
    assert_has(
        &report,
        "| ahead of kine in every step kine can do (throughput; p50 at a fixed rate) | ahead in all 2 | met |",
    );
    assert_has(
        &report,
        "| RSS: cetera's largest VmHWM <= 0.5x etcd 3.7.3's | 25.0 vs 80.0 MB (0.312x) | met |",
    );
}

#[test]
fn charts_are_written_with_the_results_values() {
    let dir = tempfile::tempdir().expect("temp dir");
    bench(&[
        "chart".as_ref(),
        fixture().as_os_str(),
        dir.path().as_os_str(),
    ]);
    let read = |file: &str| {
        std::fs::read_to_string(dir.path().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    };
    let labels = |svg: &str| -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>').map(|(_, rest)| rest))
            .filter_map(|t| {
                t.split_once("</text>")
                    .map(|(text, _)| text.trim().to_string())
            })
            .collect()
    };
    let throughput = labels(&read("throughput.svg"));
    for value in ["15.0k", "12.5k", "20.0k", "n/a", "50.0", "20.0", "100"] {
        assert!(
            throughput.contains(&value.to_string()),
            "{value} not in {throughput:?}"
        );
    }
    for server in ["etcd 3.5.1", "etcd 3.7.3", "kine v0.17.5", "cetera"] {
        assert!(
            throughput.contains(&server.to_string()),
            "legend lacks {server}"
        );
    }
    let p99 = labels(&read("p99.svg"));
    for value in ["5.00", "2.50", "40.0", "90.0"] {
        assert!(p99.contains(&value.to_string()), "{value} not in {p99:?}");
    }
    let cpu = labels(&read("cpu-per-op.svg"));
    for value in ["0.0500", "0.0250"] {
        assert!(cpu.contains(&value.to_string()), "{value} not in {cpu:?}");
    }
    let bytes = labels(&read("bytes-per-put.svg"));
    for value in ["9.00", "8.00", "12.0", "2.00"] {
        assert!(
            bytes.contains(&value.to_string()),
            "{value} not in {bytes:?}"
        );
    }
    let fsyncs = labels(&read("fsyncs-per-put.svg"));
    for value in ["1.00", "2.00", "0.500"] {
        assert!(
            fsyncs.contains(&value.to_string()),
            "{value} not in {fsyncs:?}"
        );
    }
}

/// On a database server (tests/fixtures/results-postgres.json: kine and cetera on one
/// PostgreSQL), the report shows the database's log per put beside the bytes its
/// processes wrote, and judges cetera against kine by the log; the soak, where the
/// peers shared the server at once, has no log figure.
#[test]
fn report_on_a_database_server_counts_its_log() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results-postgres.json");
    let report = bench(&["report".as_ref(), fixture.as_os_str()]);
    assert_has(
        &report,
        "| step | kine v0.17.5 puts/s | cetera puts/s | kine v0.17.5 KB/put | cetera KB/put | kine v0.17.5 DB log KB/put | cetera DB log KB/put | kine v0.17.5 fsyncs/put | cetera fsyncs/put | kine v0.17.5 db MB | cetera db MB |",
    );
    assert_has(
        &report,
        "| rate-100 | 100 | 100 | 4.00 | 6.00 | 7.00 | 1.80 | 2.000 | 1.500 | 0.0 | 0.0 |",
    );
    assert_has(
        &report,
        "| rate-100: database log KB per put <= kine's | 1.80 vs 7.00 KB | met |",
    );
    assert_has(&report, "| soak | 3.000 | 3.000 | 50.00 | 50.00 | - | - |");
    assert_has(&report, "DB log: the bytes the database server appended");
}
