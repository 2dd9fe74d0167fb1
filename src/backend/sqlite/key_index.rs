//! The key index, held in memory as etcd holds its treeIndex: for every key,
//! the log rows of its changes that the log still holds, and for every lease
//! the live keys attached to it.
//!
//! The database keeps only the revision-ordered log, so a commit appends rows
//! at the end of one B-tree and rewrites no key-ordered page. Reads find
//! their rows here and fetch them from the log by row id. The index is built
//! from the log when the database opens.
//!
//! Readers share the index with the writer. The writer adds a change as it
//! appends its row, before the commit: each reader looks only at revisions
//! up to its own snapshot's, which an uncommitted revision is above. A
//! rolled-back transaction takes its changes out again. Compaction's
//! removals wait for the commit; after them, a reader below the compacted
//! revision is told so (`Compacted`) rather than given a state with holes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use rusqlite::Connection;

use crate::backend::{Compacted, KeyRange};

/// Bits of a log row id that hold the change's position in its revision.
/// The statements spell it out: `id >> 20` is the revision, `id & 1048575`
/// the position (see V6__log_by_revision.sql).
const SUB_BITS: u32 = 20;

/// Most changes one revision can hold (a Txn's puts and deletions, or the
/// keys of one DeleteRange).
pub(super) const MAX_CHANGES_PER_REVISION: i64 = 1 << SUB_BITS;

/// The highest revision a row id can hold: reads "at the latest" use it.
pub(super) const LATEST: i64 = i64::MAX >> SUB_BITS;

/// The log's row id of change `sub` of `revision`: ids ascend with
/// (revision, sub), so the log is a rowid table appended at its end.
pub(super) fn row_id(revision: i64, sub: i64) -> i64 {
    (revision << SUB_BITS) | sub
}

/// The revision of the row `id`.
pub(super) fn revision_of(id: i64) -> i64 {
    id >> SUB_BITS
}

/// One change of a key: its log row, and whether it deleted the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Change {
    id: i64,
    deleted: bool,
}

/// A key's changes still in the log, ascending, and its lease now.
#[derive(Debug, Default)]
struct KeyHistory {
    changes: Vec<Change>,
    lease: i64,
}

impl KeyHistory {
    /// The row holding the key's state at `revision`, if it existed then.
    fn visible_at(&self, revision: i64) -> Option<i64> {
        let before = self
            .changes
            .partition_point(|c| revision_of(c.id) <= revision);
        let change = self.changes[..before].last()?;
        (!change.deleted).then_some(change.id)
    }
}

/// What undoes one `append`.
#[derive(Debug)]
pub(super) struct Undo {
    key: Vec<u8>,
    id: i64,
    lease_before: i64,
}

/// A removal compaction makes, applied to the index at its commit.
#[derive(Debug)]
pub(super) enum Removal {
    /// The key's changes before row `id`.
    Before { key: Vec<u8>, id: i64 },
    /// The change of row `id`.
    Row { key: Vec<u8>, id: i64 },
}

/// Keys -> their changes; leases -> their keys.
#[derive(Debug, Default)]
pub(super) struct KeyIndex {
    keys: BTreeMap<Vec<u8>, KeyHistory>,
    leases: HashMap<i64, BTreeSet<Vec<u8>>>,
    /// Compaction removed changes that reads below this revision may need.
    removed_below: i64,
}

impl KeyIndex {
    /// Builds the index from every row of the log.
    pub(super) fn load(conn: &Connection) -> rusqlite::Result<KeyIndex> {
        let mut index = KeyIndex::default();
        let mut stmt = conn.prepare("SELECT id, key, deleted, lease FROM log ORDER BY id")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let key: Vec<u8> = row.get(1)?;
            index.append(key, row.get(0)?, row.get(2)?, row.get(3)?);
        }
        Ok(index)
    }

    /// Adds a change of `key` (the newest of its changes); returns what undoes it.
    pub(super) fn append(&mut self, key: Vec<u8>, id: i64, deleted: bool, lease: i64) -> Undo {
        let lease = if deleted { 0 } else { lease };
        let history = self.keys.entry(key.clone()).or_default();
        history.changes.push(Change { id, deleted });
        let lease_before = std::mem::replace(&mut history.lease, lease);
        if lease_before != lease {
            self.detach(lease_before, &key);
            self.attach(lease, &key);
        }
        Undo {
            key,
            id,
            lease_before,
        }
    }

    /// Takes back an `append`; undos come newest first.
    pub(super) fn undo(&mut self, undo: Undo) {
        let Some(history) = self.keys.get_mut(&undo.key) else {
            return;
        };
        if history.changes.last().is_some_and(|c| c.id == undo.id) {
            history.changes.pop();
        }
        let lease_now = std::mem::replace(&mut history.lease, undo.lease_before);
        let empty = history.changes.is_empty();
        if lease_now != undo.lease_before {
            self.detach(lease_now, &undo.key);
            self.attach(undo.lease_before, &undo.key);
        }
        if empty {
            self.keys.remove(&undo.key);
        }
    }

    /// Applies a committed compaction's removals.
    pub(super) fn remove(&mut self, removals: Vec<Removal>) {
        for removal in removals {
            let (key, id, before) = match removal {
                Removal::Before { key, id } => (key, id, true),
                Removal::Row { key, id } => (key, id, false),
            };
            let Some(history) = self.keys.get_mut(&key) else {
                continue;
            };
            if before {
                history.changes.retain(|c| c.id >= id);
            } else {
                history.changes.retain(|c| c.id != id);
            }
            // A read at the row's revision or later needs none of what went.
            self.removed_below = self.removed_below.max(revision_of(id));
            if history.changes.is_empty() {
                let lease = history.lease;
                self.keys.remove(&key);
                self.detach(lease, &key);
            }
        }
    }

    /// Reads below this revision may miss changes compaction removed.
    pub(super) fn removed_below(&self) -> i64 {
        self.removed_below
    }

    /// Fails if compaction removed changes a read at `revision` might need.
    fn check(&self, revision: i64) -> Result<(), Compacted> {
        if revision < self.removed_below {
            return Err(Compacted);
        }
        Ok(())
    }

    /// Row ids of the keys in `range` at `revision`, ascending by key, at
    /// most `limit` (0 = all).
    pub(super) fn range(
        &self,
        range: &KeyRange,
        revision: i64,
        limit: usize,
    ) -> Result<Vec<i64>, Compacted> {
        self.check(revision)?;
        let mut ids = Vec::new();
        for (_, history) in self.keys_in(range) {
            if let Some(id) = history.visible_at(revision) {
                ids.push(id);
                if ids.len() == limit {
                    break;
                }
            }
        }
        Ok(ids)
    }

    /// Number of keys in `range` at `revision`.
    pub(super) fn count(&self, range: &KeyRange, revision: i64) -> Result<i64, Compacted> {
        self.check(revision)?;
        let count = self
            .keys_in(range)
            .filter(|(_, history)| history.visible_at(revision).is_some())
            .count();
        Ok(count as i64)
    }

    /// Row ids, ascending by key, of the keys attached to `lease` now that
    /// existed at `revision`. The caller keeps the rows whose lease is `lease`.
    pub(super) fn lease_keys(&self, lease: i64, revision: i64) -> Result<Vec<i64>, Compacted> {
        self.check(revision)?;
        let Some(keys) = self.leases.get(&lease) else {
            return Ok(Vec::new());
        };
        Ok(keys
            .iter()
            .filter_map(|key| self.keys.get(key)?.visible_at(revision))
            .collect())
    }

    /// Row ids of `key`'s changes before row `id`.
    pub(super) fn ids_before(&self, key: &[u8], id: i64) -> Vec<i64> {
        self.keys.get(key).map_or_else(Vec::new, |history| {
            history
                .changes
                .iter()
                .take_while(|c| c.id < id)
                .map(|c| c.id)
                .collect()
        })
    }

    fn keys_in<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a KeyHistory)> + 'a {
        let start = range.start.as_slice();
        let end = match &range.end {
            // BTreeMap::range panics on an end below the start.
            _ if range.is_empty() => Bound::Excluded(start),
            Some(end) => Bound::Excluded(end.as_slice()),
            None => Bound::Unbounded,
        };
        self.keys.range::<[u8], _>((Bound::Included(start), end))
    }

    fn attach(&mut self, lease: i64, key: &[u8]) {
        if lease != 0 {
            self.leases.entry(lease).or_default().insert(key.to_vec());
        }
    }

    fn detach(&mut self, lease: i64, key: &[u8]) {
        if let Some(keys) = self.leases.get_mut(&lease) {
            keys.remove(key);
            if keys.is_empty() {
                self.leases.remove(&lease);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> KeyRange {
        KeyRange {
            start: Vec::new(),
            end: None,
        }
    }

    #[test]
    fn a_key_is_seen_as_it_was_at_each_revision() {
        let mut index = KeyIndex::default();
        index.append(b"a".to_vec(), row_id(2, 0), false, 0);
        index.append(b"a".to_vec(), row_id(3, 0), true, 0);
        index.append(b"a".to_vec(), row_id(5, 0), false, 7);
        index.append(b"b".to_vec(), row_id(4, 0), false, 7);
        assert_eq!(index.range(&all(), 1, 0).unwrap(), Vec::<i64>::new());
        assert_eq!(index.range(&all(), 2, 0).unwrap(), vec![row_id(2, 0)]);
        assert_eq!(index.range(&all(), 3, 0).unwrap(), Vec::<i64>::new());
        assert_eq!(index.count(&all(), 4).unwrap(), 1);
        assert_eq!(
            index.range(&all(), LATEST, 0).unwrap(),
            vec![row_id(5, 0), row_id(4, 0)]
        );
        assert_eq!(index.range(&all(), LATEST, 1).unwrap(), vec![row_id(5, 0)]);
        assert_eq!(
            index.lease_keys(7, LATEST).unwrap(),
            vec![row_id(5, 0), row_id(4, 0)]
        );
        assert_eq!(index.lease_keys(7, 4).unwrap(), vec![row_id(4, 0)]);
    }

    #[test]
    fn undo_takes_an_append_back_with_its_lease() {
        let mut index = KeyIndex::default();
        index.append(b"a".to_vec(), row_id(2, 0), false, 7);
        let undo_put = index.append(b"a".to_vec(), row_id(3, 0), false, 8);
        let undo_new = index.append(b"b".to_vec(), row_id(3, 1), false, 8);
        index.undo(undo_new);
        index.undo(undo_put);
        assert_eq!(index.lease_keys(7, LATEST).unwrap(), vec![row_id(2, 0)]);
        assert!(index.lease_keys(8, LATEST).unwrap().is_empty());
        assert_eq!(index.range(&all(), LATEST, 0).unwrap(), vec![row_id(2, 0)]);
    }

    #[test]
    fn reads_below_a_compaction_are_refused_once_it_removed_rows() {
        let mut index = KeyIndex::default();
        index.append(b"a".to_vec(), row_id(2, 0), false, 0);
        index.append(b"a".to_vec(), row_id(3, 0), false, 0);
        index.append(b"b".to_vec(), row_id(4, 0), true, 0);
        index.remove(vec![
            Removal::Before {
                key: b"a".to_vec(),
                id: row_id(3, 0),
            },
            Removal::Row {
                key: b"b".to_vec(),
                id: row_id(4, 0),
            },
        ]);
        assert!(index.range(&all(), 3, 0).is_err());
        assert_eq!(index.range(&all(), 4, 0).unwrap(), vec![row_id(3, 0)]);
        assert_eq!(index.keys.len(), 1);
    }

    #[test]
    fn an_empty_range_is_empty() {
        let mut index = KeyIndex::default();
        index.append(b"m".to_vec(), row_id(2, 0), false, 0);
        let backwards = KeyRange {
            start: b"z".to_vec(),
            end: Some(b"a".to_vec()),
        };
        assert!(index.range(&backwards, LATEST, 0).unwrap().is_empty());
    }
}
