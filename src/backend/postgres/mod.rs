//! The PostgreSQL backend (tokio-postgres with a deadpool connection pool).
//!
//! Reads run on pooled connections in `REPEATABLE READ, READ ONLY`
//! transactions, so the counters and the data come from one snapshot. A write
//! transaction locks the single `meta` row first (`SELECT ... FOR UPDATE`):
//! several cetera instances can share one database, and their writes take
//! dense revisions one at a time, in commit order. Each commit that moves the
//! counters sends a NOTIFY on channel `cetera`; a dedicated LISTEN connection
//! turns those of other instances into [`Backend::change_feed`] wake-ups (the
//! payload names the sending instance, so that it skips its own). Jobs that
//! must run on one instance at a time hold session-level advisory locks on
//! another dedicated connection ([`Backend::hold_lock`]).
//!
//! `connect` takes the URLs k3s users write (`postgres://` or `postgresql://`,
//! libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` included), waits
//! for the server for a while at startup, creates the database if it is
//! missing and applies `migrations/postgres`.
//!
//! The code is split by concern: `endpoint` parses URLs, `tls` decides on TLS
//! and builds the rustls connector, `connect` opens connections (retries at
//! startup, database creation, migrations), `sessions` keeps the LISTEN and
//! advisory-lock connections, `txn` holds the transactions and their writes,
//! and `queries` the statements they read with.

mod connect;
mod endpoint;
mod key_writes;
mod queries;
mod range_stream;
mod sessions;
mod tls;
mod txn;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use deadpool_postgres::{ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::Client;

use self::connect::{Connector, NotifyTarget, is_transient, migrate};
use self::endpoint::Target;
use self::sessions::{AbortOnDrop, Listener, LockSession, lock_key, simple_value};
use self::txn::{BEGIN_WRITE, PostgresRead, PostgresWrite, TxnConn};
use super::changes::{ChangeFeed, DEFAULT_POLL_INTERVAL, Notifications};
use super::key_reads::KeyReads;
use super::{Backend, BackendResult, DatabaseSize, Unavailable};
use crate::backend::datastore::DatastoreTls;

/// The database used when the URL names none, as kine does.
const DEFAULT_DATABASE: &str = "kubernetes";
/// The NOTIFY channel that tells other instances a commit happened.
const CHANNEL: &str = "cetera";
/// How long `connect` keeps retrying an unreachable server.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Pooled connections per instance (reads, the writer, size queries).
const POOL_SIZE: usize = 16;
/// How long a caller waits for a free pooled connection.
const POOL_WAIT: Duration = Duration::from_secs(60);

/// Longest key stored, in bytes: a B-tree index entry must fit in a third of
/// an 8 KiB page (2704 bytes), with the revision columns beside the key.
const MAX_KEY_BYTES: usize = 2600;

/// A store in a Postgres database.
pub struct Postgres {
    connections: Arc<Connections>,
    /// Ranges of one key, gathered into few statements.
    key_reads: Arc<KeyReads>,
    /// Counted by the listener on every other instance's NOTIFY (and after
    /// a reconnect).
    changes: Arc<Notifications>,
    /// This instance's NOTIFY payload, random: its listener skips it.
    notify_payload: Arc<str>,
    /// Longest a follower waits without a NOTIFY: one lost on the way
    /// delays a watcher by this much at most.
    poll_interval: Duration,
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

        let changes = Arc::new(Notifications::new());
        // Never a bare number, as the revisions older versions send are.
        let notify_payload: Arc<str> = format!("i{:016x}", rand::random::<u64>()).into();
        let target = NotifyTarget {
            changes: changes.clone(),
            own_payload: notify_payload.clone(),
        };
        let listener = Listener::start(connector.clone(), target)
            .await
            .with_context(|| format!("cannot LISTEN on {}", connector.describe()))?;
        tracing::info!("using Postgres at {}", connector.describe());
        Ok(Postgres {
            connections: Arc::new(Connections { pool, connector }),
            key_reads: Arc::default(),
            changes,
            notify_payload,
            poll_interval: DEFAULT_POLL_INTERVAL,
            _listener: listener,
            locks: tokio::sync::Mutex::new(LockSession::default()),
        })
    }

    /// How long a follower of other instances' commits waits for a NOTIFY
    /// before it looks anyway (`--poll-interval`).
    pub fn set_poll_interval(&mut self, interval: Duration) {
        self.poll_interval = interval;
    }
}

/// Where connections come from: the pool, and the server's description for
/// errors.
pub(super) struct Connections {
    pool: Pool,
    connector: Connector,
}

impl Connections {
    /// A connection from the pool.
    pub(super) async fn pooled(&self) -> BackendResult<Object> {
        self.pool.get().await.map_err(|error| match error {
            PoolError::Backend(error) => {
                let message = format!(
                    "cannot connect to {}: {}",
                    self.connector.describe(),
                    describe(&error)
                );
                if is_transient(&error) {
                    Unavailable::error(message)
                } else {
                    anyhow!(message)
                }
            }
            PoolError::Timeout(_) => Unavailable::error(format!(
                "no Postgres connection became free within {POOL_WAIT:?}"
            )),
            other => anyhow!("no Postgres connection available: {other}"),
        })
    }
}

impl Backend for Postgres {
    fn max_key_bytes(&self) -> usize {
        MAX_KEY_BYTES
    }

    fn reads_ahead(&self) -> bool {
        true
    }

    type Read = PostgresRead;
    type Write = PostgresWrite;

    async fn read(&self) -> BackendResult<PostgresRead> {
        Ok(PostgresRead::new(
            self.connections.clone(),
            self.key_reads.clone(),
        ))
    }

    /// Sends nothing yet: BEGIN and the `meta` row lock go out with the
    /// transaction's first statement, in one round trip, so every write
    /// transaction (the identity setup included) still waits for other
    /// instances' writers before it reads anything, and under READ
    /// COMMITTED each later statement sees what they committed.
    async fn write(&self) -> BackendResult<PostgresWrite> {
        Ok(PostgresWrite::new(
            TxnConn::new(self.connections.pooled().await?, BEGIN_WRITE),
            self.notify_payload.clone(),
        ))
    }

    async fn size(&self) -> BackendResult<DatabaseSize> {
        let client = self.connections.pooled().await?;
        let statement = client
            .prepare_cached(
                "SELECT pg_database_size(current_database()), \
                 (SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::BIGINT \
                  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                  WHERE n.nspname = current_schema() AND c.relkind = 'r' \
                  AND c.relname IN ('log', 'kv', 'meta', 'settings', 'lease', 'alarm'))",
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

    /// Only cetera's own tables count: `total` is the whole database,
    /// system catalogs included, which a small quota would not even fit.
    fn quota_bytes(&self, size: &DatabaseSize) -> i64 {
        size.in_use
    }

    /// A plain VACUUM of the tables compaction deletes from, so a busy store
    /// stays the same size instead of growing until autovacuum comes by.
    async fn reclaim_compacted(&self) -> BackendResult<()> {
        let client = self.connections.pooled().await?;
        client
            .batch_execute("VACUUM log, kv")
            .await
            .map_err(|e| db_error(&e))?;
        Ok(())
    }

    /// Plain VACUUM: marks dead row versions' space reusable and returns
    /// empty pages at the end of each table to the file system, without the
    /// exclusive lock of VACUUM FULL, so reads and writes go on. VACUUM
    /// cannot run inside a transaction; the pooled connection is in none.
    async fn defragment(&self) -> BackendResult<()> {
        let client = self.connections.pooled().await?;
        client
            .batch_execute("VACUUM log, kv, meta, settings, lease, alarm, auth")
            .await
            .map_err(|e| db_error(&e))?;
        Ok(())
    }

    fn change_feed(&self) -> ChangeFeed {
        self.changes.feed(self.poll_interval)
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
            let (client, _driver) =
                self.connections
                    .connector
                    .connect(None)
                    .await
                    .map_err(|error| {
                        anyhow!(
                            "cannot open the advisory lock connection to {}: {}",
                            self.connections.connector.describe(),
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

/// One plain connection to the database `url` names, for reading another
/// program's tables (`cetera migrate --from kine+postgres://...`): parsed
/// and secured as `Postgres::connect` does, but one attempt, no database
/// created and no migrations. With `lowercase_database` the database name
/// is folded to lower case, as kine folds it. Returns the client and where
/// it is connected, for messages.
pub async fn connect_plain(
    url: &str,
    tls: &DatastoreTls,
    lowercase_database: bool,
) -> anyhow::Result<(Client, String)> {
    let mut target = Target::parse(url, tls)?;
    if lowercase_database {
        let name = target
            .config
            .get_dbname()
            .unwrap_or(DEFAULT_DATABASE)
            .to_lowercase();
        target.config.dbname(&name);
    }
    let connector = Connector::new(target)?;
    let (client, _driver) = connector.connect(None).await.map_err(|error| {
        anyhow!(
            "cannot connect to {}: {}",
            connector.describe(),
            describe(&error)
        )
    })?;
    Ok((client, connector.describe()))
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
    let message = format!("Postgres: {}", describe(error));
    if error.is_closed() || is_transient(error) {
        Unavailable::error(message)
    } else {
        anyhow!(message)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Instant;

    use tokio_postgres::{Config, NoTls};

    use super::connect::quote_identifier;
    use super::*;
    use crate::backend::{KeyRange, LogEntry, ReadAt, ReadTxn, WriteTxn};
    use crate::proto::mvccpb::KeyValue;

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

    /// A fresh, empty database on the test server, which the guard drops.
    pub(crate) async fn test_database() -> (Postgres, Box<dyn Send>) {
        let database = TestDatabase::new();
        let backend = database.connect().await;
        (backend, Box::new(database))
    }

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
        let wanted = vec![b"\x80".to_vec(), b"\x7f".to_vec(), b"none".to_vec()];
        let mut at2 = keys(&txn.keys_at(&wanted, 2).await.unwrap());
        at2.sort();
        assert_eq!(at2, vec![b"\x7f".to_vec(), b"\x80".to_vec()]);
        let at3 = txn.keys_at(&wanted, 3).await.unwrap();
        assert_eq!(keys(&at3), vec![b"\x7f".to_vec()], "deleted at 3");
        assert_eq!(
            (at3[0].value.as_slice(), at3[0].mod_revision),
            (&b"v"[..], 2)
        );
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
        let mut changes = first.change_feed();
        assert!(
            !changed_within(&mut changes, 300).await,
            "no commit, no wake-up"
        );
        // Its own commit does not wake it (its writer publishes those), and
        // does not hide the other instance's commit that follows.
        commit_entries(&first, 2, &[kv(b"a", b"1", 2)]).await;
        assert!(
            !changed_within(&mut changes, 300).await,
            "an instance's own commit does not wake its followers"
        );
        commit_entries(&second, 3, &[kv(b"b", b"1", 3)]).await;
        tokio::time::timeout(Duration::from_secs(5), changes.notified())
            .await
            .expect("a commit on one instance wakes the other");
        let mut other_changes = second.change_feed();
        commit_entries(&first, 4, &[kv(b"c", b"1", 4)]).await;
        tokio::time::timeout(Duration::from_secs(5), other_changes.notified())
            .await
            .expect("and the other way round");

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

    /// The retries last the whole patience, and the error says how long they took.
    #[tokio::test]
    async fn retries_last_their_patience_and_say_how_long() {
        let patience = Duration::from_millis(1300);
        let started = Instant::now();
        let error = Postgres::connect_within(
            "postgres://someone@127.0.0.1:1/mydb",
            &DatastoreTls::default(),
            patience,
        )
        .await
        .err()
        .expect("nothing listens on port 1");
        crate::backend::assert_gave_up_after(&error, started, patience);
    }

    /// Whether `backend`'s pooled connections use TLS.
    async fn encrypted(backend: &Postgres) -> bool {
        let client = backend.connections.pooled().await.unwrap();
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
        let client = plain.connections.pooled().await.unwrap();
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
        let client = backend.connections.pooled().await.unwrap();
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

    /// Whether `changes` hears a NOTIFY within `ms` (the poll interval's
    /// wake-ups do not count).
    async fn changed_within(changes: &mut ChangeFeed, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), changes.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn dead_listen_and_lock_sessions_are_replaced() {
        let database = TestDatabase::new();
        let first = database.connect().await;
        let second = database.connect().await;
        let mut changes = first.change_feed();
        let listeners = "SELECT pid FROM pg_stat_activity                          WHERE datname = current_database() AND query = 'LISTEN cetera'";
        assert_eq!(terminate(&first, listeners).await, 2);
        assert!(
            changed_within(&mut changes, 5000).await,
            "a new listener wakes its waiters once"
        );
        while changed_within(&mut changes, 200).await {}
        commit_entries(&second, 2, &[kv(b"a", b"1", 2)]).await;
        assert!(
            changed_within(&mut changes, 5000).await,
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
}
