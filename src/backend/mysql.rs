//! The MySQL/MariaDB backend (mysql_async).
//!
//! Reads run on pooled connections, each in a `START TRANSACTION WITH
//! CONSISTENT SNAPSHOT, READ ONLY` at REPEATABLE READ, so the counters and the
//! data a read sees come from one snapshot. A write transaction first locks
//! the `meta` row (`SELECT ... FOR UPDATE`): several cetera instances on one
//! database therefore write one after another and allocate dense revisions in
//! commit order. Statements are prepared once per connection and cached by
//! mysql_async; transactions are begun and ended with plain statements, and a
//! transaction dropped before it ends is rolled back before its connection is
//! reused.
//!
//! Endpoints come in two spellings: mysql_async's URL
//! (`mysql://user:pass@host:3306/db?options`) and kine's Go driver DSN
//! (`mysql://user:pass@tcp(host:3306)/db`, `unix(/path.sock)`), see
//! [`Endpoint::parse`].

use std::borrow::Cow;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use mysql_async::prelude::{FromRow, Queryable};
use mysql_async::{
    ClientIdentity, Conn, DriverError, IoError, Opts, OptsBuilder, Params, Pool, Row, SslOpts,
    Value, from_row_opt,
};

use super::{
    Backend, BackendResult, DatabaseSize, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn, Revisions,
    WriteTxn,
};
use crate::config::DatastoreTls;
use crate::proto::mvccpb::KeyValue;

mod migrations {
    refinery::embed_migrations!("migrations/mysql");
}

/// Longest key the schema stores, in bytes (`VARBINARY(3056)`: with the
/// revision and sub columns it fills InnoDB's 3072-byte index limit; see
/// migrations/mysql/V1__initial.sql).
pub const MAX_KEY_BYTES: usize = 3056;

/// The database used when the endpoint names none, as kine does.
pub const DEFAULT_DATABASE: &str = "kubernetes";

/// How often [`Backend::changed`] reports that another instance may have
/// written: MySQL has no notifications, so shared databases are polled.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How long `connect` keeps trying to reach a server that refuses or drops
/// connections (it may still be starting).
const CONNECT_RETRY_FOR: Duration = Duration::from_secs(30);

/// One connection attempt may take this long (mysql_async has no connect
/// timeout of its own, and a black-holed address would hang for minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Prepared statements kept per connection; the backend uses about 30, and
/// mysql_async's default cache of 32 would keep evicting them.
const STATEMENT_CACHE: usize = 64;

/// Statements run on every new connection (and again after a reset): the
/// isolation level `read()` relies on, whatever the server's default, and
/// strict mode, so that nothing (a too long key above all) is ever silently
/// truncated.
const SESSION_SETUP: [&str; 2] = [
    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'",
];

/// A store in a MySQL or MariaDB database.
pub struct Mysql {
    pool: Pool,
    /// Options of the pool's connections, for the dedicated lock connection.
    opts: Opts,
    database: String,
    poll_interval: Duration,
    /// The connection holding this instance's named locks (`GET_LOCK` locks
    /// belong to a session, so they need one that is never pooled or reset).
    lock_conn: tokio::sync::Mutex<Option<Conn>>,
}

impl Mysql {
    /// Connects to the database named by `url`, creating it and its schema if
    /// needed. `url` is a `mysql://` URL or a Go-style DSN (see
    /// [`Endpoint::parse`]); `tls` files, when given, turn TLS on.
    ///
    /// A server that refuses connections is retried for up to 30 s, as it
    /// may still be starting.
    pub async fn connect(url: &str, tls: &DatastoreTls) -> anyhow::Result<Self> {
        Self::connect_within(url, tls, CONNECT_RETRY_FOR).await
    }

    async fn connect_within(
        url: &str,
        tls: &DatastoreTls,
        retry_for: Duration,
    ) -> anyhow::Result<Self> {
        let endpoint = Endpoint::parse(url)?;
        let where_ = endpoint.describe();
        let ssl = ssl_opts(&endpoint, tls)?;
        let given = Opts::from(endpoint.opts.clone());
        let base = endpoint
            .opts
            .clone()
            .setup(SESSION_SETUP.to_vec())
            .stmt_cache_size(STATEMENT_CACHE.max(given.stmt_cache_size()))
            // Transactions are ended by this module, so the pool need not
            // reset connections; a reset would also drop their prepared statements.
            .pool_opts(given.pool_opts().clone().with_reset_connection(false));

        // First reach the server without naming the database, which may not exist yet.
        let (mut conn, ssl) = connect_server(base.clone(), ssl, &where_, retry_for).await?;
        let base = base.ssl_opts(ssl);
        let create = format!(
            "CREATE DATABASE IF NOT EXISTS {}",
            quote_ident(&endpoint.database)
        );
        if let Err(error) = conn.query_drop(&create).await {
            // A user without the CREATE privilege may still own an existing database.
            tracing::warn!(
                database = %endpoint.database,
                "cannot create the database, assuming it exists: {error}"
            );
        }
        let _ = conn.disconnect().await;

        let opts = Opts::from(base.db_name(Some(endpoint.database.clone())));
        let pool = Pool::new(opts.clone());
        migrate(&pool, &opts, &endpoint.database)
            .await
            .with_context(|| format!("cannot set up database {} on {where_}", endpoint.database))?;
        Ok(Mysql {
            pool,
            opts,
            database: endpoint.database,
            poll_interval: DEFAULT_POLL_INTERVAL,
            lock_conn: tokio::sync::Mutex::new(None),
        })
    }

    /// Sets how often [`Backend::changed`] resolves (default 100 ms).
    pub fn set_poll_interval(&mut self, interval: Duration) {
        self.poll_interval = interval;
    }

    /// The name of the database holding the store.
    pub fn database(&self) -> &str {
        &self.database
    }

    async fn conn(&self) -> BackendResult<Conn> {
        self.pool
            .get_conn()
            .await
            .map_err(db_error)
            .context("cannot get a MySQL connection")
    }

    /// A pooled connection with a transaction begun by `statement`.
    async fn begin(&self, statement: &str) -> BackendResult<Session> {
        // The pool checks a connection's socket before handing it out, but a
        // server restart can still leave a dead one to be found on first
        // use; nothing has happened yet, so take another.
        let mut attempts = 0;
        loop {
            let mut conn = self.conn().await?;
            match conn.query_drop(statement).await {
                Ok(()) => {
                    return Ok(Session {
                        conn: Some(conn),
                        open: true,
                    });
                }
                Err(error) if error.is_fatal() && attempts < 3 => attempts += 1,
                Err(error) => return Err(db_error(error).context(format!("MySQL: {statement}"))),
            }
        }
    }
}

/// Connects to the server, retrying connection failures until `retry_for`
/// has passed. Returns the connection and the TLS options that worked (a
/// `tls=preferred` endpoint drops TLS if the server has none).
async fn connect_server(
    opts: OptsBuilder,
    mut ssl: Option<Ssl>,
    where_: &str,
    retry_for: Duration,
) -> anyhow::Result<(Conn, Option<SslOpts>)> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(250);
    loop {
        let attempt = tokio::time::timeout(
            CONNECT_TIMEOUT,
            Conn::new(opts.clone().ssl_opts(ssl.clone().map(|s| s.opts))),
        )
        .await;
        let error = match attempt {
            Ok(Ok(conn)) => return Ok((conn, ssl.map(|s| s.opts))),
            Ok(Err(mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer)))
                if ssl.as_ref().is_some_and(|s| s.optional) =>
            {
                tracing::info!("{where_} offers no TLS; tls=preferred connects without it");
                ssl = None;
                continue;
            }
            Ok(Err(error)) if !retryable(&error) => {
                return Err(db_error(error).context(format!("cannot connect to MySQL at {where_}")));
            }
            Ok(Err(error)) => db_error(error),
            Err(_) => anyhow!("no answer within {CONNECT_TIMEOUT:?}"),
        };
        if started.elapsed() + delay > retry_for {
            return Err(error.context(format!(
                "cannot connect to MySQL at {where_} (gave up after {:.0?})",
                started.elapsed()
            )));
        }
        tracing::warn!("cannot connect to MySQL at {where_}, retrying in {delay:?}: {error:#}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(4));
    }
}

/// A mysql_async error as one message. Its own Display repeats the message
/// of its source, which anyhow's `{:#}` would then print once more.
fn db_error(error: mysql_async::Error) -> anyhow::Error {
    match error {
        mysql_async::Error::Io(IoError::Io(e)) => anyhow!("{e}"),
        mysql_async::Error::Io(IoError::Tls(e)) => anyhow!("TLS: {e}"),
        mysql_async::Error::Server(e) => anyhow!("{e}"),
        mysql_async::Error::Driver(e) => anyhow!("{e}"),
        mysql_async::Error::Url(e) => anyhow!("{e}"),
        mysql_async::Error::Other(e) => anyhow!("{e}"),
    }
}

/// True for failures that may go away: the server is down, starting,
/// restarting, not yet resolvable or full. Wrong credentials, TLS or URL
/// problems are final.
fn retryable(error: &mysql_async::Error) -> bool {
    use std::io::ErrorKind;
    match error {
        // rustls reports a certificate it refuses as invalid data.
        mysql_async::Error::Io(IoError::Io(e)) => !matches!(
            e.kind(),
            ErrorKind::InvalidData
                | ErrorKind::InvalidInput
                | ErrorKind::PermissionDenied
                | ErrorKind::Unsupported
        ),
        mysql_async::Error::Driver(DriverError::ConnectionClosed) => true,
        // Too many connections, server shutdown in progress.
        mysql_async::Error::Server(e) => matches!(e.code, 1040 | 1053),
        _ => false,
    }
}

/// Applies the migrations, one instance at a time.
async fn migrate(pool: &Pool, opts: &Opts, database: &str) -> anyhow::Result<()> {
    // Instances starting together on a new database would race to create the
    // same tables; a named lock (released when this connection closes) makes
    // the others wait and then find the schema in place.
    let mut guard = Conn::new(opts.clone()).await.map_err(db_error)?;
    let name = lock_name(database, "migrations");
    let got: Option<Option<i64>> = guard
        .exec_first("SELECT GET_LOCK(?, 120)", (name.as_str(),))
        .await
        .map_err(db_error)?;
    if got.flatten() != Some(1) {
        bail!("another instance held the migration lock {name} for 2 minutes");
    }
    let mut pool = pool.clone();
    let report = migrations::migrations::runner().run_async(&mut pool).await;
    let _ = guard.disconnect().await;
    let report = report.context("cannot apply MySQL migrations")?;
    for migration in report.applied_migrations() {
        tracing::info!(database, "applied migration {migration}");
    }
    Ok(())
}

/// The server-wide name of lock `name` of the store in `database`. MySQL
/// limits lock names to 64 characters, so long ones are hashed (FNV-1a, which
/// every cetera version computes alike).
fn lock_name(database: &str, name: &str) -> String {
    let full = format!("cetera/{database}/{name}");
    if full.chars().count() <= 64 {
        return full;
    }
    let hash = full.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("cetera/{hash:016x}")
}

/// `name` as a quoted MySQL identifier.
fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

// ---------------------------------------------------------------------------
// Endpoints

/// Where and how to reach the server, parsed from an endpoint.
#[derive(Clone)]
pub struct Endpoint {
    /// Address, credentials and connection options; no database.
    opts: OptsBuilder,
    /// The database holding the store.
    database: String,
    /// TLS as the endpoint asks for it (`tls=` parameter).
    tls: TlsParam,
}

/// The `tls` parameter of an endpoint, as kine and the Go driver read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum TlsParam {
    /// Not given: TLS only if certificate files are given (or `require_ssl`).
    #[default]
    Unset,
    /// `tls=false`.
    Off,
    /// `tls=true`: TLS, verifying the server.
    Verify,
    /// `tls=skip-verify`: TLS without checking the server's certificate.
    SkipVerify,
    /// `tls=preferred`: TLS without verification if the server offers it.
    Preferred,
    /// `tls=custom`: TLS with the `--datastore-*file` files (kine adds this).
    Custom,
}

impl TlsParam {
    fn parse(value: &str) -> anyhow::Result<Self> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "true" | "1" => TlsParam::Verify,
            "false" | "0" => TlsParam::Off,
            "skip-verify" => TlsParam::SkipVerify,
            "preferred" => TlsParam::Preferred,
            "custom" => TlsParam::Custom,
            _ => {
                bail!("unknown tls={value}; expected true, false, skip-verify, preferred or custom")
            }
        })
    }
}

/// A Go-driver DSN taken apart (`[user[:pass]@][net[(addr)]]/db[?params]`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct GoDsn {
    user: Option<String>,
    pass: Option<String>,
    address: Address,
    database: Option<String>,
    params: Vec<(String, String)>,
}

/// A server address.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Address {
    /// Host name or IP address, and port.
    Tcp(String, u16),
    /// Path of a unix socket.
    Unix(String),
}

/// kine's endpoint when none is given: root over the usual socket.
const KINE_DEFAULT_DSN: &str = "root@unix(/var/run/mysqld/mysqld.sock)/";

/// Go DSN parameters that change nothing here (the Go driver's own
/// settings, which kine users tend to carry along).
const IGNORED_GO_PARAMS: &[&str] = &[
    "allowAllFiles",
    "allowCleartextPasswords",
    "allowNativePasswords",
    "allowOldPasswords",
    "charset",
    "checkConnLiveness",
    "clientFoundRows",
    "collation",
    "columnsWithAlias",
    "connectionAttributes",
    "interpolateParams",
    "loc",
    "maxAllowedPacket",
    "multiStatements",
    "parseTime",
    "readTimeout",
    "rejectReadOnly",
    "serverPubKey",
    "timeout",
    "writeTimeout",
];

impl GoDsn {
    /// Parses a DSN the way go-sql-driver/mysql's `ParseDSN` does: the
    /// database follows the last '/', the credentials end at the last '@'
    /// before it, the password starts at the first ':' (so it may hold '@',
    /// ':' and '/'); the password is taken verbatim, the database and the
    /// parameter values are percent-decoded.
    fn parse(dsn: &str) -> anyhow::Result<Self> {
        let slash = dsn.rfind('/').ok_or_else(|| {
            anyhow!("no '/' before the database name (expected [user[:password]@]tcp(host:port)/database)")
        })?;
        let (left, right) = (&dsn[..slash], &dsn[slash + 1..]);
        let (credentials, server) = match left.rfind('@') {
            Some(at) => (Some(&left[..at]), &left[at + 1..]),
            None => (None, left),
        };
        let (user, pass) = match credentials {
            None => (None, None),
            Some(c) => match c.split_once(':') {
                Some((user, pass)) => (Some(user.to_string()), Some(pass.to_string())),
                None => (Some(c.to_string()), None),
            },
        };
        let (net, addr) = match server.find('(') {
            Some(open) => {
                let Some(addr) = server[open + 1..].strip_suffix(')') else {
                    bail!(
                        "the address in {server:?} must be enclosed in parentheses: tcp(host:port)"
                    );
                };
                (&server[..open], addr)
            }
            None => (server, ""),
        };
        let address = match net {
            "" | "tcp" | "tcp4" | "tcp6" if addr.is_empty() => {
                Address::Tcp("127.0.0.1".to_string(), 3306)
            }
            "" | "tcp" | "tcp4" | "tcp6" => parse_host_port(addr)?,
            "unix" if addr.is_empty() => Address::Unix("/tmp/mysql.sock".to_string()),
            "unix" => Address::Unix(addr.to_string()),
            other => bail!("unsupported network {other:?}; expected tcp(host:port) or unix(/path)"),
        };
        let (database, query) = match right.split_once('?') {
            Some((database, query)) => (database, Some(query)),
            None => (right, None),
        };
        let database = percent_encoding::percent_decode_str(database)
            .decode_utf8()
            .context("the database name is not valid UTF-8")?;
        let mut params = Vec::new();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8()
                .with_context(|| format!("the value of {name} is not valid UTF-8"))?
                .into_owned();
            params.push((name.to_string(), value));
        }
        Ok(GoDsn {
            user: user.filter(|u| !u.is_empty()),
            pass,
            address,
            database: Some(database.into_owned()).filter(|d| !d.is_empty()),
            params,
        })
    }
}

/// `host:port`, `host`, `[v6]:port` or `[v6]`.
fn parse_host_port(addr: &str) -> anyhow::Result<Address> {
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| anyhow!("unclosed '[' in address {addr:?}"))?;
        (host, after.strip_prefix(':'))
    } else {
        match addr.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (addr, None),
        }
    };
    let port = match port {
        None => 3306,
        Some(port) => port
            .parse()
            .map_err(|_| anyhow!("invalid port {port:?} in address {addr:?}"))?,
    };
    if host.is_empty() {
        bail!("no host in address {addr:?}");
    }
    Ok(Address::Tcp(host.to_string(), port))
}

/// True if what follows `mysql://` is a Go DSN rather than a URL: the part
/// before the database is empty, ends with the credentials' '@', or names
/// the server as `net(addr)` (a URL's host cannot hold a '(').
fn is_go_dsn(rest: &str) -> bool {
    let left = rest.rfind('/').map_or(rest, |slash| &rest[..slash]);
    let server = left.rfind('@').map_or(left, |at| &left[at + 1..]);
    rest.is_empty() || left.is_empty() || server.is_empty() || server.contains('(')
}

impl Endpoint {
    /// Parses a `mysql://` endpoint in either spelling:
    ///
    /// - URL: `mysql://user:pass@host:3306/db?options`, user and password
    ///   percent-encoded, options as mysql_async reads them (`socket=`,
    ///   `require_ssl=`, `pool_max=`...) plus `tls=`;
    /// - Go DSN, as kine takes it: `mysql://user:pass@tcp(host:3306)/db`,
    ///   `mysql://user@unix(/run/mysqld/mysqld.sock)/db`, `mysql://user@/db`
    ///   (127.0.0.1:3306), with `tls=true|false|skip-verify|preferred|custom`
    ///   and the Go driver's other parameters (ignored); plain `mysql://` is
    ///   kine's default, root over /var/run/mysqld/mysqld.sock.
    ///
    /// Without a database the store lives in `kubernetes`, as with kine.
    pub fn parse(endpoint: &str) -> anyhow::Result<Self> {
        let endpoint = endpoint.trim();
        let Some(rest) = endpoint.strip_prefix("mysql://") else {
            bail!("not a MySQL endpoint (expected mysql://...)");
        };
        if is_go_dsn(rest) {
            let dsn = if rest.is_empty() {
                KINE_DEFAULT_DSN
            } else {
                rest
            };
            Self::from_go_dsn(dsn)
                .with_context(|| format!("invalid MySQL endpoint {}", redact(endpoint)))
        } else {
            Self::from_url(endpoint)
                .with_context(|| format!("invalid MySQL endpoint {}", redact(endpoint)))
        }
    }

    fn from_go_dsn(dsn: &str) -> anyhow::Result<Self> {
        let dsn = GoDsn::parse(dsn)?;
        let mut opts = OptsBuilder::default().user(dsn.user).pass(dsn.pass);
        opts = match dsn.address {
            Address::Tcp(host, port) => opts.ip_or_hostname(host).tcp_port(port),
            Address::Unix(path) => opts.socket(Some(path)),
        };
        let mut tls = TlsParam::Unset;
        for (name, value) in dsn.params {
            if name == "tls" {
                tls = TlsParam::parse(&value)?;
            } else if !IGNORED_GO_PARAMS.contains(&name.as_str()) {
                tracing::warn!("ignoring unknown MySQL endpoint parameter {name}");
            }
        }
        Ok(Endpoint {
            opts,
            database: dsn.database.unwrap_or_else(|| DEFAULT_DATABASE.to_string()),
            tls,
        })
    }

    fn from_url(url: &str) -> anyhow::Result<Self> {
        // mysql_async refuses parameters it does not know, so `tls` (kine's
        // spelling, also accepted here) is taken out first. The password is
        // percent-encoded in a URL, so the first '?' starts the query.
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut tls = TlsParam::Unset;
        let mut others = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("tls", value)) => {
                    tls = TlsParam::parse(
                        &percent_encoding::percent_decode_str(value).decode_utf8_lossy(),
                    )?;
                }
                _ => others.push(pair),
            }
        }
        let url = if others.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", others.join("&"))
        };
        let opts = Opts::from_url(&url)?;
        let database = opts
            .db_name()
            .map_or_else(|| DEFAULT_DATABASE.to_string(), str::to_string);
        Ok(Endpoint {
            opts: OptsBuilder::from_opts(opts).db_name(None::<String>),
            database,
            tls,
        })
    }

    /// The server and database, for messages (no password).
    fn describe(&self) -> String {
        let opts = Opts::from(self.opts.clone());
        let user = opts.user().unwrap_or("(no user)");
        match opts.socket() {
            Some(socket) => format!("unix:{socket} as {user}, database {}", self.database),
            None => format!(
                "{}:{} as {user}, database {}",
                opts.ip_or_hostname(),
                opts.tcp_port(),
                self.database
            ),
        }
    }
}

// By hand: mysql_async's options would print the password.
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("server", &self.describe())
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// `endpoint` with the password blanked out, for messages.
fn redact(endpoint: &str) -> Cow<'_, str> {
    let Some(rest) = endpoint.strip_prefix("mysql://") else {
        return Cow::Borrowed(endpoint);
    };
    let left = rest.rfind('/').map_or(rest, |slash| &rest[..slash]);
    match left
        .rfind('@')
        .and_then(|at| left[..at].find(':').map(|colon| (colon, at)))
    {
        Some((colon, at)) => Cow::Owned(format!("mysql://{}:***{}", &rest[..colon], &rest[at..])),
        None => Cow::Borrowed(endpoint),
    }
}

/// TLS options for the connection and whether the server may refuse TLS.
#[derive(Clone, Debug)]
struct Ssl {
    opts: SslOpts,
    /// `tls=preferred`: fall back to plain text if the server has no TLS.
    optional: bool,
}

/// Combines the endpoint's TLS request with the `--datastore-*file` files.
fn ssl_opts(endpoint: &Endpoint, files: &DatastoreTls) -> anyhow::Result<Option<Ssl>> {
    let have_files =
        files.ca_file.is_some() || files.cert_file.is_some() || files.key_file.is_some();
    let from_url = Opts::from(endpoint.opts.clone()).ssl_opts().cloned();
    let mut ssl = match endpoint.tls {
        TlsParam::Off if have_files => {
            bail!("the MySQL endpoint says tls=false but TLS certificate files are given")
        }
        TlsParam::Off => return Ok(None),
        TlsParam::Unset if !have_files && from_url.is_none() => return Ok(None),
        TlsParam::Custom if !have_files => bail!(
            "the MySQL endpoint says tls=custom but no --datastore-cafile, \
             --datastore-certfile or --datastore-keyfile is given"
        ),
        TlsParam::SkipVerify | TlsParam::Preferred => from_url
            .unwrap_or_default()
            .with_danger_accept_invalid_certs(true)
            .with_danger_skip_domain_validation(true),
        _ => from_url.unwrap_or_default(),
    };
    if let Some(ca) = &files.ca_file {
        check_readable(ca, "--datastore-cafile")?;
        // Like the Go driver with a custom CA: trust only that CA.
        ssl = ssl
            .with_root_certs(vec![ca.clone().into()])
            .with_disable_built_in_roots(true);
    }
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            check_readable(cert, "--datastore-certfile")?;
            check_readable(key, "--datastore-keyfile")?;
            ssl = ssl.with_client_identity(Some(ClientIdentity::new(
                cert.clone().into(),
                key.clone().into(),
            )));
        }
        (None, None) => {}
        _ => bail!("a client certificate needs both --datastore-certfile and --datastore-keyfile"),
    }
    Ok(Some(Ssl {
        opts: ssl,
        optional: endpoint.tls == TlsParam::Preferred && !have_files,
    }))
}

/// Fails early, naming the flag, rather than at every connection attempt.
fn check_readable(path: &Path, flag: &str) -> anyhow::Result<()> {
    std::fs::File::open(path)
        .map(|_| ())
        .with_context(|| format!("cannot read {flag} {}", path.display()))
}

// ---------------------------------------------------------------------------
// Transactions

/// A pooled connection with an open transaction. If it is dropped before the
/// transaction ends, the transaction is rolled back before the connection
/// goes back to the pool.
struct Session {
    conn: Option<Conn>,
    /// A transaction is open on `conn`.
    open: bool,
}

impl Session {
    fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("connection present until drop")
    }

    async fn end(&mut self, statement: &str) -> BackendResult<()> {
        self.conn()
            .query_drop(statement)
            .await
            .map_err(db_error)
            .with_context(|| format!("MySQL: {statement}"))?;
        self.open = false;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.open {
            return; // back to the pool as it is
        }
        // Ending the transaction takes a round trip, which Drop cannot wait
        // for: a task does it and then lets the connection go back to the
        // pool. Without a runtime, the pool's reset (COM_RESET_CONNECTION)
        // ends it instead, at the price of the connection's prepared statements.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if conn.query_drop("ROLLBACK").await.is_err() {
                        conn.reset_connection(true);
                    }
                });
            }
            Err(_) => conn.reset_connection(true),
        }
    }
}

/// A read transaction: a consistent snapshot on a pooled connection.
pub struct MysqlRead {
    session: Session,
}

/// A write transaction, holding the lock on the `meta` row until it ends.
pub struct MysqlWrite {
    session: Session,
    /// The counters as locked (and as last stored by this transaction).
    revisions: Option<Revisions>,
}

impl Backend for Mysql {
    fn max_key_bytes(&self) -> usize {
        MAX_KEY_BYTES
    }

    type Read = MysqlRead;
    type Write = MysqlWrite;

    async fn read(&self) -> BackendResult<MysqlRead> {
        let session = self
            .begin("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            .await?;
        Ok(MysqlRead { session })
    }

    async fn write(&self) -> BackendResult<MysqlWrite> {
        let session = self.begin("START TRANSACTION READ WRITE").await?;
        let mut txn = MysqlWrite {
            session,
            revisions: None,
        };
        // Lock the counters before anything else: InnoDB takes a REPEATABLE
        // READ snapshot at the first plain read, so every read of this
        // transaction then sees what the previous writer (of any instance) committed.
        txn.revisions = Some(query_revisions(txn.session.conn(), true).await?);
        Ok(txn)
    }

    async fn size(&self) -> BackendResult<DatabaseSize> {
        let mut conn = self.conn().await?;
        // MySQL 8 caches table statistics for a day by default; MariaDB has
        // no such setting and refuses it, which is fine.
        let _ = conn
            .query_drop("SET SESSION information_schema_stats_expiry = 0")
            .await;
        let rows: Vec<(i64,)> = select(
            &mut conn,
            "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) \
             FROM information_schema.TABLES WHERE table_schema = ?",
            (self.database.as_str(),),
        )
        .await?;
        // InnoDB reports no free space inside the pages it uses, so all of it counts as in use.
        let total = rows.first().map_or(0, |r| r.0);
        Ok(DatabaseSize {
            total,
            in_use: total,
        })
    }

    async fn changed(&self) {
        tokio::time::sleep(self.poll_interval).await;
    }

    async fn hold_lock(&self, name: &str) -> BackendResult<bool> {
        let lock = lock_name(&self.database, name);
        let mut slot = self.lock_conn.lock().await;
        // Ours already, or free and now taken. IF evaluates only one branch,
        // so a lock already held is not taken again (GET_LOCK nests).
        const HOLD: &str = "SELECT IF(IS_USED_LOCK(?) IS NULL, GET_LOCK(?, 0), \
                            IS_USED_LOCK(?) = CONNECTION_ID())";
        let mut first_try = true;
        loop {
            let conn = match slot.as_mut() {
                Some(conn) => conn,
                None => slot.insert(
                    Conn::new(self.opts.clone())
                        .await
                        .map_err(db_error)
                        .context("cannot open the MySQL lock connection")?,
                ),
            };
            let params = (lock.as_str(), lock.as_str(), lock.as_str());
            match conn.exec_first::<Option<i64>, _, _>(HOLD, params).await {
                Ok(held) => return Ok(held.flatten() == Some(1)),
                Err(error) if first_try && error.is_fatal() => {
                    // The session is gone and its locks with it: start a new
                    // one and try to take the lock again.
                    tracing::warn!("MySQL lock connection lost, reconnecting: {error}");
                    *slot = None;
                    first_try = false;
                }
                Err(error) => {
                    return Err(db_error(error).context(format!("cannot take lock {lock}")));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Queries

/// Runs a prepared statement and decodes every row.
async fn select<T: FromRow + Send + 'static>(
    conn: &mut Conn,
    sql: &str,
    params: impl Into<Params> + Send,
) -> BackendResult<Vec<T>> {
    let rows: Vec<Row> = conn
        .exec(sql, params)
        .await
        .map_err(db_error)
        .with_context(|| format!("MySQL query failed: {sql}"))?;
    rows.into_iter()
        .map(|row| from_row_opt::<T>(row).map_err(|e| anyhow!("unexpected row from {sql}: {e}")))
        .collect()
}

/// Runs a prepared statement that returns nothing.
async fn execute(
    conn: &mut Conn,
    sql: &str,
    params: impl Into<Params> + Send,
) -> BackendResult<()> {
    conn.exec_drop(sql, params)
        .await
        .map_err(db_error)
        .with_context(|| format!("MySQL statement failed: {sql}"))
}

/// Columns of a `KeyValue`, as the range queries return them.
type KvRow = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

fn kv_from_row((key, value, create_revision, mod_revision, version, lease): KvRow) -> KeyValue {
    KeyValue {
        key,
        value,
        create_revision,
        mod_revision,
        version,
        lease,
    }
}

/// LIMIT for "no limit": MySQL has no LIMIT ALL.
const NO_LIMIT: u64 = u64::MAX;

/// The range or count statement for a read at `at`. Ranges with and without
/// an upper bound are separate statements, so an unbounded one never
/// compares against a made-up end. The statements take, in order: start,
/// end (if bounded), the revision twice (history), the limit (ranges).
fn range_sql(at: ReadAt, bounded: bool, count: bool, keys_only: bool) -> String {
    let end = if bounded { " AND `key` < ?" } else { "" };
    let value = if keys_only { "X''" } else { "value" };
    match (at, count) {
        (ReadAt::Current, false) => format!(
            "SELECT `key`, {value}, create_revision, mod_revision, version, lease \
             FROM kv WHERE `key` >= ?{end} ORDER BY `key` LIMIT ?"
        ),
        (ReadAt::Current, true) => format!("SELECT COUNT(*) FROM kv WHERE `key` >= ?{end}"),
        // A key's state at revision R is its log row with the greatest
        // (revision, sub) at or below R; one key can change twice in one
        // revision. The correlated subquery walks log_key_revision backwards
        // from R for each key, so with a LIMIT only the first keys are
        // visited (a window function would rank the whole range first, which
        // MariaDB 10.11 does with a full sort).
        (ReadAt::Revision(_), false) => format!(
            "SELECT `key`, {value}, create_revision, revision, version, lease \
             FROM log AS l WHERE `key` >= ?{end} AND revision <= ? AND deleted = 0 \
             AND (revision, sub) = (SELECT revision, sub FROM log \
                 WHERE `key` = l.`key` AND revision <= ? \
                 ORDER BY revision DESC, sub DESC LIMIT 1) \
             ORDER BY `key` LIMIT ?"
        ),
        (ReadAt::Revision(_), true) => format!(
            "SELECT COUNT(*) FROM log AS l \
             WHERE `key` >= ?{end} AND revision <= ? AND deleted = 0 \
             AND (revision, sub) = (SELECT revision, sub FROM log \
                 WHERE `key` = l.`key` AND revision <= ? \
                 ORDER BY revision DESC, sub DESC LIMIT 1)"
        ),
    }
}

/// Parameters of a `range_sql` statement.
fn range_params(range: &KeyRange, at: ReadAt, limit: Option<u64>) -> Vec<Value> {
    let mut params = vec![Value::from(range.start.as_slice())];
    if let Some(end) = &range.end {
        params.push(Value::from(end.as_slice()));
    }
    if let ReadAt::Revision(revision) = at {
        params.push(Value::from(revision));
        params.push(Value::from(revision));
    }
    if let Some(limit) = limit {
        params.push(Value::from(limit));
    }
    params
}

async fn query_range(
    conn: &mut Conn,
    range: &KeyRange,
    at: ReadAt,
    limit: usize,
    keys_only: bool,
) -> BackendResult<Vec<KeyValue>> {
    let limit = if limit == 0 { NO_LIMIT } else { limit as u64 };
    let sql = range_sql(at, range.end.is_some(), false, keys_only);
    let rows: Vec<KvRow> = select(conn, &sql, range_params(range, at, Some(limit))).await?;
    Ok(rows.into_iter().map(kv_from_row).collect())
}

async fn query_count(conn: &mut Conn, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
    let sql = range_sql(at, range.end.is_some(), true, false);
    let rows: Vec<(i64,)> = select(conn, &sql, range_params(range, at, None)).await?;
    Ok(rows.first().map_or(0, |r| r.0))
}

async fn query_revisions(conn: &mut Conn, for_update: bool) -> BackendResult<Revisions> {
    let sql = if for_update {
        "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1 FOR UPDATE"
    } else {
        "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1"
    };
    let rows: Vec<(i64, i64, i64)> = select(conn, sql, ()).await?;
    let (current, compact, compacted_through) = rows
        .first()
        .copied()
        .ok_or_else(|| anyhow!("the meta table has no row"))?;
    Ok(Revisions {
        current,
        compact,
        compacted_through,
    })
}

async fn query_log(conn: &mut Conn, after: i64, through: i64) -> BackendResult<Vec<LogEntry>> {
    type LogRow = (Vec<u8>, Vec<u8>, i64, i64, i64, i64, i64, i64);
    let rows: Vec<LogRow> = select(
        conn,
        "SELECT `key`, value, create_revision, revision, version, lease, sub, deleted \
         FROM log WHERE revision > ? AND revision <= ? ORDER BY revision, sub",
        (after, through),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(key, value, create, revision, version, lease, sub, deleted)| LogEntry {
                kv: kv_from_row((key, value, create, revision, version, lease)),
                sub,
                deleted: deleted != 0,
            },
        )
        .collect())
}

async fn query_setting(conn: &mut Conn, name: &str) -> BackendResult<Option<i64>> {
    let rows: Vec<(i64,)> =
        select(conn, "SELECT value FROM settings WHERE name = ?", (name,)).await?;
    Ok(rows.first().map(|r| r.0))
}

fn lease_from_row((id, ttl, expires_at): (i64, i64, i64)) -> LeaseRow {
    LeaseRow {
        id,
        ttl,
        expires_at,
    }
}

async fn query_lease(conn: &mut Conn, id: i64) -> BackendResult<Option<LeaseRow>> {
    let rows = select(
        conn,
        "SELECT id, ttl, expires_at FROM lease WHERE id = ?",
        (id,),
    )
    .await?;
    Ok(rows.into_iter().next().map(lease_from_row))
}

async fn query_leases(conn: &mut Conn) -> BackendResult<Vec<LeaseRow>> {
    let rows = select(
        conn,
        "SELECT id, ttl, expires_at FROM lease ORDER BY expires_at, id",
        (),
    )
    .await?;
    Ok(rows.into_iter().map(lease_from_row).collect())
}

async fn query_expired_leases(
    conn: &mut Conn,
    now_ms: i64,
    limit: usize,
) -> BackendResult<Vec<i64>> {
    let rows: Vec<(i64,)> = select(
        conn,
        "SELECT id FROM lease WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
        (now_ms, limit as u64),
    )
    .await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

async fn query_lease_keys(conn: &mut Conn, id: i64) -> BackendResult<Vec<KeyValue>> {
    let rows: Vec<KvRow> = select(
        conn,
        "SELECT `key`, value, create_revision, mod_revision, version, lease \
         FROM kv WHERE lease = ? ORDER BY `key`",
        (id,),
    )
    .await?;
    Ok(rows.into_iter().map(kv_from_row).collect())
}

/// The read queries, shared by read and write transactions; `revisions`
/// differs between them.
macro_rules! impl_read_txn {
    ($ty:ty) => {
        impl ReadTxn for $ty {
            async fn revisions(&mut self) -> BackendResult<Revisions> {
                self.current_revisions().await
            }

            async fn range(
                &mut self,
                range: &KeyRange,
                at: ReadAt,
                limit: usize,
                keys_only: bool,
            ) -> BackendResult<Vec<KeyValue>> {
                query_range(self.session.conn(), range, at, limit, keys_only).await
            }

            async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
                query_count(self.session.conn(), range, at).await
            }

            async fn log_entries(
                &mut self,
                after: i64,
                through: i64,
            ) -> BackendResult<Vec<LogEntry>> {
                query_log(self.session.conn(), after, through).await
            }

            async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
                query_setting(self.session.conn(), name).await
            }

            async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
                query_lease(self.session.conn(), id).await
            }

            async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
                query_leases(self.session.conn()).await
            }

            async fn expired_leases(
                &mut self,
                now_ms: i64,
                limit: usize,
            ) -> BackendResult<Vec<i64>> {
                query_expired_leases(self.session.conn(), now_ms, limit).await
            }

            async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
                query_lease_keys(self.session.conn(), id).await
            }
        }
    };
}

impl_read_txn!(MysqlRead);
impl_read_txn!(MysqlWrite);

impl MysqlRead {
    async fn current_revisions(&mut self) -> BackendResult<Revisions> {
        query_revisions(self.session.conn(), false).await
    }
}

impl MysqlWrite {
    /// The counters, locked `FOR UPDATE` when the transaction began (so that
    /// other instances' writers wait for this one), and kept up to date by
    /// `set_revisions`.
    async fn current_revisions(&mut self) -> BackendResult<Revisions> {
        match self.revisions {
            Some(revisions) => Ok(revisions),
            None => {
                let revisions = query_revisions(self.session.conn(), true).await?;
                self.revisions = Some(revisions);
                Ok(revisions)
            }
        }
    }
}

impl WriteTxn for MysqlWrite {
    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let kv = &entry.kv;
        if kv.key.len() > MAX_KEY_BYTES {
            bail!(
                "key of {} bytes is longer than the {MAX_KEY_BYTES} bytes the MySQL backend stores",
                kv.key.len()
            );
        }
        let conn = self.session.conn();
        execute(
            conn,
            "INSERT INTO log (revision, sub, `key`, value, create_revision, version, lease, deleted) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                kv.mod_revision,
                entry.sub,
                kv.key.as_slice(),
                kv.value.as_slice(),
                kv.create_revision,
                kv.version,
                kv.lease,
                i64::from(entry.deleted),
            ),
        )
        .await?;
        if entry.deleted {
            execute(conn, "DELETE FROM kv WHERE `key` = ?", (kv.key.as_slice(),)).await
        } else {
            // VALUES() rather than MySQL 8's row alias, which MariaDB lacks.
            execute(
                conn,
                "INSERT INTO kv (`key`, value, create_revision, mod_revision, version, lease) \
                 VALUES (?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value), \
                 create_revision = VALUES(create_revision), mod_revision = VALUES(mod_revision), \
                 version = VALUES(version), lease = VALUES(lease)",
                (
                    kv.key.as_slice(),
                    kv.value.as_slice(),
                    kv.create_revision,
                    kv.mod_revision,
                    kv.version,
                    kv.lease,
                ),
            )
            .await
        }
    }

    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "UPDATE meta SET revision = ?, compact_revision = ?, compacted_through = ? WHERE id = 1",
            (
                revisions.current,
                revisions.compact,
                revisions.compacted_through,
            ),
        )
        .await?;
        self.revisions = Some(revisions);
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "DELETE FROM log WHERE `key` = ? AND revision <= ? AND (revision < ? OR sub < ?)",
            (
                entry.kv.key.as_slice(),
                entry.kv.mod_revision,
                entry.kv.mod_revision,
                entry.sub,
            ),
        )
        .await
    }

    async fn remove_entry(&mut self, entry: &LogEntry) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "DELETE FROM log WHERE revision = ? AND sub = ?",
            (entry.kv.mod_revision, entry.sub),
        )
        .await
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "INSERT INTO settings (name, value) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE value = VALUES(value)",
            (name, value),
        )
        .await
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        execute(
            self.session.conn(),
            "INSERT INTO lease (id, ttl, expires_at) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE ttl = VALUES(ttl), expires_at = VALUES(expires_at)",
            (lease.id, lease.ttl, lease.expires_at),
        )
        .await
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        execute(self.session.conn(), "DELETE FROM lease WHERE id = ?", (id,)).await
    }

    async fn commit(mut self) -> BackendResult<()> {
        self.session.end("COMMIT").await
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::backend::conformance::TestStore;
    use crate::store::Store;

    /// The server the tests use; each test gets a database of its own on it.
    fn test_server_url() -> String {
        std::env::var("CETERA_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/".to_string())
    }

    /// `url` with its database replaced by `database` (URL form only).
    fn with_database(url: &str, database: &str) -> String {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let authority = base
            .find("://")
            .expect("CETERA_TEST_MYSQL_URL must be a URL")
            + 3;
        let path = base[authority..]
            .find('/')
            .map_or(base.len(), |i| authority + i);
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!("{}/{database}{query}", &base[..path])
    }

    /// Drops the test database when the test ends.
    struct DropDatabase {
        server: String,
        database: String,
    }

    impl Drop for DropDatabase {
        fn drop(&mut self) {
            let (server, database) = (self.server.clone(), self.database.clone());
            // Drop cannot await, and the test's runtime may be single-threaded:
            // do it on a thread with a runtime of its own.
            let dropped = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async {
                    let mut conn = Conn::new(Opts::from_url(&server)?).await?;
                    // Connections of the store that are still open (a task in
                    // the middle of a transaction) would hold DROP DATABASE up.
                    let others: Vec<u64> = conn
                        .exec(
                            "SELECT id FROM information_schema.PROCESSLIST \
                             WHERE db = ? AND id <> CONNECTION_ID()",
                            (database.as_str(),),
                        )
                        .await?;
                    for id in others {
                        let _ = conn.query_drop(format!("KILL {id}")).await;
                    }
                    conn.query_drop("SET SESSION lock_wait_timeout = 10")
                        .await?;
                    conn.query_drop(format!(
                        "DROP DATABASE IF EXISTS {}",
                        quote_ident(&database)
                    ))
                    .await?;
                    conn.disconnect().await?;
                    anyhow::Ok(())
                })
            })
            .join();
            if let Ok(Err(error)) = dropped {
                eprintln!("cannot drop test database {}: {error:#}", self.database);
            }
        }
    }

    async fn open() -> TestStore<Mysql> {
        let server = test_server_url();
        let database = format!("cetera_test_{:016x}", rand::random::<u64>());
        let backend = Mysql::connect_within(
            &with_database(&server, &database),
            &DatastoreTls::default(),
            Duration::from_secs(3),
        )
        .await
        .unwrap_or_else(|error| {
            panic!(
                "the MySQL conformance tests need a MySQL or MariaDB server at {server} \
                 (set CETERA_TEST_MYSQL_URL to use another): {error:#}"
            )
        });
        let guard = DropDatabase { server, database };
        TestStore {
            store: Store::open(backend).await.unwrap(),
            guard: Box::new(guard),
        }
    }

    crate::conformance_suite!(open);

    fn tcp(host: &str, port: u16) -> Address {
        Address::Tcp(host.to_string(), port)
    }

    #[test]
    fn go_dsn_parts() {
        let dsn =
            GoDsn::parse("user:pass@tcp(db.example:3307)/k8s?tls=true&parseTime=true").unwrap();
        assert_eq!(
            dsn,
            GoDsn {
                user: Some("user".into()),
                pass: Some("pass".into()),
                address: tcp("db.example", 3307),
                database: Some("k8s".into()),
                params: vec![
                    ("tls".into(), "true".into()),
                    ("parseTime".into(), "true".into())
                ],
            }
        );
        // The password runs from the first ':' to the last '@' before the last '/'.
        let dsn = GoDsn::parse("me:p@ss:w/rd@tcp(10.0.0.1)/db").unwrap();
        assert_eq!(dsn.user.as_deref(), Some("me"));
        assert_eq!(dsn.pass.as_deref(), Some("p@ss:w/rd"));
        assert_eq!(dsn.address, tcp("10.0.0.1", 3306));
        let dsn = GoDsn::parse("root@unix(/run/mysqld/mysqld.sock)/").unwrap();
        assert_eq!(dsn.address, Address::Unix("/run/mysqld/mysqld.sock".into()));
        assert_eq!(dsn.database, None);
        assert_eq!(dsn.pass, None);
        let dsn = GoDsn::parse("tcp([::1]:3310)/my%2Fdb").unwrap();
        assert_eq!(dsn.address, tcp("::1", 3310));
        assert_eq!(dsn.user, None);
        assert_eq!(dsn.database.as_deref(), Some("my/db"));
        let dsn = GoDsn::parse("u@/db").unwrap();
        assert_eq!(dsn.address, tcp("127.0.0.1", 3306));
        let dsn = GoDsn::parse("/").unwrap();
        assert_eq!((dsn.user, dsn.database), (None, None));
    }

    #[test]
    fn go_dsn_errors() {
        let error = |dsn: &str| format!("{:#}", GoDsn::parse(dsn).unwrap_err());
        assert!(error("root@tcp(host:3306)").contains("no '/'"));
        assert!(error("root@tcp(host:3306/db").contains("parentheses"));
        assert!(error("root@udp(host)/db").contains("unsupported network"));
        assert!(error("root@tcp(host:port)/db").contains("invalid port"));
        assert!(error("root@tcp(:3306)/db").contains("no host"));
    }

    fn opts(endpoint: &Endpoint) -> Opts {
        Opts::from(endpoint.opts.clone())
    }

    #[test]
    fn endpoints_in_go_form() {
        let e = Endpoint::parse("mysql://k3s:secret@tcp(mysql.local:3307)/kine?tls=skip-verify")
            .unwrap();
        let o = opts(&e);
        assert_eq!((o.ip_or_hostname(), o.tcp_port()), ("mysql.local", 3307));
        assert_eq!((o.user(), o.pass()), (Some("k3s"), Some("secret")));
        assert_eq!(
            o.db_name(),
            None,
            "the database is chosen after creating it"
        );
        assert_eq!(e.database, "kine");
        assert_eq!(e.tls, TlsParam::SkipVerify);

        let e = Endpoint::parse("mysql://root@unix(/run/mysqld/mysqld.sock)/").unwrap();
        assert_eq!(opts(&e).socket(), Some("/run/mysqld/mysqld.sock"));
        assert_eq!(e.database, DEFAULT_DATABASE);

        let e = Endpoint::parse("mysql://").unwrap();
        assert_eq!(opts(&e).socket(), Some("/var/run/mysqld/mysqld.sock"));
        assert_eq!(opts(&e).user(), Some("root"));

        let e = Endpoint::parse("mysql://u@/db").unwrap();
        assert_eq!(opts(&e).ip_or_hostname(), "127.0.0.1");
        assert_eq!(e.database, "db");
    }

    #[test]
    fn endpoints_in_url_form() {
        let e = Endpoint::parse(
            "mysql://u:p%40ss@db.example:3308/store?pool_min=1&pool_max=5&tls=true",
        )
        .unwrap();
        let o = opts(&e);
        assert_eq!((o.ip_or_hostname(), o.tcp_port()), ("db.example", 3308));
        assert_eq!((o.user(), o.pass()), (Some("u"), Some("p@ss")));
        assert_eq!(o.pool_opts().constraints().max(), 5);
        assert_eq!(e.database, "store");
        assert_eq!(e.tls, TlsParam::Verify);

        let e = Endpoint::parse("mysql://root@127.0.0.1:3306/").unwrap();
        assert_eq!(e.database, DEFAULT_DATABASE);
        assert_eq!(e.tls, TlsParam::Unset);
        let e = Endpoint::parse("mysql://root@localhost").unwrap();
        assert_eq!(e.database, DEFAULT_DATABASE);

        let e = Endpoint::parse("mysql://root@localhost/db?socket=%2Ftmp%2Fm.sock").unwrap();
        assert_eq!(opts(&e).socket(), Some("/tmp/m.sock"));

        let e = Endpoint::parse("mysql://root@localhost/db?require_ssl=true").unwrap();
        assert!(opts(&e).ssl_opts().is_some());
    }

    #[test]
    fn endpoint_errors_name_the_problem_without_the_password() {
        let error = |url: &str| format!("{:#}", Endpoint::parse(url).unwrap_err());
        let message = error("mysql://u:hunter2@host/db?bogus=1");
        assert!(message.contains("bogus"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let message = error("mysql://u:hunter2@tcp(host:x)/db");
        assert!(message.contains("invalid port"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let message = error("mysql://u:hunter2@tcp(host:3306/db");
        assert!(message.contains("parentheses"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(error("mysql://h/db?tls=maybe").contains("unknown tls=maybe"));
        assert!(error("postgres://h/db").contains("not a MySQL endpoint"));
    }

    #[test]
    fn tls_comes_from_files_or_the_endpoint() {
        let none = DatastoreTls::default();
        let plain = Endpoint::parse("mysql://root@tcp(h)/").unwrap();
        assert!(ssl_opts(&plain, &none).unwrap().is_none());
        let verify = Endpoint::parse("mysql://root@tcp(h)/?tls=true").unwrap();
        let ssl = ssl_opts(&verify, &none).unwrap().unwrap();
        assert!(!ssl.opts.accept_invalid_certs() && !ssl.optional);
        let preferred = Endpoint::parse("mysql://root@tcp(h)/?tls=preferred").unwrap();
        let ssl = ssl_opts(&preferred, &none).unwrap().unwrap();
        assert!(ssl.opts.accept_invalid_certs() && ssl.optional);

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "").unwrap();
        let files = DatastoreTls {
            ca_file: Some(ca.clone()),
            ..Default::default()
        };
        let ssl = ssl_opts(&plain, &files).unwrap().unwrap();
        assert_eq!(ssl.opts.root_certs(), &[ca.clone().into()]);
        assert!(ssl.opts.disable_built_in_roots());

        let off = Endpoint::parse("mysql://root@tcp(h)/?tls=false").unwrap();
        assert!(ssl_opts(&off, &files).is_err());
        let custom = Endpoint::parse("mysql://root@tcp(h)/?tls=custom").unwrap();
        assert!(ssl_opts(&custom, &none).is_err());
        let half = DatastoreTls {
            cert_file: Some(ca),
            ..Default::default()
        };
        assert!(ssl_opts(&plain, &half).is_err());
        let missing = DatastoreTls {
            ca_file: Some(dir.path().join("nope.pem")),
            ..Default::default()
        };
        let message = format!("{:#}", ssl_opts(&plain, &missing).unwrap_err());
        assert!(message.contains("--datastore-cafile"), "{message}");
    }

    #[test]
    fn lock_names_fit_mysql() {
        assert_eq!(lock_name("kubernetes", "lease"), "cetera/kubernetes/lease");
        let long = lock_name(&"d".repeat(64), "lease-expiry");
        assert!(long.len() <= 64 && long.starts_with("cetera/"), "{long}");
        assert_eq!(long, lock_name(&"d".repeat(64), "lease-expiry"));
        assert_ne!(long, lock_name(&"d".repeat(64), "compaction"));
    }

    #[tokio::test]
    async fn unreachable_server_is_a_clear_error() {
        // Nothing listens on port 1.
        let error = Mysql::connect_within(
            "mysql://root@127.0.0.1:1/db",
            &DatastoreTls::default(),
            Duration::from_millis(600),
        )
        .await
        .err()
        .expect("no server");
        let message = format!("{error:#}");
        assert!(message.contains("127.0.0.1:1"), "{message}");
        assert!(message.contains("gave up"), "{message}");
    }

    #[tokio::test]
    async fn keys_are_bytes_and_too_long_keys_are_refused() {
        let t = open().await;
        let backend = t.store.backend();
        let keys: Vec<Vec<u8>> = vec![
            b"a".to_vec(),
            b"a ".to_vec(),
            b"a\0".to_vec(),
            b"A".to_vec(),
            vec![0xff, 0x00],
            vec![b'k'; MAX_KEY_BYTES],
        ];
        let mut txn = backend.write().await.unwrap();
        let mut revs = txn.revisions().await.unwrap();
        for (sub, key) in keys.iter().enumerate() {
            let entry = LogEntry {
                kv: KeyValue {
                    key: key.clone(),
                    value: vec![0, 1, 2, 0xff],
                    create_revision: 2,
                    mod_revision: 2,
                    version: 1,
                    lease: 0,
                },
                sub: sub as i64,
                deleted: false,
            };
            txn.append(&entry).await.unwrap();
        }
        revs.current = 2;
        txn.set_revisions(revs).await.unwrap();
        let too_long = LogEntry {
            kv: KeyValue {
                key: vec![b'k'; MAX_KEY_BYTES + 1],
                ..Default::default()
            },
            sub: 99,
            deleted: false,
        };
        let message = format!("{:#}", txn.append(&too_long).await.unwrap_err());
        assert!(message.contains("longer than"), "{message}");
        txn.commit().await.unwrap();

        let mut sorted = keys.clone();
        sorted.sort();
        let mut read = backend.read().await.unwrap();
        let all = KeyRange {
            start: vec![0],
            end: None,
        };
        for at in [ReadAt::Current, ReadAt::Revision(2)] {
            let got = read.range(&all, at, 0, false).await.unwrap();
            let got_keys: Vec<Vec<u8>> = got.iter().map(|kv| kv.key.clone()).collect();
            assert_eq!(got_keys, sorted, "{at:?}");
            assert!(got.iter().all(|kv| kv.value == [0, 1, 2, 0xff]));
            assert_eq!(read.count(&all, at).await.unwrap(), keys.len() as i64);
            let single = KeyRange::single(b"a");
            let one = read.range(&single, at, 0, true).await.unwrap();
            assert_eq!(one.len(), 1);
            assert_eq!(one[0].key, b"a");
            let two = read.range(&all, at, 2, false).await.unwrap();
            assert_eq!(two.len(), 2);
        }
        drop(read);

        // A value bigger than etcd's request limit goes through whole.
        let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
        let mut txn = backend.write().await.unwrap();
        let entry = LogEntry {
            kv: KeyValue {
                key: b"big".to_vec(),
                value: big.clone(),
                create_revision: 3,
                mod_revision: 3,
                version: 1,
                lease: 0,
            },
            sub: 0,
            deleted: false,
        };
        txn.append(&entry).await.unwrap();
        txn.commit().await.unwrap();
        let mut read = backend.read().await.unwrap();
        let single = KeyRange::single(b"big");
        for at in [ReadAt::Current, ReadAt::Revision(3)] {
            let got = read.range(&single, at, 0, false).await.unwrap();
            assert!(got[0].value == big, "{at:?}");
        }
        drop(read);

        let size = backend.size().await.unwrap();
        assert!(size.total > 0 && size.in_use <= size.total, "{size:?}");
    }

    #[tokio::test]
    async fn go_dsn_and_socket_endpoints_connect() {
        let t = open().await;
        let database = t.store.backend().database();
        let server = Opts::from(Endpoint::parse(&test_server_url()).unwrap().opts);
        let credentials = match server.pass() {
            Some(pass) => format!("{}:{pass}", server.user().unwrap_or_default()),
            None => server.user().unwrap_or_default().to_string(),
        };
        let (host, port) = (server.ip_or_hostname(), server.tcp_port());
        let quick = Duration::from_secs(1);
        let none = DatastoreTls::default();
        // tls=preferred: TLS if the server has it, plain text if not.
        let go = format!("mysql://{credentials}@tcp({host}:{port})/{database}?tls=preferred");
        let backend = Mysql::connect_within(&go, &none, quick).await.unwrap();
        let mut txn = backend.read().await.unwrap();
        assert_eq!(txn.revisions().await.unwrap().current, 1);

        let socket = "/run/mysqld/mysqld.sock";
        if std::path::Path::new(socket).exists() {
            let unix = format!("mysql://{credentials}@unix({socket})/{database}");
            let backend = Mysql::connect_within(&unix, &none, quick).await.unwrap();
            let mut txn = backend.read().await.unwrap();
            assert_eq!(txn.revisions().await.unwrap().current, 1);
        } else {
            eprintln!("no server socket at {socket}; unix(...) endpoint not tried");
        }
    }

    /// Needs a server with TLS: CETERA_TEST_MYSQL_TLS_URL (a user that
    /// REQUIRE X509), and CETERA_TEST_MYSQL_TLS_DIR holding ca.pem,
    /// client.pem and client.key.
    #[tokio::test]
    #[ignore = "needs a MySQL server with TLS, see the comment"]
    async fn tls_with_ca_and_client_certificate() {
        let url = std::env::var("CETERA_TEST_MYSQL_TLS_URL").unwrap();
        let dir = PathBuf::from(std::env::var("CETERA_TEST_MYSQL_TLS_DIR").unwrap());
        let files = DatastoreTls {
            ca_file: Some(dir.join("ca.pem")),
            cert_file: Some(dir.join("client.pem")),
            key_file: Some(dir.join("client.key")),
        };
        let quick = Duration::from_secs(1);
        let backend = Mysql::connect_within(&url, &files, quick).await.unwrap();
        let mut txn = backend.read().await.unwrap();
        assert_eq!(txn.revisions().await.unwrap().current, 1);
        let mut conn = backend.conn().await.unwrap();
        let cipher: Option<(String, String)> = conn
            .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .await
            .unwrap();
        assert!(!cipher.unwrap().1.is_empty(), "the connection uses TLS");
        // Without the client certificate the server refuses the user.
        let ca_only = DatastoreTls {
            ca_file: files.ca_file.clone(),
            ..Default::default()
        };
        let message = format!(
            "{:#}",
            Mysql::connect_within(&url, &ca_only, quick)
                .await
                .err()
                .unwrap()
        );
        assert!(message.contains("Access denied"), "{message}");
        // A CA that did not sign the server's certificate is refused.
        let wrong_ca = DatastoreTls {
            ca_file: files.cert_file.clone(),
            ..files.clone()
        };
        assert!(Mysql::connect_within(&url, &wrong_ca, quick).await.is_err());
    }

    #[tokio::test]
    async fn a_lock_whose_session_died_is_taken_again() {
        let t = open().await;
        let backend = t.store.backend();
        assert!(backend.hold_lock("job").await.unwrap());
        let mut admin = Conn::new(Opts::from_url(&test_server_url()).unwrap())
            .await
            .unwrap();
        let holder: Option<Option<u64>> = admin
            .exec_first(
                "SELECT IS_USED_LOCK(?)",
                (lock_name(backend.database(), "job"),),
            )
            .await
            .unwrap();
        let holder = holder.flatten().expect("the lock is held");
        admin.query_drop(format!("KILL {holder}")).await.unwrap();
        assert!(backend.hold_lock("job").await.unwrap(), "taken again");
        let now: Option<Option<u64>> = admin
            .exec_first(
                "SELECT IS_USED_LOCK(?)",
                (lock_name(backend.database(), "job"),),
            )
            .await
            .unwrap();
        assert_ne!(now.flatten(), Some(holder), "by a new session");
    }

    #[tokio::test]
    async fn a_dropped_write_is_rolled_back_and_writers_serialize() {
        let t = open().await;
        let backend = t.store.backend();
        let before = t.store.revisions();
        {
            let mut txn = backend.write().await.unwrap();
            let mut revs = txn.revisions().await.unwrap();
            revs.current += 10;
            txn.set_revisions(revs).await.unwrap();
            // Dropped without commit.
        }
        let mut second = backend.write().await.unwrap();
        assert_eq!(second.revisions().await.unwrap(), before);
        // A writer of another instance waits for the first one's lock.
        let other = Mysql::connect(
            &with_database(&test_server_url(), backend.database()),
            &DatastoreTls::default(),
        )
        .await
        .unwrap();
        // Named locks: one holder at a time, across instances.
        assert!(backend.hold_lock("job").await.unwrap());
        assert!(backend.hold_lock("job").await.unwrap(), "still held");
        assert!(!other.hold_lock("job").await.unwrap(), "held by the other");
        assert!(other.hold_lock("other-job").await.unwrap());
        let waiting = tokio::spawn(async move {
            let mut txn = other.write().await.unwrap();
            txn.revisions().await.unwrap()
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "the second writer waits for the lock"
        );
        let mut revs = second.revisions().await.unwrap();
        revs.current += 1;
        second.set_revisions(revs).await.unwrap();
        second.commit().await.unwrap();
        assert_eq!(waiting.await.unwrap().current, before.current + 1);
    }
}
