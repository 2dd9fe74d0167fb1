//! Reading kine's `kine` table (k3s-io/kine v0.16.4, the schemas of
//! pkg/drivers/sqlite/sqlite.go, pkg/drivers/pgsql/pgsql.go and
//! pkg/drivers/mysql/mysql.go) on each of its SQL dialects, inside one read
//! transaction, so that every query of an import sees the same snapshot.
//!
//! Only the columns an import needs are read: `old_value` (kine's copy of
//! the previous value, for its watch's prev_kv) is not.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use mysql_async::prelude::Queryable;
use rusqlite::OpenFlags;
use rusqlite::types::ValueRef;

use crate::backend::datastore::DatastoreTls;

/// The columns read, in this order, in every dialect; integers cast to
/// 64 bits since older kine schemas declared some of them 32-bit.
const PG_COLUMNS: &str = "id::BIGINT, name, created::BIGINT, deleted::BIGINT, \
     create_revision::BIGINT, prev_revision::BIGINT, lease::BIGINT, value";
const MYSQL_COLUMNS: &str = "CAST(id AS SIGNED), CAST(name AS BINARY), CAST(created AS SIGNED), \
     CAST(deleted AS SIGNED), CAST(create_revision AS SIGNED), CAST(prev_revision AS SIGNED), \
     CAST(lease AS SIGNED), value";
const SQLITE_COLUMNS: &str =
    "id, name, created, deleted, create_revision, prev_revision, lease, value";

/// One row of kine's table: a revision (`id`) of key `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KineRow {
    /// The revision.
    pub id: i64,
    /// The key.
    pub name: Vec<u8>,
    /// The key's first row after it was absent.
    pub created: bool,
    /// A deletion (also every gap row).
    pub deleted: bool,
    /// The key's create revision, as kine stored it (0 in create rows and deletions).
    pub create_revision: i64,
    /// The key's previous row; in kine's `compact_rev_key` row, the compact revision.
    pub prev_revision: i64,
    /// kine's "lease": the TTL in seconds the key was written with (0: none).
    pub lease: i64,
    /// The value (NULL in deletions, read as empty).
    pub value: Vec<u8>,
}

/// Where a kine datastore is: the part of `--from` after `kine+`, in kine's
/// own endpoint syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KineEndpoint {
    /// `sqlite://PATH[?options]`.
    Sqlite(PathBuf),
    /// `postgres://...` or `postgresql://...`.
    Postgres(String),
    /// `mysql://...`, kine's Go DSN (`user:pass@tcp(host:3306)/db`) or a URL.
    Mysql(String),
}

impl KineEndpoint {
    /// Parses the endpoint given after `kine+`.
    pub(crate) fn parse(endpoint: &str) -> anyhow::Result<Self> {
        let endpoint = endpoint.trim();
        if let Some(rest) = endpoint.strip_prefix("sqlite://") {
            // kine's DSN: the file, then its driver options after '?'.
            let path = rest.split('?').next().unwrap_or_default();
            if path.is_empty() {
                bail!("kine+{endpoint} names no SQLite file");
            }
            return Ok(KineEndpoint::Sqlite(PathBuf::from(path)));
        }
        match endpoint.split_once("://").map(|(scheme, _)| scheme) {
            Some("postgres" | "postgresql") => Ok(KineEndpoint::Postgres(endpoint.to_string())),
            Some("mysql") => Ok(KineEndpoint::Mysql(endpoint.to_string())),
            _ => bail!(
                "unknown kine endpoint kine+{endpoint}; expected kine+sqlite://PATH, \
                 kine+postgres://... or kine+mysql://..."
            ),
        }
    }
}

/// An open read transaction on kine's table.
pub(crate) enum KineSource {
    /// The SQLite file, read-only.
    Sqlite(rusqlite::Connection),
    /// A PostgreSQL connection in a REPEATABLE READ, READ ONLY transaction.
    Postgres(tokio_postgres::Client),
    /// A MySQL connection in a consistent-snapshot, read-only transaction.
    Mysql(mysql_async::Conn),
}

/// Which dialect a query is written for.
struct Dialects<'a> {
    sqlite: &'a str,
    postgres: &'a str,
    mysql: &'a str,
}

impl KineSource {
    /// Connects and begins the read transaction. The `kine` table must exist.
    pub(crate) async fn open(endpoint: &KineEndpoint, tls: &DatastoreTls) -> anyhow::Result<Self> {
        let mut source = match endpoint {
            KineEndpoint::Sqlite(path) => KineSource::Sqlite(open_sqlite(path)?),
            KineEndpoint::Postgres(url) => {
                // kine folds the database name to lower case.
                let (client, where_) =
                    crate::backend::postgres::connect_plain(url, tls, true).await?;
                client
                    .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    .await
                    .with_context(|| format!("cannot begin a read on {where_}"))?;
                tracing::info!("reading kine's table at {where_}");
                KineSource::Postgres(client)
            }
            KineEndpoint::Mysql(url) => {
                let (mut conn, where_) = crate::backend::mysql::connect_plain(url, tls).await?;
                conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                    .await
                    .with_context(|| format!("cannot begin a read on {where_}"))?;
                tracing::info!("reading kine's table at {where_}");
                KineSource::Mysql(conn)
            }
        };
        // Also takes the SQLite snapshot: the first read does.
        let found = source
            .integers(Dialects {
                sqlite: "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'kine'",
                postgres: "SELECT COUNT(*)::BIGINT FROM information_schema.tables \
                           WHERE table_schema = current_schema() AND table_name = 'kine'",
                mysql: "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.tables \
                        WHERE table_schema = DATABASE() AND table_name = 'kine'",
            })
            .await?;
        if found.first().copied().unwrap_or(0) == 0 {
            bail!("the source has no `kine` table: it is not a kine datastore");
        }
        Ok(source)
    }

    /// kine's current revision: the largest id (0 for an empty table).
    pub(crate) async fn current_revision(&mut self) -> anyhow::Result<i64> {
        self.single(Dialects {
            sqlite: "SELECT COALESCE(MAX(id), 0) FROM kine",
            postgres: "SELECT COALESCE(MAX(id), 0)::BIGINT FROM kine",
            mysql: "SELECT CAST(COALESCE(MAX(id), 0) AS SIGNED) FROM kine",
        })
        .await
    }

    /// kine's compact revision, read as kine reads it (generic.go's
    /// CompactRevSQL): the prev_revision of its `compact_rev_key` row, 0
    /// if it never compacted.
    pub(crate) async fn compact_revision(&mut self) -> anyhow::Result<i64> {
        self.single(Dialects {
            sqlite: "SELECT COALESCE(MAX(prev_revision), 0) FROM kine \
                     WHERE name = 'compact_rev_key'",
            postgres: "SELECT COALESCE(MAX(prev_revision), 0)::BIGINT FROM kine \
                       WHERE name = 'compact_rev_key'",
            mysql: "SELECT CAST(COALESCE(MAX(prev_revision), 0) AS SIGNED) FROM kine \
                    WHERE name = 'compact_rev_key'",
        })
        .await
    }

    /// The live keys and the distinct positive leases among them, counted
    /// in SQL the way kine lists (each name's largest id, not a deletion),
    /// leaving out kine's `compact_rev_key`: the source side of the import's
    /// checks, computed independently of the conversion. Names are grouped
    /// bytewise (MySQL's ascii column would fold case).
    pub(crate) async fn live_counts(&mut self) -> anyhow::Result<(i64, i64)> {
        let counts = self
            .integers(Dialects {
                sqlite: "SELECT COUNT(*), COUNT(DISTINCT CASE WHEN k.lease > 0 THEN k.lease END) \
                         FROM kine AS k INNER JOIN \
                         (SELECT MAX(id) AS id FROM kine GROUP BY CAST(name AS BLOB)) AS m \
                         ON k.id = m.id \
                         WHERE k.deleted = 0 AND k.name != 'compact_rev_key'",
                postgres: "SELECT COUNT(*)::BIGINT, \
                           COUNT(DISTINCT CASE WHEN k.lease > 0 THEN k.lease END)::BIGINT \
                           FROM kine AS k INNER JOIN \
                           (SELECT MAX(id) AS id FROM kine GROUP BY name) AS m ON k.id = m.id \
                           WHERE k.deleted = 0 AND k.name != 'compact_rev_key'",
                mysql: "SELECT CAST(COUNT(*) AS SIGNED), \
                        CAST(COUNT(DISTINCT CASE WHEN k.lease > 0 THEN k.lease END) AS SIGNED) \
                        FROM kine AS k INNER JOIN \
                        (SELECT MAX(id) AS id FROM kine GROUP BY CAST(name AS BINARY)) AS m \
                        ON k.id = m.id \
                        WHERE k.deleted = 0 AND CAST(k.name AS BINARY) != 'compact_rev_key'",
            })
            .await?;
        match counts[..] {
            [keys, leases] => Ok((keys, leases)),
            _ => bail!("kine count query returned {} columns", counts.len()),
        }
    }

    /// Up to `limit` rows with `id > after`, in id order.
    pub(crate) async fn rows_after(
        &mut self,
        after: i64,
        limit: usize,
    ) -> anyhow::Result<Vec<KineRow>> {
        let limit = limit as i64;
        match self {
            KineSource::Sqlite(conn) => {
                let sql =
                    format!("SELECT {SQLITE_COLUMNS} FROM kine WHERE id > ?1 ORDER BY id LIMIT ?2");
                sqlite_rows(conn, &sql, rusqlite::params![after, limit])
            }
            KineSource::Postgres(client) => {
                let sql =
                    format!("SELECT {PG_COLUMNS} FROM kine WHERE id > $1 ORDER BY id LIMIT $2");
                let rows = client
                    .query(&sql, &[&after, &limit])
                    .await
                    .context("reading kine's table")?;
                rows.iter().map(postgres_row).collect()
            }
            KineSource::Mysql(conn) => {
                let sql =
                    format!("SELECT {MYSQL_COLUMNS} FROM kine WHERE id > ? ORDER BY id LIMIT ?");
                let rows: Vec<mysql_async::Row> = conn
                    .exec(sql, (after, limit))
                    .await
                    .context("reading kine's table")?;
                rows.into_iter().map(mysql_row).collect()
            }
        }
    }

    /// The rows with the given ids, in any order.
    pub(crate) async fn rows_by_id(&mut self, ids: &[i64]) -> anyhow::Result<Vec<KineRow>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Plain integers, so they go into the statement as literals.
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        match self {
            KineSource::Sqlite(conn) => {
                let sql = format!("SELECT {SQLITE_COLUMNS} FROM kine WHERE id IN ({list})");
                sqlite_rows(conn, &sql, [])
            }
            KineSource::Postgres(client) => {
                let sql = format!("SELECT {PG_COLUMNS} FROM kine WHERE id IN ({list})");
                let rows = client
                    .query(&sql, &[])
                    .await
                    .context("reading kine's table")?;
                rows.iter().map(postgres_row).collect()
            }
            KineSource::Mysql(conn) => {
                let sql = format!("SELECT {MYSQL_COLUMNS} FROM kine WHERE id IN ({list})");
                let rows: Vec<mysql_async::Row> =
                    conn.query(sql).await.context("reading kine's table")?;
                rows.into_iter().map(mysql_row).collect()
            }
        }
    }

    /// The one integer a query returns.
    async fn single(&mut self, sql: Dialects<'_>) -> anyhow::Result<i64> {
        self.integers(sql)
            .await?
            .first()
            .copied()
            .context("kine query returned no value")
    }

    /// The integer columns of the one row a query returns.
    async fn integers(&mut self, sql: Dialects<'_>) -> anyhow::Result<Vec<i64>> {
        match self {
            KineSource::Sqlite(conn) => {
                let mut statement = conn.prepare(sql.sqlite).context("querying kine's table")?;
                let columns = statement.column_count();
                let values = statement
                    .query_row([], |row| {
                        (0..columns)
                            .map(|i| row.get::<_, i64>(i))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .context("querying kine's table")?;
                Ok(values)
            }
            KineSource::Postgres(client) => {
                let row = client
                    .query_one(sql.postgres, &[])
                    .await
                    .context("querying kine's table")?;
                (0..row.len())
                    .map(|i| row.try_get::<_, i64>(i).map_err(Into::into))
                    .collect()
            }
            KineSource::Mysql(conn) => {
                let row: Option<mysql_async::Row> = conn
                    .query_first(sql.mysql)
                    .await
                    .context("querying kine's table")?;
                let row = row.context("kine query returned no row")?;
                (0..row.len())
                    .map(|i| {
                        row.get_opt::<i64, _>(i)
                            .context("kine query returned no value")?
                            .map_err(|e| anyhow::anyhow!("kine query: {e}"))
                    })
                    .collect()
            }
        }
    }
}

/// Opens kine's SQLite file read-only, so nothing in it changes. A file
/// that is missing, or is not a database, is refused with its path.
fn open_sqlite(path: &Path) -> anyhow::Result<rusqlite::Connection> {
    if !path.is_file() {
        bail!("kine database {} does not exist", path.display());
    }
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("cannot open kine database {}", path.display()))?;
    // A k3s writing the file holds its write lock for moments only; wait
    // for it as kine's own connections do (busy_timeout 30 s).
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.execute_batch("BEGIN DEFERRED")
        .with_context(|| format!("cannot read kine database {}", path.display()))?;
    tracing::info!(path = %path.display(), "reading kine's SQLite file");
    Ok(conn)
}

fn sqlite_rows(
    conn: &rusqlite::Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> anyhow::Result<Vec<KineRow>> {
    let mut statement = conn.prepare_cached(sql).context("reading kine's table")?;
    let rows = statement
        .query_map(params, |row| {
            // Go wrote names as TEXT and values as BLOB; accept either
            // storage class for both.
            let bytes = |i: usize| -> rusqlite::Result<Vec<u8>> {
                Ok(match row.get_ref(i)? {
                    ValueRef::Text(b) | ValueRef::Blob(b) => b.to_vec(),
                    ValueRef::Null => Vec::new(),
                    ValueRef::Integer(n) => n.to_string().into_bytes(),
                    ValueRef::Real(x) => x.to_string().into_bytes(),
                })
            };
            let int = |i: usize| -> rusqlite::Result<i64> {
                Ok(row.get::<_, Option<i64>>(i)?.unwrap_or(0))
            };
            Ok(KineRow {
                id: row.get(0)?,
                name: bytes(1)?,
                created: int(2)? != 0,
                deleted: int(3)? != 0,
                create_revision: int(4)?,
                prev_revision: int(5)?,
                lease: int(6)?,
                value: bytes(7)?,
            })
        })
        .context("reading kine's table")?;
    rows.map(|row| row.context("reading kine's table"))
        .collect()
}

fn postgres_row(row: &tokio_postgres::Row) -> anyhow::Result<KineRow> {
    let int =
        |i: usize| -> anyhow::Result<i64> { Ok(row.try_get::<_, Option<i64>>(i)?.unwrap_or(0)) };
    Ok(KineRow {
        id: row.try_get(0)?,
        name: row
            .try_get::<_, Option<String>>(1)?
            .unwrap_or_default()
            .into_bytes(),
        created: int(2)? != 0,
        deleted: int(3)? != 0,
        create_revision: int(4)?,
        prev_revision: int(5)?,
        lease: int(6)?,
        value: row.try_get::<_, Option<Vec<u8>>>(7)?.unwrap_or_default(),
    })
}

fn mysql_row(row: mysql_async::Row) -> anyhow::Result<KineRow> {
    let bytes = |i: usize| -> anyhow::Result<Vec<u8>> {
        Ok(row
            .get_opt::<Option<Vec<u8>>, _>(i)
            .context("kine row is short")?
            .map_err(|e| anyhow::anyhow!("kine row: {e}"))?
            .unwrap_or_default())
    };
    let int = |i: usize| -> anyhow::Result<i64> {
        Ok(row
            .get_opt::<Option<i64>, _>(i)
            .context("kine row is short")?
            .map_err(|e| anyhow::anyhow!("kine row: {e}"))?
            .unwrap_or(0))
    };
    Ok(KineRow {
        id: int(0)?,
        name: bytes(1)?,
        created: int(2)? != 0,
        deleted: int(3)? != 0,
        create_revision: int(4)?,
        prev_revision: int(5)?,
        lease: int(6)?,
        value: bytes(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file left by a k3s killed mid-run: its last writes only in the WAL,
    /// no shared-memory file. It is read, with those writes, and left as it was.
    #[tokio::test]
    async fn a_wal_left_by_a_killed_kine_is_read_without_changing_the_file() {
        let (live, copy) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let path = live.path().join("state.db");
        let writer = rusqlite::Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
                 CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT,
                   created INTEGER, deleted INTEGER, create_revision INTEGER,
                   prev_revision INTEGER, lease INTEGER, value BLOB, old_value BLOB);
                 INSERT INTO kine(name, created, deleted, create_revision, prev_revision,
                   lease, value) VALUES ('/a', 1, 0, 0, 0, 0, x'76');",
            )
            .unwrap();
        let copied = copy.path().join("state.db");
        for suffix in ["", "-wal"] {
            std::fs::copy(
                format!("{}{suffix}", path.display()),
                format!("{}{suffix}", copied.display()),
            )
            .unwrap();
        }
        drop(writer);
        let before = std::fs::read(&copied).unwrap();
        let endpoint = KineEndpoint::Sqlite(copied.clone());
        let mut source = KineSource::open(&endpoint, &DatastoreTls::default())
            .await
            .unwrap();
        assert_eq!(source.current_revision().await.unwrap(), 1);
        let rows = source.rows_after(0, 10).await.unwrap();
        assert_eq!(
            (rows[0].name.as_slice(), rows[0].value.as_slice()),
            (&b"/a"[..], &b"v"[..])
        );
        drop(source);
        assert_eq!(std::fs::read(&copied).unwrap(), before);
        assert!(copy.path().join("state.db-wal").exists());
    }

    #[tokio::test]
    async fn a_file_without_kines_table_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER)")
            .unwrap();
        let error = KineSource::open(&KineEndpoint::Sqlite(path), &DatastoreTls::default())
            .await
            .err()
            .unwrap();
        assert!(error.to_string().contains("no `kine` table"), "{error}");
        let missing = KineEndpoint::Sqlite(dir.path().join("missing.db"));
        let error = KineSource::open(&missing, &DatastoreTls::default())
            .await
            .err()
            .unwrap();
        assert!(error.to_string().contains("does not exist"), "{error}");
    }

    #[test]
    fn kine_endpoints() {
        assert_eq!(
            KineEndpoint::parse("sqlite:///var/lib/rancher/k3s/server/db/state.db?_journal=WAL")
                .unwrap(),
            KineEndpoint::Sqlite("/var/lib/rancher/k3s/server/db/state.db".into())
        );
        assert_eq!(
            KineEndpoint::parse("mysql://root:pw@tcp(db:3306)/k3s").unwrap(),
            KineEndpoint::Mysql("mysql://root:pw@tcp(db:3306)/k3s".into())
        );
        assert!(matches!(
            KineEndpoint::parse("postgresql://u@h/k3s").unwrap(),
            KineEndpoint::Postgres(_)
        ));
        assert!(KineEndpoint::parse("sqlite://").is_err());
        assert!(KineEndpoint::parse("nats://h").is_err());
        assert!(KineEndpoint::parse("/var/lib/state.db").is_err());
    }
}
