//! The statements and their rows: running prepared statements, the range and
//! count SQL at the current or an older revision, and the read queries that
//! read and write transactions share.

use anyhow::{Context, anyhow, bail};
use mysql_async::prelude::{FromRow, Queryable};
use mysql_async::{Conn, Params, Row, Value, from_row_opt};

use super::db_error;
use crate::backend::key_reads::{KeyRead, reads_from_rows};
use crate::backend::rows::{
    Column, Columns, ColumnsFrom, alarm_from_row, auth_record_from_row, kv_from_row,
    lease_from_row, log_entry_from_row, revisions_from_row,
};
use crate::backend::{
    AlarmRow, BackendResult, CurrentRange, CurrentRangeQuery, KeyRange, LeaseRow, LogEntry, ReadAt,
    Revisions,
};
use crate::proto::mvccpb::KeyValue;

/// Runs a prepared statement and decodes every row.
pub(super) async fn select<T: FromRow + Send + 'static>(
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
pub(super) async fn execute(
    conn: &mut Conn,
    sql: &str,
    params: impl Into<Params> + Send,
) -> BackendResult<()> {
    conn.exec_drop(sql, params)
        .await
        .map_err(db_error)
        .with_context(|| format!("MySQL statement failed: {sql}"))
}

impl Columns for Row {
    type Error = anyhow::Error;

    fn column<T: Column>(&self, index: usize) -> BackendResult<T> {
        self.get_opt(index)
            .ok_or_else(|| anyhow!("the row has no column {index}"))?
            .map_err(|e| anyhow!("unexpected value in column {index}: {e}"))
    }
}

/// Runs a prepared statement and decodes every row with `decode`.
async fn select_with<T>(
    conn: &mut Conn,
    sql: &str,
    params: impl Into<Params> + Send,
    decode: impl Fn(&Row) -> BackendResult<T>,
) -> BackendResult<Vec<T>> {
    let rows: Vec<Row> = select(conn, sql, params).await?;
    rows.iter()
        .map(|row| decode(row).with_context(|| format!("unexpected row from {sql}")))
        .collect()
}

/// LIMIT for "no limit": MySQL has no LIMIT ALL.
pub(super) const NO_LIMIT: u64 = u64::MAX;

/// The range or count statement for a read at `at`. Ranges with and without
/// an upper bound are separate statements, so an unbounded one never
/// compares against a made-up end. The statements take, in order: start,
/// end (if bounded), the revision twice (history), the limit (ranges).
pub(super) fn range_sql(at: ReadAt, bounded: bool, count: bool, keys_only: bool) -> String {
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
pub(super) fn range_params(range: &KeyRange, at: ReadAt, limit: Option<u64>) -> Vec<Value> {
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

pub(super) async fn query_range(
    conn: &mut Conn,
    range: &KeyRange,
    at: ReadAt,
    limit: usize,
    keys_only: bool,
) -> BackendResult<Vec<KeyValue>> {
    let limit = if limit == 0 { NO_LIMIT } else { limit as u64 };
    let sql = range_sql(at, range.end.is_some(), false, keys_only);
    select_with(
        conn,
        &sql,
        range_params(range, at, Some(limit)),
        kv_from_row,
    )
    .await
}

/// `ReadTxn::current_range` in one statement (so one snapshot, even
/// outside a transaction): the counters and the count or NULL in a row of
/// their own (its key NULL), then each key's columns (their counters NULL).
/// A UNION ALL, not a join of the counters with the keys: MariaDB
/// materialises a derived table with its own LIMIT and sorts the join, which
/// made a one-key Range 2-3x the cost of a plain SELECT. The statement takes
/// start and end (if bounded) for the count, then for the keys, then the
/// limit (0: no keys). Errors are the driver's, so that the caller can tell
/// a dead connection.
pub(super) async fn query_current_range(
    conn: &mut Conn,
    query: CurrentRangeQuery<'_>,
) -> mysql_async::Result<CurrentRange> {
    if query.rows
        && let Some(key) = query.range.as_single()
    {
        return query_current_key(conn, key, query).await;
    }
    let range = query.range;
    let end = if range.end.is_some() {
        " AND `key` < ?"
    } else {
        ""
    };
    let value = if query.keys_only { "X''" } else { "value" };
    let count = match query.count {
        true => format!("(SELECT COUNT(*) FROM kv WHERE `key` >= ?{end})"),
        false => "NULL".to_string(),
    };
    let sql = format!(
        "SELECT revision, compact_revision, compacted_through, {count}, \
           NULL, NULL, NULL, NULL, NULL, NULL \
         FROM meta WHERE id = 1 \
         UNION ALL (\
           SELECT NULL, NULL, NULL, NULL, \
             `key`, {value}, create_revision, mod_revision, version, lease \
           FROM kv WHERE `key` >= ?{end} ORDER BY `key` LIMIT ?)"
    );
    let limit = match (query.rows, query.limit) {
        (false, _) => 0,
        (true, 0) => NO_LIMIT,
        (true, limit) => limit as u64,
    };
    let mut params = Vec::new();
    if query.count {
        params.extend(range_params(range, ReadAt::Current, None));
    }
    params.extend(range_params(range, ReadAt::Current, Some(limit)));
    let rows: Vec<Row> = conn.exec(sql.as_str(), params).await?;
    let decode = || -> anyhow::Result<CurrentRange> {
        let mut counters = None;
        let mut kvs = Vec::with_capacity(rows.len().saturating_sub(1));
        for row in &rows {
            if row.column::<Option<Vec<u8>>>(4)?.is_some() {
                kvs.push(kv_from_row(&ColumnsFrom { row, first: 4 })?);
            } else {
                counters = Some(row);
            }
        }
        let counters = counters.context("the meta table has no row")?;
        // A UNION ALL's parts come out in order in MariaDB, but SQL does
        // not promise it: a reordering is an error, not a wrong answer.
        if !kvs.is_sorted_by(|a, b| a.key < b.key) {
            bail!("MySQL returned a range out of key order");
        }
        let count: Option<i64> = counters.column(3)?;
        Ok(CurrentRange {
            revisions: revisions_from_row(counters)?,
            kvs,
            count: count.filter(|_| query.count),
        })
    };
    decode().map_err(|error| mysql_async::Error::Other(error.into()))
}

/// `query_current_range` for one key (see `query_current_keys`).
async fn query_current_key(
    conn: &mut Conn,
    key: &[u8],
    query: CurrentRangeQuery<'_>,
) -> mysql_async::Result<CurrentRange> {
    let read = query_current_keys(conn, &[key]).await?.remove(0);
    Ok(read.into_range(query))
}

/// The counters and each of `keys` (in their order, repeats allowed) in one
/// statement: the counters' row left-joined with the keys' rows, so one row
/// with no key when none exists. MariaDB reads the counters and a key by
/// primary key before it plans the rest, and the statement costs it about
/// half a UNION ALL's server CPU (docs/benchmarks/sql-backends.md). One key goes as the prepared statement a
/// lone read has always used; several as text, with the keys as literals (a
/// prepared statement for each number of keys would crowd the connection's
/// statement cache).
pub(super) async fn query_current_keys(
    conn: &mut Conn,
    keys: &[&[u8]],
) -> mysql_async::Result<Vec<KeyRead>> {
    const COLUMNS: &str = "SELECT m.revision, m.compact_revision, m.compacted_through, \
           kv.`key`, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease \
         FROM meta m LEFT JOIN kv ON kv.`key`";
    let rows: Vec<Row> = match keys {
        [key] => {
            let sql = format!("{COLUMNS} = ? WHERE m.id = 1");
            conn.exec(sql, (key,)).await?
        }
        _ => {
            let list: Vec<String> = keys.iter().map(|key| bytes_literal(key)).collect();
            let sql = format!("{COLUMNS} IN ({}) WHERE m.id = 1", list.join(", "));
            conn.query(sql).await?
        }
    };
    let decode = || -> anyhow::Result<Vec<KeyRead>> {
        reads_from_rows(keys, &rows)?.context("the meta table has no row")
    };
    decode().map_err(|error| mysql_async::Error::Other(error.into()))
}

/// `ReadTxn::keys_at` in one statement: each key's last log row at or
/// below `revision`, unless it deleted the key. Sent as text, with the keys
/// as literals: a prepared statement for each number of keys would crowd
/// the connection's statement cache.
pub(super) async fn query_keys_at(
    conn: &mut Conn,
    keys: &[Vec<u8>],
    revision: i64,
) -> BackendResult<Vec<KeyValue>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = keys.iter().map(|key| bytes_literal(key)).collect();
    let sql = format!(
        "SELECT `key`, value, create_revision, revision, version, lease \
         FROM log AS l WHERE `key` IN ({}) AND revision <= {revision} AND deleted = 0 \
         AND (revision, sub) = (SELECT revision, sub FROM log \
             WHERE `key` = l.`key` AND revision <= {revision} \
             ORDER BY revision DESC, sub DESC LIMIT 1)",
        list.join(", ")
    );
    let rows: Vec<Row> = conn
        .query(&sql)
        .await
        .map_err(db_error)
        .context("MySQL query failed: the keys at a revision")?;
    rows.iter()
        .map(|row| kv_from_row(row).context("unexpected row from the keys at a revision"))
        .collect()
}

const HEX_DIGITS: &[u8; 16] = b"0123456789ABCDEF";

/// `bytes` as a MySQL hexadecimal literal, which needs no escaping.
pub(super) fn bytes_literal(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(3 + 2 * bytes.len());
    text.push_str("X'");
    for byte in bytes {
        text.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(HEX_DIGITS[usize::from(byte & 0xf)]));
    }
    text.push('\'');
    text
}

pub(super) async fn query_count(
    conn: &mut Conn,
    range: &KeyRange,
    at: ReadAt,
) -> BackendResult<i64> {
    let sql = range_sql(at, range.end.is_some(), true, false);
    let rows: Vec<(i64,)> = select(conn, &sql, range_params(range, at, None)).await?;
    Ok(rows.first().map_or(0, |r| r.0))
}

pub(super) async fn query_revisions(conn: &mut Conn, for_update: bool) -> BackendResult<Revisions> {
    let sql = if for_update {
        "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1 FOR UPDATE"
    } else {
        "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1"
    };
    select_with(conn, sql, (), revisions_from_row)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("the meta table has no row"))
}

pub(super) async fn query_log(
    conn: &mut Conn,
    after: i64,
    through: i64,
) -> BackendResult<Vec<LogEntry>> {
    select_with(
        conn,
        "SELECT `key`, value, create_revision, revision, version, lease, sub, deleted \
         FROM log WHERE revision > ? AND revision <= ? ORDER BY revision, sub",
        (after, through),
        log_entry_from_row,
    )
    .await
}

pub(super) async fn query_setting(conn: &mut Conn, name: &str) -> BackendResult<Option<i64>> {
    let rows: Vec<(i64,)> =
        select(conn, "SELECT value FROM settings WHERE name = ?", (name,)).await?;
    Ok(rows.first().map(|r| r.0))
}

pub(super) async fn query_lease(conn: &mut Conn, id: i64) -> BackendResult<Option<LeaseRow>> {
    let leases = select_with(
        conn,
        "SELECT id, ttl, expires_at FROM lease WHERE id = ?",
        (id,),
        lease_from_row,
    )
    .await?;
    Ok(leases.into_iter().next())
}

pub(super) async fn query_leases(conn: &mut Conn) -> BackendResult<Vec<LeaseRow>> {
    select_with(
        conn,
        "SELECT id, ttl, expires_at FROM lease ORDER BY expires_at, id",
        (),
        lease_from_row,
    )
    .await
}

pub(super) async fn query_alarms(conn: &mut Conn) -> BackendResult<Vec<AlarmRow>> {
    select_with(
        conn,
        "SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm",
        (),
        alarm_from_row,
    )
    .await
}

pub(super) async fn query_expired_leases(
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

pub(super) async fn query_lease_keys(conn: &mut Conn, id: i64) -> BackendResult<Vec<KeyValue>> {
    select_with(
        conn,
        "SELECT `key`, value, create_revision, mod_revision, version, lease \
         FROM kv WHERE lease = ? ORDER BY `key`",
        (id,),
        kv_from_row,
    )
    .await
}

pub(super) async fn query_auth_records(
    conn: &mut Conn,
    kind: crate::backend::AuthKind,
) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
    select_with(
        conn,
        "SELECT name, record FROM auth WHERE kind = ? ORDER BY name",
        (kind.as_str(),),
        auth_record_from_row,
    )
    .await
}
