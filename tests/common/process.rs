//! Server processes of the tests: a free port, a child process with its output
//! in a log file, waiting until it answers gRPC (a KV Range or a Maintenance
//! Status), signals, and the panic that shows a server's output when it does
//! not start.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::{
    RangeRequest, StatusRequest, kv_client::KvClient, maintenance_client::MaintenanceClient,
};

use super::client::ClientTls;

/// How long a server may take from spawn to answering its first request.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a server is restarted on a fresh port when the port we picked was taken by
/// someone else between `free_port` and the server's bind (tests run in parallel).
pub const PORT_RETRIES: usize = 3;

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

/// A child process with its combined stdout/stderr going to a log file.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `program` with `args`, its output going to `log`. The cetera
    /// binary gets the environment the oracle asks for
    /// ([`cetera_env`](super::reference_binaries::cetera_env)).
    pub fn spawn(program: &Path, args: &[String], log: PathBuf) -> Proc {
        let out = File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log file handle");
        let env = if program == super::cetera_server::cetera_bin() {
            super::reference_binaries::cetera_env()
        } else {
            Vec::new()
        };
        let child = Command::new(program)
            .args(args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Proc { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits up to `timeout` for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.signal("-TERM", timeout)
    }

    /// Sends `signal` (as `kill` spells it, e.g. `-INT`), then waits up to
    /// `timeout` for the exit status.
    pub fn signal(&mut self, signal: &str, timeout: Duration) -> Option<std::process::ExitStatus> {
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
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Spawns `program` and waits until it serves on `port` (see [`Proc::wait_ready`]).
    /// `None` when it exited because the port was taken and `attempt` (counted from 1)
    /// leaves another of [`PORT_RETRIES`]; otherwise a failure panics with its output.
    pub async fn spawn_ready(
        program: &Path,
        args: &[String],
        log: PathBuf,
        port: u16,
        name: &str,
        tls: Option<&ClientTls>,
        attempt: usize,
    ) -> Option<Proc> {
        let mut proc = Proc::spawn(program, args, log);
        match proc.wait_ready(port, name, tls).await {
            Ok(()) => Some(proc),
            Err((in_use, msg)) => {
                proc.kill();
                if !(in_use && attempt < PORT_RETRIES) {
                    fail_startup(&format!("{msg} (args: {args:?})"), &proc.log);
                }
                None
            }
        }
    }

    /// Waits until `127.0.0.1:port` accepts and a KV Range or Maintenance Status call
    /// succeeds. Err carries a description; `Err(true)` marks "exited, port was in use".
    pub async fn wait_ready(
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

pub fn fail_startup(msg: &str, log: &Path) -> ! {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    panic!(
        "{msg}\n----- output of the server ({}) -----\n{text}\n----- end of server output -----",
        log.display()
    );
}
