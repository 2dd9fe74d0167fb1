//! A real etcd 3.5.1 cluster of N members on 127.0.0.1, the reference for
//! differential tests of the Cluster and Maintenance calls that only mean
//! something with several members (MemberAdd/Remove/Update/Promote, MoveLeader).

use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::StatusRequest;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use tempfile::TempDir;

use super::client::{channel, local_url};
use super::etcd_server::etcd_member_args;
use super::process::{PORT_RETRIES, Proc, fail_startup, free_port};
use super::reference_binaries::etcd_bin;

/// How long `leader` waits for the members to agree on a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// etcd refuses MemberAdd (Unavailable "etcdserver: unhealthy cluster") until
/// every voter has been connected to the others for its HealthInterval, 5 s.
const HEALTH_INTERVAL: Duration = Duration::from_secs(5);

/// N real etcd members founding one cluster; dropping it kills them all.
pub struct EtcdCluster {
    procs: Vec<Proc>,
    client_ports: Vec<u16>,
    /// When all members answered.
    ready_at: Instant,
    dir: TempDir,
}

impl EtcdCluster {
    /// Starts an `n`-member cluster (members `m0`..), all at once since each
    /// waits for the others to come up. `None` (after a loud warning) when the
    /// binary is not installed and not in CI.
    pub async fn start(n: usize) -> Option<EtcdCluster> {
        assert!(n > 0, "a cluster needs a member");
        let bin = etcd_bin()?;
        let dir = tempfile::Builder::new()
            .prefix("etcd-cluster-test-")
            .tempdir()
            .expect("create tempdir");
        for attempt in 1..=PORT_RETRIES {
            let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
            let peer_url = |i: usize| local_url(ports[i].1);
            let initial_cluster = (0..n)
                .map(|i| format!("m{i}={}", peer_url(i)))
                .collect::<Vec<_>>()
                .join(",");
            let mut procs: Vec<Proc> = (0..n)
                .map(|i| {
                    let client_url = local_url(ports[i].0);
                    let data_dir = dir.path().join(format!("data-{attempt}-m{i}"));
                    let args = etcd_member_args(
                        &format!("m{i}"),
                        &data_dir,
                        &client_url,
                        &peer_url(i),
                        &initial_cluster,
                    );
                    let log = dir.path().join(format!("etcd-{attempt}-m{i}.log"));
                    Proc::spawn(&bin, &args, log)
                })
                .collect();
            // All members are running by now, so waiting for them one after the
            // other costs no more than waiting for the slowest.
            let mut failure = None;
            for (i, proc) in procs.iter_mut().enumerate() {
                if let Err((in_use, msg)) = proc
                    .wait_ready(ports[i].0, &format!("etcd m{i}"), None)
                    .await
                {
                    failure = Some((i, in_use, msg));
                    break;
                }
            }
            let Some((i, in_use, msg)) = failure else {
                return Some(EtcdCluster {
                    procs,
                    client_ports: ports.iter().map(|p| p.0).collect(),
                    ready_at: Instant::now(),
                    dir,
                });
            };
            for proc in &mut procs {
                proc.kill();
            }
            if !(in_use && attempt < PORT_RETRIES) {
                fail_startup(
                    &format!("{msg} (initial cluster {initial_cluster})"),
                    &procs[i].log,
                );
            }
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// Stops member `i`'s process (SIGSTOP): the others hear nothing from it
    /// and its connections stay open, as across a partition.
    pub fn pause(&mut self, i: usize) {
        self.procs[i].signal("-STOP", Duration::ZERO);
    }

    /// Lets member `i`'s process run again (SIGCONT).
    pub fn resume(&mut self, i: usize) {
        self.procs[i].signal("-CONT", Duration::ZERO);
    }

    /// The members' gRPC endpoints, `http://127.0.0.1:PORT`, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.client_ports.iter().copied().map(local_url).collect()
    }

    /// The index of the member whose Status says it leads (waiting up to 10 s
    /// for one to).
    pub async fn leader(&self) -> usize {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        let mut last = String::from("no answer yet");
        loop {
            for (i, endpoint) in self.endpoints().iter().enumerate() {
                let status = MaintenanceClient::new(channel(endpoint).await)
                    .status(StatusRequest {})
                    .await;
                match status {
                    Ok(status) => {
                        let status = status.into_inner();
                        let id = status.header.as_ref().map_or(0, |h| h.member_id);
                        if status.leader != 0 && status.leader == id {
                            return i;
                        }
                        last = format!("{endpoint}: leader {:x}", status.leader);
                    }
                    Err(e) => last = format!("{endpoint}: {e}"),
                }
            }
            if Instant::now() > deadline {
                panic!("no leader after {LEADER_TIMEOUT:?} (last: {last})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the members have been connected long enough for etcd to
    /// accept MemberAdd (its strict reconfiguration check): the health interval
    /// after they all answered, plus a second for peers that connected later.
    pub async fn wait_reconfigurable(&self) {
        let since = self.ready_at + HEALTH_INTERVAL + Duration::from_secs(1);
        tokio::time::sleep_until(since.into()).await;
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for proc in &mut self.procs {
            proc.kill();
        }
    }
}
