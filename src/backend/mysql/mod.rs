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
//! `Endpoint::parse`.
//!
//! The code is split by concern: `endpoint` and `dsn` parse endpoints, `tls`
//! builds the TLS options, `connect` reaches the server (retries at startup,
//! migrations), `txn` holds the transactions and their writes, `key_writes`
//! gathers a transaction's key writes into multi-row statements, and
//! `queries` the statements they read with (those of one-key Ranges
//! gathered by `backend::key_reads`).

mod connect;
mod dsn;
mod endpoint;
mod key_writes;
mod queries;
mod range_stream;
mod tls;
mod txn;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, DEFAULT_POOL_CONSTRAINTS, IoError, Opts, Pool, PoolConstraints};

use self::connect::{connect_server, migrate, quote_ident};
use self::endpoint::Endpoint;
use self::queries::select;
use self::tls::ssl_opts;
use self::txn::{MysqlRead, MysqlWrite, Session};
use super::changes::{ChangeFeed, DEFAULT_POLL_INTERVAL};
use super::key_reads::KeyReads;
use super::{Backend, BackendResult, DatabaseSize, Unavailable};
use crate::backend::datastore::DatastoreTls;

/// Longest key the schema stores, in bytes (`VARBINARY(3056)`: with the
/// revision and sub columns it fills InnoDB's 3072-byte index limit; see
/// migrations/mysql/V1__initial.sql).
const MAX_KEY_BYTES: usize = 3056;

/// The database used when the endpoint names none, as kine does.
const DEFAULT_DATABASE: &str = "kubernetes";

/// How long `connect` keeps trying to reach a server that refuses or drops
/// connections (it may still be starting).
const CONNECT_RETRY_FOR: Duration = Duration::from_secs(30);

/// Prepared statements kept per connection; the backend uses about 30, and
/// mysql_async's default cache of 32 would keep evicting them.
const STATEMENT_CACHE: usize = 64;
/// Pooled connections per instance unless the URL's `pool_min`/`pool_max`
/// say otherwise, as on PostgreSQL. mysql_async's own default (10 to 100)
/// let 64 clients' Ranges run as 64 MariaDB threads on the same cores:
/// 10-20% fewer Ranges and puts a second and p99 twice as long
/// (docs/benchmarks/shared-database.md, "MySQL's pool").
const POOL: PoolConstraints = match PoolConstraints::new(10, 16) {
    Some(pool) => pool,
    None => panic!("pool_min above pool_max"),
};

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
    /// Ranges of one key, gathered into few statements.
    key_reads: Arc<KeyReads>,
}

impl Mysql {
    /// Connects to the database named by `url`, creating it and its schema if
    /// needed. `url` is a `mysql://` URL or a Go-style DSN (see
    /// `Endpoint::parse`); `tls` files, when given, turn TLS on.
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
            .pool_opts(pool_opts(&given));

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
            key_reads: Arc::default(),
        })
    }

    /// Sets how often a [`ChangeFeed`] of this backend wakes (default 100 ms).
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

    /// A transaction begun by `statement`, which goes out with its first
    /// statements, on a pooled connection taken then.
    fn session(&self, statement: &'static str) -> Session {
        Session::new(self.pool.clone(), statement)
    }
}

/// The pool's options: the URL's, with cetera's connection count unless
/// the URL set one, and no reset of connections given back: transactions
/// are ended by this module, and a reset would also drop their prepared
/// statements.
fn pool_opts(given: &Opts) -> mysql_async::PoolOpts {
    let pool = given.pool_opts().clone().with_reset_connection(false);
    match pool.constraints() == DEFAULT_POOL_CONSTRAINTS {
        true => pool.with_constraints(POOL),
        false => pool,
    }
}

/// One plain connection to the database `url` names, for reading another
/// program's tables (`cetera migrate --from kine+mysql://...`): parsed and
/// secured as `Mysql::connect` does (URL or Go DSN, `kubernetes` if none is
/// named), but one attempt, no database created and no migrations; the
/// session reads at REPEATABLE READ. Returns the connection and where it is
/// connected, for messages.
pub async fn connect_plain(url: &str, tls: &DatastoreTls) -> anyhow::Result<(Conn, String)> {
    let endpoint = Endpoint::parse(url)?;
    let where_ = endpoint.describe();
    let ssl = ssl_opts(&endpoint, tls)?;
    let opts = endpoint
        .opts
        .clone()
        .db_name(Some(endpoint.database.clone()))
        .setup(SESSION_SETUP[..1].to_vec());
    let (conn, _) = connect_server(opts, ssl, &where_, Duration::ZERO).await?;
    Ok((conn, where_))
}

/// A mysql_async error as one message. Its own Display repeats the message
/// of its source, which anyhow's `{:#}` would then print once more.
fn db_error(error: mysql_async::Error) -> anyhow::Error {
    let out_of_reach = out_of_reach(&error);
    let message = match error {
        mysql_async::Error::Io(IoError::Io(e)) => e.to_string(),
        mysql_async::Error::Io(IoError::Tls(e)) => format!("TLS: {e}"),
        mysql_async::Error::Server(e) => e.to_string(),
        mysql_async::Error::Driver(e) => e.to_string(),
        mysql_async::Error::Url(e) => e.to_string(),
        mysql_async::Error::Other(e) => e.to_string(),
    };
    if out_of_reach {
        Unavailable::error(message)
    } else {
        anyhow!(message)
    }
}

/// Whether `error` means the server is gone, unreachable, refusing
/// connections or not answering in time, rather than refusing a statement.
fn out_of_reach(error: &mysql_async::Error) -> bool {
    /// ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, ER_LOCK_WAIT_TIMEOUT,
    /// ER_CONNECTION_KILLED.
    const UNAVAILABLE_CODES: [u16; 4] = [1040, 1053, 1205, 1927];
    match error {
        mysql_async::Error::Io(_) => true,
        mysql_async::Error::Server(e) => UNAVAILABLE_CODES.contains(&e.code),
        mysql_async::Error::Driver(
            mysql_async::DriverError::ConnectionClosed | mysql_async::DriverError::PoolDisconnected,
        ) => true,
        other => other.is_fatal(),
    }
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

impl Backend for Mysql {
    fn max_key_bytes(&self) -> usize {
        MAX_KEY_BYTES
    }

    fn reads_ahead(&self) -> bool {
        true
    }

    type Read = MysqlRead;
    type Write = MysqlWrite;

    async fn read(&self) -> BackendResult<MysqlRead> {
        let session = self.session("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY");
        Ok(MysqlRead {
            session,
            key_reads: Arc::clone(&self.key_reads),
        })
    }

    /// Sends nothing yet: the transaction begins and locks the counters
    /// with its first statements, in one round trip. The lock comes before
    /// anything else: InnoDB takes a REPEATABLE READ snapshot at the first
    /// plain read, so every read of this transaction then sees what the
    /// previous writer (of any instance) committed.
    async fn write(&self) -> BackendResult<MysqlWrite> {
        Ok(MysqlWrite::new(
            self.session("START TRANSACTION READ WRITE"),
        ))
    }

    async fn size(&self) -> BackendResult<DatabaseSize> {
        let mut conn = self.conn().await?;
        // MySQL 8 caches table statistics for a day by default; MariaDB has
        // no such setting and refuses it, which is fine.
        let _ = conn
            .query_drop("SET SESSION information_schema_stats_expiry = 0")
            .await;
        // data_free is the free space of a table's own tablespace (file per
        // table, the default): allocated on disk, holding nothing. InnoDB
        // refreshes these statistics in the background, so they lag writes.
        let rows: Vec<(i64, i64)> = select(
            &mut conn,
            "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED), \
             CAST(COALESCE(SUM(data_free), 0) AS SIGNED) \
             FROM information_schema.TABLES WHERE table_schema = ?",
            (self.database.as_str(),),
        )
        .await?;
        let (in_use, free) = rows.first().copied().unwrap_or_default();
        Ok(DatabaseSize {
            total: in_use + free,
            in_use,
        })
    }

    /// The tables' data and indexes, as before free space was reported:
    /// InnoDB keeps a few MiB free per table, which a small quota would
    /// not fit.
    fn quota_bytes(&self, size: &DatabaseSize) -> i64 {
        size.in_use
    }

    /// OPTIMIZE TABLE: InnoDB rebuilds each table (online, as ALTER TABLE
    /// ... FORCE) and gives the freed pages back when the table has a file
    /// of its own (innodb_file_per_table, the default).
    async fn defragment(&self) -> BackendResult<()> {
        let mut conn = self.conn().await?;
        conn.query_drop("OPTIMIZE TABLE log, kv, meta, settings, lease")
            .await
            .map_err(db_error)
            .context("OPTIMIZE TABLE failed")?;
        Ok(())
    }

    fn change_feed(&self) -> ChangeFeed {
        ChangeFeed::every(self.poll_interval)
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

#[cfg(test)]
pub(crate) mod tests {

    use super::*;
    use crate::backend::{KeyRange, LogEntry, ReadAt, ReadTxn, WriteTxn};
    use crate::proto::mvccpb::KeyValue;

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

    /// A fresh, empty database on the test server, which the guard drops.
    pub(crate) async fn test_database() -> (Mysql, Box<dyn Send>) {
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
        (backend, Box::new(DropDatabase { server, database }))
    }

    #[test]
    fn lock_names_fit_mysql() {
        assert_eq!(lock_name("kubernetes", "lease"), "cetera/kubernetes/lease");
        let long = lock_name(&"d".repeat(64), "lease-expiry");
        assert!(long.len() <= 64 && long.starts_with("cetera/"), "{long}");
        assert_eq!(long, lock_name(&"d".repeat(64), "lease-expiry"));
        assert_ne!(long, lock_name(&"d".repeat(64), "compaction"));
    }

    #[test]
    fn the_pool_holds_16_connections_unless_the_url_says() {
        let pool = |url: &str| {
            let opts = Opts::from(Endpoint::parse(url).unwrap().opts);
            let pool = pool_opts(&opts);
            assert!(!pool.reset_connection(), "{url}");
            (pool.constraints().min(), pool.constraints().max())
        };
        assert_eq!(pool("mysql://root@127.0.0.1:3306/db"), (10, 16));
        assert_eq!(pool("mysql://root@tcp(127.0.0.1:3306)/db"), (10, 16));
        let given = "mysql://root@127.0.0.1:3306/db?pool_min=1&pool_max=5";
        assert_eq!(pool(given), (1, 5));
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

    /// The retries last the whole patience, and the error says how long they took.
    #[tokio::test]
    async fn retries_last_their_patience_and_say_how_long() {
        let patience = Duration::from_millis(1300);
        let started = std::time::Instant::now();
        let error = Mysql::connect_within(
            "mysql://root@127.0.0.1:1/db",
            &DatastoreTls::default(),
            patience,
        )
        .await
        .err()
        .expect("no server");
        crate::backend::assert_gave_up_after(&error, started, patience);
    }

    #[tokio::test]
    async fn keys_are_bytes_and_too_long_keys_are_refused() {
        let (backend, _guard) = test_database().await;
        let backend = &backend;
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
        let wanted = [b"a".to_vec(), b"absent".to_vec()];
        let at = read.keys_at(&wanted, 2).await.unwrap();
        assert_eq!(at.len(), 1);
        assert_eq!((at[0].key.as_slice(), at[0].mod_revision), (&b"a"[..], 2));
        assert_eq!(at[0].value, [0, 1, 2, 0xff]);
        assert!(read.keys_at(&wanted, 1).await.unwrap().is_empty());
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
        let got = read.keys_at(&[b"big".to_vec()], 3).await.unwrap();
        assert!(got.len() == 1 && got[0].value == big, "keys_at");
        drop(read);

        let size = backend.size().await.unwrap();
        assert!(size.total > 0 && size.in_use <= size.total, "{size:?}");
    }

    #[tokio::test]
    async fn go_dsn_and_socket_endpoints_connect() {
        let (backend, _guard) = test_database().await;
        let database = backend.database();
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

    /// How the server sees this backend's connections: "host:port" over TCP,
    /// "localhost" over the unix socket.
    async fn client_host(backend: &Mysql) -> String {
        let mut conn = backend.conn().await.unwrap();
        conn.query_first(
            "SELECT host FROM information_schema.processlist WHERE id = CONNECTION_ID()",
        )
        .await
        .unwrap()
        .unwrap()
    }

    /// An endpoint that names a TCP address connects over TCP, even to a
    /// local server (mysql_async would otherwise ask the server for its
    /// socket and switch to it, past host-based grants and TLS); one that
    /// names a socket uses the socket.
    #[tokio::test]
    async fn endpoints_connect_the_way_they_say() {
        let (backend, _guard) = test_database().await;
        let database = backend.database();
        let server = Opts::from(Endpoint::parse(&test_server_url()).unwrap().opts);
        let user = server.user().unwrap_or_default();
        let credentials = match server.pass() {
            Some(pass) => format!("{user}:{pass}"),
            None => user.to_string(),
        };
        let (host, port) = (server.ip_or_hostname(), server.tcp_port());
        let quick = Duration::from_secs(1);
        let none = DatastoreTls::default();
        for endpoint in [
            format!("mysql://{credentials}@tcp({host}:{port})/{database}"),
            with_database(&test_server_url(), database),
        ] {
            let backend = Mysql::connect_within(&endpoint, &none, quick)
                .await
                .unwrap();
            let seen = client_host(&backend).await;
            let tcp_port = seen.rsplit_once(':').map(|(_, port)| port.parse::<u16>());
            assert!(
                matches!(tcp_port, Some(Ok(_))),
                "{endpoint}: the server sees {seen:?}, not a TCP peer"
            );
        }

        let socket = "/run/mysqld/mysqld.sock";
        if !std::path::Path::new(socket).exists() {
            eprintln!("no server socket at {socket}; unix(...) endpoints not tried");
            return;
        }
        let encoded = socket.replace('/', "%2F");
        for endpoint in [
            format!("mysql://{credentials}@unix({socket})/{database}"),
            format!("mysql://{credentials}@localhost/{database}?socket={encoded}"),
        ] {
            let backend = Mysql::connect_within(&endpoint, &none, quick)
                .await
                .unwrap();
            assert_eq!(client_host(&backend).await, "localhost", "{endpoint}");
        }
    }

    #[tokio::test]
    async fn a_lock_whose_session_died_is_taken_again() {
        let (backend, _guard) = test_database().await;
        let backend = &backend;
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
        let (backend, _guard) = test_database().await;
        let backend = &backend;
        let before = backend.read().await.unwrap().revisions().await.unwrap();
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
