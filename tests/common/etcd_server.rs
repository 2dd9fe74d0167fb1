//! The reference server: real etcd (the oracle, 3.7.3 or 3.5.1, see
//! `reference_binaries::oracle`), a single member on 127.0.0.1 with its data
//! in a tempdir.

use std::path::Path;

use tempfile::TempDir;

use super::client::{ClientTls, local_addr, local_url};
use super::process::{PORT_RETRIES, Proc, STARTUP_TIMEOUT, free_port};
use super::reference_binaries::{etcd_bin, oracle};

/// The oracle's flag for the interval of watch progress notifications:
/// 3.6 and later removed 3.5's `--experimental-` name.
pub fn progress_notify_interval_flag() -> &'static str {
    if oracle().is_36_or_later() {
        "--watch-progress-notify-interval"
    } else {
        "--experimental-watch-progress-notify-interval"
    }
}

/// The command line of one real etcd member: its name, data dir, client and peer URLs
/// (listened on and advertised) and the `--initial-cluster` it founds with.
pub fn etcd_member_args(
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

/// Real etcd (the oracle), a single member on 127.0.0.1 with its data in a tempdir.
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

    /// Starts etcd on a data dir that `etcdutl snapshot restore` made from
    /// `snapshot` (for the member's own peer URL, as an operator restores).
    pub async fn start_restored(snapshot: &Path) -> Option<Etcd> {
        let etcdutl = super::reference_binaries::etcdutl()?;
        let restore = |data_dir: &Path, peer_url: &str| {
            let out = std::process::Command::new(&etcdutl)
                .arg("snapshot")
                .arg("restore")
                .arg(snapshot)
                .arg("--data-dir")
                .arg(data_dir)
                .args([
                    "--name",
                    "default",
                    "--initial-advertise-peer-urls",
                    peer_url,
                ])
                .arg("--initial-cluster")
                .arg(format!("default={peer_url}"))
                .output()
                .expect("run etcdutl snapshot restore");
            assert!(
                out.status.success(),
                "etcdutl snapshot restore failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        Etcd::launch_prepared(&[], None, &restore).await
    }

    /// Starts etcd with `extra_args` expecting it to refuse to start: its
    /// output once it has exited, and whether its data dir was created.
    /// Panics if it is still running after the startup timeout.
    pub async fn refused_with(extra_args: &[&str]) -> Option<(String, bool)> {
        let bin = etcd_bin()?;
        let dir = tempfile::tempdir().expect("create tempdir");
        let (client, peer) = (local_url(free_port()), local_url(free_port()));
        let data_dir = dir.path().join("data");
        let mut args = etcd_member_args(
            "default",
            &data_dir,
            &client,
            &peer,
            &format!("default={peer}"),
        );
        args.extend(extra_args.iter().map(|s| s.to_string()));
        let mut proc = Proc::spawn(&bin, &args, dir.path().join("etcd.log"));
        let deadline = std::time::Instant::now() + STARTUP_TIMEOUT;
        while proc.child.try_wait().expect("wait for etcd").is_none() {
            if std::time::Instant::now() > deadline {
                proc.kill();
                panic!("etcd started with {extra_args:?}:\n{}", proc.log_text());
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Some((proc.log_text(), data_dir.exists()))
    }

    async fn launch(extra_args: &[&str], tls: Option<&ClientTls>) -> Option<Etcd> {
        Etcd::launch_prepared(extra_args, tls, &|_, _| {}).await
    }

    /// Starts etcd after `prepare(data dir, peer URL)` has run.
    async fn launch_prepared(
        extra_args: &[&str],
        tls: Option<&ClientTls>,
        prepare: &dyn Fn(&Path, &str),
    ) -> Option<Etcd> {
        let bin = etcd_bin()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let dir = tempfile::Builder::new()
            .prefix("etcd-test-")
            .tempdir()
            .expect("create tempdir");
        for attempt in 1..=PORT_RETRIES {
            let (client, peer) = (free_port(), free_port());
            let client_url = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = local_url(peer);
            let data_dir = dir.path().join(format!("data-{attempt}"));
            let mut args = etcd_member_args(
                "default",
                &data_dir,
                &client_url,
                &peer_url,
                &format!("default={peer_url}"),
            );
            args.extend(extra_args.iter().map(|s| s.to_string()));
            prepare(&data_dir, &peer_url);
            let log = dir.path().join(format!("etcd-{attempt}.log"));
            if let Some(proc) =
                Proc::spawn_ready(&bin, &args, log, client, "etcd", tls, attempt).await
            {
                return Some(Etcd {
                    proc,
                    client_port: client,
                    dir,
                });
            }
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// gRPC endpoint URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        local_url(self.client_port)
    }

    /// `127.0.0.1:PORT`, the form etcdctl's `--endpoints` takes.
    pub fn addr(&self) -> String {
        local_addr(self.client_port)
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
