//! A replicated cetera cluster for tests: N members on one SQLite file each,
//! the first founding the cluster (`--cluster-init`, or as a single server
//! that MemberAdd turns into the founder: `start_single`), the others
//! joining it.
//! Member i serves peers on 127.0.0.(i+2) and sends from that address (never
//! 127.0.0.1, where every test server takes its client port, so that a peer
//! port is never taken by another test's server), and
//! (unless started direct) other members reach it through a `FaultProxy`, so
//! that a test can cut one member off from the rest (`isolate`) and heal the
//! cut.
//!
//! With env `CETERA_TEST_CLUSTER=1`, `Cetera::start_with` gives every test a
//! follower of a 3-member cluster instead of a single server: the
//! differential suites run so against replicated mode. With env
//! `CETERA_KEEP_CLUSTER_LOGS` set, each cluster's folder (the members'
//! datastores and logs) is kept and its path printed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cetera::proto::etcdserverpb::StatusRequest;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use tempfile::TempDir;

use super::cetera_server::{cetera_bin, serve_args};
use super::client::local_addr;
use super::fault_proxy::FaultProxy;
use super::process::{PORT_RETRIES, Proc, free_port};

/// The cluster token of test clusters.
pub const TOKEN: &str = "test-cluster-token";

/// One member.
pub struct Member {
    proc: Option<Proc>,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    peer: SocketAddr,
    /// The peer URL it advertises.
    pub peer_url: String,
    /// What other members reach it through, when the cluster can be cut.
    proxy: Option<FaultProxy>,
    dir: PathBuf,
    datastore: PathBuf,
    args: Vec<String>,
    runs: usize,
}

impl Member {
    /// `127.0.0.1:PORT` of its etcd API.
    pub fn addr(&self) -> String {
        local_addr(self.port)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Its SQLite datastore.
    pub fn datastore(&self) -> PathBuf {
        self.datastore.clone()
    }

    /// Whether its process runs.
    pub fn is_running(&self) -> bool {
        self.proc.is_some()
    }

    /// What it printed in its current run.
    pub fn log(&self) -> String {
        self.proc.as_ref().map(Proc::log_text).unwrap_or_default()
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
    }

    /// SIGTERM, waiting for the exit.
    pub fn stop(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.terminate(Duration::from_secs(10));
            proc.kill();
        }
    }

    /// Spawns the member and waits until it serves; moves to another client
    /// port if the chosen one turns out to be taken (tests run in parallel).
    async fn launch(&mut self) {
        for attempt in 1..=PORT_RETRIES {
            let mut args = serve_args(&self.addr(), &self.datastore().display().to_string());
            args.extend(self.args.iter().cloned());
            self.runs += 1;
            let log = self.dir.join(format!("cetera-{}.log", self.runs));
            let (port, name) = (self.port, "cetera member");
            if let Some(proc) =
                Proc::spawn_ready(cetera_bin(), &args, log, port, name, None, attempt).await
            {
                self.proc = Some(proc);
                return;
            }
            self.port = free_port();
        }
    }

    /// Starts it for the first time, expecting it may fail: the text of its
    /// log when it exits before it serves.
    async fn try_launch(&mut self) -> Result<(), String> {
        let mut args = serve_args(&self.addr(), &self.datastore().display().to_string());
        args.extend(self.args.iter().cloned());
        self.runs += 1;
        let log = self.dir.join(format!("cetera-{}.log", self.runs));
        let mut proc = Proc::spawn(cetera_bin(), &args, log);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match proc.wait_ready(self.port, "cetera member", None).await {
                Ok(()) => {
                    self.proc = Some(proc);
                    return Ok(());
                }
                // Not ready yet (a join takes its time): wait on, until it
                // serves or exits.
                Err((_, message)) if !message.contains("exited") && Instant::now() < deadline => {}
                Err(_) => {
                    proc.kill();
                    return Err(proc.log_text());
                }
            }
        }
    }

    /// Starts it again with the flags it was first started with.
    pub async fn restart(&mut self) {
        self.kill();
        self.launch().await;
    }

    /// Starts it again as a single node on its datastore, without cluster flags.
    pub async fn restart_alone(&mut self) {
        self.kill();
        self.args.clear();
        self.launch().await;
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Members of one cluster; killed when dropped.
pub struct Cluster {
    /// The members, founder first.
    pub members: Vec<Member>,
    founder_url: Option<String>,
    /// Whether members reach each other through fault proxies.
    proxied: bool,
    /// Flags every member gets.
    extra_args: Vec<String>,
    /// Where members keep their data, if not beside their logs.
    data_root: Option<PathBuf>,
    /// The token joining members give, if not `TOKEN` (see `use_token`).
    token: Option<String>,
    /// Whether the first member starts as a single server, without cluster
    /// flags (`start_single`).
    single_founder: bool,
    _dir: TempDir,
}

impl Cluster {
    /// Starts an `n`-member cluster that `isolate` can cut, and waits until
    /// every member serves. The proxies run on the caller's runtime, which
    /// must keep running (a multi-threaded one, or a test that never blocks).
    pub async fn start(n: usize) -> Cluster {
        Cluster::start_from(n, None).await
    }

    /// Starts an `n`-member cluster whose members reach each other directly
    /// (no proxies, so the test's runtime may block), each with `extra_args`.
    pub async fn start_direct(n: usize, extra_args: &[&str]) -> Cluster {
        Cluster::launch(n, None, false, extra_args, None).await
    }

    /// Starts an `n`-member cluster as `start_direct` does, each member's
    /// data (store and Raft log) in `data_root/member-I`, a file system the
    /// test controls; their logs stay in a temporary directory.
    pub async fn start_direct_on(n: usize, data_root: &Path) -> Cluster {
        Cluster::launch(n, None, false, &[], Some(data_root)).await
    }

    /// Starts an `n`-member cluster whose founder converts the single-node
    /// SQLite datastore `founder_data` in place.
    pub async fn start_from(n: usize, founder_data: Option<&Path>) -> Cluster {
        Cluster::launch(n, founder_data, true, &[], None).await
    }

    async fn launch(
        n: usize,
        founder_data: Option<&Path>,
        proxied: bool,
        extra_args: &[&str],
        data_root: Option<&Path>,
    ) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("cetera-cluster-")
            .tempdir()
            .expect("create tempdir");
        let mut dir = dir;
        if std::env::var_os("CETERA_KEEP_CLUSTER_LOGS").is_some() {
            eprintln!("cluster kept in {}", dir.path().display());
            dir.disable_cleanup(true);
        }
        let mut cluster = Cluster {
            members: Vec::new(),
            founder_url: None,
            proxied,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            data_root: data_root.map(Path::to_path_buf),
            token: None,
            single_founder: false,
            _dir: dir,
        };
        for i in 0..n {
            let datastore = founder_data.filter(|_| i == 0);
            let member = cluster.plan_member_on(datastore);
            cluster.start_member(member).await;
        }
        cluster
    }

    /// Starts a single server, with neither cluster flags nor a token, that
    /// MemberAdd turns into a cluster's founder; later members (`plan_member`)
    /// join it with the token it made up (`use_token`). Members reach each
    /// other directly.
    pub async fn start_single() -> Cluster {
        let mut cluster = Cluster::launch(0, None, false, &[], None).await;
        cluster.single_founder = true;
        let founder = cluster.plan_member();
        cluster.start_member(founder).await;
        cluster
    }

    /// Joining members not started yet give `token` (the one a single
    /// server made up when MemberAdd founded the cluster).
    pub fn use_token(&mut self, token: &str) {
        self.token = Some(token.to_string());
        for member in self.members.iter_mut().filter(|m| m.runs == 0) {
            if let Some(at) = member.args.iter().position(|a| a == "--token") {
                member.args[at + 1] = token.to_string();
            }
        }
    }

    /// Adds a member that is not started yet and returns its index: it
    /// founds the cluster if it is the first, else joins it. Its peer URL is
    /// known from now on, for MemberAdd.
    pub fn plan_member(&mut self) -> usize {
        self.plan_member_on(None)
    }

    fn plan_member_on(&mut self, datastore: Option<&Path>) -> usize {
        let i = self.members.len();
        let member_dir = self._dir.path().join(format!("member-{i}"));
        std::fs::create_dir_all(&member_dir).expect("member dir");
        let data_dir = match &self.data_root {
            Some(root) => root.join(format!("member-{i}")),
            None => member_dir.clone(),
        };
        std::fs::create_dir_all(&data_dir).expect("member data dir");
        let datastore = datastore.map_or_else(|| data_dir.join("state.db"), Path::to_path_buf);
        let ip = member_ip(i);
        let peer = SocketAddr::new(ip, free_port_on(ip));
        let proxy = self.proxied.then(|| FaultProxy::start(peer));
        let scheme = if self.extra_args.iter().any(|a| a == "--peer-cert-file") {
            "https"
        } else {
            "http"
        };
        let peer_url = match &proxy {
            Some(proxy) => format!("{scheme}://{}", proxy.addr()),
            None => format!("{scheme}://{peer}"),
        };
        let mut args = vec![
            "--name".to_string(),
            format!("member-{i}"),
            "--peer-listen-address".to_string(),
            peer.to_string(),
            "--advertise-peer-url".to_string(),
            peer_url.clone(),
        ];
        args.extend(self.extra_args.iter().cloned());
        match &self.founder_url {
            None if self.single_founder => self.founder_url = Some(peer_url.clone()),
            None => {
                args.extend(["--token".to_string(), TOKEN.to_string()]);
                args.push("--cluster-init".to_string());
                self.founder_url = Some(peer_url.clone());
            }
            Some(founder) => {
                let token = self.token.as_deref().unwrap_or(TOKEN);
                args.extend(["--token".to_string(), token.to_string()]);
                args.push("--join".to_string());
                args.push(founder.clone());
            }
        }
        self.members.push(Member {
            proc: None,
            port: free_port(),
            peer,
            peer_url,
            proxy,
            dir: member_dir,
            datastore,
            args,
            runs: 0,
        });
        i
    }

    /// Starts member `i` for the first time and waits until it serves.
    pub async fn start_member(&mut self, i: usize) {
        self.members[i].launch().await;
    }

    /// Starts member `i` for the first time: Err with its log when it exits
    /// before it serves (a join the cluster refused, say).
    pub async fn try_start_member(&mut self, i: usize) -> Result<(), String> {
        self.members[i].try_launch().await
    }

    /// Member `i`'s id, as its Status header gives it.
    pub async fn member_id(&self, i: usize) -> u64 {
        let endpoint = self.members[i].endpoint();
        status(&endpoint)
            .await
            .and_then(|s| s.header)
            .unwrap_or_else(|| panic!("no Status from member {i}"))
            .member_id
    }

    /// Client endpoints of the running members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.is_running())
            .map(Member::endpoint)
            .collect()
    }

    /// The member every running member (but those in `except`) names as
    /// leader, once they agree; panics after `timeout`.
    pub async fn leader(&self, except: &[usize], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.agreed_leader(except).await {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "the members agreed on no leader within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn agreed_leader(&self, except: &[usize]) -> Option<usize> {
        let mut named = None;
        let mut ids = Vec::new();
        for (i, member) in self.members.iter().enumerate() {
            if !member.is_running() || except.contains(&i) {
                continue;
            }
            let status = status(&member.endpoint()).await?;
            ids.push((i, status.header.map_or(0, |h| h.member_id)));
            if status.leader == 0 || named.is_some_and(|l| l != status.leader) {
                return None;
            }
            named = Some(status.leader);
        }
        let leader = named?;
        ids.iter().find(|(_, id)| *id == leader).map(|(i, _)| *i)
    }

    /// Cuts member `i` off from the others, both ways (its client port stays up).
    pub fn isolate(&self, i: usize) {
        self.proxy(i).cut();
        for j in (0..self.members.len()).filter(|j| *j != i) {
            self.proxy(j).block(member_ip(i));
        }
    }

    /// Cuts the other members' way to member `i` (its own way to them stays).
    pub fn cut_inbound(&self, i: usize) {
        self.proxy(i).cut();
    }

    /// Undoes `isolate(i)`.
    pub fn heal(&self, i: usize) {
        self.proxy(i).heal();
        for j in (0..self.members.len()).filter(|j| *j != i) {
            self.proxy(j).unblock(member_ip(i));
        }
    }

    fn proxy(&self, i: usize) -> &FaultProxy {
        self.members[i]
            .proxy
            .as_ref()
            .expect("a cluster started with proxies (Cluster::start)")
    }
}

/// The address member `i` serves peers on and sends from.
fn member_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, i as u8 + 2))
}

/// A port on `ip` that nothing holds now, from below the kernel's
/// ephemeral range (32768 on): the member binds it later, and a port the
/// kernel hands out (for `bind(0)`, for an outgoing connection) can be taken
/// by another test's socket meanwhile, while a member's peer address cannot
/// move once announced.
fn free_port_on(ip: IpAddr) -> u16 {
    loop {
        let port = rand::random_range(20_000..32_768);
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
}

/// Maintenance Status of the server at `endpoint`, if it answers within 1 s.
pub async fn status(endpoint: &str) -> Option<cetera::proto::etcdserverpb::StatusResponse> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(1))
        .connect()
        .await
        .ok()?;
    MaintenanceClient::new(channel)
        .status(StatusRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}
