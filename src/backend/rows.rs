//! Row decoding shared by the three dialects: which column of a read
//! statement holds what, and how those columns become the backend's types.
//! Each driver only says how it reads one column (`Columns`).

use super::{AlarmRow, LeaseRow, LogEntry, Revisions};
use crate::proto::mvccpb::KeyValue;

/// A column type that every driver decodes (bytes, integers, booleans).
pub(crate) trait Column:
    rusqlite::types::FromSql + tokio_postgres::types::FromSqlOwned + mysql_async::prelude::FromValue
{
}

impl<T> Column for T where
    T: rusqlite::types::FromSql
        + tokio_postgres::types::FromSqlOwned
        + mysql_async::prelude::FromValue
{
}

/// A result row of one driver, read by column position.
pub(crate) trait Columns {
    /// The driver's error for a column that is missing or of another type.
    type Error;

    /// Column `index` (from 0) as `T`.
    fn column<T: Column>(&self, index: usize) -> Result<T, Self::Error>;
}

/// A key from the columns every key read selects, in this order: `key,
/// value, create_revision, mod_revision, version, lease` (a log read selects
/// its `revision` as the mod revision).
pub(crate) fn kv_from_row<R: Columns>(row: &R) -> Result<KeyValue, R::Error> {
    Ok(KeyValue {
        key: row.column(0)?,
        value: row.column(1)?,
        create_revision: row.column(2)?,
        mod_revision: row.column(3)?,
        version: row.column(4)?,
        lease: row.column(5)?,
    })
}

/// A log row: the `kv_from_row` columns, then `sub, deleted`.
pub(crate) fn log_entry_from_row<R: Columns>(row: &R) -> Result<LogEntry, R::Error> {
    Ok(LogEntry {
        kv: kv_from_row(row)?,
        sub: row.column(6)?,
        deleted: row.column(7)?,
    })
}

/// A lease from `id, ttl, expires_at`.
pub(crate) fn lease_from_row<R: Columns>(row: &R) -> Result<LeaseRow, R::Error> {
    Ok(LeaseRow {
        id: row.column(0)?,
        ttl: row.column(1)?,
        expires_at: row.column(2)?,
    })
}

/// An alarm from `member_id, alarm`.
pub(crate) fn alarm_from_row<R: Columns>(row: &R) -> Result<AlarmRow, R::Error> {
    Ok(AlarmRow {
        member_id: row.column(0)?,
        alarm: row.column(1)?,
    })
}

/// An auth record from `name, record`.
pub(crate) fn auth_record_from_row<R: Columns>(row: &R) -> Result<(Vec<u8>, Vec<u8>), R::Error> {
    Ok((row.column(0)?, row.column(1)?))
}

/// The counters from the meta row's `revision, compact_revision, compacted_through`.
pub(crate) fn revisions_from_row<R: Columns>(row: &R) -> Result<Revisions, R::Error> {
    Ok(Revisions {
        current: row.column(0)?,
        compact: row.column(1)?,
        compacted_through: row.column(2)?,
    })
}

/// The columns of a row from `first` on, read as a row of their own (a
/// statement that selects the counters before a key's columns).
pub(crate) struct ColumnsFrom<'a, R> {
    /// The whole row.
    pub row: &'a R,
    /// Its column that is column 0 here.
    pub first: usize,
}

impl<R: Columns> Columns for ColumnsFrom<'_, R> {
    type Error = R::Error;

    fn column<T: Column>(&self, index: usize) -> Result<T, R::Error> {
        self.row.column(self.first + index)
    }
}
