//! The read statements, shared by read and write transactions: log rows by
//! id (for the key index's reads), the counters, the log by revision,
//! settings, leases, alarms and auth records, and the decoding of their rows.

use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::journal::UnappliedView;
use super::key_index::row_id;

use crate::backend::rows::{
    Column, Columns, alarm_from_row, auth_record_from_row, kv_from_row, lease_from_row,
    log_entry_from_row, revisions_from_row,
};
use crate::backend::{AlarmRow, AuthKind, BackendResult, Compacted, LeaseRow, LogEntry, Revisions};
use crate::proto::mvccpb::KeyValue;

// rusqlite's row callbacks must accept a `Row` of any lifetime, which a
// generic decoder named by itself cannot: so they are wrapped in closures.
impl Columns for Row<'_> {
    type Error = rusqlite::Error;

    fn column<T: Column>(&self, index: usize) -> rusqlite::Result<T> {
        self.get(index)
    }
}

/// Rows a long read fetches between two looks at the flag of a waiting
/// commit (see `yield_to_commit`).
const ROWS_PER_YIELD: usize = 256;

/// Lets a batch commit that waits for readers go first: in rollback journal
/// mode SQLite commits only once no reader holds the database, so a read
/// that is still going ends its transaction and begins another (which
/// waits for the commit). Its rows do not change meanwhile, only
/// compaction removes some (see `txn`). Nothing to do without the flag (a
/// snapshot file, the writer) or with it down.
pub(super) fn yield_to_commit(
    conn: &Connection,
    waiting: Option<&AtomicBool>,
) -> rusqlite::Result<()> {
    if waiting.is_some_and(|waiting| waiting.load(Ordering::Acquire)) {
        restart_read(conn)?;
    }
    Ok(())
}

/// Ends the read transaction on `conn`, if any, and begins another, whose
/// snapshot starts with its first statement.
pub(super) fn restart_read(conn: &Connection) -> rusqlite::Result<()> {
    if !conn.is_autocommit() {
        conn.prepare_cached("ROLLBACK")?.execute([])?;
        conn.prepare_cached("BEGIN")?.execute([])?;
    }
    Ok(())
}

/// The rows `ids` of the log as keys, in the order given: those committed
/// but not yet applied from `unapplied`, the rest from the table. With
/// `keys_only` the values are left empty, so that no overflow page of a
/// large value is read. The key index names every id, but compaction may
/// have removed a row since the index was asked (a read below the compacted
/// revision): `Compacted`, as the index would answer now.
pub(super) fn query_rows(
    conn: &Connection,
    unapplied: Option<&UnappliedView>,
    waiting: Option<&AtomicBool>,
    ids: &[i64],
    keys_only: bool,
) -> BackendResult<Vec<KeyValue>> {
    let sql = if keys_only {
        "SELECT key, x'', create_revision, id >> 20, version, lease FROM log WHERE id = ?1"
    } else {
        "SELECT key, value, create_revision, id >> 20, version, lease FROM log WHERE id = ?1"
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let mut found = Vec::with_capacity(ids.len());
    for (n, id) in ids.iter().enumerate() {
        if n > 0 && n % ROWS_PER_YIELD == 0 {
            yield_to_commit(conn, waiting)?;
        }
        let row = match unapplied.and_then(|u| u.row(*id, keys_only)) {
            Some(row) => row,
            None => match stmt.query_row([id], |r| kv_from_row(r)) {
                Err(rusqlite::Error::QueryReturnedNoRows) => return Err(Compacted.into()),
                row => row?,
            },
        };
        found.push(row);
    }
    Ok(found)
}

/// The counters, and the `meta` row they came from. A commit that only adds
/// revisions leaves `meta` alone (one page less to write per commit): every
/// new revision has a row in the log, so the current revision is the larger
/// of `meta.revision` and the log's last revision. `meta.revision` is
/// brought up to date whenever the compaction counters change, so that
/// compaction removing the log's last rows never takes revisions back.
pub(super) fn query_revisions(conn: &Connection) -> rusqlite::Result<(Revisions, Revisions)> {
    conn.prepare_cached(
        "SELECT revision, compact_revision, compacted_through, (SELECT MAX(id) >> 20 FROM log) \
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
    waiting: Option<&AtomicBool>,
    after: i64,
    through: i64,
) -> rusqlite::Result<Vec<LogEntry>> {
    let mut stmt = conn.prepare_cached(
        "SELECT key, value, create_revision, id >> 20, version, lease, id & 1048575, deleted \
         FROM log WHERE id >= ?1 AND id < ?2 ORDER BY id LIMIT ?3",
    )?;
    // A read that may have to let a commit go first reads in pages.
    let page = match waiting {
        Some(_) => ROWS_PER_YIELD as i64,
        None => -1,
    };
    let (mut from, to) = (row_id(after + 1, 0), row_id(through + 1, 0));
    let mut entries = Vec::new();
    loop {
        let read = entries.len();
        let rows = stmt.query_map(params![from, to, page], |row| log_entry_from_row(row))?;
        for entry in rows {
            entries.push(entry?);
        }
        match entries.last() {
            Some(last) if page > 0 && entries.len() - read == page as usize => {
                from = row_id(last.kv.mod_revision, last.sub) + 1;
                yield_to_commit(conn, waiting)?;
            }
            _ => return Ok(entries),
        }
    }
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

/// The first `limit` leases expired at `now_ms`, soonest first: (id, expires_at).
pub(super) fn query_expired_leases(
    conn: &Connection,
    now_ms: i64,
    limit: usize,
) -> rusqlite::Result<Vec<(i64, i64)>> {
    conn.prepare_cached(
        "SELECT id, expires_at FROM lease WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2",
    )?
    .query_map(params![now_ms, limit as i64], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?
    .collect()
}

pub(super) fn query_alarms(conn: &Connection) -> rusqlite::Result<Vec<AlarmRow>> {
    conn.prepare_cached("SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm")?
        .query_map([], |r| alarm_from_row(r))?
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
