//! The cetera server under test: the binary of this build as a child process
//! on a fresh database of the backend CETERA_TEST_BACKEND names (or, with
//! CETERA_TEST_CLUSTER, a follower of a 3-member cluster), restarted, killed
//! or signalled by the tests.

use std::path::Path;
use std::time::Duration;

use tempfile::TempDir;

use super::client::{ClientTls, local_addr, local_url};
use super::process::{PORT_RETRIES, Proc, free_port};
use super::{cluster, datastore};

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

/// The cetera binary of this build.
pub fn cetera_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cetera"))
}

/// The command line of a server listening for clients on `listen` (`HOST:PORT`) and
/// storing its data at `endpoint`; its other flags follow.
pub fn serve_args(listen: &str, endpoint: &str) -> Vec<String> {
    [
        "--listen-address".to_string(),
        listen.to_string(),
        "--endpoint".to_string(),
        endpoint.to_string(),
    ]
    .into()
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
            let mut args = serve_args(&local_addr(self.port), &self.endpoint);
            args.extend(self.extra_args.iter().cloned());
            self.runs += 1;
            let log = self.log_path();
            let (port, tls) = (self.port, self.tls.as_ref());
            if let Some(proc) =
                Proc::spawn_ready(cetera_bin(), &args, log, port, "cetera", tls, attempt).await
            {
                self.proc = Some(proc);
                return;
            }
            new_port = true;
        }
    }

    /// Starts cetera on `endpoint` expecting it to refuse to start: returns its
    /// exit status and output once it exits; panics if it serves instead.
    pub async fn refused_on(endpoint: &str) -> (std::process::ExitStatus, String) {
        Cetera::refused(endpoint, &[]).await
    }

    /// Starts cetera on `endpoint` with `extra_args`, expecting it to refuse
    /// to start, as [`Cetera::refused_on`].
    pub async fn refused_on_with(
        endpoint: &str,
        extra_args: &[&str],
    ) -> (std::process::ExitStatus, String) {
        Cetera::refused(endpoint, extra_args).await
    }

    /// Starts cetera with `extra_args` on a fresh SQLite file, expecting it to
    /// refuse to start, as [`Cetera::refused_on`].
    pub async fn refused_with(extra_args: &[&str]) -> (std::process::ExitStatus, String) {
        let dir = tempfile::tempdir().expect("create tempdir");
        let endpoint = dir.path().join("state.db").display().to_string();
        Cetera::refused(&endpoint, extra_args).await
    }

    async fn refused(endpoint: &str, extra_args: &[&str]) -> (std::process::ExitStatus, String) {
        let dir = tempfile::tempdir().expect("create tempdir");
        let port = free_port();
        let mut args = serve_args(&local_addr(port), endpoint);
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let log = dir.path().join("cetera.log");
        let mut proc = Proc::spawn(cetera_bin(), &args, log);
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
        local_url(self.port)
    }

    /// `127.0.0.1:PORT`, the form etcdctl's `--endpoints` takes.
    pub fn addr(&self) -> String {
        local_addr(self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (e.g. to read its memory use from /proc), while running.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }

    /// The `--endpoint` of the datastore the server runs on.
    pub fn datastore_endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Everything the server printed so far (current run only).
    pub fn log(&self) -> String {
        self.proc.as_ref().map(Proc::log_text).unwrap_or_default()
    }

    /// Everything the last run printed, also once it has stopped.
    pub fn last_log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The log file of the last run.
    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join(format!("cetera-{}.log", self.runs))
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
