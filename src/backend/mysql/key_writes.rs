//! The key writes of a write transaction, gathered into few statements.
//!
//! A put is a log row and a `kv` row. Sent one statement each, MariaDB
//! spent about 0.1 ms of CPU per put, most of it the fixed cost of a
//! statement; one multi-row statement for a batch's log rows and one for
//! its `kv` changes cost it a quarter of that (docs/benchmarks/sql-backends.md).

use std::collections::BTreeMap;

use super::queries::bytes_literal;

/// Consecutive key writes not sent yet. Anything else the transaction
/// sends or reads goes after them ([`KeyWrites::take`]), so statements
/// keep their order.
#[derive(Default)]
pub(super) struct KeyWrites {
    /// The log rows, each a `(...)` tuple of literals.
    log_rows: Vec<String>,
    /// Each key's state after its last write: the log row (revision, sub)
    /// that holds it, or None once deleted. Only the last matters: nothing
    /// reads `kv` before they are sent.
    states: BTreeMap<Vec<u8>, Option<(i64, i64)>>,
    /// About how long their statements are, in bytes.
    bytes: usize,
}

impl KeyWrites {
    /// Adds a log row's tuple; its `kv` change comes with [`Self::key`].
    pub(super) fn log_row(&mut self, tuple: String) {
        self.bytes += tuple.len() + 2;
        self.log_rows.push(tuple);
    }

    /// Records a key's state after a write: held by the log row
    /// `(revision, sub)`, or deleted.
    pub(super) fn key(&mut self, key: &[u8], row: Option<(i64, i64)>) {
        self.bytes += 2 * key.len() + 48;
        self.states.insert(key.to_vec(), row);
    }

    /// About how long the statements would be, in bytes.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is gathered.
    pub(super) fn is_empty(&self) -> bool {
        self.log_rows.is_empty() && self.states.is_empty()
    }

    /// The statements for everything gathered, in the order they must run
    /// (the log rows first: `kv` copies the live ones from there), leaving
    /// nothing behind.
    pub(super) fn take(&mut self) -> Vec<String> {
        let writes = std::mem::take(self);
        let mut statements = Vec::with_capacity(3);
        if !writes.log_rows.is_empty() {
            statements.push(format!(
                "INSERT INTO log (revision, sub, `key`, value, create_revision, version, lease, \
                 deleted) VALUES {}",
                writes.log_rows.join(", ")
            ));
        }
        let mut rows = Vec::new();
        let mut deleted = Vec::new();
        for (key, row) in &writes.states {
            match row {
                Some((revision, sub)) => rows.push(format!("({revision}, {sub})")),
                None => deleted.push(bytes_literal(key)),
            }
        }
        if !rows.is_empty() {
            // The value is copied from the log row rather than sent twice.
            // VALUES() rather than MySQL 8's row alias, which MariaDB lacks.
            statements.push(format!(
                "INSERT INTO kv (`key`, value, create_revision, mod_revision, version, lease) \
                 SELECT `key`, value, create_revision, revision, version, lease FROM log \
                 WHERE (revision, sub) IN ({}) \
                 ON DUPLICATE KEY UPDATE value = VALUES(value), \
                 create_revision = VALUES(create_revision), mod_revision = VALUES(mod_revision), \
                 version = VALUES(version), lease = VALUES(lease)",
                rows.join(", ")
            ));
        }
        if !deleted.is_empty() {
            statements.push(format!(
                "DELETE FROM kv WHERE `key` IN ({})",
                deleted.join(", ")
            ));
        }
        statements
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_written_twice_keeps_its_last_state() {
        let mut writes = KeyWrites::default();
        writes.log_row("(5, 0, X'61')".into());
        writes.key(b"a", Some((5, 0)));
        writes.log_row("(6, 0, X'62')".into());
        writes.key(b"b", Some((6, 0)));
        writes.log_row("(7, 0, X'61')".into());
        writes.key(b"a", None);
        writes.log_row("(8, 0, X'62')".into());
        writes.key(b"b", Some((8, 0)));
        let statements = writes.take();
        assert_eq!(statements.len(), 3);
        assert!(
            statements[0]
                .ends_with("VALUES (5, 0, X'61'), (6, 0, X'62'), (7, 0, X'61'), (8, 0, X'62')")
        );
        assert!(statements[1].contains("WHERE (revision, sub) IN ((8, 0)) ON DUPLICATE"));
        assert_eq!(statements[2], "DELETE FROM kv WHERE `key` IN (X'61')");
        assert!(writes.is_empty(), "nothing left behind");
        assert_eq!(writes.bytes(), 0);
    }
}
