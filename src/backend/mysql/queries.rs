//! The statements and their rows: running prepared statements, the range and
//! count SQL at the current or an older revision, and the read queries that
//! read and write transactions share.

use anyhow::{Context, anyhow};
use mysql_async::prelude::{FromRow, Queryable};
use mysql_async::{Conn, Params, Row, Value, from_row_opt};

use super::db_error;
use crate::backend::{AlarmRow, BackendResult, KeyRange, LeaseRow, LogEntry, ReadAt, Revisions};
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

pub(super) async fn query_range(
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

pub(super) async fn query_log(
    conn: &mut Conn,
    after: i64,
    through: i64,
) -> BackendResult<Vec<LogEntry>> {
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

pub(super) async fn query_setting(conn: &mut Conn, name: &str) -> BackendResult<Option<i64>> {
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

pub(super) async fn query_lease(conn: &mut Conn, id: i64) -> BackendResult<Option<LeaseRow>> {
    let rows = select(
        conn,
        "SELECT id, ttl, expires_at FROM lease WHERE id = ?",
        (id,),
    )
    .await?;
    Ok(rows.into_iter().next().map(lease_from_row))
}

pub(super) async fn query_leases(conn: &mut Conn) -> BackendResult<Vec<LeaseRow>> {
    let rows = select(
        conn,
        "SELECT id, ttl, expires_at FROM lease ORDER BY expires_at, id",
        (),
    )
    .await?;
    Ok(rows.into_iter().map(lease_from_row).collect())
}

pub(super) async fn query_alarms(conn: &mut Conn) -> BackendResult<Vec<AlarmRow>> {
    let rows: Vec<(i64, i32)> = select(
        conn,
        "SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm",
        (),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|(member_id, alarm)| AlarmRow { member_id, alarm })
        .collect())
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
    let rows: Vec<KvRow> = select(
        conn,
        "SELECT `key`, value, create_revision, mod_revision, version, lease \
         FROM kv WHERE lease = ? ORDER BY `key`",
        (id,),
    )
    .await?;
    Ok(rows.into_iter().map(kv_from_row).collect())
}

pub(super) async fn query_auth_records(
    conn: &mut Conn,
    kind: crate::backend::AuthKind,
) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
    select(
        conn,
        "SELECT name, record FROM auth WHERE kind = ? ORDER BY name",
        (kind.as_str(),),
    )
    .await
}
