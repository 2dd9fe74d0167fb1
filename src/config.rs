//! Command-line flags; each can also be set with a CETERA_* environment
//! variable, and etcd's flags, `ETCD_*` variables and `--config-file` YAML
//! are read as etcd reads them (`etcd` below).

pub mod etcd;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::backend::datastore::DatastoreTls;

/// Default SQLite file, as kine and k3s use.
pub const DEFAULT_ENDPOINT: &str = "sqlite://./db/state.db";

/// The major and minor number of an etcd version such as `3.7.3` or
/// `v3.6.0-rc.1` (0 for a part that is not a number).
pub fn major_minor(version: &str) -> (u64, u64) {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|part| part.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The etcd version cetera reports unless told otherwise: 3.7.3, the release
/// whose API it serves (README, "The reported version").
pub const DEFAULT_EMULATED_VERSION: &str = "3.7.3";

/// cetera: the etcd v3 API on SQLite, PostgreSQL or MySQL.
#[derive(Parser, Debug, Clone)]
#[command(name = "cetera", version, about, long_about = None)]
pub struct Config {
    /// Address the etcd gRPC API listens on.
    #[arg(long, env = "CETERA_LISTEN_ADDRESS", default_value = "127.0.0.1:2379")]
    pub listen_address: SocketAddr,

    /// Where the data lives: `sqlite://PATH` or a bare file path (the folder is
    /// created), `postgres://USER:PASSWORD@HOST:PORT/DB` (or postgresql://),
    /// or `mysql://USER:PASSWORD@HOST:PORT/DB`. k3s's `--datastore-endpoint`
    /// name is accepted too.
    // Not global: `cetera migrate` names its datastores with --from and --to;
    // `cetera restore` has its own copy of the flag.
    #[arg(
        long,
        visible_alias = "datastore-endpoint",
        env = "CETERA_ENDPOINT",
        default_value = DEFAULT_ENDPOINT
    )]
    pub endpoint: String,

    /// CA certificate that the database server's certificate must chain to
    /// (Postgres/MySQL over TLS; k3s's name).
    #[arg(long, env = "CETERA_DATASTORE_CAFILE", global = true)]
    pub datastore_cafile: Option<PathBuf>,

    /// Client certificate presented to the database server.
    #[arg(long, env = "CETERA_DATASTORE_CERTFILE", global = true)]
    pub datastore_certfile: Option<PathBuf>,

    /// Key of --datastore-certfile.
    #[arg(long, env = "CETERA_DATASTORE_KEYFILE", global = true)]
    pub datastore_keyfile: Option<PathBuf>,

    /// Client URLs this member reports in MemberList (comma-separated).
    /// Default: http:// and the listen address, with 127.0.0.1 for 0.0.0.0.
    #[arg(long, env = "CETERA_ADVERTISE_CLIENT_URLS", value_delimiter = ',')]
    pub advertise_client_urls: Vec<String>,

    /// Member name reported in MemberList.
    #[arg(long, env = "CETERA_NAME", default_value = "default")]
    pub name: String,

    /// etcd's YAML configuration file (etcd's key names; the TLS flags in
    /// `client-transport-security` and `peer-transport-security`). When
    /// given, the command line's other flags and ETCD_* variables are
    /// ignored, as etcd ignores them.
    #[arg(long, env = "CETERA_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,

    /// etcd's data directory: without --endpoint, the SQLite database is
    /// DIR/cetera/state.db.
    #[arg(long, env = "CETERA_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// etcd's peer URLs to listen on (comma-separated): the first one's
    /// address is --peer-listen-address (replicated mode only).
    #[arg(long, value_delimiter = ',')]
    pub listen_peer_urls: Vec<String>,

    /// etcd's peer URLs to advertise (comma-separated): the first one is
    /// --advertise-peer-url (replicated mode only).
    #[arg(long, value_delimiter = ',')]
    pub initial_advertise_peer_urls: Vec<String>,

    /// etcd's log level: debug, info, warn, error, panic or fatal (the last
    /// two log errors). Without it, RUST_LOG's filter, or info.
    #[arg(long, value_parser = ["debug", "info", "warn", "error", "dpanic", "panic", "fatal"])]
    pub log_level: Option<String>,

    /// etcd's log outputs (comma-separated): stderr (etcd's `default`),
    /// stdout, or file paths, appended to.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub log_outputs: Vec<String>,

    /// etcd's logger: only `zap`, as etcd 3.5 (cetera's line format is
    /// --log-format).
    #[arg(long, default_value = "zap")]
    pub logger: String,

    /// Largest write request accepted, in bytes (etcd's default: 1.5 MiB).
    #[arg(long, env = "CETERA_MAX_REQUEST_BYTES", default_value_t = 1_572_864)]
    pub max_request_bytes: usize,

    /// Most operations in one Txn: compares, or ops in either branch.
    #[arg(long, env = "CETERA_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: usize,

    /// etcd version that Status and /version report, and whose answers cetera
    /// gives where releases differ. The default, 3.7.3, is the release whose
    /// API cetera serves (RangeStream included) and Kubernetes 1.37's etcd;
    /// its storage feature check needs 3.5.13 or later for RequestWatchProgress.
    #[arg(long, env = "CETERA_EMULATED_ETCD_VERSION", default_value = DEFAULT_EMULATED_VERSION)]
    pub emulated_etcd_version: String,

    /// How often watchers that ask for progress notifications get one
    /// (etcd 3.6's name; 3.5's --experimental-watch-progress-notify-interval
    /// is accepted too; Kubernetes setups use 5s).
    #[arg(
        long,
        visible_alias = "experimental-watch-progress-notify-interval",
        env = "CETERA_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "5s",
        value_parser = parse_interval
    )]
    pub watch_progress_notify_interval: std::time::Duration,

    /// etcd 3.6's feature gates, `Name=true,Other=false` (may be repeated).
    /// etcd's gate names are accepted and have no effect on cetera; an
    /// unknown name is refused, as etcd refuses it.
    #[arg(long, env = "CETERA_FEATURE_GATES", value_parser = parse_feature_gates)]
    pub feature_gates: Vec<FeatureGates>,

    /// How often an instance on a shared database looks for other
    /// instances' writes: MySQL's only signal, PostgreSQL's bound on a
    /// notification lost on the way (SQLite is not shared).
    #[arg(long, env = "CETERA_POLL_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub poll_interval: std::time::Duration,

    /// Database size, in bytes, at which writes are refused and the NOSPACE
    /// alarm is raised, as etcd's flag: 0 means etcd's default of 2 GiB, a
    /// negative number turns the quota off. On PostgreSQL it counts cetera's
    /// tables, elsewhere the whole database.
    #[arg(
        long,
        env = "CETERA_QUOTA_BACKEND_BYTES",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub quota_backend_bytes: i64,

    /// How --auto-compaction-retention is read: `periodic` (a duration) or
    /// `revision` (a number of revisions), as in etcd.
    #[arg(long, env = "CETERA_AUTO_COMPACTION_MODE", value_enum, default_value_t = AutoCompactionMode::Periodic)]
    pub auto_compaction_mode: AutoCompactionMode,

    /// History kept by automatic compaction, as etcd reads it: periodic mode
    /// takes a duration (`30m`, `1h`) or a bare number of hours, revision mode
    /// a number of revisions. 0 turns automatic compaction off.
    #[arg(long, env = "CETERA_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,

    /// How often revision-mode automatic compaction checks the revision
    /// (fixed at 5 minutes in etcd).
    #[arg(long, env = "CETERA_AUTO_COMPACTION_REVISION_INTERVAL", default_value = "5m", value_parser = parse_interval)]
    pub auto_compaction_revision_interval: std::time::Duration,

    /// Auth token type: `simple`, or `jwt,sign-method=RS256,priv-key=FILE,
    /// pub-key=FILE,ttl=5m` (etcd's signed tokens, valid on every instance
    /// given the same keys).
    #[arg(long, env = "CETERA_AUTH_TOKEN", default_value = "simple", value_parser = parse_auth_token)]
    pub auth_token: String,

    /// Seconds an unused simple auth token stays valid (etcd's --auth-token-ttl).
    #[arg(long, env = "CETERA_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,

    /// bcrypt cost of stored password hashes (etcd's --bcrypt-cost).
    #[arg(long, env = "CETERA_BCRYPT_COST", default_value_t = crate::auth::BCRYPT_COST,
          value_parser = clap::value_parser!(u32).range(4..=31))]
    pub bcrypt_cost: u32,

    /// Log line format.
    #[arg(long, env = "CETERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,

    /// Certificate (PEM) for TLS on the gRPC port; with --key-file, clients
    /// must use TLS (etcd's name; kine's --server-cert-file is accepted too).
    #[arg(long, visible_alias = "server-cert-file", env = "CETERA_CERT_FILE")]
    pub cert_file: Option<PathBuf>,

    /// Private key (PEM) of --cert-file.
    #[arg(long, visible_alias = "server-key-file", env = "CETERA_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// CA certificates (PEM) that client certificates must chain to.
    #[arg(long, env = "CETERA_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,

    /// Refuse clients without a certificate signed by --trusted-ca-file.
    /// Takes an optional value, as etcd's `--client-cert-auth=true`.
    #[arg(
        long,
        env = "CETERA_CLIENT_CERT_AUTH",
        num_args = 0..=1,
        default_missing_value = "true",
        default_value_t = false,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub client_cert_auth: bool,

    /// etcd's client listeners: URLs, comma-separated or repeated, each
    /// serving gRPC and the HTTP API: `http://HOST:PORT`, `https://HOST:PORT`
    /// (needs --cert-file and --key-file) or `unix://PATH`. When given,
    /// --listen-address is not used.
    #[arg(long, value_delimiter = ',')]
    pub listen_client_urls: Vec<String>,

    /// etcd's extra listeners for /metrics and the health checks only:
    /// `http://HOST:PORT` or `https://HOST:PORT` (the client TLS settings).
    #[arg(long, value_delimiter = ',')]
    pub listen_metrics_urls: Vec<String>,

    /// Address of the HTTP server for /metrics (Prometheus), /healthz,
    /// /readyz and /health, e.g. 127.0.0.1:2381. Off unless given.
    #[arg(long, env = "CETERA_METRICS_ADDRESS")]
    pub metrics_address: Option<SocketAddr>,

    /// Found a replicated cluster with this member (k3s's name). A
    /// single-node SQLite datastore becomes the cluster's first member and
    /// keeps every key and revision. Given again on every restart.
    #[arg(long, env = "CETERA_CLUSTER_INIT", conflicts_with = "join")]
    pub cluster_init: bool,
    /// Join the replicated cluster whose member serves peers at this URL
    /// (e.g. http://10.0.0.1:2380); needs --token. Given again on every restart.
    #[arg(long, env = "CETERA_JOIN")]
    pub join: Option<String>,
    /// The cluster token every member presents to the others. With
    /// --cluster-init and no token, one is made up and written beside the
    /// datastore (PATH.token).
    #[arg(long, env = "CETERA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Address the peer service (Raft traffic between members) listens on.
    #[arg(
        long,
        env = "CETERA_PEER_LISTEN_ADDRESS",
        default_value = "127.0.0.1:2380"
    )]
    pub peer_listen_address: SocketAddr,
    /// Peer URL the other members reach this one at. Default: http:// and
    /// --peer-listen-address.
    #[arg(long, env = "CETERA_ADVERTISE_PEER_URL")]
    pub advertise_peer_url: Option<String>,
    /// Certificate (PEM) of the peer service, also shown to the members this
    /// one calls (etcd's name). Peer traffic is then TLS both ways, and needs
    /// --peer-trusted-ca-file.
    #[arg(long, env = "CETERA_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --peer-cert-file.
    #[arg(long, env = "CETERA_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// CA certificates (PEM) that every member's peer certificate must chain
    /// to, on both ends of a peer connection.
    #[arg(long, env = "CETERA_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// A one-off command instead of serving. The datastore TLS flags apply
    /// to it too.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Commands other than serving (`cetera [flags]` with none serves).
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Load a snapshot (from `etcdctl snapshot save` against cetera) into the
    /// datastore named by --endpoint. Revisions, history and leases are kept;
    /// the store gets a new cluster and member id.
    Restore {
        /// The snapshot file.
        file: PathBuf,
        /// The datastore to load it into, in the forms the server's
        /// --endpoint takes (default: that flag's value, or CETERA_ENDPOINT).
        #[arg(long, visible_alias = "datastore-endpoint")]
        endpoint: Option<String>,
        /// Replace whatever the datastore holds (otherwise it must be empty).
        #[arg(long)]
        force: bool,
    },
    /// Copy the whole store from one datastore to another (any of SQLite,
    /// PostgreSQL, MySQL), keeping revisions, leases, users and the cluster
    /// id, then verify both sides. --datastore-cafile/certfile/keyfile apply
    /// to both.
    Migrate {
        /// Source, in --endpoint's forms (sqlite://PATH, postgres://, mysql://),
        /// a live etcd: http://host:2379 or https://host:2379, or a file saved
        /// by `etcdctl snapshot save`: etcd-snapshot:///path/to/file.db, or a
        /// kine datastore: kine+ and kine's endpoint (kine+sqlite:///path/state.db,
        /// kine+postgres://..., kine+mysql://user@tcp(host:3306)/db).
        #[arg(long)]
        from: String,
        /// Target, in --endpoint's forms, or a live etcd (http(s)://host:2379);
        /// must be empty unless --force.
        #[arg(long)]
        to: String,
        /// Replace whatever the target holds.
        #[arg(long)]
        force: bool,
        /// Copy the history after the compact revision; with false, only the
        /// live keys, compacted at the current revision.
        #[arg(
            long,
            num_args = 0..=1,
            default_value_t = true,
            default_missing_value = "true",
            value_parser = clap::builder::BoolishValueParser::new()
        )]
        history: bool,
        /// CA certificate of an https:// etcd source (etcdctl's --cacert).
        #[arg(long)]
        from_cacert: Option<PathBuf>,
        /// Client certificate for an etcd source (etcdctl's --cert).
        #[arg(long)]
        from_cert: Option<PathBuf>,
        /// Key of --from-cert (etcdctl's --key).
        #[arg(long)]
        from_key: Option<PathBuf>,
        /// CA certificate of an https:// etcd target (etcdctl's --cacert).
        #[arg(long)]
        to_cacert: Option<PathBuf>,
        /// Client certificate for an etcd target (etcdctl's --cert).
        #[arg(long)]
        to_cert: Option<PathBuf>,
        /// Key of --to-cert (etcdctl's --key).
        #[arg(long)]
        to_key: Option<PathBuf>,
    },
}

/// A duration such as `5s` or `100ms`, at least 100 ms as etcd requires.
fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    let interval = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if interval < std::time::Duration::from_millis(100) {
        return Err("must be at least 100ms".to_string());
    }
    Ok(interval)
}

/// The gates etcd 3.6 and 3.7 know (server/features/etcd_features.go),
/// with the featuregate package's AllAlpha and AllBeta. None has a
/// counterpart in cetera: they switch etcd's corruption checks, lease
/// checkpoints, peer addressing, defragmentation and write paths.
pub const ETCD_FEATURE_GATES: &[&str] = &[
    "AllAlpha",
    "AllBeta",
    "CompactHashCheck",
    "FastLeaseKeepAlive",
    "InitialCorruptCheck",
    "LeaseCheckpoint",
    "LeaseCheckpointPersist",
    "PriorityRequest",
    "SetMemberLocalAddr",
    "StopGRPCServiceOnDefrag",
    "TxnModeWriteWithSharedBuffer",
];

/// One `--feature-gates` value: gate names with the state asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates(pub Vec<(String, bool)>);

/// Go's strconv.ParseBool, which etcd reads bool flags and gate values with.
fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Reads `Name=bool,...` as etcd's featuregate Set does, with its messages.
fn parse_feature_gates(text: &str) -> Result<FeatureGates, String> {
    let mut gates = Vec::new();
    for item in text.split(',').filter(|item| !item.is_empty()) {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.trim(), value.trim()),
            None => return Err(format!("missing bool value for {}", item.trim())),
        };
        let on = parse_go_bool(value).ok_or_else(|| {
            format!(
                "invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
            )
        })?;
        if !ETCD_FEATURE_GATES.contains(&name) {
            return Err(format!("unrecognized feature gate: {name}"));
        }
        gates.push((name.to_string(), on));
    }
    Ok(FeatureGates(gates))
}

/// How `--auto-compaction-retention` is read.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompactionMode {
    /// A duration of history to keep.
    Periodic,
    /// A number of revisions to keep.
    Revision,
}

/// etcd's --auth-token: `simple` (options after a comma are accepted and
/// ignored, as etcd ignores them for simple tokens) or
/// `jwt,sign-method=...,priv-key=...,pub-key=...,ttl=...`; the JWT keys are
/// read when the server starts.
fn parse_auth_token(text: &str) -> Result<String, String> {
    match crate::auth::decompose_token_options(text) {
        Ok((kind, _)) if kind == "simple" || kind == "jwt" => Ok(text.to_string()),
        Ok(_) | Err(_) => Err(crate::auth::TokenOptionsError::InvalidOptions.to_string()),
    }
}

/// How log lines are written.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Where `--data-dir` puts the SQLite database, inside the directory.
pub const DATA_DIR_DATABASE: &str = "cetera/state.db";

impl Config {
    /// The configuration of this process: its command line, ETCD_* and
    /// CETERA_* variables, or the `--config-file` YAML, as etcd reads them;
    /// with what to log once logging is set up.
    pub fn load() -> Result<(Config, Vec<etcd::Note>), etcd::LoadError> {
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .collect();
        etcd::load(
            std::env::args_os(),
            &|name| std::env::var(name).ok(),
            &names,
        )
    }

    /// Applies etcd's flags that set cetera's own settings: --data-dir,
    /// --listen-peer-urls, --initial-advertise-peer-urls, --logger.
    fn resolve_etcd_flags(
        &mut self,
        matches: &clap::ArgMatches,
        notes: &mut Vec<etcd::Note>,
    ) -> Result<(), etcd::LoadError> {
        let given = |id: &str| {
            !matches!(
                matches.value_source(id),
                None | Some(clap::parser::ValueSource::DefaultValue)
            )
        };
        let fail = |message: String| etcd::LoadError::Etcd { message, code: 1 };
        if let Some(dir) = &self.data_dir {
            if given("endpoint") {
                notes.push(etcd::Note::Warn(format!(
                    "--data-dir {} not used: the data is where --endpoint says",
                    dir.display()
                )));
            } else {
                self.endpoint = dir.join(DATA_DIR_DATABASE).display().to_string();
            }
        }
        if let Some(url) = self.listen_peer_urls.first()
            && !given("peer_listen_address")
        {
            self.peer_listen_address = url_address(url)
                .ok_or_else(|| fail(format!("invalid --listen-peer-urls {url:?}")))?;
            if self.listen_peer_urls.len() > 1 {
                notes.push(etcd::Note::Warn(format!(
                    "--listen-peer-urls: only the first URL, {url}, is listened on"
                )));
            }
        }
        if let Some(url) = self.initial_advertise_peer_urls.first()
            && self.advertise_peer_url.is_none()
        {
            self.advertise_peer_url = Some(url.clone());
        }
        match self.logger.as_str() {
            "zap" => {}
            "capnslog" => return Err(fail("--logger=capnslog is removed in v3.5".to_string())),
            other => return Err(fail(format!("unknown logger option {other:?}"))),
        }
        Ok(())
    }

    /// The automatic compaction the flags ask for, if any.
    pub fn auto_compaction(&self) -> anyhow::Result<Option<crate::store::AutoCompaction>> {
        let mode = match self.auto_compaction_mode {
            AutoCompactionMode::Periodic => "periodic",
            AutoCompactionMode::Revision => "revision",
        };
        crate::store::auto_compaction::parse_retention(
            mode,
            &self.auto_compaction_retention,
            self.auto_compaction_revision_interval,
        )
        .map_err(|e| anyhow::anyhow!("--auto-compaction-retention: {e}"))
    }

    /// The TLS files for the database connection.
    pub fn datastore_tls(&self) -> DatastoreTls {
        DatastoreTls {
            ca_file: self.datastore_cafile.clone(),
            cert_file: self.datastore_certfile.clone(),
            key_file: self.datastore_keyfile.clone(),
        }
    }

    /// The flags with `cetera restore --endpoint`, if given, as the endpoint.
    pub fn with_command_endpoint(mut self) -> Config {
        if let Some(Command::Restore {
            endpoint: Some(endpoint),
            ..
        }) = &self.command
        {
            self.endpoint = endpoint.clone();
        }
        self
    }

    /// The client URLs to report, derived from the listen address unless given.
    pub fn client_urls(&self) -> Vec<String> {
        if !self.advertise_client_urls.is_empty() {
            return self.advertise_client_urls.clone();
        }
        let mut addr = self.listen_address;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let scheme = if self.cert_file.is_some() {
            "https"
        } else {
            "http"
        };
        vec![format!("{scheme}://{addr}")]
    }

    /// The peer URL other members reach this one at.
    pub fn peer_url(&self) -> String {
        if let Some(url) = &self.advertise_peer_url {
            return url.clone();
        }
        let mut addr = self.peer_listen_address;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let scheme = if self.peer_cert_file.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{addr}")
    }

    /// The `--feature-gates` settings, later ones overriding earlier ones.
    pub fn feature_gates(&self) -> std::collections::BTreeMap<String, bool> {
        self.feature_gates
            .iter()
            .flat_map(|gates| gates.0.iter().cloned())
            .collect()
    }

    /// Whether the emulated etcd refuses a watch from a negative revision:
    /// 3.5.24, 3.6.6 and later do (server/etcdserver/api/v3rpc/watch.go).
    pub fn watch_refuses_negative_start(&self) -> bool {
        let mut parts = self
            .emulated_etcd_version
            .trim_start_matches('v')
            .split(['.', '-', '+'])
            .map(|part| part.parse::<u64>().ok());
        let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
            (parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        match (major, minor) {
            (3, 5) => patch >= 24,
            (3, 6) => patch >= 6,
            (3, minor) => minor > 6,
            (major, _) => major > 3,
        }
    }

    /// The order of a Txn's checks of the emulated etcd: 3.6 rewrote them
    /// (one pass in op order, a Put's lease before its key).
    pub fn txn_checks(&self) -> crate::store::TxnChecks {
        if major_minor(&self.emulated_etcd_version) >= (3, 6) {
            crate::store::TxnChecks::Etcd36
        } else {
            crate::store::TxnChecks::Etcd35
        }
    }

    /// Whether this server is a member of a replicated cluster.
    pub fn replicated(&self) -> bool {
        self.cluster_init || self.join.is_some()
    }
}

/// The socket address of a URL such as `http://10.0.0.1:2380` (a name is
/// looked up).
fn url_address(url: &str) -> Option<SocketAddr> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16()?;
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .ok()?
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_url_of_wildcard_listener_is_loopback() {
        let config = Config::parse_from(["cetera", "--listen-address", "0.0.0.0:2379"]);
        assert_eq!(config.client_urls(), vec!["http://127.0.0.1:2379"]);
        let config =
            Config::parse_from(["cetera", "--advertise-client-urls", "http://a:1,http://b:2"]);
        assert_eq!(config.client_urls(), vec!["http://a:1", "http://b:2"]);
    }

    #[test]
    fn quota_and_auto_compaction_flags() {
        use crate::store::AutoCompaction;
        use std::time::Duration;
        let config = Config::parse_from(["cetera"]);
        assert_eq!(config.quota_backend_bytes, 0);
        assert_eq!(config.auto_compaction().unwrap(), None);
        let config = Config::parse_from(["cetera", "--quota-backend-bytes", "-1"]);
        assert_eq!(config.quota_backend_bytes, -1);
        let config = Config::parse_from(["cetera", "--auto-compaction-retention", "1"]);
        assert_eq!(
            config.auto_compaction().unwrap(),
            Some(AutoCompaction::Periodic(Duration::from_secs(3600)))
        );
        let config = Config::parse_from([
            "cetera",
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "1000",
            "--auto-compaction-revision-interval",
            "1s",
        ]);
        assert_eq!(
            config.auto_compaction().unwrap(),
            Some(AutoCompaction::Revision {
                retention: 1000,
                interval: Duration::from_secs(1)
            })
        );
        let config = Config::parse_from(["cetera", "--auto-compaction-retention", "5x"]);
        let error = config.auto_compaction().unwrap_err().to_string();
        assert!(
            error.contains("error parsing CompactionRetention"),
            "{error}"
        );
        assert!(Config::try_parse_from(["cetera", "--auto-compaction-mode", "hourly"]).is_err());
    }

    #[test]
    fn tls_flags_take_etcd_and_kine_names() {
        let config = Config::parse_from([
            "cetera",
            "--server-cert-file",
            "c.pem",
            "--server-key-file",
            "k.pem",
            "--client-cert-auth",
        ]);
        assert_eq!(config.cert_file, Some(PathBuf::from("c.pem")));
        assert_eq!(config.key_file, Some(PathBuf::from("k.pem")));
        assert!(config.client_cert_auth);
        assert_eq!(config.client_urls(), vec!["https://127.0.0.1:2379"]);
        let config = Config::parse_from(["cetera", "--client-cert-auth=false"]);
        assert!(!config.client_cert_auth);
        let config = Config::parse_from(["cetera", "--client-cert-auth=true"]);
        assert!(config.client_cert_auth);
    }

    #[test]
    fn restore_is_a_subcommand_and_serving_needs_none() {
        let config = Config::parse_from(["cetera", "--endpoint", "/x.db"]);
        assert!(config.command.is_none());
        // The datastore flags work on either side of the subcommand.
        for args in [
            &[
                "cetera",
                "restore",
                "snap.db",
                "--endpoint",
                "/y.db",
                "--force",
            ][..],
            &[
                "cetera",
                "--endpoint",
                "/y.db",
                "restore",
                "--force",
                "snap.db",
            ][..],
        ] {
            let config = Config::parse_from(args).with_command_endpoint();
            assert_eq!(config.endpoint, "/y.db");
            match config.command {
                Some(Command::Restore { file, force, .. }) => {
                    assert_eq!((file, force), (PathBuf::from("snap.db"), true));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn migrate_keeps_history_unless_told_false() {
        let history = |extra: &[&str]| {
            let mut args = vec!["cetera", "migrate", "--from", "/a.db", "--to", "/b.db"];
            args.extend_from_slice(extra);
            match Config::parse_from(args).command {
                Some(Command::Migrate { history, force, .. }) => (history, force),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(history(&[]), (true, false));
        assert_eq!(history(&["--history"]), (true, false));
        assert_eq!(history(&["--history=false", "--force"]), (false, true));
        assert_eq!(history(&["--history", "true"]), (true, false));
        let missing = Config::try_parse_from(["cetera", "migrate", "--from", "/a.db"]);
        assert!(missing.is_err());
    }

    #[test]
    fn watch_progress_interval_takes_etcd_35_and_36_names() {
        for flag in [
            "--watch-progress-notify-interval",
            "--experimental-watch-progress-notify-interval",
        ] {
            let config = Config::parse_from(["cetera", flag, "250ms"]);
            assert_eq!(
                config.watch_progress_notify_interval,
                std::time::Duration::from_millis(250)
            );
        }
        let config = Config::parse_from(["cetera"]);
        assert_eq!(
            config.watch_progress_notify_interval,
            std::time::Duration::from_secs(5)
        );
    }

    #[test]
    fn feature_gates_are_read_as_etcd_reads_them() {
        let config = Config::parse_from([
            "cetera",
            "--feature-gates",
            "CompactHashCheck=true, StopGRPCServiceOnDefrag = false,,",
            "--feature-gates=CompactHashCheck=f,AllAlpha=1",
        ]);
        let gates = config.feature_gates();
        assert_eq!(
            gates.into_iter().collect::<Vec<_>>(),
            vec![
                ("AllAlpha".to_string(), true),
                ("CompactHashCheck".to_string(), false),
                ("StopGRPCServiceOnDefrag".to_string(), false),
            ]
        );
        assert!(Config::parse_from(["cetera"]).feature_gates().is_empty());
        for (value, message) in [
            ("NoSuchGate=true", "unrecognized feature gate: NoSuchGate"),
            (
                "CompactHashCheck",
                "missing bool value for CompactHashCheck",
            ),
            (
                "CompactHashCheck=yes",
                "invalid value of CompactHashCheck=yes, err: strconv.ParseBool: parsing \"yes\": invalid syntax",
            ),
            // Names are case-sensitive, as in etcd.
            (
                "compacthashcheck=true",
                "unrecognized feature gate: compacthashcheck",
            ),
        ] {
            let error = Config::try_parse_from(["cetera", "--feature-gates", value])
                .unwrap_err()
                .to_string();
            assert!(error.contains(message), "{value}: {error}");
        }
    }

    #[test]
    fn negative_watch_starts_are_refused_from_3_5_24_and_3_6_6() {
        let refuses = |version: &str| {
            Config::parse_from(["cetera", "--emulated-etcd-version", version])
                .watch_refuses_negative_start()
        };
        for (version, expected) in [
            ("3.5.13", false),
            ("3.5.23", false),
            ("3.5.24", true),
            ("3.6.5", false),
            ("v3.6.6", true),
            ("3.7.0-rc.0", true),
            ("3.4.40", false),
            ("4.0.0", true),
            ("3.6", false),
        ] {
            assert_eq!(refuses(version), expected, "{version}");
        }
        // The default, 3.7.3, is one of them.
        assert!(Config::parse_from(["cetera"]).watch_refuses_negative_start());
    }

    #[test]
    fn datastore_endpoint_alias() {
        let config = Config::parse_from(["cetera", "--datastore-endpoint", "/x.db"]);
        assert_eq!(config.endpoint, "/x.db");
    }
}
