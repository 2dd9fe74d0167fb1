//! Running an etcdctl binary against a server, and making its output
//! comparable between servers.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `etcdctl --endpoints <endpoint> <args>` with the v3 API and a short dial timeout.
fn command(etcdctl: &Path, endpoint: &str, args: &[&str]) -> Command {
    let mut command = Command::new(etcdctl);
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--dial-timeout=5s")
        .args(args);
    command
}

/// Runs `etcdctl --endpoints <endpoint> <args>` with the v3 API and a short dial timeout.
pub fn run_etcdctl(etcdctl: &Path, endpoint: &str, args: &[&str]) -> Output {
    command(etcdctl, endpoint, args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", etcdctl.display()))
}

/// Like [`run_etcdctl`], with `stdin` written to etcdctl's stdin and the pipe closed (an
/// empty `stdin` makes a command that reads its value from stdin end, not wait on a
/// terminal).
pub fn run_etcdctl_with_stdin(
    etcdctl: &Path,
    endpoint: &str,
    args: &[&str],
    stdin: &str,
) -> Output {
    let mut child = command(etcdctl, endpoint, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", etcdctl.display()));
    let mut pipe = child.stdin.take().expect("stdin is piped");
    // etcdctl may exit without reading stdin; a broken pipe is not an error here.
    let _ = pipe.write_all(stdin.as_bytes());
    drop(pipe);
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait for {}: {e}", etcdctl.display()))
}

/// etcdctl output made comparable between servers: etcdctl's own JSON log lines (retry
/// warnings with timestamps and addresses) dropped, and the cluster id, member id and
/// raft term zeroed in `-w json` and `-w fields` output.
pub fn normalize_etcdctl(text: &str) -> String {
    let mut out: String = text
        .lines()
        .filter(|line| !line.starts_with("{\"level\":"))
        .map(|line| format!("{line}\n"))
        .collect();
    for field in [
        "\"cluster_id\":",
        "\"member_id\":",
        "\"raft_term\":",
        "\"ClusterID\" : ",
        "\"MemberID\" : ",
        "\"RaftTerm\" : ",
    ] {
        let mut result = String::new();
        let mut rest = out.as_str();
        while let Some(at) = rest.find(field) {
            let (before, after) = rest.split_at(at + field.len());
            result.push_str(before);
            result.push('0');
            rest = after.trim_start_matches(|c: char| c.is_ascii_digit());
        }
        result.push_str(rest);
        out = result;
    }
    out
}
