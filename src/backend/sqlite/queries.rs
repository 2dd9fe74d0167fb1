//! The read statements, shared by read and write transactions: ranges and
//! counts at the current or an older revision, the counters, the log,
//! settings, leases, alarms and auth records, and the decoding of their rows.

use rusqlite::{Connection, OptionalExtension, Row, ToSql, params};

use crate::backend::rows::{
    Column, Columns, alarm_from_row, auth_record_from_row, kv_from_row, lease_from_row,
    log_entry_from_row, revisions_from_row,
};
use crate::backend::{AlarmRow, AuthKind, KeyRange, LeaseRow, LogEntry, ReadAt, Revisions};
use crate::proto::mvccpb::KeyValue;

// rusqlite's row callbacks must accept a `Row` of any lifetime, which a
// generic decoder named by itself cannot: so they are wrapped in closures.
impl Columns for Row<'_> {
    type Error = rusqlite::Error;

    fn column<T: Column>(&self, index: usize) -> rusqlite::Result<T> {
        self.get(index)
    }
}

// Range queries come in two shapes, with and without an upper bound, so that
// SQLite can always use the key index for both ends.
const CURRENT_RANGE: &str = "SELECT key, value, create_revision, mod_revision, version, lease \
     FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key LIMIT ?3";
const CURRENT_RANGE_FROM: &str = "SELECT key, value, create_revision, mod_revision, version, lease \
     FROM kv WHERE key >= ?1 ORDER BY key LIMIT ?3";
// One key: an equality on the primary key lets SQLite stop after the row
// instead of stepping on to the next key to find the end of the range.
const CURRENT_GET: &str = "SELECT key, value, create_revision, mod_revision, version, lease \
     FROM kv WHERE key = ?1";
const CURRENT_COUNT: &str = "SELECT COUNT(*) FROM kv WHERE key >= ?1 AND key < ?2";
const CURRENT_COUNT_FROM: &str = "SELECT COUNT(*) FROM kv WHERE key >= ?1";
// A key's state at revision R is its log row with the largest (revision, sub)
// at or below R: one key can change twice in one revision (a Txn may delete
// from "\0" and put the same key, as etcd allows).
const HISTORY_RANGE: &str = "SELECT key, value, create_revision, revision, version, lease \
     FROM log AS l WHERE key >= ?1 AND key < ?2 AND revision <= ?4 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?4 \
                            ORDER BY revision DESC, sub DESC LIMIT 1) \
     ORDER BY key LIMIT ?3";
const HISTORY_RANGE_FROM: &str = "SELECT key, value, create_revision, revision, version, lease \
     FROM log AS l WHERE key >= ?1 AND revision <= ?4 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?4 \
                            ORDER BY revision DESC, sub DESC LIMIT 1) \
     ORDER BY key LIMIT ?3";
const HISTORY_COUNT: &str = "SELECT COUNT(*) FROM log AS l \
     WHERE key >= ?1 AND key < ?2 AND revision <= ?3 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?3 \
                            ORDER BY revision DESC, sub DESC LIMIT 1)";
const HISTORY_COUNT_FROM: &str = "SELECT COUNT(*) FROM log AS l \
     WHERE key >= ?1 AND revision <= ?3 AND deleted = 0 \
     AND (revision, sub) = (SELECT revision, sub FROM log WHERE key = l.key AND revision <= ?3 \
                            ORDER BY revision DESC, sub DESC LIMIT 1)";

/// Runs one of the range or count statements. Parameters are, in order,
/// start, end, then `extra`; each statement uses a prefix of that list.
/// `capacity` is how many rows are expected at most, so that the result is
/// allocated once (0 when unknown).
fn query_keys<T>(
    conn: &Connection,
    sql: &str,
    range: &KeyRange,
    extra: &[&dyn ToSql],
    capacity: usize,
    mut map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    let end: &[u8] = range.end.as_deref().unwrap_or_default();
    let mut stmt = conn.prepare_cached(sql)?;
    let used = stmt.parameter_count();
    let all = [&range.start as &dyn ToSql, &end]
        .into_iter()
        .chain(extra.iter().copied());
    for (index, value) in all.enumerate().take(used) {
        stmt.raw_bind_parameter(index + 1, value)?;
    }
    let mut rows = stmt.raw_query();
    let mut found = Vec::with_capacity(capacity);
    while let Some(row) = rows.next()? {
        found.push(map(row)?);
    }
    Ok(found)
}

/// True if `range` holds exactly one key: `[key, key + "\0")`.
fn is_single_key(range: &KeyRange) -> bool {
    range.end.as_deref().is_some_and(|end| {
        end.len() == range.start.len() + 1 && end.starts_with(&range.start) && end.ends_with(&[0])
    })
}

/// Rows of a range read to allocate for up front: its limit, or one for a
/// single key, up to a bound.
fn expected_rows(range: &KeyRange, limit: usize) -> usize {
    const MOST: usize = 1024;
    match limit {
        0 if is_single_key(range) => 1,
        limit => limit.min(MOST),
    }
}

pub(super) fn query_range(
    conn: &Connection,
    range: &KeyRange,
    at: ReadAt,
    limit: usize,
) -> rusqlite::Result<Vec<KeyValue>> {
    let capacity = expected_rows(range, limit);
    // SQLite reads a negative LIMIT as no limit.
    let limit = if limit == 0 { -1 } else { limit as i64 };
    match at {
        ReadAt::Current => {
            let sql = if is_single_key(range) {
                CURRENT_GET
            } else if range.end.is_some() {
                CURRENT_RANGE
            } else {
                CURRENT_RANGE_FROM
            };
            query_keys(conn, sql, range, &[&limit], capacity, |r| kv_from_row(r))
        }
        ReadAt::Revision(rev) => {
            let sql = if range.end.is_some() {
                HISTORY_RANGE
            } else {
                HISTORY_RANGE_FROM
            };
            query_keys(conn, sql, range, &[&limit, &rev], capacity, |r| {
                kv_from_row(r)
            })
        }
    }
}

pub(super) fn query_count(
    conn: &Connection,
    range: &KeyRange,
    at: ReadAt,
) -> rusqlite::Result<i64> {
    let counts = match at {
        ReadAt::Current => {
            let sql = if range.end.is_some() {
                CURRENT_COUNT
            } else {
                CURRENT_COUNT_FROM
            };
            query_keys(conn, sql, range, &[], 1, |r| r.get(0))?
        }
        ReadAt::Revision(rev) => {
            let sql = if range.end.is_some() {
                HISTORY_COUNT
            } else {
                HISTORY_COUNT_FROM
            };
            query_keys(conn, sql, range, &[&rev], 1, |r| r.get(0))?
        }
    };
    Ok(counts.first().copied().unwrap_or(0))
}

/// The counters, and the `meta` row they came from. A commit that only adds
/// revisions leaves `meta` alone (one page less to write per commit): every
/// new revision has a row in the log, so the current revision is the larger
/// of `meta.revision` and the log's last revision. `meta.revision` is
/// brought up to date whenever the compaction counters change, so that
/// compaction removing the log's last rows never takes revisions back.
pub(super) fn query_revisions(conn: &Connection) -> rusqlite::Result<(Revisions, Revisions)> {
    conn.prepare_cached(
        "SELECT revision, compact_revision, compacted_through, (SELECT MAX(revision) FROM log) \
         FROM meta",
    )?
    .query_row([], |r| {
        let meta = revisions_from_row(r)?;
        let logged: Option<i64> = r.get(3)?;
        let revisions = Revisions {
            current: meta.current.max(logged.unwrap_or(0)),
            ..meta
        };
        Ok((revisions, meta))
    })
}

pub(super) fn query_log(
    conn: &Connection,
    after: i64,
    through: i64,
) -> rusqlite::Result<Vec<LogEntry>> {
    let mut stmt = conn.prepare_cached(
        "SELECT key, value, create_revision, revision, version, lease, sub, deleted \
         FROM log WHERE revision > ?1 AND revision <= ?2 ORDER BY revision, sub",
    )?;
    let rows = stmt.query_map(params![after, through], |row| log_entry_from_row(row))?;
    rows.collect()
}

pub(super) fn query_lease(conn: &Connection, id: i64) -> rusqlite::Result<Option<LeaseRow>> {
    conn.prepare_cached("SELECT id, ttl, expires_at FROM lease WHERE id = ?1")?
        .query_row([id], |r| lease_from_row(r))
        .optional()
}

pub(super) fn query_leases(conn: &Connection) -> rusqlite::Result<Vec<LeaseRow>> {
    conn.prepare_cached("SELECT id, ttl, expires_at FROM lease ORDER BY expires_at, id")?
        .query_map([], |r| lease_from_row(r))?
        .collect()
}

pub(super) fn query_expired_leases(
    conn: &Connection,
    now_ms: i64,
    limit: usize,
) -> rusqlite::Result<Vec<i64>> {
    conn.prepare_cached("SELECT id FROM lease WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2")?
        .query_map(params![now_ms, limit as i64], |r| r.get(0))?
        .collect()
}

pub(super) fn query_alarms(conn: &Connection) -> rusqlite::Result<Vec<AlarmRow>> {
    conn.prepare_cached("SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm")?
        .query_map([], |r| alarm_from_row(r))?
        .collect()
}

/// `lease != 0` lets SQLite use the partial index on kv(lease, key).
pub(super) fn query_lease_keys(conn: &Connection, id: i64) -> rusqlite::Result<Vec<KeyValue>> {
    conn.prepare_cached(
        "SELECT key, value, create_revision, mod_revision, version, lease \
         FROM kv WHERE lease = ?1 AND lease != 0 ORDER BY key",
    )?
    .query_map([id], |r| kv_from_row(r))?
    .collect()
}

pub(super) fn query_setting(conn: &Connection, name: &str) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached("SELECT value FROM settings WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()
}

pub(super) fn query_auth_records(
    conn: &Connection,
    kind: AuthKind,
) -> rusqlite::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    conn.prepare_cached("SELECT name, record FROM auth WHERE kind = ?1 ORDER BY name")?
        .query_map([kind.as_str()], |r| auth_record_from_row(r))?
        .collect()
}
