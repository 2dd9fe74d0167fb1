//! The PostgreSQL backend (tokio-postgres with a deadpool connection pool).
//!
//! Reads run on pooled connections in `REPEATABLE READ, READ ONLY`
//! transactions, so the counters and the data come from one snapshot. A write
//! transaction locks the single `meta` row first (`SELECT ... FOR UPDATE`):
//! several cetera instances can share one database, and their writes take
//! dense revisions one at a time, in commit order. Each commit that moves the
//! counters sends a NOTIFY on channel `cetera`; a dedicated LISTEN connection
//! turns those into [`Backend::changed`] wake-ups. Jobs that must run on one
//! instance at a time hold session-level advisory locks on another dedicated
//! connection ([`Backend::hold_lock`]).
//!
//! `connect` takes the URLs k3s users write (`postgres://` or `postgresql://`,
//! libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` included), waits
//! for the server for a while at startup, creates the database if it is
//! missing and applies `migrations/postgres`.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::future::poll_fn;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Row, SimpleQueryMessage};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{
    Backend, BackendResult, DatabaseSize, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn, Revisions,
    WriteTxn,
};
use crate::config::DatastoreTls;
use crate::proto::mvccpb::KeyValue;

mod embedded {
    refinery::embed_migrations!("migrations/postgres");
}

/// The database used when the URL names none, as kine does.
pub const DEFAULT_DATABASE: &str = "kubernetes";
/// The NOTIFY channel that tells other instances a commit happened.
const CHANNEL: &str = "cetera";
/// How long `connect` keeps retrying an unreachable server.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Connect timeout when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pooled connections per instance (reads, the writer, size queries).
const POOL_SIZE: usize = 16;
/// How long a caller waits for a free pooled connection.
const POOL_WAIT: Duration = Duration::from_secs(60);
/// How often the LISTEN connection checks that the server still answers: a
/// connection that died silently would otherwise lose notifications unnoticed.
const LISTEN_HEALTH_INTERVAL: Duration = Duration::from_secs(30);
/// How long a health check or lock query may take before its connection is
/// given up as dead.
const SESSION_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest key stored, in bytes: a B-tree index entry must fit in a third of
/// an 8 KiB page (2704 bytes), with the revision columns beside the key.
pub const MAX_KEY_BYTES: usize = 2600;

/// A store in a Postgres database.
pub struct Postgres {
    pool: Pool,
    connector: Connector,
    /// Signalled by the listener on every NOTIFY (and after a reconnect).
    changes: Arc<Notify>,
    /// The LISTEN connection's task, stopped when the backend is dropped.
    _listener: AbortOnDrop,
    /// The connection holding advisory locks, and the locks it holds.
    locks: tokio::sync::Mutex<LockSession>,
}

impl Postgres {
    /// Connects to the database named by `url`, creating it and its schema if needed.
    ///
    /// `url` is a `postgres://` or `postgresql://` URL as k3s users write it;
    /// it names the database `kubernetes` if it names none. TLS files come
    /// from `tls` unless the URL's `sslrootcert`, `sslcert` or `sslkey` say
    /// otherwise. An unreachable server is retried for 30 seconds.
    pub async fn connect(url: &str, tls: &DatastoreTls) -> anyhow::Result<Self> {
        Self::connect_within(url, tls, STARTUP_TIMEOUT).await
    }

    /// `connect`, retrying an unreachable server for at most `patience`.
    async fn connect_within(
        url: &str,
        tls: &DatastoreTls,
        patience: Duration,
    ) -> anyhow::Result<Self> {
        let target = Target::parse(url, tls)?;
        let connector = Connector::new(target)?;
        let mut client = connector.connect_at_startup(patience).await?;
        migrate(&mut client)
            .await
            .with_context(|| format!("cannot apply migrations to {}", connector.describe()))?;
        drop(client);

        let manager = connector.manager(ManagerConfig {
            // The transaction types end every transaction they begin (see
            // `TxnConn`), so a returned connection needs no check beyond
            // being open.
            recycling_method: RecyclingMethod::Fast,
        });
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .build()
            .context("cannot build the Postgres connection pool")?;

        let changes = Arc::new(Notify::new());
        let listener = Listener::start(connector.clone(), changes.clone())
            .await
            .with_context(|| format!("cannot LISTEN on {}", connector.describe()))?;
        tracing::info!("using Postgres at {}", connector.describe());
        Ok(Postgres {
            pool,
            connector,
            changes,
            _listener: listener,
            locks: tokio::sync::Mutex::new(LockSession::default()),
        })
    }

    async fn pooled(&self) -> BackendResult<Object> {
        self.pool.get().await.map_err(|error| match error {
            PoolError::Backend(error) => anyhow!(
                "cannot connect to {}: {}",
                self.connector.describe(),
                describe(&error)
            ),
            other => anyhow!("no Postgres connection available: {other}"),
        })
    }
}

// ---------------------------------------------------------------------------
// URLs and TLS settings
// ---------------------------------------------------------------------------

/// libpq's `sslmode` values; tokio-postgres parses only three of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> anyhow::Result<Self> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => bail!(
                "unknown sslmode {other:?}; expected disable, allow, prefer, require, \
                 verify-ca or verify-full"
            ),
        })
    }
}

/// What the URL and the TLS flags ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SslRequest {
    /// `sslmode` from the URL, if given.
    mode: Option<SslMode>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verify {
    /// Encrypt only (libpq's `require` without a CA).
    Nothing,
    /// The chain must lead to a trusted CA; the name is not checked (`verify-ca`).
    Chain,
    /// Chain and host name (`verify-full`).
    Full,
}

/// The TLS connection to make, decided from an [`SslRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct TlsPlan {
    /// Fail rather than fall back to plain text when the server has no TLS.
    required: bool,
    verify: Verify,
    /// CA bundle; the system's when `None`.
    ca: Option<PathBuf>,
    /// Client certificate and key.
    client: Option<(PathBuf, PathBuf)>,
}

impl SslRequest {
    /// `None` for a plain-text connection.
    ///
    /// Without TLS files and without `sslmode=require`/`verify-*` the
    /// connection is plain, as k3s users expect from their `?sslmode=disable`
    /// era. Files without an `sslmode` mean `verify-full`, as kine does;
    /// `require` with a CA checks the chain, as libpq does.
    fn plan(&self) -> anyhow::Result<Option<TlsPlan>> {
        let has_files = self.ca.is_some() || self.cert.is_some() || self.key.is_some();
        let client = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            (Some(_), None) => {
                bail!("a client certificate needs its key (--datastore-keyfile or sslkey=)")
            }
            (None, Some(_)) => {
                bail!("a client key needs its certificate (--datastore-certfile or sslcert=)")
            }
        };
        let has_ca = self.ca.is_some();
        let (required, verify) = match self.mode {
            Some(SslMode::Disable) => {
                if has_files {
                    tracing::warn!("sslmode=disable: the datastore TLS files are not used");
                }
                return Ok(None);
            }
            None | Some(SslMode::Allow | SslMode::Prefer) if !has_files => return Ok(None),
            None => (true, Verify::Full),
            Some(SslMode::Allow | SslMode::Prefer) => (
                false,
                if has_ca {
                    Verify::Full
                } else {
                    Verify::Nothing
                },
            ),
            Some(SslMode::Require) => (
                true,
                if has_ca {
                    Verify::Chain
                } else {
                    Verify::Nothing
                },
            ),
            Some(SslMode::VerifyCa) => (true, Verify::Chain),
            Some(SslMode::VerifyFull) => (true, Verify::Full),
        };
        Ok(Some(TlsPlan {
            required,
            verify,
            ca: self.ca.clone(),
            client,
        }))
    }
}

/// A parsed URL: the driver's settings and the TLS request.
#[derive(Debug)]
struct Target {
    config: Config,
    ssl: SslRequest,
}

impl Target {
    /// Parses `url`, taking out the libpq TLS options tokio-postgres does not
    /// know and passing every other option through as written.
    fn parse(url: &str, files: &DatastoreTls) -> anyhow::Result<Self> {
        let url = url.trim();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            bail!(
                "invalid Postgres URL {}: expected postgres://... or postgresql://...",
                redact(url)
            );
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let invalid = |message: String| anyhow!("invalid Postgres URL {}: {message}", redact(url));
        let mut ssl = SslRequest::default();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = || {
                percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map(|v| v.into_owned())
                    .map_err(|_| invalid(format!("option {key} is not UTF-8")))
            };
            match key {
                "sslmode" => {
                    ssl.mode = Some(SslMode::parse(&value()?).map_err(|e| invalid(e.to_string()))?)
                }
                "sslrootcert" => ssl.ca = Some(value()?.into()),
                "sslcert" => ssl.cert = Some(value()?.into()),
                "sslkey" => ssl.key = Some(value()?.into()),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut config: Config = rest.parse().map_err(|e| invalid(describe(&e)))?;

        // Files named in the URL win over the flags, as in kine.
        ssl.ca = ssl.ca.or_else(|| files.ca_file.clone());
        ssl.cert = ssl.cert.or_else(|| files.cert_file.clone());
        ssl.key = ssl.key.or_else(|| files.key_file.clone());

        if config.get_dbname().is_none_or(str::is_empty) {
            config.dbname(DEFAULT_DATABASE);
        }
        // libpq would try a Unix socket, Go's lib/pq (kine) localhost.
        if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
            config.host("localhost");
        }
        if config.get_application_name().is_none() {
            config.application_name("cetera");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        Ok(Target { config, ssl })
    }
}

/// `url` with its password hidden, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// The well-known places of the system's CA bundle (what OpenSSL and
/// rustls-native-certs look at on Linux and the BSDs).
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

fn read_certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read certificates from {}", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

fn root_store(ca: Option<&Path>) -> anyhow::Result<RootCertStore> {
    let path = match ca {
        Some(path) => path.to_path_buf(),
        None => std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .or_else(|| {
                SYSTEM_CA_BUNDLES
                    .iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
            })
            .context(
                "verifying the server's certificate needs a CA: set --datastore-cafile or \
                 sslrootcert=, or install the system CA bundle",
            )?,
    };
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(read_certificates(&path)?);
    if added == 0 {
        bail!("{} holds no usable CA certificate", path.display());
    }
    Ok(roots)
}

/// Builds the rustls connector for `plan`.
fn rustls_connector(plan: &TlsPlan) -> anyhow::Result<MakeRustlsConnect> {
    // An explicit provider: the process may link more than one rustls
    // backend, and then rustls has no default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("cannot set up TLS")?;
    let builder = match plan.verify {
        Verify::Full => builder.with_root_certificates(root_store(plan.ca.as_deref())?),
        Verify::Chain => {
            let inner = WebPkiServerVerifier::builder_with_provider(
                Arc::new(root_store(plan.ca.as_deref())?),
                provider,
            )
            .build()
            .context("cannot set up TLS certificate verification")?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        }
        Verify::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider))),
    };
    let mut config = match &plan.client {
        Some((cert, key)) => {
            let key = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("cannot read the client key {}", key.display()))?;
            builder
                .with_client_auth_cert(read_certificates(cert)?, key)
                .context("the client certificate does not match its key")?
        }
        None => builder.with_no_client_auth(),
    };
    // Postgres 17 checks the ALPN name on direct TLS; older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(MakeRustlsConnect::new(config))
}

/// `verify-ca`: the chain must be trusted, the name may differ.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// libpq's `require` without a CA: encrypted, certificate not checked. The
/// handshake signatures are still verified, so the session key is the server's.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

// ---------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------

#[derive(Clone)]
enum Tls {
    Off,
    Rustls(MakeRustlsConnect),
}

/// Opens connections to the configured database: the pool's and the
/// dedicated ones (LISTEN, advisory locks, migrations).
#[derive(Clone)]
struct Connector {
    config: Config,
    tls: Tls,
}

impl Connector {
    fn new(target: Target) -> anyhow::Result<Self> {
        let Target { mut config, ssl } = target;
        // Postgres has no TLS on Unix sockets (libpq skips it there too).
        #[cfg(unix)]
        let plan = if config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)))
            && config.get_hostaddrs().is_empty()
        {
            None
        } else {
            ssl.plan()?
        };
        #[cfg(not(unix))]
        let plan = ssl.plan()?;
        let tls = match plan {
            None => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                Tls::Off
            }
            Some(plan) => {
                config.ssl_mode(if plan.required {
                    tokio_postgres::config::SslMode::Require
                } else {
                    tokio_postgres::config::SslMode::Prefer
                });
                Tls::Rustls(rustls_connector(&plan)?)
            }
        };
        Ok(Connector { config, tls })
    }

    fn database(&self) -> &str {
        self.config.get_dbname().unwrap_or(DEFAULT_DATABASE)
    }

    /// Where this connects to, for messages: hosts, database, user.
    fn describe(&self) -> String {
        let ports = self.config.get_ports();
        let mut hosts = Vec::new();
        let names = self.config.get_hosts();
        let count = names.len().max(self.config.get_hostaddrs().len());
        for i in 0..count {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            let host = match (names.get(i), self.config.get_hostaddrs().get(i)) {
                (_, Some(addr)) => format!("{addr}:{port}"),
                (Some(tokio_postgres::config::Host::Tcp(name)), None) => format!("{name}:{port}"),
                #[cfg(unix)]
                (Some(tokio_postgres::config::Host::Unix(dir)), None) => {
                    format!("{} (Unix socket, port {port})", dir.display())
                }
                (None, None) => continue,
            };
            hosts.push(host);
        }
        let mut text = format!("{}, database {:?}", hosts.join(", "), self.database());
        if let Some(user) = self.config.get_user() {
            let _ = write!(text, ", user {user:?}");
        }
        if matches!(self.tls, Tls::Rustls(_)) {
            text.push_str(", TLS");
        }
        text
    }

    /// Opens one connection and drives it on its own task, which signals
    /// `notify` on every notification and ends when the client is dropped.
    async fn connect(
        &self,
        notify: Option<Arc<Notify>>,
    ) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        match &self.tls {
            Tls::Off => {
                let (client, connection) = self.config.connect(NoTls).await?;
                Ok((client, spawn_driver(connection, notify)))
            }
            Tls::Rustls(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await?;
                Ok((client, spawn_driver(connection, notify)))
            }
        }
    }

    fn manager(&self, config: ManagerConfig) -> Manager {
        match &self.tls {
            Tls::Off => Manager::from_config(self.config.clone(), NoTls, config),
            Tls::Rustls(tls) => Manager::from_config(self.config.clone(), tls.clone(), config),
        }
    }

    /// The first connection: waits up to `patience` for the server to
    /// accept connections and creates the database if it does not exist.
    async fn connect_at_startup(&self, patience: Duration) -> anyhow::Result<Client> {
        let deadline = Instant::now() + patience;
        let mut delay = Duration::from_millis(250);
        let mut created = false;
        loop {
            let error = match self.connect(None).await {
                Ok((client, _driver)) => return Ok(client),
                Err(error) => error,
            };
            if error.code() == Some(&SqlState::INVALID_CATALOG_NAME) && !created {
                self.create_database().await?;
                created = true;
                continue;
            }
            if !is_transient(&error) {
                bail!(
                    "cannot connect to {}: {}",
                    self.describe(),
                    describe(&error)
                );
            }
            if Instant::now() + delay > deadline {
                bail!(
                    "cannot connect to {} (gave up after {}s): {}",
                    self.describe(),
                    patience.as_secs(),
                    describe(&error)
                );
            }
            tracing::warn!(
                "cannot connect to {}, retrying in {delay:?}: {}",
                self.describe(),
                describe(&error)
            );
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Creates the database from the `postgres` maintenance database (or
    /// `template1` where there is none). Another instance creating it at the
    /// same moment is fine.
    async fn create_database(&self) -> anyhow::Result<()> {
        let name = self.database().to_string();
        let mut last_error = None;
        for admin in ["postgres", "template1"] {
            let mut connector = self.clone();
            connector.config.dbname(admin);
            let client = match connector.connect(None).await {
                Ok((client, _driver)) => client,
                Err(error) if error.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
                    last_error = Some(error);
                    continue;
                }
                Err(error) => {
                    bail!(
                        "database {name:?} does not exist, and cannot connect to {} to create \
                         it: {}",
                        connector.describe(),
                        describe(&error)
                    )
                }
            };
            tracing::info!("creating Postgres database {name:?}");
            let sql = format!("CREATE DATABASE {}", quote_identifier(&name));
            return match client.batch_execute(&sql).await {
                Ok(()) => Ok(()),
                // A concurrent creator won: 42P04, or 23505 from pg_database's index.
                Err(error)
                    if matches!(
                        error.code(),
                        Some(&SqlState::DUPLICATE_DATABASE | &SqlState::UNIQUE_VIOLATION)
                    ) =>
                {
                    Ok(())
                }
                Err(error) => {
                    let hint = if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
                        " (create it, or grant the user CREATEDB)"
                    } else {
                        ""
                    };
                    bail!(
                        "database {name:?} does not exist and cannot be created{hint}: {}",
                        describe(&error)
                    )
                }
            };
        }
        let detail = last_error.map(|e| describe(&e)).unwrap_or_default();
        bail!(
            "database {name:?} does not exist, and there is no postgres or template1 database \
             to create it from: {detail}"
        )
    }
}

/// Drives `connection` on its own task; see [`Connector::connect`].
fn spawn_driver<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    notify: Option<Arc<Notify>>,
) -> JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(note))) => {
                    if let Some(notify) = &notify
                        && note.channel() == CHANNEL
                    {
                        wake_all(notify);
                    }
                }
                Some(Ok(AsyncMessage::Notice(notice))) => {
                    tracing::debug!("Postgres: {}: {}", notice.severity(), notice.message());
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    tracing::debug!("Postgres connection ended: {}", describe(&error));
                    return;
                }
                None => return,
            }
        }
    })
}

/// Wakes every current waiter of `changed()`, and the next one to come:
/// a caller busy with the previous change must not miss this one.
fn wake_all(notify: &Notify) {
    notify.notify_waiters();
    notify.notify_one();
}

/// Errors worth retrying at startup: the server is not there yet, or not
/// ready. Authentication and configuration errors are not.
fn is_transient(error: &tokio_postgres::Error) -> bool {
    match error.code() {
        Some(code) => [
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
        ]
        .contains(code),
        // tokio-postgres exposes the error kind only through its message.
        None => matches!(
            error.to_string().as_str(),
            "error connecting to server"
                | "timeout waiting for server"
                | "error communicating with the server"
                | "connection closed"
        ),
    }
}

/// A driver error as one line: the server's message and SQLSTATE, or the
/// client-side error with its causes.
fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            let _ = write!(text, "; {detail}");
        }
        if let Some(hint) = db.hint() {
            let _ = write!(text, "; hint: {hint}");
        }
        return text;
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

fn db_error(error: &tokio_postgres::Error) -> anyhow::Error {
    anyhow!("Postgres: {}", describe(error))
}

fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A stable 64-bit key for an advisory lock name: the same on every
/// instance and every build (FNV-1a), prefixed so as not to meet other
/// applications' locks on the same database.
fn lock_key(name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"cetera:".iter().chain(name.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// Applies the embedded migrations, one instance at a time: refinery
/// itself does not guard against two instances starting together.
async fn migrate(client: &mut Client) -> anyhow::Result<()> {
    let key = lock_key("migrations");
    client
        .batch_execute(&format!("SELECT pg_advisory_lock({key})"))
        .await
        .map_err(|e| db_error(&e))?;
    let report = embedded::migrations::runner().run_async(client).await;
    // The lock would go with the session anyway; release it for clarity.
    let _ = client
        .batch_execute(&format!("SELECT pg_advisory_unlock({key})"))
        .await;
    for migration in report?.applied_migrations() {
        tracing::info!("applied Postgres migration {migration}");
    }
    Ok(())
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The LISTEN connection: keeps one open, reconnecting when it dies.
struct Listener;

impl Listener {
    /// LISTENs before returning, so no commit after `connect` goes unseen,
    /// then keeps the connection alive on a task.
    async fn start(connector: Connector, changes: Arc<Notify>) -> anyhow::Result<AbortOnDrop> {
        let session = Self::listen(&connector, &changes)
            .await
            .map_err(|e| anyhow!(describe(&e)))?;
        Ok(AbortOnDrop(tokio::spawn(Self::run(
            connector, changes, session,
        ))))
    }

    async fn listen(
        connector: &Connector,
        changes: &Arc<Notify>,
    ) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        let (client, driver) = connector.connect(Some(changes.clone())).await?;
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        Ok((client, driver))
    }

    async fn run(connector: Connector, changes: Arc<Notify>, first: (Client, JoinHandle<()>)) {
        let mut session = Some(first);
        let mut delay = Duration::from_millis(250);
        loop {
            let (client, mut driver) = match session.take() {
                Some(session) => session,
                None => match Self::listen(&connector, &changes).await {
                    Ok(session) => {
                        tracing::info!("LISTEN connection to {} restored", connector.describe());
                        // Notifications sent while it was down are lost.
                        wake_all(&changes);
                        delay = Duration::from_millis(250);
                        session
                    }
                    Err(error) => {
                        tracing::warn!(
                            "cannot LISTEN on {}, retrying in {delay:?}: {}",
                            connector.describe(),
                            describe(&error)
                        );
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(10));
                        continue;
                    }
                },
            };
            let mut health = tokio::time::interval(LISTEN_HEALTH_INTERVAL);
            health.tick().await;
            loop {
                tokio::select! {
                    _ = &mut driver => {
                        tracing::warn!("LISTEN connection to {} lost", connector.describe());
                        break;
                    }
                    _ = health.tick() => {
                        let check = tokio::time::timeout(
                            SESSION_QUERY_TIMEOUT,
                            client.simple_query("SELECT 1"),
                        );
                        if !matches!(check.await, Ok(Ok(_))) {
                            tracing::warn!(
                                "LISTEN connection to {} stopped answering",
                                connector.describe()
                            );
                            break;
                        }
                    }
                }
            }
            driver.abort();
        }
    }
}

/// The dedicated connection for advisory locks: a session-level lock lives
/// exactly as long as the session that took it.
#[derive(Default)]
struct LockSession {
    client: Option<Client>,
    held: HashSet<i64>,
}

impl LockSession {
    fn lost(&mut self) {
        if !self.held.is_empty() {
            tracing::warn!("the advisory lock connection died: its locks are released");
        }
        self.client = None;
        self.held.clear();
    }
}

/// Runs one statement that returns a single value, on a dedicated connection.
async fn simple_value(client: &Client, sql: &str) -> anyhow::Result<Option<String>> {
    let messages = tokio::time::timeout(SESSION_QUERY_TIMEOUT, client.simple_query(sql))
        .await
        .map_err(|_| anyhow!("Postgres did not answer within {SESSION_QUERY_TIMEOUT:?}"))?
        .map_err(|e| db_error(&e))?;
    Ok(messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
        _ => None,
    }))
}

// ---------------------------------------------------------------------------
// Transactions
// ---------------------------------------------------------------------------

/// A pooled connection running one transaction. Whatever way it ends, the
/// connection goes back to the pool outside any transaction, or is closed.
struct TxnConn {
    client: Option<Object>,
    /// The BEGIN not sent yet: it goes out with the first statement, in one
    /// round trip, and a read that issues no statement never begins at all.
    begin: Option<&'static str>,
    /// A statement failed, so Postgres has aborted the transaction (and
    /// would answer COMMIT with a silent ROLLBACK).
    failed: bool,
}

impl TxnConn {
    fn new(client: Object, begin: &'static str) -> Self {
        TxnConn {
            client: Some(client),
            begin: Some(begin),
            failed: false,
        }
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> BackendResult<Vec<Row>> {
        let client = self
            .client
            .as_ref()
            .expect("connection present until the transaction ends");
        let result = async {
            let statement = client.prepare_cached(sql).await?;
            match self.begin.take() {
                None => client.query(&statement, params).await,
                Some(begin) => {
                    // `biased` polls (and so sends) BEGIN first: the
                    // statement must run inside the transaction.
                    let (began, rows) = tokio::join!(
                        biased;
                        client.batch_execute(begin),
                        client.query(&statement, params),
                    );
                    began?;
                    rows
                }
            }
        }
        .await;
        result.map_err(|error| {
            self.failed = true;
            db_error(&error)
        })
    }
}

impl Drop for TxnConn {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if self.begin.is_some() {
            return; // Nothing was sent: the connection goes back as it came.
        }
        roll_back_in_background(client);
    }
}

/// Ends the open transaction of `client` and returns it to the pool; a
/// connection that cannot roll back (or whose task never runs, as when the
/// runtime shuts down) is closed instead, never pooled mid-transaction.
fn roll_back_in_background(client: Object) {
    struct CloseUnlessReturned(Option<Object>);
    impl Drop for CloseUnlessReturned {
        fn drop(&mut self) {
            if let Some(client) = self.0.take() {
                drop(Object::take(client));
            }
        }
    }
    let mut guard = CloseUnlessReturned(Some(client));
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // The guard closes the connection; the server rolls back.
    };
    runtime.spawn(async move {
        let client = guard.0.as_ref().expect("present until returned");
        if client.batch_execute("ROLLBACK").await.is_ok() {
            drop(guard.0.take()); // Back to the pool.
        }
    });
}

/// A read transaction on a pooled connection; a consistent snapshot.
pub struct PostgresRead {
    conn: TxnConn,
}

/// A write transaction on a pooled connection, holding the `meta` row lock.
pub struct PostgresWrite {
    conn: TxnConn,
    /// The counters as locked, or as last set in this transaction.
    revisions: Revisions,
}

const BEGIN_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
// READ COMMITTED whatever the server's default: the meta row lock already
// orders writers, and SERIALIZABLE would only add serialization failures.
const BEGIN_WRITE: &str = "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE";
const READ_META: &str =
    "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1";
const LOCK_META: &str =
    "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1 FOR UPDATE";

impl Backend for Postgres {
    fn max_key_bytes(&self) -> usize {
        MAX_KEY_BYTES
    }

    type Read = PostgresRead;
    type Write = PostgresWrite;

    async fn read(&self) -> BackendResult<PostgresRead> {
        Ok(PostgresRead {
            conn: TxnConn::new(self.pooled().await?, BEGIN_READ),
        })
    }

    /// Begins and locks the `meta` row at once, rather than in
    /// `revisions()`: every write transaction (the identity setup included)
    /// then waits for other instances' writers before it reads anything, and
    /// under READ COMMITTED each later statement sees what they committed.
    async fn write(&self) -> BackendResult<PostgresWrite> {
        let mut conn = TxnConn::new(self.pooled().await?, BEGIN_WRITE);
        let rows = conn.query(LOCK_META, &[]).await?;
        let revisions = revisions_from(&rows)?;
        Ok(PostgresWrite { conn, revisions })
    }

    async fn size(&self) -> BackendResult<DatabaseSize> {
        let client = self.pooled().await?;
        let statement = client
            .prepare_cached(
                "SELECT pg_database_size(current_database()), \
                 (SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::BIGINT \
                  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                  WHERE n.nspname = current_schema() AND c.relkind = 'r' \
                  AND c.relname IN ('log', 'kv', 'meta', 'settings', 'lease'))",
            )
            .await
            .map_err(|e| db_error(&e))?;
        let row = client
            .query_one(&statement, &[])
            .await
            .map_err(|e| db_error(&e))?;
        Ok(DatabaseSize {
            total: row.try_get(0)?,
            // What cetera's tables and their indexes take, without the
            // catalog; Postgres reports no free space short of pgstattuple.
            in_use: row.try_get(1)?,
        })
    }

    async fn changed(&self) {
        self.changes.notified().await
    }

    async fn hold_lock(&self, name: &str) -> BackendResult<bool> {
        let key = lock_key(name);
        let mut session = self.locks.lock().await;
        if session.client.as_ref().is_some_and(Client::is_closed) {
            session.lost();
        }
        if session.held.contains(&key) {
            // Held as long as the session lives; make sure it still does.
            let client = session.client.as_ref().expect("locks are held by a client");
            match simple_value(client, "SELECT 1").await {
                Ok(_) => return Ok(true),
                Err(error) => {
                    tracing::warn!("advisory lock connection check failed: {error:#}");
                    session.lost();
                }
            }
        }
        if session.client.is_none() {
            let (client, _driver) = self.connector.connect(None).await.map_err(|error| {
                anyhow!(
                    "cannot open the advisory lock connection to {}: {}",
                    self.connector.describe(),
                    describe(&error)
                )
            })?;
            session.client = Some(client);
        }
        let client = session.client.as_ref().expect("connected above");
        match simple_value(client, &format!("SELECT pg_try_advisory_lock({key})")).await {
            Ok(taken) => {
                let taken = taken.as_deref() == Some("t");
                if taken {
                    session.held.insert(key);
                }
                Ok(taken)
            }
            Err(error) => {
                session.lost();
                Err(error)
            }
        }
    }
}

// Range statements come in eight shapes: at the current revision (kv) or an
// older one (log), with or without an upper bound (so that an unbounded range
// never compares against an end), with or without values. Parameters: $1
// start, then $2 end when bounded, then the revision (history only), then
// the limit (NULL for none).
//
// A key's state at revision R is its log row with the greatest (revision,
// sub) at or below R: one key can change twice in one revision (a Txn may
// delete from "\0" and put the same key, as etcd allows).
//
// The historical shape has no outer ORDER BY: the rows come out of the
// subquery in key order already (the planner knows it and would add no sort),
// but with an outer ORDER BY Postgres plans the subquery for full retrieval,
// ignoring the LIMIT: a sort of every version in the range instead of an
// index scan that stops after `limit` keys (10x slower on a 100k-row log).
// `range` checks the order all the same.
static RANGE_SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut all = Vec::new();
    for history in [false, true] {
        for bounded in [false, true] {
            for keys_only in [false, true] {
                let value = if keys_only { "''::BYTEA" } else { "value" };
                let mut next = 2;
                let mut param = || {
                    next += 1;
                    format!("${}", next - 1)
                };
                let end = if bounded {
                    format!(" AND key < {}", param())
                } else {
                    String::new()
                };
                all.push(if history {
                    let revision = param();
                    let limit = param();
                    format!(
                        "SELECT key, {value}, create_revision, revision, version, lease FROM (\
                           SELECT DISTINCT ON (key) key, {value} AS value, create_revision, \
                             revision, version, lease, deleted \
                           FROM log WHERE key >= $1{end} AND revision <= {revision} \
                           ORDER BY key, revision DESC, sub DESC\
                         ) AS at_revision WHERE NOT deleted LIMIT {limit}"
                    )
                } else {
                    let limit = param();
                    format!(
                        "SELECT key, {value}, create_revision, mod_revision, version, lease \
                         FROM kv WHERE key >= $1{end} ORDER BY key LIMIT {limit}"
                    )
                });
            }
        }
    }
    all
});

/// Count statements: current or historical, with or without an upper bound.
static COUNT_SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut all = Vec::new();
    for history in [false, true] {
        for bounded in [false, true] {
            let (end, revision) = if bounded {
                (" AND key < $2", "$3")
            } else {
                ("", "$2")
            };
            all.push(if history {
                format!(
                    "SELECT COUNT(*) FROM (\
                       SELECT DISTINCT ON (key) deleted FROM log \
                       WHERE key >= $1{end} AND revision <= {revision} \
                       ORDER BY key, revision DESC, sub DESC\
                     ) AS at_revision WHERE NOT deleted"
                )
            } else {
                format!("SELECT COUNT(*) FROM kv WHERE key >= $1{end}")
            });
        }
    }
    all
});

fn range_sql(at: ReadAt, bounded: bool, keys_only: bool) -> &'static str {
    let history = matches!(at, ReadAt::Revision(_));
    &RANGE_SQL[usize::from(history) * 4 + usize::from(bounded) * 2 + usize::from(keys_only)]
}

fn count_sql(at: ReadAt, bounded: bool) -> &'static str {
    let history = matches!(at, ReadAt::Revision(_));
    &COUNT_SQL[usize::from(history) * 2 + usize::from(bounded)]
}

fn kv_from_row(row: &Row) -> BackendResult<KeyValue> {
    Ok(KeyValue {
        key: row.try_get(0)?,
        value: row.try_get(1)?,
        create_revision: row.try_get(2)?,
        mod_revision: row.try_get(3)?,
        version: row.try_get(4)?,
        lease: row.try_get(5)?,
    })
}

fn lease_from_row(row: &Row) -> BackendResult<LeaseRow> {
    Ok(LeaseRow {
        id: row.try_get(0)?,
        ttl: row.try_get(1)?,
        expires_at: row.try_get(2)?,
    })
}

fn revisions_from(rows: &[Row]) -> BackendResult<Revisions> {
    let row = rows.first().context("the meta row is missing")?;
    Ok(Revisions {
        current: row.try_get(0)?,
        compact: row.try_get(1)?,
        compacted_through: row.try_get(2)?,
    })
}

/// `limit` as SQL: NULL (no limit) for 0.
fn sql_limit(limit: usize) -> Option<i64> {
    (limit > 0).then(|| i64::try_from(limit).unwrap_or(i64::MAX))
}

/// The read queries, shared by read and write transactions.
impl TxnConn {
    async fn revisions(&mut self) -> BackendResult<Revisions> {
        let rows = self.query(READ_META, &[]).await?;
        revisions_from(&rows)
    }

    async fn range(
        &mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> BackendResult<Vec<KeyValue>> {
        let limit = sql_limit(limit);
        let revision = match at {
            ReadAt::Current => None,
            ReadAt::Revision(revision) => Some(revision),
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&range.start];
        if let Some(end) = &range.end {
            params.push(end);
        }
        if let Some(revision) = &revision {
            params.push(revision);
        }
        params.push(&limit);
        let sql = range_sql(at, range.end.is_some(), keys_only);
        let rows = self.query(sql, &params).await?;
        let kvs: Vec<KeyValue> = rows.iter().map(kv_from_row).collect::<BackendResult<_>>()?;
        if !kvs.is_sorted_by(|a, b| a.key < b.key) {
            bail!("Postgres returned a range out of key order");
        }
        Ok(kvs)
    }

    async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
        let revision = match at {
            ReadAt::Current => None,
            ReadAt::Revision(revision) => Some(revision),
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&range.start];
        if let Some(end) = &range.end {
            params.push(end);
        }
        if let Some(revision) = &revision {
            params.push(revision);
        }
        let rows = self
            .query(count_sql(at, range.end.is_some()), &params)
            .await?;
        let row = rows.first().context("COUNT returned no row")?;
        Ok(row.try_get(0)?)
    }

    async fn log_entries(&mut self, after: i64, through: i64) -> BackendResult<Vec<LogEntry>> {
        let rows = self
            .query(
                "SELECT key, value, create_revision, revision, version, lease, sub, deleted \
                 FROM log WHERE revision > $1 AND revision <= $2 ORDER BY revision, sub",
                &[&after, &through],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(LogEntry {
                    kv: kv_from_row(row)?,
                    sub: row.try_get(6)?,
                    deleted: row.try_get(7)?,
                })
            })
            .collect()
    }

    async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
        let rows = self
            .query("SELECT value FROM settings WHERE name = $1", &[&name])
            .await?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(Into::into)
    }

    async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
        let rows = self
            .query(
                "SELECT id, ttl, expires_at FROM lease WHERE id = $1",
                &[&id],
            )
            .await?;
        rows.first().map(lease_from_row).transpose()
    }

    async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
        let rows = self
            .query(
                "SELECT id, ttl, expires_at FROM lease ORDER BY expires_at, id",
                &[],
            )
            .await?;
        rows.iter().map(lease_from_row).collect()
    }

    async fn expired_leases(&mut self, now_ms: i64, limit: usize) -> BackendResult<Vec<i64>> {
        let rows = self
            .query(
                "SELECT id FROM lease WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2",
                &[&now_ms, &sql_limit(limit)],
            )
            .await?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(Into::into))
            .collect()
    }

    async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
        // `lease <> 0` lets every plan use the partial index kv_lease.
        let rows = self
            .query(
                "SELECT key, value, create_revision, mod_revision, version, lease \
                 FROM kv WHERE lease = $1 AND lease <> 0 ORDER BY key",
                &[&id],
            )
            .await?;
        rows.iter().map(kv_from_row).collect()
    }
}

/// Forwards the read queries other than `revisions` to the transaction's `TxnConn`.
macro_rules! forward_reads {
    () => {
        async fn range(
            &mut self,
            range: &KeyRange,
            at: ReadAt,
            limit: usize,
            keys_only: bool,
        ) -> BackendResult<Vec<KeyValue>> {
            self.conn.range(range, at, limit, keys_only).await
        }

        async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
            self.conn.count(range, at).await
        }

        async fn log_entries(&mut self, after: i64, through: i64) -> BackendResult<Vec<LogEntry>> {
            self.conn.log_entries(after, through).await
        }

        async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
            self.conn.setting(name).await
        }

        async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
            self.conn.lease(id).await
        }

        async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
            self.conn.leases().await
        }

        async fn expired_leases(&mut self, now_ms: i64, limit: usize) -> BackendResult<Vec<i64>> {
            self.conn.expired_leases(now_ms, limit).await
        }

        async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
            self.conn.lease_keys(id).await
        }
    };
}

impl ReadTxn for PostgresRead {
    async fn revisions(&mut self) -> BackendResult<Revisions> {
        self.conn.revisions().await
    }

    forward_reads!();
}

impl ReadTxn for PostgresWrite {
    /// No query: this transaction holds the meta row lock, so no one else
    /// can have changed the counters since it locked or set them.
    async fn revisions(&mut self) -> BackendResult<Revisions> {
        Ok(self.revisions)
    }

    forward_reads!();
}

impl WriteTxn for PostgresWrite {
    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let kv = &entry.kv;
        // One statement, one round trip: the log row and the kv change.
        let sql = if entry.deleted {
            "WITH logged AS (\
               INSERT INTO log (revision, sub, key, value, create_revision, version, lease, deleted) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, TRUE)\
             ) DELETE FROM kv WHERE key = $3"
        } else {
            "WITH logged AS (\
               INSERT INTO log (revision, sub, key, value, create_revision, version, lease, deleted) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, FALSE)\
             ) INSERT INTO kv (key, value, create_revision, mod_revision, version, lease) \
             VALUES ($3, $4, $5, $1, $6, $7) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, \
               create_revision = EXCLUDED.create_revision, mod_revision = EXCLUDED.mod_revision, \
               version = EXCLUDED.version, lease = EXCLUDED.lease"
        };
        self.conn
            .query(
                sql,
                &[
                    &kv.mod_revision,
                    &entry.sub,
                    &kv.key,
                    &kv.value,
                    &kv.create_revision,
                    &kv.version,
                    &kv.lease,
                ],
            )
            .await?;
        Ok(())
    }

    /// Also NOTIFYs the other instances; Postgres delivers it at commit.
    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        let payload = revisions.current.to_string();
        self.conn
            .query(
                "WITH updated AS (\
                   UPDATE meta SET revision = $1, compact_revision = $2, compacted_through = $3 \
                   WHERE id = 1\
                 ) SELECT pg_notify('cetera', $4)",
                &[
                    &revisions.current,
                    &revisions.compact,
                    &revisions.compacted_through,
                    &payload,
                ],
            )
            .await?;
        self.revisions = revisions;
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.conn
            .query(
                "DELETE FROM log WHERE key = $1 AND (revision, sub) < ($2, $3)",
                &[&entry.kv.key, &entry.kv.mod_revision, &entry.sub],
            )
            .await?;
        Ok(())
    }

    async fn remove_entry(&mut self, entry: &LogEntry) -> BackendResult<()> {
        self.conn
            .query(
                "DELETE FROM log WHERE revision = $1 AND sub = $2",
                &[&entry.kv.mod_revision, &entry.sub],
            )
            .await?;
        Ok(())
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        self.conn
            .query(
                "INSERT INTO settings (name, value) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                &[&name, &value],
            )
            .await?;
        Ok(())
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        self.conn
            .query(
                "INSERT INTO lease (id, ttl, expires_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET ttl = EXCLUDED.ttl, expires_at = EXCLUDED.expires_at",
                &[&lease.id, &lease.ttl, &lease.expires_at],
            )
            .await?;
        Ok(())
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        self.conn
            .query("DELETE FROM lease WHERE id = $1", &[&id])
            .await?;
        Ok(())
    }

    async fn commit(mut self) -> BackendResult<()> {
        if self.conn.failed {
            // Dropping self rolls back.
            bail!("the transaction was aborted by an earlier error");
        }
        let client = self
            .conn
            .client
            .take()
            .expect("connection present until the transaction ends");
        match client.batch_execute("COMMIT").await {
            Ok(()) => Ok(()), // The connection goes back to the pool.
            Err(error) => {
                // Whether it committed is unknown; do not reuse the connection.
                drop(Object::take(client));
                Err(db_error(&error).context("COMMIT failed"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::conformance::TestStore;
    use crate::store::Store;

    /// The server the tests create their databases on.
    fn base_url() -> String {
        std::env::var("CETERA_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/".to_string())
    }

    /// `base` naming database `name` instead of its own, options kept.
    fn url_for(base: &str, name: &str) -> String {
        let (base, query) = match base.split_once('?') {
            Some((base, query)) => (base, format!("?{query}")),
            None => (base, String::new()),
        };
        let (scheme, rest) = base.split_once("://").expect("a URL");
        let authority = rest.split('/').next().unwrap_or_default();
        format!("{scheme}://{authority}/{name}{query}")
    }

    /// A database of its own for one test; dropped (with FORCE, ending the
    /// connections still open on it) when the guard goes.
    struct TestDatabase {
        url: String,
        admin_url: String,
        name: String,
    }

    impl TestDatabase {
        fn new() -> Self {
            let name = format!("cetera_test_{:016x}", rand::random::<u64>());
            let base = base_url();
            TestDatabase {
                url: url_for(&base, &name),
                admin_url: url_for(&base, "postgres"),
                name,
            }
        }

        /// A backend on this database: `Postgres::connect` creates it.
        async fn connect(&self) -> Postgres {
            match Postgres::connect_within(
                &self.url,
                &DatastoreTls::default(),
                Duration::from_secs(3),
            )
            .await
            {
                Ok(backend) => backend,
                Err(error) if std::env::var("CI").as_deref() == Ok("true") => {
                    panic!("CI=true and the Postgres tests cannot reach their server: {error:#}")
                }
                Err(error) => panic!(
                    "the Postgres tests need a server: {error:#}\n\
                     Start one with trust authentication, e.g.\n  \
                     docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17\n\
                     or point CETERA_TEST_POSTGRES_URL at one (now {})",
                    base_url()
                ),
            }
        }
    }

    impl Drop for TestDatabase {
        fn drop(&mut self) {
            // Drop runs inside the test's runtime, which cannot block on a
            // future: use a thread with a runtime of its own.
            let admin_url = self.admin_url.clone();
            let sql = format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_identifier(&self.name)
            );
            let dropped = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async {
                    let config: Config = admin_url.parse()?;
                    let (client, connection) = config.connect(NoTls).await?;
                    tokio::spawn(connection);
                    client.batch_execute(&sql).await?;
                    anyhow::Ok(())
                })
            })
            .join();
            if !matches!(dropped, Ok(Ok(()))) {
                eprintln!("warning: cannot drop test database {}", self.name);
            }
        }
    }

    async fn open() -> TestStore<Postgres> {
        let database = TestDatabase::new();
        let backend = database.connect().await;
        TestStore {
            store: Store::open(backend).await.unwrap(),
            guard: Box::new(database),
        }
    }

    crate::conformance_suite!(open);

    fn kv(key: &[u8], value: &[u8], revision: i64) -> LogEntry {
        LogEntry {
            kv: KeyValue {
                key: key.to_vec(),
                value: value.to_vec(),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
                lease: 0,
            },
            sub: 0,
            deleted: false,
        }
    }

    fn from(start: &[u8]) -> KeyRange {
        KeyRange {
            start: start.to_vec(),
            end: None,
        }
    }

    fn keys(kvs: &[KeyValue]) -> Vec<Vec<u8>> {
        kvs.iter().map(|kv| kv.key.clone()).collect()
    }

    async fn commit_entries(backend: &Postgres, revision: i64, entries: &[LogEntry]) {
        let mut txn = backend.write().await.unwrap();
        let mut revs = txn.revisions().await.unwrap();
        for (sub, entry) in entries.iter().enumerate() {
            let mut entry = entry.clone();
            entry.sub = sub as i64;
            entry.kv.mod_revision = revision;
            txn.append(&entry).await.unwrap();
        }
        revs.current = revision;
        txn.set_revisions(revs).await.unwrap();
        txn.commit().await.unwrap();
    }

    #[tokio::test]
    async fn keys_compare_bytewise_and_history_drops_deletions() {
        let database = TestDatabase::new();
        let backend = database.connect().await;
        let all: Vec<&[u8]> = vec![b"\0", b"\x7f", b"\x80", b"\xff", b"\xff\0", b"a"];
        let entries: Vec<LogEntry> = all.iter().map(|k| kv(k, b"v", 2)).collect();
        commit_entries(&backend, 2, &entries).await;
        let mut gone = kv(b"\x80", b"", 3);
        gone.deleted = true;
        commit_entries(&backend, 3, &[gone]).await;

        let mut txn = backend.read().await.unwrap();
        let current = txn
            .range(&from(b"\x7f"), ReadAt::Current, 0, false)
            .await
            .unwrap();
        assert_eq!(
            keys(&current),
            vec![b"\x7f".to_vec(), b"\xff".to_vec(), b"\xff\0".to_vec()]
        );
        let at2 = txn
            .range(&from(b"\x7f"), ReadAt::Revision(2), 0, false)
            .await
            .unwrap();
        assert_eq!(keys(&at2).len(), 4);
        assert_eq!(at2[1].key, b"\x80");
        let bounded = KeyRange {
            start: b"\x7f".to_vec(),
            end: Some(b"\xff".to_vec()),
        };
        let at3 = txn
            .range(&bounded, ReadAt::Revision(3), 0, true)
            .await
            .unwrap();
        assert_eq!(keys(&at3), vec![b"\x7f".to_vec()]);
        assert!(at3[0].value.is_empty(), "keys_only leaves values out");
        let limited = txn
            .range(&from(b""), ReadAt::Revision(2), 2, false)
            .await
            .unwrap();
        assert_eq!(keys(&limited), vec![b"\0".to_vec(), b"a".to_vec()]);
        assert_eq!(limited[0].value, b"v");
        assert_eq!(txn.count(&from(b""), ReadAt::Revision(2)).await.unwrap(), 6);
        assert_eq!(txn.count(&from(b""), ReadAt::Revision(3)).await.unwrap(), 5);
        assert_eq!(txn.count(&bounded, ReadAt::Current).await.unwrap(), 1);
        assert_eq!(txn.count(&from(b"\xff"), ReadAt::Current).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn reads_see_one_snapshot_and_unfinished_writes_roll_back() {
        let database = TestDatabase::new();
        let backend = database.connect().await;
        let mut snapshot = backend.read().await.unwrap();
        assert_eq!(snapshot.revisions().await.unwrap().current, 1);
        commit_entries(&backend, 2, &[kv(b"a", b"1", 2)]).await;
        assert!(
            snapshot
                .range(&from(b""), ReadAt::Current, 0, false)
                .await
                .unwrap()
                .is_empty()
        );

        // A write dropped without commit leaves nothing behind, and its
        // connection is reusable.
        for _ in 0..POOL_SIZE + 2 {
            let mut txn = backend.write().await.unwrap();
            txn.append(&kv(b"b", b"1", 3)).await.unwrap();
        }
        let mut txn = backend.read().await.unwrap();
        assert_eq!(txn.revisions().await.unwrap().current, 2);
        let live = txn
            .range(&from(b""), ReadAt::Current, 0, false)
            .await
            .unwrap();
        assert_eq!(keys(&live), vec![b"a".to_vec()]);
        let size = backend.size().await.unwrap();
        assert!(size.total >= size.in_use && size.in_use > 0, "{size:?}");
    }

    #[tokio::test]
    async fn instances_on_one_database_wake_each_other_and_share_locks() {
        let database = TestDatabase::new();
        let first = database.connect().await;
        let second = database.connect().await;
        let quiet = tokio::time::timeout(Duration::from_millis(300), first.changed()).await;
        assert!(quiet.is_err(), "no commit, no wake-up");
        commit_entries(&second, 2, &[kv(b"a", b"1", 2)]).await;
        tokio::time::timeout(Duration::from_secs(5), first.changed())
            .await
            .expect("a commit on one instance wakes the other");

        assert!(first.hold_lock("expiry").await.unwrap());
        assert!(first.hold_lock("expiry").await.unwrap());
        assert!(!second.hold_lock("expiry").await.unwrap());
        assert!(second.hold_lock("compaction").await.unwrap());
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !second.hold_lock("expiry").await.unwrap() {
            assert!(Instant::now() < deadline, "the lock dies with its holder");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn instances_starting_together_create_and_migrate_once() {
        let database = TestDatabase::new();
        let (first, second) = tokio::join!(database.connect(), database.connect());
        let mut txn = first.read().await.unwrap();
        assert_eq!(txn.revisions().await.unwrap().current, 1);
        drop((txn, second));
    }

    #[tokio::test]
    async fn an_unreachable_server_is_named_in_the_error() {
        let url = "postgres://someone:secret@127.0.0.1:1/mydb";
        let error = Postgres::connect_within(url, &DatastoreTls::default(), Duration::from_secs(1))
            .await
            .err()
            .expect("nothing listens on port 1");
        let message = format!("{error:#}");
        for part in ["127.0.0.1:1", "\"mydb\"", "\"someone\"", "refused"] {
            assert!(message.contains(part), "{message}");
        }
        assert!(!message.contains("secret"), "{message}");
    }

    /// Whether `backend`'s pooled connections use TLS.
    async fn encrypted(backend: &Postgres) -> bool {
        let client = backend.pooled().await.unwrap();
        let row = client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        row.get(0)
    }

    #[tokio::test]
    async fn sslmode_require_encrypts_when_the_server_has_tls() {
        let database = TestDatabase::new();
        let plain = database.connect().await;
        assert!(!encrypted(&plain).await, "no sslmode, no files: plain text");
        let client = plain.pooled().await.unwrap();
        let ssl: String = client.query_one("SHOW ssl", &[]).await.unwrap().get(0);
        if ssl != "on" {
            eprintln!("skipped: the test server has no TLS");
            return;
        }
        let separator = if database.url.contains('?') { '&' } else { '?' };
        let url = format!("{}{separator}sslmode=require", database.url);
        let tls = Postgres::connect(&url, &DatastoreTls::default())
            .await
            .unwrap();
        assert!(encrypted(&tls).await);
        let mut txn = tls.read().await.unwrap();
        assert_eq!(txn.revisions().await.unwrap().current, 1);
    }

    /// Ends the sessions on `backend`'s database that `filter` (a WHERE
    /// clause on pg_stat_activity or pg_locks) picks, as a failover would.
    async fn terminate(backend: &Postgres, sql: &str) -> usize {
        let client = backend.pooled().await.unwrap();
        let rows = client.query(sql, &[]).await.unwrap();
        let pids: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
        for pid in &pids {
            client
                .execute("SELECT pg_terminate_backend($1)", &[pid])
                .await
                .unwrap();
        }
        pids.len()
    }

    async fn changed_within(backend: &Postgres, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), backend.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn dead_listen_and_lock_sessions_are_replaced() {
        let database = TestDatabase::new();
        let first = database.connect().await;
        let second = database.connect().await;
        let listeners = "SELECT pid FROM pg_stat_activity                          WHERE datname = current_database() AND query = 'LISTEN cetera'";
        assert_eq!(terminate(&first, listeners).await, 2);
        assert!(
            changed_within(&first, 5000).await,
            "a new listener wakes its waiters once"
        );
        while changed_within(&first, 200).await {}
        commit_entries(&second, 2, &[kv(b"a", b"1", 2)]).await;
        assert!(
            changed_within(&first, 5000).await,
            "the new listener hears commits"
        );

        assert!(first.hold_lock("expiry").await.unwrap());
        let holders = "SELECT pid FROM pg_locks WHERE locktype = 'advisory'                        AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
        assert_eq!(terminate(&second, holders).await, 1);
        assert!(
            second.hold_lock("expiry").await.unwrap(),
            "the lock died with its session"
        );
        assert!(
            !first.hold_lock("expiry").await.unwrap(),
            "and the first instance knows it"
        );
    }

    #[test]
    fn urls_default_to_the_kubernetes_database_and_keep_their_options() {
        let none = DatastoreTls::default();
        let target = Target::parse("postgres://u:secret@db.example:6432", &none).unwrap();
        assert_eq!(target.config.get_dbname(), Some(DEFAULT_DATABASE));
        assert_eq!(target.config.get_user(), Some("u"));
        assert_eq!(target.config.get_ports(), &[6432]);
        let target = Target::parse("postgres://db.example/", &none).unwrap();
        assert_eq!(target.config.get_dbname(), Some(DEFAULT_DATABASE));

        let target = Target::parse(
            "postgresql://u@db.example/k3s?sslmode=disable&connect_timeout=5&application_name=x",
            &none,
        )
        .unwrap();
        assert_eq!(target.config.get_dbname(), Some("k3s"));
        assert_eq!(
            target.config.get_connect_timeout(),
            Some(&Duration::from_secs(5))
        );
        assert_eq!(target.config.get_application_name(), Some("x"));
        assert_eq!(target.ssl.mode, Some(SslMode::Disable));
        assert_eq!(target.ssl.plan().unwrap(), None);

        let target = Target::parse("postgres:///k3s?host=/var/run/postgresql", &none).unwrap();
        assert_eq!(
            target.config.get_hosts(),
            &[tokio_postgres::config::Host::Unix(
                "/var/run/postgresql".into()
            )]
        );
        let target = Target::parse("postgres://%2Ftmp/k3s", &none).unwrap();
        assert_eq!(
            target.config.get_hosts(),
            &[tokio_postgres::config::Host::Unix("/tmp".into())]
        );
        // No host at all: localhost, as kine.
        let target = Target::parse("postgres:///k3s", &none).unwrap();
        assert_eq!(
            target.config.get_hosts(),
            &[tokio_postgres::config::Host::Tcp("localhost".into())]
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        let none = DatastoreTls::default();
        let error = Target::parse("postgres://u:hunter2@h/db?bogus=1", &none)
            .unwrap_err()
            .to_string();
        assert!(error.contains("bogus"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.contains("u:***@h/db"), "{error}");
        let error = Target::parse("postgres://h/db?sslmode=sometimes", &none)
            .unwrap_err()
            .to_string();
        assert!(error.contains("sometimes"), "{error}");
        assert!(Target::parse("mysql://h/db", &none).is_err());
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://u:p@ss@h?x=1"), "postgres://u:***@h?x=1");
    }

    #[test]
    fn tls_follows_sslmode_and_the_files() {
        let plan = |url: &str, files: &DatastoreTls| Target::parse(url, files).unwrap().ssl.plan();
        let none = DatastoreTls::default();
        let ca = DatastoreTls {
            ca_file: Some("/ca.pem".into()),
            ..Default::default()
        };
        assert_eq!(plan("postgres://h/db", &none).unwrap(), None);
        assert_eq!(plan("postgres://h/db?sslmode=prefer", &none).unwrap(), None);
        let require = plan("postgres://h/db?sslmode=require", &none)
            .unwrap()
            .unwrap();
        assert_eq!((require.required, require.verify), (true, Verify::Nothing));
        let with_ca = plan("postgres://h/db?sslmode=require", &ca)
            .unwrap()
            .unwrap();
        assert_eq!(with_ca.verify, Verify::Chain);
        // Files and no sslmode: verify-full, as kine.
        let files_only = plan("postgres://h/db", &ca).unwrap().unwrap();
        assert_eq!(
            (files_only.required, files_only.verify),
            (true, Verify::Full)
        );
        assert_eq!(files_only.ca, Some("/ca.pem".into()));
        // The URL's files win over the flags.
        let url_ca = plan(
            "postgres://h/db?sslmode=verify-ca&sslrootcert=%2Fother.pem",
            &ca,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (url_ca.verify, url_ca.ca),
            (Verify::Chain, Some("/other.pem".into()))
        );
        assert_eq!(plan("postgres://h/db?sslmode=disable", &ca).unwrap(), None);
        let half = DatastoreTls {
            cert_file: Some("/c.pem".into()),
            ..Default::default()
        };
        assert!(plan("postgres://h/db", &half).is_err());
        // A CA file that is not there is reported by name.
        let error = Connector::new(Target::parse("postgres://h/db", &ca).unwrap())
            .err()
            .unwrap();
        assert!(format!("{error:#}").contains("/ca.pem"), "{error:#}");
    }

    #[test]
    fn lock_keys_are_stable() {
        assert_eq!(lock_key("expiry"), lock_key("expiry"));
        assert_ne!(lock_key("expiry"), lock_key("compaction"));
        // FNV-1a of "cetera:" alone, fixed forever: instances of different
        // versions must agree on every key.
        assert_eq!(lock_key(""), 0x879c_9279_c629_e1dbu64 as i64);
    }

    #[test]
    fn statements_number_their_parameters_in_order() {
        let at = ReadAt::Revision(5);
        assert!(range_sql(ReadAt::Current, false, false).contains("LIMIT $2"));
        assert!(range_sql(ReadAt::Current, true, false).contains("key < $2"));
        assert!(range_sql(ReadAt::Current, true, true).contains("LIMIT $3"));
        assert!(range_sql(at, false, false).contains("revision <= $2"));
        assert!(range_sql(at, true, false).contains("revision <= $3"));
        assert!(range_sql(at, true, true).contains("LIMIT $4"));
        assert!(!range_sql(at, false, true).contains("key <"));
        assert!(count_sql(at, true).contains("revision <= $3"));
        assert!(!count_sql(ReadAt::Current, false).contains('<'));
    }
}
