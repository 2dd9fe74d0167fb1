//! `cetera migrate --from kine+...`: kine-format databases on SQLite,
//! PostgreSQL and MySQL, built by issuing the statements kine issues,
//! migrated into each backend and read back through the etcd API: the
//! revisions, the history after kine's compact revision (reads at old
//! revisions), versions, and leases; an interrupted import of 100k rows
//! (nothing committed) and its rerun; and an import over the etcd API from
//! a server whose lease RPCs answer "not supported", as kine's do.
//!
//! The fixture follows k3s-io/kine at tag v0.16.4:
//! - the schemas of pkg/drivers/sqlite/sqlite.go, pkg/drivers/pgsql/pgsql.go
//!   and pkg/drivers/mysql/mysql.go;
//! - every write is pkg/drivers/generic/generic.go's insert (InsertSQL with
//!   `RETURNING id` on PostgreSQL, InsertLastInsertIDSQL on SQLite and
//!   MySQL, which set LastInsertID), with the arguments
//!   pkg/logstructured/logstructured.go's Create, Update and Delete pass
//!   through pkg/logstructured/sqllog/sql.go's Append;
//! - kine's start writes its `compact_rev_key` row (sql.go compactStart) and
//!   the `/registry/health` key (logstructured.go Start);
//! - gap rows are generic.go's FillSQL, as the poller in sql.go writes them
//!   for a revision whose insert did not commit (on PostgreSQL after the
//!   sequence handed that id out, as a failed insert leaves it);
//! - a compaction is each driver's CompactSQL then generic.go's
//!   UpdateCompactSQL, in one transaction (sql.go compact);
//! - the apiserver's `compact_rev_key` lives in `compact_rev_key_apiserver`
//!   as "version|value" (pkg/server/compact.go EncodeVersion).

mod common;
#[path = "migrate_kine/fake_kine.rs"]
mod fake_kine;

use std::collections::BTreeMap;
use std::path::Path;

use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::{RangeRequest, RangeResponse};
use cetera::proto::mvccpb::KeyValue;
use common::datastore::{FreshDatabase, TestBackend};
use common::kv_fixtures::range_all;
use common::migration::{
    assert_empty_store, assert_prints, assert_success, kill_migrate_at_progress, leases, migrate,
    text,
};
use common::{Cetera, channel, in_ci};
use mysql_async::prelude::Queryable;

/// A kine database being written as kine writes it.
enum Kine {
    Sqlite(rusqlite::Connection),
    Postgres(tokio_postgres::Client),
    Mysql(mysql_async::Conn),
}

/// kine's schema per dialect (v0.16.4, each driver's `schema`).
const SQLITE_SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS kine (
        id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, created INTEGER, deleted INTEGER,
        create_revision INTEGER, prev_revision INTEGER, lease INTEGER, value BLOB,
        old_value BLOB);
    CREATE INDEX IF NOT EXISTS kine_name_index ON kine (name);
    CREATE INDEX IF NOT EXISTS kine_name_id_index ON kine (name,id);
    CREATE INDEX IF NOT EXISTS kine_id_deleted_index ON kine (id,deleted);
    CREATE INDEX IF NOT EXISTS kine_prev_revision_index ON kine (prev_revision);
    CREATE UNIQUE INDEX IF NOT EXISTS kine_name_prev_revision_uindex
        ON kine (name, prev_revision);
    CREATE INDEX IF NOT EXISTS kine_id_compact_rev_key_with_prev_revision_index
        ON kine(id, name, prev_revision) WHERE name != 'compact_rev_key' AND prev_revision != 0;";
const POSTGRES_SCHEMA: &str = r#"
    CREATE TABLE IF NOT EXISTS kine (
        id BIGSERIAL PRIMARY KEY, name text COLLATE "C", created INTEGER, deleted INTEGER,
        create_revision BIGINT, prev_revision BIGINT, lease INTEGER, value bytea,
        old_value bytea);
    CREATE INDEX IF NOT EXISTS kine_name_index ON kine (name);
    CREATE INDEX IF NOT EXISTS kine_name_id_index ON kine (name,id);
    CREATE INDEX IF NOT EXISTS kine_id_deleted_index ON kine (id,deleted);
    CREATE INDEX IF NOT EXISTS kine_prev_revision_index ON kine (prev_revision);
    CREATE UNIQUE INDEX IF NOT EXISTS kine_name_prev_revision_uindex
        ON kine (name, prev_revision);
    CREATE INDEX IF NOT EXISTS kine_list_query_index on kine(name, id DESC, deleted);"#;
const MYSQL_SCHEMA: [&str; 6] = [
    "CREATE TABLE IF NOT EXISTS kine (
        id BIGINT UNSIGNED AUTO_INCREMENT, name VARCHAR(630) CHARACTER SET ascii,
        created INTEGER, deleted INTEGER, create_revision BIGINT UNSIGNED,
        prev_revision BIGINT UNSIGNED, lease INTEGER, value MEDIUMBLOB, old_value MEDIUMBLOB,
        PRIMARY KEY (id))",
    "CREATE INDEX kine_name_index ON kine (name)",
    "CREATE INDEX kine_name_id_index ON kine (name,id)",
    "CREATE INDEX kine_id_deleted_index ON kine (id,deleted)",
    "CREATE INDEX kine_prev_revision_index ON kine (prev_revision)",
    "CREATE UNIQUE INDEX kine_name_prev_revision_uindex ON kine (name, prev_revision)",
];

/// generic.go InsertLastInsertIDSQL (SQLite, MySQL) and InsertSQL (PostgreSQL).
const INSERT: &str = "INSERT INTO kine(name, created, deleted, create_revision, prev_revision, \
     lease, value, old_value) SELECT ?, ?, ?, ?, ?, ?, ?, (SELECT value FROM kine WHERE id = ?) \
     AS old_value";
const INSERT_PG: &str = "INSERT INTO kine(name, created, deleted, create_revision, \
     prev_revision, lease, value, old_value) SELECT $1, $2, $3, $4, $5, $6, $7, \
     (SELECT value FROM kine WHERE id = $8) AS old_value RETURNING id";
/// generic.go FillSQL.
const FILL: &str = "INSERT INTO kine(id, name, created, deleted, create_revision, \
     prev_revision, lease, value, old_value) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)";
const FILL_PG: &str = "INSERT INTO kine(id, name, created, deleted, create_revision, \
     prev_revision, lease, value, old_value) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9)";
/// Each driver's CompactSQL.
const COMPACT_SQLITE: &str = "DELETE FROM kine AS kv WHERE kv.id IN (
        SELECT kp.prev_revision AS id FROM kine AS kp
        WHERE kp.name != 'compact_rev_key' AND kp.prev_revision != 0 AND kp.id <= ?
        UNION
        SELECT kd.id AS id FROM kine AS kd WHERE kd.deleted != 0 AND kd.id <= ?)";
const COMPACT_PG: &str = "DELETE FROM kine AS kv USING (
        SELECT kp.prev_revision AS id FROM kine AS kp
        WHERE kp.name != 'compact_rev_key' AND kp.prev_revision != 0 AND kp.id <= $1
        UNION
        SELECT kd.id AS id FROM kine AS kd WHERE kd.deleted != 0 AND kd.id <= $2
    ) AS ks WHERE kv.id = ks.id";
const COMPACT_MYSQL: &str = "DELETE kv FROM kine AS kv INNER JOIN (
        SELECT kp.prev_revision AS id FROM kine AS kp
        WHERE kp.name != 'compact_rev_key' AND kp.prev_revision != 0 AND kp.id <= ?
        UNION
        SELECT kd.id AS id FROM kine AS kd WHERE kd.deleted != 0 AND kd.id <= ?
    ) AS ks ON kv.id = ks.id";
/// generic.go UpdateCompactSQL.
const UPDATE_COMPACT: &str = "UPDATE kine SET prev_revision = ? WHERE name = 'compact_rev_key'";
const UPDATE_COMPACT_PG: &str = "UPDATE kine SET prev_revision = $1 WHERE name = 'compact_rev_key'";

/// The arguments of generic.go's Insert.
struct Insert<'a> {
    key: &'a str,
    create: bool,
    delete: bool,
    create_revision: i64,
    previous_revision: i64,
    ttl: i64,
    value: Option<&'a [u8]>,
}

impl Kine {
    /// Creates kine's table in an SQLite file.
    fn sqlite(path: &Path) -> Kine {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL;").unwrap();
        conn.execute_batch(SQLITE_SCHEMA).unwrap();
        Kine::Sqlite(conn)
    }

    /// Creates the database `name` on the test PostgreSQL and kine's table in it.
    async fn postgres(base: &str, name: &str) -> Kine {
        let (admin, driver) =
            tokio_postgres::connect(&format!("{base}/postgres"), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(driver);
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
        let (client, driver) =
            tokio_postgres::connect(&format!("{base}/{name}"), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(driver);
        client.batch_execute(POSTGRES_SCHEMA).await.unwrap();
        Kine::Postgres(client)
    }

    /// Creates the database `name` on the test MySQL and kine's table in it.
    async fn mysql(base: &str, name: &str) -> Kine {
        let mut admin = mysql_async::Conn::from_url(base).await.unwrap();
        admin
            .query_drop(format!("CREATE DATABASE `{name}`"))
            .await
            .unwrap();
        admin.disconnect().await.unwrap();
        let mut conn = mysql_async::Conn::from_url(format!("{base}/{name}"))
            .await
            .unwrap();
        for statement in MYSQL_SCHEMA {
            conn.query_drop(statement).await.unwrap();
        }
        Kine::Mysql(conn)
    }

    /// generic.go Insert: returns the new row's id.
    async fn insert(&mut self, row: Insert<'_>) -> i64 {
        let (create, delete) = (i64::from(row.create), i64::from(row.delete));
        match self {
            Kine::Sqlite(conn) => {
                conn.prepare_cached(INSERT)
                    .unwrap()
                    .execute(rusqlite::params![
                        row.key,
                        create,
                        delete,
                        row.create_revision,
                        row.previous_revision,
                        row.ttl,
                        row.value,
                        row.previous_revision
                    ])
                    .unwrap();
                conn.last_insert_rowid()
            }
            Kine::Postgres(client) => {
                let (create, delete, ttl) = (create as i32, delete as i32, row.ttl as i32);
                client
                    .query_one(
                        INSERT_PG,
                        &[
                            &row.key,
                            &create,
                            &delete,
                            &row.create_revision,
                            &row.previous_revision,
                            &ttl,
                            &row.value,
                            &row.previous_revision,
                        ],
                    )
                    .await
                    .unwrap()
                    .get(0)
            }
            Kine::Mysql(conn) => {
                conn.exec_drop(
                    INSERT,
                    (
                        row.key,
                        create,
                        delete,
                        row.create_revision,
                        row.previous_revision,
                        row.ttl,
                        row.value,
                        row.previous_revision,
                    ),
                )
                .await
                .unwrap();
                conn.last_insert_id().unwrap() as i64
            }
        }
    }

    /// sql.go's poller filling a revision that never committed: generic.go
    /// Fill. Returns the gap's id.
    async fn gap(&mut self) -> i64 {
        let id = match self {
            // The sequence handed the id to an insert that failed.
            Kine::Postgres(client) => client
                .query_one("SELECT nextval('kine_id_seq')", &[])
                .await
                .unwrap()
                .get(0),
            _ => self.max_id().await + 1,
        };
        let name = format!("gap-{id}");
        let none: Option<&[u8]> = None;
        match self {
            Kine::Sqlite(conn) => {
                conn.execute(FILL, rusqlite::params![id, name, 0, 1, 0, 0, 0, none, none])
                    .unwrap();
            }
            Kine::Postgres(client) => {
                let (zero, one) = (0i32, 1i32);
                client
                    .execute(
                        FILL_PG,
                        &[&id, &name, &zero, &one, &0i64, &0i64, &zero, &none, &none],
                    )
                    .await
                    .unwrap();
            }
            Kine::Mysql(conn) => {
                conn.exec_drop(FILL, (id, name, 0, 1, 0, 0, 0, none, none))
                    .await
                    .unwrap();
            }
        }
        id
    }

    /// sql.go compact: CompactSQL and UpdateCompactSQL in one transaction.
    async fn compact(&mut self, revision: i64) {
        match self {
            Kine::Sqlite(conn) => {
                let txn = conn.transaction().unwrap();
                txn.execute(COMPACT_SQLITE, [revision, revision]).unwrap();
                txn.execute(UPDATE_COMPACT, [revision]).unwrap();
                txn.commit().unwrap();
            }
            Kine::Postgres(client) => {
                let txn = client.transaction().await.unwrap();
                txn.execute(COMPACT_PG, &[&revision, &revision])
                    .await
                    .unwrap();
                txn.execute(UPDATE_COMPACT_PG, &[&revision]).await.unwrap();
                txn.commit().await.unwrap();
            }
            Kine::Mysql(conn) => {
                let mut txn = conn
                    .start_transaction(mysql_async::TxOpts::default())
                    .await
                    .unwrap();
                txn.exec_drop(COMPACT_MYSQL, (revision, revision))
                    .await
                    .unwrap();
                txn.exec_drop(UPDATE_COMPACT, (revision,)).await.unwrap();
                txn.commit().await.unwrap();
            }
        }
    }

    async fn max_id(&mut self) -> i64 {
        match self {
            Kine::Sqlite(conn) => conn
                .query_row("SELECT COALESCE(MAX(id), 0) FROM kine", [], |r| r.get(0))
                .unwrap(),
            Kine::Postgres(client) => client
                .query_one("SELECT COALESCE(MAX(id), 0)::BIGINT FROM kine", &[])
                .await
                .unwrap()
                .get(0),
            Kine::Mysql(conn) => conn
                .query_first("SELECT CAST(COALESCE(MAX(id), 0) AS SIGNED) FROM kine")
                .await
                .unwrap()
                .unwrap(),
        }
    }
}

/// A key's last kine row, as logstructured.go's `get` sees it.
#[derive(Clone, Copy)]
struct Last {
    id: i64,
    created: bool,
    deleted: bool,
    create_revision: i64,
}

/// Writes kine's way (logstructured.go Create, Update, Delete) and keeps
/// the etcd state a client should see at every revision.
struct Writer {
    kine: Kine,
    last: BTreeMap<String, Last>,
    /// The live keys after each revision.
    states: BTreeMap<i64, BTreeMap<Vec<u8>, KeyValue>>,
    live: BTreeMap<Vec<u8>, KeyValue>,
}

impl Writer {
    /// kine's start on a new database: its compact_rev_key row, then the
    /// health key.
    async fn start(kine: Kine) -> Writer {
        let mut writer = Writer {
            kine,
            last: BTreeMap::new(),
            states: BTreeMap::new(),
            live: BTreeMap::new(),
        };
        writer.raw_create("compact_rev_key", b"", 0).await;
        writer
            .raw_create("/registry/health", br#"{"health":"true"}"#, 0)
            .await;
        writer
    }

    /// Records the state at revision `id`.
    fn record(&mut self, id: i64) {
        self.states.insert(id, self.live.clone());
    }

    /// logstructured.go Create, without the client-visible state.
    async fn raw_create(&mut self, key: &str, value: &[u8], ttl: i64) -> i64 {
        let previous = match self.last.get(key) {
            Some(last) if !last.deleted => panic!("{key} exists"),
            Some(last) => last.id,
            None => 0,
        };
        let id = self
            .kine
            .insert(Insert {
                key,
                create: true,
                delete: false,
                create_revision: 0,
                previous_revision: previous,
                ttl,
                value: Some(value),
            })
            .await;
        self.last.insert(
            key.into(),
            Last {
                id,
                created: true,
                deleted: false,
                create_revision: 0,
            },
        );
        self.record(id);
        id
    }

    /// A client's create (etcd view: version 1).
    async fn create(&mut self, key: &str, value: &str, ttl: i64) -> i64 {
        let id = self.raw_create(key, value.as_bytes(), ttl).await;
        self.set(key, value, id, id, 1, ttl);
        id
    }

    fn set(&mut self, key: &str, value: &str, create: i64, id: i64, version: i64, ttl: i64) {
        self.live.insert(
            key.as_bytes().to_vec(),
            KeyValue {
                key: key.into(),
                create_revision: create,
                mod_revision: id,
                version,
                value: value.into(),
                lease: ttl,
            },
        );
        self.record(id);
    }

    /// logstructured.go Update: returns the new id.
    async fn update(&mut self, key: &str, value: &str, ttl: i64) -> i64 {
        let last = self.last[key];
        assert!(!last.deleted);
        // kine's get reports a create row's own id as its create revision.
        let create_revision = if last.created {
            last.id
        } else {
            last.create_revision
        };
        let id = self
            .kine
            .insert(Insert {
                key,
                create: false,
                delete: false,
                create_revision,
                previous_revision: last.id,
                ttl,
                value: Some(value.as_bytes()),
            })
            .await;
        self.last.insert(
            key.into(),
            Last {
                id,
                created: false,
                deleted: false,
                create_revision,
            },
        );
        let version = self.live.get(key.as_bytes()).map_or(0, |kv| kv.version) + 1;
        if key == "compact_rev_key_apiserver" {
            self.record(id);
        } else {
            self.set(key, value, create_revision, id, version, ttl);
        }
        id
    }

    /// logstructured.go Delete.
    async fn delete(&mut self, key: &str) -> i64 {
        let last = self.last[key];
        let id = self
            .kine
            .insert(Insert {
                key,
                create: false,
                delete: true,
                create_revision: 0,
                previous_revision: last.id,
                ttl: 0,
                value: None,
            })
            .await;
        self.last.insert(
            key.into(),
            Last {
                id,
                created: false,
                deleted: true,
                create_revision: 0,
            },
        );
        self.live.remove(key.as_bytes());
        self.record(id);
        id
    }

    /// The apiserver's compaction Txn through kine (compact.go): the key
    /// `compact_rev_key_apiserver` with "version|revision"; clients see
    /// `compact_rev_key` at that version.
    async fn apiserver_compact_key(&mut self, version: i64, revision: i64) -> i64 {
        let key = "compact_rev_key_apiserver";
        let stored = format!("{version}|{revision}");
        let id = if version == 1 {
            self.raw_create(key, stored.as_bytes(), 0).await
        } else {
            self.update(key, &stored, 0).await
        };
        let create = self
            .live
            .get(&b"compact_rev_key"[..])
            .map_or(id, |kv| kv.create_revision);
        self.set(
            "compact_rev_key",
            &revision.to_string(),
            create,
            id,
            version,
            0,
        );
        id
    }

    async fn gap(&mut self) -> i64 {
        let id = self.kine.gap().await;
        self.record(id);
        id
    }

    /// A kine compaction at `revision`. Keys whose create row it removes
    /// (their oldest row left is an update) read from here on with the
    /// version rule of the import: 2 at that row, counted on from there.
    async fn compact(&mut self, revision: i64) {
        self.kine.compact(revision).await;
        let at = self.states.range(..=revision).last().unwrap().1.clone();
        for (key, kv) in at {
            if key == b"compact_rev_key" || kv.create_revision == kv.mod_revision {
                continue;
            }
            let offset = kv.version - 2;
            for state in self.states.range_mut(revision..).map(|(_, s)| s) {
                if let Some(later) = state.get_mut(&key)
                    && later.create_revision == kv.create_revision
                {
                    later.version -= offset;
                }
            }
            if let Some(live) = self.live.get_mut(&key)
                && live.create_revision == kv.create_revision
            {
                live.version -= offset;
            }
        }
    }

    /// The current revision (kine's largest id).
    fn current(&self) -> i64 {
        *self.states.keys().last().unwrap()
    }

    /// Closes the database (as a stopped k3s leaves it) and returns what a
    /// client should see.
    fn finish(self) -> Expected {
        Expected {
            states: self.states,
        }
    }
}

/// The live keys a client should see after each revision.
struct Expected {
    states: BTreeMap<i64, BTreeMap<Vec<u8>, KeyValue>>,
}

impl Expected {
    /// The current revision (kine's largest id).
    fn current(&self) -> i64 {
        *self.states.keys().last().unwrap()
    }

    /// The live keys at `revision`.
    fn at(&self, revision: i64) -> Vec<KeyValue> {
        self.states
            .range(..=revision)
            .last()
            .map(|(_, s)| s.values().cloned().collect())
            .unwrap_or_default()
    }
}

const EVENT_TTL: i64 = 3660;
const MASTER_TTL: i64 = 15;
const OTHER_TTL: i64 = 7200;

/// A k3s-shaped dataset: namespaces, config maps written over, a node lease
/// renewed, the apiserver's master lease (TTL 15) and Events (TTL 3660)
/// under kine's fake leases, a pod deleted and created again, gap rows, the
/// apiserver's compaction key, a compaction, and writes after it.
/// Returns the writer (with the expected states) and the compact revision.
async fn k3s_dataset(kine: Kine) -> (Writer, i64) {
    let mut w = Writer::start(kine).await;
    w.create("/registry/namespaces/default", "ns-default", 0)
        .await;
    w.create("/registry/namespaces/kube-system", "ns-ks", 0)
        .await;
    for i in 0..5 {
        w.create(&format!("/registry/configmaps/kube-system/cm-{i}"), "c1", 0)
            .await;
    }
    w.update("/registry/configmaps/kube-system/cm-1", "c2", 0)
        .await;
    w.update("/registry/configmaps/kube-system/cm-1", "c3", 0)
        .await;
    w.update("/registry/configmaps/kube-system/cm-2", "c2", 0)
        .await;
    // Capitals: kine's MySQL column compares them case-insensitively.
    w.create("/registry/clusterroles/MyRole", "role", 0).await;
    w.create("/registry/leases/kube-node-lease/node-1", "renew-0", 0)
        .await;
    for i in 1..=4 {
        w.update(
            "/registry/leases/kube-node-lease/node-1",
            &format!("renew-{i}"),
            0,
        )
        .await;
    }
    w.create("/registry/masterleases/10.0.0.1", "m1", MASTER_TTL)
        .await;
    w.gap().await;
    for i in 0..6 {
        w.create(
            &format!("/registry/events/default/ev-{i}"),
            "event",
            EVENT_TTL,
        )
        .await;
    }
    w.delete("/registry/events/default/ev-0").await;
    w.delete("/registry/configmaps/kube-system/cm-4").await;
    let first = w.current();
    w.apiserver_compact_key(1, first).await;
    w.create("/registry/pods/default/web-0", "pod-1", 0).await;
    w.update("/registry/pods/default/web-0", "pod-2", 0).await;
    w.delete("/registry/pods/default/web-0").await;
    w.create("/registry/pods/default/web-0", "pod-3", 0).await;
    w.update("/registry/masterleases/10.0.0.1", "m2", MASTER_TTL)
        .await;
    let compact_at = w.current();
    // Written before kine's compactor ran (it never compacts the newest
    // revisions): these stay history after the compact revision.
    w.update("/registry/leases/kube-node-lease/node-1", "renew-5", 0)
        .await;
    w.delete("/registry/configmaps/kube-system/cm-3").await;
    w.compact(compact_at).await;
    w.update("/registry/configmaps/kube-system/cm-1", "c4", 0)
        .await;
    w.update("/registry/leases/kube-node-lease/node-1", "renew-6", 0)
        .await;
    w.create("/registry/events/default/ev-6", "event", EVENT_TTL)
        .await;
    w.create("/registry/secrets/default/token", "s", OTHER_TTL)
        .await;
    w.delete("/registry/events/default/ev-1").await;
    w.gap().await;
    w.apiserver_compact_key(2, compact_at).await;
    w.delete("/registry/pods/default/web-0").await;
    w.update("/registry/namespaces/default", "ns-default-2", 0)
        .await;
    (w, compact_at)
}

/// Skips (or, in CI, fails) when a database server is not running.
fn reachable(backend: TestBackend) -> bool {
    if FreshDatabase::reachable(backend) {
        return true;
    }
    if in_ci() {
        panic!("{backend:?} is not reachable (CI=true, so this is an error)");
    }
    eprintln!("!!! WARNING: {backend:?} is not reachable; SKIPPING it");
    false
}

/// The database name in a FreshDatabase endpoint, and the server URL before it.
fn split_database(endpoint: &str) -> (String, String) {
    let without_query = endpoint.split('?').next().unwrap();
    let (base, name) = without_query.rsplit_once('/').unwrap();
    (base.to_string(), name.to_string())
}

async fn range_at(
    kv: &mut KvClient<tonic::transport::Channel>,
    revision: i64,
) -> Result<RangeResponse, String> {
    kv.range(range_all(revision))
        .await
        .map(|r| r.into_inner())
        .map_err(|s| s.message().to_string())
}

/// Runs `cetera migrate --from FROM --to TARGET`, checks what it prints,
/// then reads the target through cetera: every revision from kine's
/// compact revision on as the dataset had it, older ones compacted, and
/// the leases. Returns the HashKV line.
async fn migrate_and_check(
    from: &str,
    target: &FreshDatabase,
    w: &Expected,
    compact_at: i64,
) -> String {
    let output = migrate(from, &target.endpoint, &[]);
    assert_success(&output, "cetera migrate --from kine");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let current = w.current();
    let live = w.at(current);
    assert_prints(
        &stdout,
        &format!("migrated: revision {current}, compact revision {compact_at}, history kept"),
    );
    assert_prints(
        &stdout,
        &format!("verified revision: source {current} target {current} (equal)"),
    );
    assert_prints(
        &stdout,
        &format!("verified compact revision: source {compact_at} target {compact_at}"),
    );
    assert_prints(
        &stdout,
        &format!("verified HashKV at revision {current}: source"),
    );
    let keys = live.len();
    assert_prints(
        &stdout,
        &format!("verified keys at revision {current}: source {keys} target {keys} (equal)"),
    );
    assert_prints(&stdout, "verified leases: source 3 target 3 (equal)");

    let server = Cetera::start_on(&target.endpoint).await;
    let mut kv = KvClient::new(channel(&server.endpoint()).await);
    for revision in 1..=current {
        let got = range_at(&mut kv, revision).await;
        if revision < compact_at {
            assert_eq!(
                got.unwrap_err(),
                "etcdserver: mvcc: required revision has been compacted",
                "revision {revision}"
            );
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("revision {revision}: {e}"));
        assert_eq!(got.header.unwrap().revision, current);
        assert_eq!(
            got.kvs,
            w.at(revision),
            "{} at revision {revision}",
            target.endpoint
        );
    }
    // kine's bookkeeping is not there; the apiserver's compaction key is, as
    // kine showed it.
    let compact_key = got_key(&mut kv, "compact_rev_key").await.unwrap();
    assert_eq!(
        (compact_key.value, compact_key.version),
        (compact_at.to_string().into_bytes(), 2)
    );
    assert!(got_key(&mut kv, "/registry/health").await.is_none());
    assert!(
        got_key(&mut kv, "compact_rev_key_apiserver")
            .await
            .is_none()
    );

    // One lease per TTL of the live keys, id = TTL, with its keys and
    // (nearly) the full TTL.
    let got = leases(&server.endpoint()).await;
    let want: Vec<(i64, Vec<Vec<u8>>)> = [MASTER_TTL, EVENT_TTL, OTHER_TTL]
        .into_iter()
        .map(|ttl| {
            let keys = live
                .iter()
                .filter(|kv| kv.lease == ttl)
                .map(|kv| kv.key.clone())
                .collect();
            (ttl, keys)
        })
        .collect();
    assert_eq!(
        got.iter()
            .map(|(id, _, _, keys)| (*id, keys.clone()))
            .collect::<Vec<_>>(),
        want
    );
    for (id, granted, remaining, _) in &got {
        assert_eq!(granted, id);
        assert!(
            *remaining <= *granted && *remaining > *granted - 60,
            "{got:?}"
        );
    }
    stdout
        .lines()
        .find(|line| line.starts_with("verified HashKV"))
        .unwrap()
        .to_string()
}

async fn got_key(kv: &mut KvClient<tonic::transport::Channel>, key: &str) -> Option<KeyValue> {
    kv.range(RangeRequest {
        key: key.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .kvs
    .pop()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kine_sqlite_file_migrates_to_each_backend_with_history_and_leases() {
    let source_dir = tempfile::tempdir().unwrap();
    let path = source_dir.path().join("state.db");
    let (w, compact_at) = k3s_dataset(Kine::sqlite(&path)).await;
    // Closed, as after `systemctl stop k3s`.
    let w = w.finish();
    let from = format!("kine+sqlite://{}", path.display());
    let mut hashes = Vec::new();
    for backend in [
        TestBackend::Sqlite,
        TestBackend::Postgres,
        TestBackend::Mysql,
    ] {
        if !reachable(backend) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let target = FreshDatabase::of(backend, dir.path());
        hashes.push(migrate_and_check(&from, &target, &w, compact_at).await);
    }
    // The same store on every backend.
    hashes.dedup();
    assert_eq!(hashes.len(), 1, "{hashes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kine_databases_on_postgres_and_mysql_migrate_with_history_and_leases() {
    let mut hashes = Vec::new();
    // The same dataset in kine's SQLite dialect, for comparison.
    let sqlite_dir = tempfile::tempdir().unwrap();
    let sqlite_path = sqlite_dir.path().join("state.db");
    let (w, compact_at) = k3s_dataset(Kine::sqlite(&sqlite_path)).await;
    let w = w.finish();
    let target_dir = tempfile::tempdir().unwrap();
    let target = FreshDatabase::of(TestBackend::Sqlite, target_dir.path());
    hashes.push(
        migrate_and_check(
            &format!("kine+sqlite://{}", sqlite_path.display()),
            &target,
            &w,
            compact_at,
        )
        .await,
    );
    for backend in [TestBackend::Postgres, TestBackend::Mysql] {
        if !reachable(backend) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        // The database is made here, by kine's schema, not by cetera.
        let source = FreshDatabase::of(backend, dir.path());
        let (base, name) = split_database(&source.endpoint);
        let (kine, from) = match backend {
            // kine's other scheme, and the name in capitals: kine folds it
            // to lower case.
            TestBackend::Postgres => (
                Kine::postgres(&base, &name).await,
                format!(
                    "kine+{}/{}?sslmode=disable",
                    base.replacen("postgres://", "postgresql://", 1),
                    name.to_uppercase()
                ),
            ),
            _ => {
                // kine's own Go DSN spelling.
                let host = base
                    .trim_start_matches("mysql://")
                    .trim_start_matches("root@");
                (
                    Kine::mysql(&base, &name).await,
                    format!("kine+mysql://root@tcp({host})/{name}"),
                )
            }
        };
        let (w, compact_at) = k3s_dataset(kine).await;
        let w = w.finish();
        let target = FreshDatabase::of(TestBackend::Sqlite, dir.path());
        hashes.push(migrate_and_check(&from, &target, &w, compact_at).await);
    }
    // Each of kine's dialects gives the same store.
    hashes.dedup();
    assert_eq!(hashes.len(), 1, "{hashes:?}");
}

/// Writes `rows` kine rows into a new SQLite file in one transaction: 5000
/// Events created and rewritten over and over, some deleted and created
/// again.
fn large_kine_file(path: &Path, rows: usize) {
    let mut conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(SQLITE_SCHEMA).unwrap();
    let txn = conn.transaction().unwrap();
    {
        let mut insert = txn.prepare(INSERT).unwrap();
        let mut last: Vec<Option<(i64, bool, i64)>> = vec![None; 5000];
        let value = [b'e'; 200];
        for n in 0..rows {
            let slot = n % 5000;
            let key = format!("/registry/events/default/ev-{slot:04}");
            // (create, delete, create_revision, previous)
            let (create, delete, create_rev, previous) = match last[slot] {
                None => (1, 0, 0, 0),
                Some((id, true, _)) => (1, 0, 0, id),
                Some((id, false, create_rev)) if n % 7 == 0 => (0, 1, create_rev, id),
                Some((id, false, create_rev)) => (0, 0, create_rev, id),
            };
            let create_column = if create == 1 || delete == 1 {
                0
            } else {
                create_rev
            };
            let payload: Option<&[u8]> = (delete == 0).then_some(&value[..]);
            let ttl = if delete == 1 { 0 } else { EVENT_TTL };
            insert
                .execute(rusqlite::params![
                    key,
                    create,
                    delete,
                    create_column,
                    previous,
                    ttl,
                    payload,
                    previous
                ])
                .unwrap();
            let id = txn.last_insert_rowid();
            let create_rev = if create == 1 { id } else { create_rev };
            last[slot] = Some((id, delete == 1, create_rev));
        }
    }
    txn.commit().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_import_of_100k_rows_commits_nothing_and_a_rerun_completes() {
    let source_dir = tempfile::tempdir().unwrap();
    let path = source_dir.path().join("state.db");
    large_kine_file(&path, 100_000);
    let from = format!("kine+sqlite://{}", path.display());
    let dir = tempfile::tempdir().unwrap();
    let target = FreshDatabase::new(dir.path());

    // Progress is reported (a line every tenth without a terminal); kill -9
    // at the first one.
    kill_migrate_at_progress(&from, &target.endpoint, " of 100000 revisions");
    assert_empty_store(&target.endpoint).await;

    let rerun = migrate(&from, &target.endpoint, &[]);
    assert_success(&rerun, "rerun of cetera migrate --from kine");
    let stdout = String::from_utf8_lossy(&rerun.stdout);
    assert_prints(
        &stdout,
        "migrated: revision 100000, compact revision -1, history kept",
    );
    assert_prints(&stdout, "verified HashKV at revision 100000");
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(
        stderr.contains("copied 100000 of 100000 revisions"),
        "{}",
        text(&rerun)
    );

    // Spot checks through the API: a key's history and version.
    let server = Cetera::start_on(&target.endpoint).await;
    let mut kv = KvClient::new(channel(&server.endpoint()).await);
    let resp = range_at(&mut kv, 0).await.unwrap();
    assert!(resp.count > 4000 && resp.count <= 5000, "{}", resp.count);
    let first = range_at(&mut kv, 5000).await.unwrap();
    assert_eq!(first.kvs.len(), 5000);
    assert!(
        first
            .kvs
            .iter()
            .all(|kv| kv.version == 1 && kv.lease == EVENT_TTL)
    );
    let got = leases(&server.endpoint()).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, EVENT_TTL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_kine_is_imported_over_the_etcd_api_with_leases_from_the_keys() {
    let source_dir = tempfile::tempdir().unwrap();
    let (w, _) = k3s_dataset(Kine::sqlite(&source_dir.path().join("state.db"))).await;
    let w = w.finish();
    let current = w.current();
    let live = w.at(current);
    // What kine lists: versions 0 (the apiserver's compaction key aside,
    // which it keeps under another name), its own compact_rev_key row and
    // its health key.
    let mut rows: Vec<(Vec<u8>, KeyValue)> = live
        .iter()
        .map(|kv| {
            if kv.key == b"compact_rev_key" {
                (b"compact_rev_key_apiserver".to_vec(), kv.clone())
            } else {
                let listed = KeyValue {
                    version: 0,
                    ..kv.clone()
                };
                (kv.key.clone(), listed)
            }
        })
        .collect();
    for (key, value, revision) in [
        ("compact_rev_key", "", 1),
        ("/registry/health", r#"{"health":"true"}"#, 2),
    ] {
        let kv = KeyValue {
            key: key.into(),
            value: value.into(),
            create_revision: revision,
            mod_revision: revision,
            ..Default::default()
        };
        rows.push((key.into(), kv));
    }
    // Pages of 1000 keys: enough to need several; some in capitals, which
    // kine on MySQL lists out of bytewise order.
    for n in 0..2500 {
        let key = if n % 100 == 0 {
            format!("/registry/configmaps/bulk/CM-{n:05}")
        } else {
            format!("/registry/configmaps/bulk/cm-{n:05}")
        };
        let kv = KeyValue {
            key: key.clone().into(),
            value: b"x".to_vec(),
            create_revision: 3,
            mod_revision: 3,
            ..Default::default()
        };
        rows.push((key.into(), kv));
    }
    let addr = fake_kine::FakeKine::new(rows.clone(), current)
        .serve()
        .await;

    let dir = tempfile::tempdir().unwrap();
    let target = FreshDatabase::new(dir.path());
    let output = migrate(&format!("http://{addr}"), &target.endpoint, &[]);
    assert_success(&output, "cetera migrate --from a kine");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("lease leases is not supported"), "{stderr}");
    assert!(
        stderr.contains("deriving the leases from the keys' lease fields"),
        "{stderr}"
    );
    assert_prints(
        &stdout,
        &format!("migrated: revision {current}, compact revision {current}, history dropped"),
    );
    let keys = live.len() + 2500;
    assert_prints(
        &stdout,
        &format!("verified keys at revision {current}: source {keys} target {keys} (equal)"),
    );
    assert_prints(&stdout, "verified leases: source 3 target 3 (equal)");

    let server = Cetera::start_on(&target.endpoint).await;
    let mut kv =
        KvClient::new(channel(&server.endpoint()).await).max_decoding_message_size(usize::MAX);
    let got = range_at(&mut kv, 0).await.unwrap();
    // The keys as kine listed them, without its bookkeeping, each at
    // version 1 at least.
    let mut want: Vec<KeyValue> = rows
        .into_iter()
        .map(|(_, kv)| kv)
        .filter(|kv| {
            kv.key != b"/registry/health" && !(kv.key == b"compact_rev_key" && kv.version == 0)
        })
        .map(|kv| KeyValue {
            version: kv.version.max(1),
            ..kv
        })
        .collect();
    want.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(got.kvs, want);
    let got = leases(&server.endpoint()).await;
    let ids: Vec<(i64, i64, usize)> = got
        .iter()
        .map(|(id, granted, _, keys)| (*id, *granted, keys.len()))
        .collect();
    let count = |ttl| live.iter().filter(|kv| kv.lease == ttl).count();
    assert_eq!(
        ids,
        vec![
            (MASTER_TTL, MASTER_TTL, count(MASTER_TTL)),
            (EVENT_TTL, EVENT_TTL, count(EVENT_TTL)),
            (OTHER_TTL, OTHER_TTL, count(OTHER_TTL)),
        ]
    );
}
