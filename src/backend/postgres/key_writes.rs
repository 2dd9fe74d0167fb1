//! The key writes of a write transaction, gathered into few statements.
//!
//! A put is a log row and a `kv` row. Sent one statement each (both in one
//! statement with a CTE), PostgreSQL's work per put was mostly the fixed cost
//! of a statement; a batch's log rows in one `INSERT ... SELECT FROM
//! unnest(...)` and its `kv` changes in one more cost about 0.6 of it in a
//! pgbench model of a batch of 16 puts (BENCHMARKS.md, issue 30).

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
    /// leaving nothing behind.
    pub(super) fn take(&mut self) -> Vec<(&'static str, Params)> {
        let KeyWrites { rows, states } = std::mem::take(self);
        let mut statements = Vec::with_capacity(3);
        if rows.is_empty() {
            return statements;
        }
        let column = |f: &dyn Fn(&LogEntry) -> i64| rows.iter().map(f).collect::<Vec<i64>>();
        let log: Params = vec![
            Box::new(column(&|r| r.kv.mod_revision)),
            Box::new(column(&|r| r.sub)),
            Box::new(rows.iter().map(|r| r.kv.key.clone()).collect::<Vec<_>>()),
            Box::new(rows.iter().map(|r| r.kv.value.clone()).collect::<Vec<_>>()),
            Box::new(column(&|r| r.kv.create_revision)),
            Box::new(column(&|r| r.kv.version)),
            Box::new(column(&|r| r.kv.lease)),
            Box::new(rows.iter().map(|r| r.deleted).collect::<Vec<bool>>()),
        ];
        statements.push((INSERT_LOG, log));
        let (live, deleted): (Vec<_>, Vec<_>) =
            states.into_iter().partition(|(_, at)| at.is_some());
        if !live.is_empty() {
            let live: Vec<&LogEntry> = live
                .iter()
                .filter_map(|(_, at)| *at)
                .map(|i| &rows[i])
                .collect();
            let column =
                |f: &dyn Fn(&LogEntry) -> i64| live.iter().map(|r| f(r)).collect::<Vec<i64>>();
            let kv: Params = vec![
                Box::new(live.iter().map(|r| r.kv.key.clone()).collect::<Vec<_>>()),
                Box::new(live.iter().map(|r| r.kv.value.clone()).collect::<Vec<_>>()),
                Box::new(column(&|r| r.kv.create_revision)),
                Box::new(column(&|r| r.kv.mod_revision)),
                Box::new(column(&|r| r.kv.version)),
                Box::new(column(&|r| r.kv.lease)),
            ];
            statements.push((UPSERT_KV, kv));
        }
        if !deleted.is_empty() {
            let keys: Vec<Vec<u8>> = deleted.into_iter().map(|(key, _)| key).collect();
            statements.push((DELETE_KV, vec![Box::new(keys)]));
        }
        statements
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
