//! The read statements, shared by read and write transactions: ranges and
//! counts at the current or an older revision, the log, settings and
//! leases, and the decoding of their rows.

use std::sync::LazyLock;

use anyhow::{Context, bail};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::txn::TxnConn;
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

const READ_META: &str =
    "SELECT revision, compact_revision, compacted_through FROM meta WHERE id = 1";

// Range statements come in eight shapes: at the current revision (kv) or an
// older one (log), with or without an upper bound (so that an unbounded range
// never compares against an end), with or without values. Parameters: $1
// start, then $2 end when bounded, then the revision (history only), then
// the limit (NULL for none).
//
// A key's state at revision R is its log row with the greatest (revision,
// sub) at or below R: one key can change twice in one revision (a Txn may
// delete from "\0" and put the same key, as etcd allows).
//
// The historical shape has no outer ORDER BY: the rows come out of the
// subquery in key order already (the planner knows it and would add no sort),
// but with an outer ORDER BY Postgres plans the subquery for full retrieval,
// ignoring the LIMIT: a sort of every version in the range instead of an
// index scan that stops after `limit` keys (10x slower on a 100k-row log).
// `range` checks the order all the same.
static RANGE_SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut all = Vec::new();
    for history in [false, true] {
        for bounded in [false, true] {
            for keys_only in [false, true] {
                let value = if keys_only { "''::BYTEA" } else { "value" };
                let mut next = 2;
                let mut param = || {
                    next += 1;
                    format!("${}", next - 1)
                };
                let end = if bounded {
                    format!(" AND key < {}", param())
                } else {
                    String::new()
                };
                all.push(if history {
                    let revision = param();
                    let limit = param();
                    format!(
                        "SELECT key, {value}, create_revision, revision, version, lease FROM (\
                           SELECT DISTINCT ON (key) key, {value} AS value, create_revision, \
                             revision, version, lease, deleted \
                           FROM log WHERE key >= $1{end} AND revision <= {revision} \
                           ORDER BY key, revision DESC, sub DESC\
                         ) AS at_revision WHERE NOT deleted LIMIT {limit}"
                    )
                } else {
                    let limit = param();
                    format!(
                        "SELECT key, {value}, create_revision, mod_revision, version, lease \
                         FROM kv WHERE key >= $1{end} ORDER BY key LIMIT {limit}"
                    )
                });
            }
        }
    }
    all
});

/// Count statements: current or historical, with or without an upper bound.
static COUNT_SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut all = Vec::new();
    for history in [false, true] {
        for bounded in [false, true] {
            let (end, revision) = if bounded {
                (" AND key < $2", "$3")
            } else {
                ("", "$2")
            };
            all.push(if history {
                format!(
                    "SELECT COUNT(*) FROM (\
                       SELECT DISTINCT ON (key) deleted FROM log \
                       WHERE key >= $1{end} AND revision <= {revision} \
                       ORDER BY key, revision DESC, sub DESC\
                     ) AS at_revision WHERE NOT deleted"
                )
            } else {
                format!("SELECT COUNT(*) FROM kv WHERE key >= $1{end}")
            });
        }
    }
    all
});

/// `TxnConn::current_keys`: the counters' row left-joined with the current
/// rows of the keys. Parameters: $1 the keys.
const CURRENT_KEYS_SQL: &str = "SELECT m.revision, m.compact_revision, m.compacted_through, \
       kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease \
     FROM meta AS m LEFT JOIN kv ON kv.key = ANY($1) WHERE m.id = 1";

/// `ReadTxn::keys_at`: each key's last log row at or below the revision,
/// unless that row deleted it. Parameters: $1 the keys, $2 the revision.
const KEYS_AT_SQL: &str = "SELECT key, value, create_revision, revision, version, lease FROM (\
       SELECT DISTINCT ON (key) key, value, create_revision, revision, version, lease, deleted \
       FROM log WHERE key = ANY($1) AND revision <= $2 \
       ORDER BY key, revision DESC, sub DESC\
     ) AS at_revision WHERE NOT deleted";

/// Current-range statements (`ReadTxn::current_range`): the counters, the
/// count or NULL, then each key's columns, in one statement and so from one
/// snapshot, with or without an upper bound, values and the count.
/// Parameters: $1 start, $2 end when bounded, then the limit (0: no keys).
/// A range with no keys still gives the counters, in one row of NULL keys.
/// The keys come out of the join in the subquery's key order (one meta row
/// drives a nested loop); `current_range` checks it.
static CURRENT_RANGE_SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut all = Vec::new();
    for bounded in [false, true] {
        for keys_only in [false, true] {
            for count in [false, true] {
                let value = if keys_only { "''::BYTEA" } else { "value" };
                let (end, limit) = if bounded {
                    (" AND key < $2", "$3")
                } else {
                    ("", "$2")
                };
                let count = if count {
                    format!("(SELECT COUNT(*) FROM kv WHERE key >= $1{end})")
                } else {
                    "NULL::BIGINT".to_string()
                };
                all.push(format!(
                    "SELECT m.revision, m.compact_revision, m.compacted_through, {count}, \
                       r.key, r.value, r.create_revision, r.mod_revision, r.version, r.lease \
                     FROM meta AS m LEFT JOIN LATERAL (\
                       SELECT key, {value} AS value, create_revision, mod_revision, version, lease \
                       FROM kv WHERE key >= $1{end} ORDER BY key LIMIT {limit}\
                     ) AS r ON TRUE WHERE m.id = 1"
                ));
            }
        }
    }
    all
});

pub(super) fn current_range_sql(bounded: bool, keys_only: bool, count: bool) -> &'static str {
    &CURRENT_RANGE_SQL[usize::from(bounded) * 4 + usize::from(keys_only) * 2 + usize::from(count)]
}

pub(super) fn range_sql(at: ReadAt, bounded: bool, keys_only: bool) -> &'static str {
    let history = matches!(at, ReadAt::Revision(_));
    &RANGE_SQL[usize::from(history) * 4 + usize::from(bounded) * 2 + usize::from(keys_only)]
}

fn count_sql(at: ReadAt, bounded: bool) -> &'static str {
    let history = matches!(at, ReadAt::Revision(_));
    &COUNT_SQL[usize::from(history) * 2 + usize::from(bounded)]
}

impl Columns for Row {
    type Error = tokio_postgres::Error;

    fn column<T: Column>(&self, index: usize) -> Result<T, tokio_postgres::Error> {
        self.try_get(index)
    }
}

pub(super) fn revisions_from(rows: &[Row]) -> BackendResult<Revisions> {
    let row = rows.first().context("the meta row is missing")?;
    Ok(revisions_from_row(row)?)
}

/// `limit` as SQL: NULL (no limit) for 0.
pub(super) fn sql_limit(limit: usize) -> Option<i64> {
    (limit > 0).then(|| i64::try_from(limit).unwrap_or(i64::MAX))
}

/// The parameters a range and a count statement begin with: start, end if
/// bounded, then the revision of a historical read.
pub(super) fn key_params<'a>(range: &'a KeyRange, at: &'a ReadAt) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&range.start];
    if let Some(end) = &range.end {
        params.push(end);
    }
    if let ReadAt::Revision(revision) = at {
        params.push(revision);
    }
    params
}

/// The read queries, shared by read and write transactions.
impl TxnConn {
    pub(super) async fn revisions(&mut self) -> BackendResult<Revisions> {
        let rows = self.query(READ_META, &[]).await?;
        revisions_from(&rows)
    }

    pub(super) async fn range(
        &mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> BackendResult<Vec<KeyValue>> {
        let limit = sql_limit(limit);
        let mut params = key_params(range, &at);
        params.push(&limit);
        let sql = range_sql(at, range.end.is_some(), keys_only);
        let rows = self.query(sql, &params).await?;
        let kvs: Vec<KeyValue> = rows.iter().map(kv_from_row).collect::<Result<_, _>>()?;
        if !kvs.is_sorted_by(|a, b| a.key < b.key) {
            bail!("Postgres returned a range out of key order");
        }
        Ok(kvs)
    }

    /// `ReadTxn::keys_at` in one statement.
    pub(super) async fn keys_at(
        &mut self,
        keys: &[Vec<u8>],
        revision: i64,
    ) -> BackendResult<Vec<KeyValue>> {
        let rows = self.query(KEYS_AT_SQL, &[&keys, &revision]).await?;
        Ok(rows.iter().map(kv_from_row).collect::<Result<_, _>>()?)
    }

    /// `ReadTxn::current_range` in one statement. Sent first, it runs
    /// outside any transaction: one statement, one snapshot, one round trip,
    /// and nothing to roll back.
    pub(super) async fn current_range(
        &mut self,
        query: CurrentRangeQuery<'_>,
    ) -> BackendResult<CurrentRange> {
        let range = query.range;
        let limit = match query.rows {
            true => sql_limit(query.limit),
            false => Some(0),
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&range.start];
        if let Some(end) = &range.end {
            params.push(end);
        }
        params.push(&limit);
        let sql = current_range_sql(range.end.is_some(), query.keys_only, query.count);
        // No BEGIN when nothing was sent yet: the statement is the read.
        let begin = self.begin.take();
        let rows = self.query(sql, &params).await;
        self.begin = begin;
        let rows = rows?;
        let first = rows.first().context("the meta row is missing")?;
        let revisions = revisions_from_row(first)?;
        let count: Option<i64> = first.try_get(3)?;
        let mut kvs = Vec::with_capacity(rows.len());
        for row in &rows {
            if row.try_get::<_, Option<Vec<u8>>>(4)?.is_some() {
                kvs.push(kv_from_row(&ColumnsFrom { row, first: 4 })?);
            }
        }
        if !kvs.is_sorted_by(|a, b| a.key < b.key) {
            bail!("Postgres returned a range out of key order");
        }
        Ok(CurrentRange {
            revisions,
            kvs,
            count: count.filter(|_| query.count),
        })
    }

    /// The counters and each of `keys` (in their order, repeats allowed)
    /// in one statement, outside any transaction when it is the first (see
    /// `current_range`): the counters' row left-joined with the keys' rows,
    /// so one row with no key when none exists.
    pub(super) async fn current_keys(&mut self, keys: &[&[u8]]) -> BackendResult<Vec<KeyRead>> {
        let begin = self.begin.take();
        let rows = self.query(CURRENT_KEYS_SQL, &[&keys]).await;
        self.begin = begin;
        reads_from_rows(keys, &rows?)?.context("the meta row is missing")
    }

    pub(super) async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
        let params = key_params(range, &at);
        let rows = self
            .query(count_sql(at, range.end.is_some()), &params)
            .await?;
        let row = rows.first().context("COUNT returned no row")?;
        Ok(row.try_get(0)?)
    }

    pub(super) async fn log_entries(
        &mut self,
        after: i64,
        through: i64,
    ) -> BackendResult<Vec<LogEntry>> {
        let rows = self
            .query(
                "SELECT key, value, create_revision, revision, version, lease, sub, deleted \
                 FROM log WHERE revision > $1 AND revision <= $2 ORDER BY revision, sub",
                &[&after, &through],
            )
            .await?;
        Ok(rows
            .iter()
            .map(log_entry_from_row)
            .collect::<Result<_, _>>()?)
    }

    pub(super) async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
        let rows = self
            .query("SELECT value FROM settings WHERE name = $1", &[&name])
            .await?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(Into::into)
    }

    pub(super) async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
        let rows = self
            .query(
                "SELECT id, ttl, expires_at FROM lease WHERE id = $1",
                &[&id],
            )
            .await?;
        Ok(rows.first().map(lease_from_row).transpose()?)
    }

    pub(super) async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
        let rows = self
            .query(
                "SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm",
                &[],
            )
            .await?;
        Ok(rows.iter().map(alarm_from_row).collect::<Result<_, _>>()?)
    }

    pub(super) async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
        let rows = self
            .query(
                "SELECT id, ttl, expires_at FROM lease ORDER BY expires_at, id",
                &[],
            )
            .await?;
        Ok(rows.iter().map(lease_from_row).collect::<Result<_, _>>()?)
    }

    pub(super) async fn expired_leases(
        &mut self,
        now_ms: i64,
        limit: usize,
    ) -> BackendResult<Vec<i64>> {
        let rows = self
            .query(
                "SELECT id FROM lease WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2",
                &[&now_ms, &sql_limit(limit)],
            )
            .await?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(Into::into))
            .collect()
    }

    pub(super) async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
        // `lease <> 0` lets every plan use the partial index kv_lease.
        let rows = self
            .query(
                "SELECT key, value, create_revision, mod_revision, version, lease \
                 FROM kv WHERE lease = $1 AND lease <> 0 ORDER BY key",
                &[&id],
            )
            .await?;
        Ok(rows.iter().map(kv_from_row).collect::<Result<_, _>>()?)
    }

    pub(super) async fn auth_records(
        &mut self,
        kind: crate::backend::AuthKind,
    ) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let rows = self
            .query(
                "SELECT name, record FROM auth WHERE kind = $1 ORDER BY name",
                &[&kind.as_str()],
            )
            .await?;
        Ok(rows
            .iter()
            .map(auth_record_from_row)
            .collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_number_their_parameters_in_order() {
        let at = ReadAt::Revision(5);
        assert!(range_sql(ReadAt::Current, false, false).contains("LIMIT $2"));
        assert!(range_sql(ReadAt::Current, true, false).contains("key < $2"));
        assert!(range_sql(ReadAt::Current, true, true).contains("LIMIT $3"));
        assert!(range_sql(at, false, false).contains("revision <= $2"));
        assert!(range_sql(at, true, false).contains("revision <= $3"));
        assert!(range_sql(at, true, true).contains("LIMIT $4"));
        assert!(!range_sql(at, false, true).contains("key <"));
        assert!(count_sql(at, true).contains("revision <= $3"));
        assert!(!count_sql(ReadAt::Current, false).contains('<'));
    }
}
