//! The key writes of a write transaction, gathered into few statements.
//!
//! A put is a log row and a `kv` row. Sent one statement each (both in one
//! statement with a CTE), PostgreSQL's work per put was mostly the fixed cost
//! of a statement; a batch's log rows in one `INSERT ... SELECT FROM
//! unnest(...)` and its `kv` changes in one more cost about 0.6 of it in a
//! pgbench model of a batch of 16 puts (docs/benchmarks/sql-backends.md).

use std::collections::BTreeMap;

use tokio_postgres::types::ToSql;

use crate::backend::LogEntry;

/// A statement's parameters.
pub(super) type Params = Vec<Box<dyn ToSql + Sync + Send>>;

const INSERT_LOG: &str = "INSERT INTO log (revision, sub, key, value, create_revision, version, lease, deleted) \
     SELECT * FROM unnest($1::BIGINT[], $2::BIGINT[], $3::BYTEA[], $4::BYTEA[], \
       $5::BIGINT[], $6::BIGINT[], $7::BIGINT[], $8::BOOLEAN[])";

const UPSERT_KV: &str = "INSERT INTO kv (key, value, create_revision, mod_revision, version, lease) \
     SELECT * FROM unnest($1::BYTEA[], $2::BYTEA[], $3::BIGINT[], $4::BIGINT[], \
       $5::BIGINT[], $6::BIGINT[]) \
     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, \
       create_revision = EXCLUDED.create_revision, mod_revision = EXCLUDED.mod_revision, \
       version = EXCLUDED.version, lease = EXCLUDED.lease";

const DELETE_KV: &str = "DELETE FROM kv WHERE key = ANY($1::BYTEA[])";

/// Consecutive key writes not sent yet. Anything else the transaction
/// sends or reads goes after them (`TxnConn` takes them first), so
/// statements keep their order.
#[derive(Default)]
pub(super) struct KeyWrites {
    /// The log rows, in the order written.
    rows: Vec<LogEntry>,
    /// Each key's state after its last write: the index in `rows` of the
    /// row that holds it, or None once deleted. Only the last matters:
    /// nothing reads `kv` before they are sent, and one statement cannot
    /// change a row twice.
    states: BTreeMap<Vec<u8>, Option<usize>>,
}

impl KeyWrites {
    /// Adds a log row and the change it makes to its key.
    pub(super) fn add(&mut self, entry: &LogEntry) {
        let live = (!entry.deleted).then_some(self.rows.len());
        self.states.insert(entry.kv.key.clone(), live);
        self.rows.push(entry.clone());
    }

    /// Whether nothing is gathered.
    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The statements for everything gathered, in the order they must run,
    /// leaving nothing behind. The log rows' keys and values move into the
    /// log statement; only the live keys' values are copied for `kv`.
    pub(super) fn take(&mut self) -> Vec<(&'static str, Params)> {
        let KeyWrites { rows, states } = std::mem::take(self);
        let mut statements = Vec::with_capacity(3);
        if rows.is_empty() {
            return statements;
        }
        let mut live = Kv::default();
        let mut deleted: Vec<Vec<u8>> = Vec::new();
        for (key, at) in states {
            match at {
                Some(i) => live.push(key, &rows[i]),
                None => deleted.push(key),
            }
        }
        statements.push((INSERT_LOG, Log::from(rows).into_params()));
        if !live.keys.is_empty() {
            statements.push((UPSERT_KV, live.into_params()));
        }
        if !deleted.is_empty() {
            statements.push((DELETE_KV, vec![Box::new(deleted)]));
        }
        statements
    }
}

/// The columns of `INSERT_LOG`.
#[derive(Default)]
struct Log {
    revisions: Vec<i64>,
    subs: Vec<i64>,
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
    create_revisions: Vec<i64>,
    versions: Vec<i64>,
    leases: Vec<i64>,
    deleted: Vec<bool>,
}

impl From<Vec<LogEntry>> for Log {
    fn from(rows: Vec<LogEntry>) -> Self {
        let mut log = Log::default();
        for row in rows {
            log.revisions.push(row.kv.mod_revision);
            log.subs.push(row.sub);
            log.create_revisions.push(row.kv.create_revision);
            log.versions.push(row.kv.version);
            log.leases.push(row.kv.lease);
            log.deleted.push(row.deleted);
            log.keys.push(row.kv.key);
            log.values.push(row.kv.value);
        }
        log
    }
}

impl Log {
    fn into_params(self) -> Params {
        vec![
            Box::new(self.revisions),
            Box::new(self.subs),
            Box::new(self.keys),
            Box::new(self.values),
            Box::new(self.create_revisions),
            Box::new(self.versions),
            Box::new(self.leases),
            Box::new(self.deleted),
        ]
    }
}

/// The columns of `UPSERT_KV`.
#[derive(Default)]
struct Kv {
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
    create_revisions: Vec<i64>,
    mod_revisions: Vec<i64>,
    versions: Vec<i64>,
    leases: Vec<i64>,
}

impl Kv {
    fn push(&mut self, key: Vec<u8>, row: &LogEntry) {
        self.keys.push(key);
        self.values.push(row.kv.value.clone());
        self.create_revisions.push(row.kv.create_revision);
        self.mod_revisions.push(row.kv.mod_revision);
        self.versions.push(row.kv.version);
        self.leases.push(row.kv.lease);
    }

    fn into_params(self) -> Params {
        vec![
            Box::new(self.keys),
            Box::new(self.values),
            Box::new(self.create_revisions),
            Box::new(self.mod_revisions),
            Box::new(self.versions),
            Box::new(self.leases),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every log row, in order; each key's last state only.
    #[test]
    fn rows_in_order_and_each_key_its_last_state() {
        let mut writes = KeyWrites::default();
        for written in [
            LogEntry::of_key("a", 5, false),
            LogEntry::of_key("b", 6, false),
            LogEntry::of_key("a", 7, true),
            LogEntry::of_key("b", 8, false),
        ] {
            writes.add(&written);
        }
        let statements = writes.take();
        let sql: Vec<&str> = statements.iter().map(|(sql, _)| *sql).collect();
        assert_eq!(sql, [INSERT_LOG, UPSERT_KV, DELETE_KV]);
        let debug = |params: &Params| format!("{params:?}");
        assert!(
            debug(&statements[0].1)
                .starts_with("[[5, 6, 7, 8], [0, 0, 0, 0], [[97], [98], [97], [98]]")
        );
        assert!(debug(&statements[1].1).starts_with("[[[98]], [[]], [0], [8],"));
        assert_eq!(debug(&statements[2].1), "[[[97]]]");
        assert!(writes.is_empty(), "nothing left behind");
        assert!(writes.take().is_empty());
    }
}
