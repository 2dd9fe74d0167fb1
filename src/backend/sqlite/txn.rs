//! Read and write transactions: the pooled reader's snapshot, the single
//! writer's transaction, their `ReadTxn` and `WriteTxn` impls and the write
//! statements.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::OwnedMutexGuard;

use super::checkpointer::{self, Checkpointer};
use super::journal::{APPLY_BYTES, Journal, UnappliedView};
use super::key_index::{KeyIndex, LATEST, MAX_CHANGES_PER_REVISION, Removal, Undo, row_id};
use super::queries::{
    query_alarms, query_auth_records, query_expired_leases, query_lease, query_leases, query_log,
    query_revisions, query_rows, query_setting, restart_read,
};
use super::readers::{Reader, Readers};
use super::record_log::Change;
use crate::backend::{
    AlarmRow, AuthKind, BackendResult, Compacted, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn,
    Revisions, WriteTxn,
};
use crate::proto::mvccpb::KeyValue;

/// The key index the server's transactions share.
pub(super) type SharedIndex = Arc<RwLock<KeyIndex>>;

/// A read transaction on a pooled connection, which goes back to the pool
/// on drop, keeping its SQLite transaction for the next read (see `readers`).
pub struct SqliteRead {
    pub(super) conn: Option<Connection>,
    /// The pool `conn` came from; None for a snapshot file's connection.
    pub(super) readers: Option<Arc<Readers>>,
    /// The count of the writer's commits when `conn`'s transaction began.
    pub(super) began_after: u64,
    /// The server's key index; for a snapshot file, one built from its log
    /// when a read first needs it.
    pub(super) index: Option<SharedIndex>,
    /// The current revision of this snapshot, once read: what `Current` reads see.
    pub(super) snapshot_revision: Option<i64>,
    /// The rows committed to the record log but not yet to SQLite when the
    /// read began (see `journal`).
    pub(super) unapplied: Option<UnappliedView>,
    /// The server's flag for a batch commit waiting for readers (see
    /// `journal`): a long read lets go of its SQLite snapshot when it is up
    /// (`queries::yield_to_commit`). None where no batch is committed (a
    /// snapshot file; a member of a cluster, in WAL mode).
    pub(super) commit_waiting: Option<Arc<AtomicBool>>,
    /// The index's compaction mark when the read began: log rows read after
    /// it moved may be missing (see `check_log_intact`).
    pub(super) removed_below: i64,
}

impl Drop for SqliteRead {
    fn drop(&mut self) {
        if let (Some(conn), Some(readers)) = (self.conn.take(), &self.readers) {
            readers.give_back(Reader {
                conn,
                began_after: self.began_after,
            });
        }
    }
}

/// The write transaction on the single writer connection.
pub struct SqliteWrite {
    pub(super) conn: OwnedMutexGuard<Connection>,
    pub(super) checkpointer: Arc<Checkpointer>,
    /// The read connections, told of each commit (see `readers`).
    pub(super) readers: Arc<Readers>,
    /// The `meta` row as this transaction read it (see `query_revisions`).
    pub(super) meta: Option<Revisions>,
    /// The current revision as this transaction read it.
    pub(super) read_current: i64,
    /// The revision of the last log row appended in this transaction.
    pub(super) last_appended: i64,
    pub(super) committed: bool,
    /// The server's key index, which this transaction's appends enter at
    /// once (see `key_index`).
    pub(super) index: SharedIndex,
    /// After `clear`: the index this transaction builds, which replaces the
    /// shared one at commit, so that readers meanwhile see the old store whole.
    pub(super) replacement: Option<SharedIndex>,
    /// What takes this transaction's appends out of `index` if it rolls back.
    pub(super) undo: Vec<Undo>,
    /// Compaction's removals, applied to `index` at commit.
    pub(super) removals: Vec<Removal>,
    /// The ids of the log rows compaction removed, deleted from SQLite at
    /// the commit that takes them there, in id order (see `delete_rows`).
    pub(super) removed_rows: Vec<i64>,
    /// The record log, if this write commits through it (see `journal`).
    pub(super) journal: Option<Arc<Journal>>,
    /// The changes made, for the record log; emptied once they pass
    /// `journal::APPLY_BYTES` (the write then commits directly).
    pub(super) records: Vec<Change>,
    /// The bytes of `records`.
    pub(super) record_bytes: usize,
    /// The replication mark this write set, for the batch (replicated mode,
    /// where the journal does not record).
    pub(super) mark: Option<Vec<u8>>,
    /// True once the write changed what the record log does not hold
    /// (auth, alarms, a restore, ...): it then commits directly to SQLite.
    pub(super) direct: bool,
    /// True if this write is the step that finishes a compaction: its batch
    /// is applied with it, so that the file shows the space freed when a
    /// physical Compact answers, as etcd's does.
    pub(super) finishes_compaction: bool,
}

impl Drop for SqliteWrite {
    fn drop(&mut self) {
        if !self.committed {
            match &self.journal {
                Some(journal) => journal.roll_back(&self.conn),
                None => {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
            }
            let mut index = write_index(&self.index);
            for undo in self.undo.drain(..).rev() {
                index.undo(undo);
            }
        }
    }
}

fn read_index(index: &SharedIndex) -> std::sync::RwLockReadGuard<'_, KeyIndex> {
    index.read().expect("key index poisoned")
}

fn write_index(index: &SharedIndex) -> std::sync::RwLockWriteGuard<'_, KeyIndex> {
    index.write().expect("key index poisoned")
}

/// The read queries, shared by read and write transactions.
macro_rules! impl_read_txn {
    ($ty:ty, $conn:ident => $get:expr) => {
        impl ReadTxn for $ty {
            async fn revisions(&mut self) -> BackendResult<Revisions> {
                let (mut revisions, meta) = {
                    let $conn = &*self;
                    query_revisions($get)?
                };
                if let Some(unapplied) = self.unapplied() {
                    revisions = unapplied.revisions(revisions);
                }
                self.note_meta(meta, revisions.current);
                Ok(revisions)
            }

            async fn range(
                &mut self,
                range: &KeyRange,
                at: ReadAt,
                limit: usize,
                keys_only: bool,
            ) -> BackendResult<Vec<KeyValue>> {
                let (index, revision) = self.view(at)?;
                let ids = read_index(&index).range(range, revision, limit)?;
                let $conn = self;
                query_rows(
                    $get,
                    $conn.unapplied(),
                    $conn.commit_waiting(),
                    &ids,
                    keys_only,
                )
            }

            async fn count(&mut self, range: &KeyRange, at: ReadAt) -> BackendResult<i64> {
                let (index, revision) = self.view(at)?;
                Ok(read_index(&index).count(range, revision)?)
            }

            async fn log_entries(
                &mut self,
                after: i64,
                through: i64,
            ) -> BackendResult<Vec<LogEntry>> {
                let $conn = self;
                let mut entries = query_log($get, $conn.commit_waiting(), after, through)?;
                $conn.check_log_intact(after)?;
                if let Some(unapplied) = $conn.unapplied() {
                    unapplied.add_log(after, through, &mut entries);
                }
                Ok(entries)
            }

            async fn setting(&mut self, name: &str) -> BackendResult<Option<i64>> {
                let $conn = self;
                if let Some(value) = $conn.unapplied().and_then(|u| u.setting(name)) {
                    return Ok(Some(value));
                }
                Ok(query_setting($get, name)?)
            }

            async fn lease(&mut self, id: i64) -> BackendResult<Option<LeaseRow>> {
                let $conn = self;
                if let Some(lease) = $conn.unapplied().and_then(|u| u.lease(id)) {
                    return Ok(lease);
                }
                Ok(query_lease($get, id)?)
            }

            async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
                let $conn = self;
                let mut leases = query_leases($get)?;
                if let Some(unapplied) = $conn.unapplied() {
                    unapplied.merge_leases(&mut leases);
                }
                Ok(leases)
            }

            async fn expired_leases(
                &mut self,
                now_ms: i64,
                limit: usize,
            ) -> BackendResult<Vec<i64>> {
                let $conn = self;
                // Leases the unapplied changes removed or moved may be among
                // the snapshot's first `limit`: read as many more.
                let touched = $conn.unapplied().map_or(0, |u| u.leases_touched());
                let expired = query_expired_leases($get, now_ms, limit + touched)?;
                Ok(match $conn.unapplied() {
                    Some(unapplied) if touched > 0 => {
                        unapplied.merge_expired(expired, now_ms, limit)
                    }
                    _ => expired.into_iter().take(limit).map(|(id, _)| id).collect(),
                })
            }

            async fn lease_keys(&mut self, id: i64) -> BackendResult<Vec<KeyValue>> {
                let (index, revision) = self.view(ReadAt::Current)?;
                let ids = read_index(&index).lease_keys(id, revision)?;
                let $conn = self;
                let mut keys =
                    query_rows($get, $conn.unapplied(), $conn.commit_waiting(), &ids, false)?;
                // Keys attached now that had another lease at the snapshot's revision.
                keys.retain(|kv| kv.lease == id);
                Ok(keys)
            }

            async fn alarms(&mut self) -> BackendResult<Vec<AlarmRow>> {
                let $conn = self;
                Ok(query_alarms($get)?)
            }

            async fn auth_records(
                &mut self,
                kind: AuthKind,
            ) -> BackendResult<Vec<(Vec<u8>, Vec<u8>)>> {
                let $conn = self;
                Ok(query_auth_records($get, kind)?)
            }

            async fn replication_mark(&mut self) -> BackendResult<Option<Vec<u8>>> {
                let $conn = self;
                Ok($get
                    .prepare_cached("SELECT mark FROM replication WHERE id = 1")?
                    .query_row([], |r| r.get(0))
                    .optional()?)
            }
        }
    };
}

impl SqliteRead {
    fn commit_waiting(&self) -> Option<&AtomicBool> {
        self.commit_waiting.as_deref()
    }

    /// Ends the SQLite transaction and begins another, for a reader about
    /// to wait for something else (a stream for its client): in rollback
    /// journal mode a transaction held meanwhile would hold up the next
    /// batch commit, and the writer with it. What the reader reads next is
    /// as `queries::yield_to_commit` says.
    pub(super) fn let_go(&mut self) -> BackendResult<()> {
        if self.commit_waiting.is_some() {
            restart_read(self.conn.as_ref().expect("connection present until drop"))?;
        }
        Ok(())
    }

    /// Fails if the log rows after `after` that a read just took from SQLite
    /// may be missing some: compaction removed rows at or after `after + 1`,
    /// and did so since this read began (rows it had removed before, a read
    /// of the whole log, the copy of a snapshot, knows of). The read may
    /// have moved to a later SQLite snapshot since it began (see
    /// `queries::yield_to_commit`).
    fn check_log_intact(&self, after: i64) -> BackendResult<()> {
        let (Some(index), Some(_)) = (&self.index, &self.commit_waiting) else {
            return Ok(());
        };
        let removed_below = read_index(index).removed_below();
        if removed_below > self.removed_below.max(after + 1) {
            return Err(Compacted.into());
        }
        Ok(())
    }

    fn note_meta(&mut self, _meta: Revisions, current: i64) {
        self.snapshot_revision = Some(current);
    }

    fn unapplied(&self) -> Option<&UnappliedView> {
        self.unapplied.as_ref()
    }

    /// The index to read and the revision a read at `at` sees in it.
    fn view(&mut self, at: ReadAt) -> BackendResult<(SharedIndex, i64)> {
        let conn = self.conn.as_ref().expect("connection present until drop");
        let index = match &self.index {
            Some(index) => index.clone(),
            None => {
                let index = Arc::new(RwLock::new(KeyIndex::load(conn)?));
                self.index.insert(index).clone()
            }
        };
        let revision = match (at, self.snapshot_revision) {
            (ReadAt::Revision(revision), _) => revision,
            (ReadAt::Current, Some(current)) => current,
            (ReadAt::Current, None) => {
                let mut current = query_revisions(conn)?.0.current;
                if let Some(unapplied) = &self.unapplied {
                    current = unapplied.current(current);
                }
                *self.snapshot_revision.insert(current)
            }
        };
        Ok((index, revision))
    }
}

impl SqliteWrite {
    /// The writer never lets go of its transaction.
    fn commit_waiting(&self) -> Option<&AtomicBool> {
        None
    }

    /// Only the writer removes rows: what it reads is whole.
    fn check_log_intact(&self, _after: i64) -> BackendResult<()> {
        Ok(())
    }

    fn note_meta(&mut self, meta: Revisions, current: i64) {
        self.meta = Some(meta);
        self.read_current = current;
    }

    /// The writer's connection sees every commit: nothing is unapplied for it.
    fn unapplied(&self) -> Option<&UnappliedView> {
        None
    }

    /// The connection, for a change the record log does not hold: the
    /// write then commits directly (see `journal`).
    fn direct(&mut self) -> &Connection {
        self.direct = true;
        &self.conn
    }

    /// Notes `change` for the record log, if this write goes through it.
    fn record(&mut self, change: Change) {
        if self.journal.is_none() || self.direct {
            return;
        }
        self.record_bytes += change.size();
        if self.record_bytes > APPLY_BYTES {
            // Too large for the record log: committed directly.
            self.direct = true;
            self.records = Vec::new();
        } else {
            self.records.push(change);
        }
    }

    /// The index to read and the revision a read at `at` sees in it: the
    /// writer's own changes are the latest there are.
    fn view(&mut self, at: ReadAt) -> BackendResult<(SharedIndex, i64)> {
        let index = self.replacement.as_ref().unwrap_or(&self.index).clone();
        let revision = match at {
            ReadAt::Revision(revision) => revision,
            ReadAt::Current => LATEST,
        };
        Ok((index, revision))
    }

    /// Removes log row `id`; the caller notes the removal for the index.
    /// The row stays in SQLite until the commit that takes the removal
    /// there: nothing reads it meanwhile, as the index no longer has it.
    fn remove_row(&mut self, id: i64) {
        self.removed_rows.push(id);
        self.record(Change::RowRemoved(id));
    }

    /// Applies `removal` to the index: to the replacement at once (nobody
    /// else reads it), to the shared one at commit.
    fn note_removal(&mut self, removal: Removal) {
        match &self.replacement {
            Some(replacement) => write_index(replacement).remove(vec![removal]),
            None => self.removals.push(removal),
        }
    }

    /// True if the log alone tells the store's counters after `revisions`:
    /// the compaction counters are as `meta` has them and the current
    /// revision is the last one logged (or unchanged since it was read).
    fn meta_still_holds(&self, revisions: &Revisions) -> bool {
        self.meta.is_some_and(|meta| {
            meta.compact == revisions.compact
                && meta.compacted_through == revisions.compacted_through
                && (revisions.current == self.last_appended
                    || revisions.current == self.read_current)
        })
    }
}

impl_read_txn!(SqliteRead, txn => txn.conn.as_ref().expect("connection present until drop"));
impl_read_txn!(SqliteWrite, txn => &txn.conn);

impl WriteTxn for SqliteWrite {
    async fn append(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let kv = &entry.kv;
        if !(0..MAX_CHANGES_PER_REVISION).contains(&entry.sub) {
            anyhow::bail!(
                "revision {} would change more than {MAX_CHANGES_PER_REVISION} keys, the most \
                 one revision of the SQLite store holds",
                kv.mod_revision
            );
        }
        let id = row_id(kv.mod_revision, entry.sub);
        insert_row(&self.conn, entry)?;
        if self.journal.is_some() && !self.direct {
            self.record(Change::Row(entry.clone()));
        }
        self.last_appended = self.last_appended.max(kv.mod_revision);
        match &self.replacement {
            Some(replacement) => {
                write_index(replacement).append(kv.key.clone(), id, entry.deleted, kv.lease);
            }
            None => {
                let undo =
                    write_index(&self.index).append(kv.key.clone(), id, entry.deleted, kv.lease);
                self.undo.push(undo);
            }
        }
        Ok(())
    }

    async fn set_revisions(&mut self, revisions: Revisions) -> BackendResult<()> {
        if self.meta_still_holds(&revisions) {
            return Ok(());
        }
        write_revisions(&self.conn, &revisions)?;
        self.record(Change::Revisions(revisions));
        self.finishes_compaction = revisions.compact > 0
            && revisions.compacted_through >= revisions.compact
            && self
                .meta
                .is_none_or(|meta| meta.compacted_through < revisions.compacted_through);
        self.note_meta(revisions, revisions.current);
        Ok(())
    }

    async fn remove_history_before(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let id = row_id(entry.kv.mod_revision, entry.sub);
        let (index, _) = self.view(ReadAt::Current)?;
        let earlier = read_index(&index).ids_before(&entry.kv.key, id);
        for earlier in earlier {
            self.remove_row(earlier);
        }
        self.note_removal(Removal::Before {
            key: entry.kv.key.clone(),
            id,
        });
        Ok(())
    }

    async fn remove_entry(&mut self, entry: &LogEntry) -> BackendResult<()> {
        let id = row_id(entry.kv.mod_revision, entry.sub);
        self.remove_row(id);
        self.note_removal(Removal::Row {
            key: entry.kv.key.clone(),
            id,
        });
        Ok(())
    }

    async fn set_setting(&mut self, name: &str, value: i64) -> BackendResult<()> {
        write_setting(&self.conn, name, value)?;
        self.record(Change::Setting(name.to_owned(), value));
        Ok(())
    }

    async fn put_lease(&mut self, lease: &LeaseRow) -> BackendResult<()> {
        write_lease(&self.conn, lease.id, Some(lease))?;
        self.record(Change::Lease(*lease));
        Ok(())
    }

    async fn remove_lease(&mut self, id: i64) -> BackendResult<()> {
        write_lease(&self.conn, id, None)?;
        self.record(Change::LeaseRemoved(id));
        Ok(())
    }

    async fn add_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.direct()
            .prepare_cached("INSERT OR IGNORE INTO alarm (member_id, alarm) VALUES (?1, ?2)")?
            .execute(params![alarm.member_id, alarm.alarm])?;
        Ok(())
    }

    async fn remove_alarm(&mut self, alarm: &AlarmRow) -> BackendResult<()> {
        self.direct()
            .prepare_cached("DELETE FROM alarm WHERE member_id = ?1 AND alarm = ?2")?
            .execute(params![alarm.member_id, alarm.alarm])?;
        Ok(())
    }

    async fn clear(&mut self) -> BackendResult<()> {
        self.direct().execute_batch(
            "DELETE FROM log; DELETE FROM lease; DELETE FROM settings; DELETE FROM alarm; DELETE FROM auth; DELETE FROM replication;",
        )?;
        self.replacement = Some(SharedIndex::default());
        self.removals.clear();
        self.removed_rows.clear();
        self.meta = None;
        self.last_appended = 0;
        self.set_revisions(Revisions::EMPTY_STORE).await
    }

    async fn put_auth_record(
        &mut self,
        kind: AuthKind,
        name: &[u8],
        record: &[u8],
    ) -> BackendResult<()> {
        self.direct()
            .prepare_cached("INSERT OR REPLACE INTO auth (kind, name, record) VALUES (?1, ?2, ?3)")?
            .execute(params![kind.as_str(), name, record])?;
        Ok(())
    }

    async fn set_replication_mark(&mut self, mark: &[u8]) -> BackendResult<()> {
        // Once the journal stops recording (replicated mode) the mark rides
        // in the batch with the entry's changes; the record log has no
        // place for one, so until then it is committed directly.
        match &self.journal {
            Some(journal) if !journal.recording() => self.mark = Some(mark.to_vec()),
            _ => self.direct = true,
        }
        write_replication_mark(&self.conn, mark)?;
        Ok(())
    }

    async fn remove_auth_record(&mut self, kind: AuthKind, name: &[u8]) -> BackendResult<()> {
        self.direct()
            .prepare_cached("DELETE FROM auth WHERE kind = ?1 AND name = ?2")?
            .execute(params![kind.as_str(), name])?;
        Ok(())
    }

    async fn commit(mut self) -> BackendResult<()> {
        match self.journal.clone() {
            None => {
                delete_rows(&self.conn, std::mem::take(&mut self.removed_rows))?;
                self.readers
                    .committing(|| self.conn.execute_batch("COMMIT"))?;
                self.checkpointer
                    .after_commit(&self.conn, checkpointer::wal_pages_after_commit());
            }
            Some(journal) if !self.direct && self.records.is_empty() && self.mark.is_none() => {
                // Nothing changed (a Txn whose compare failed, a read-only
                // Txn): nothing to record, and no reason to commit the batch.
                // Taking back its savepoint is keeping it, and ends a batch
                // that holds nothing else.
                journal.roll_back(&self.conn);
            }
            Some(journal) => {
                let records = std::mem::take(&mut self.records);
                let recorded = !self.direct
                    && !journal.stalled()
                    && journal.commit_changes(
                        &self.conn,
                        records,
                        self.mark.take(),
                        self.record_bytes,
                        self.last_appended,
                    )?;
                if !recorded {
                    delete_rows(&self.conn, std::mem::take(&mut self.removed_rows))?;
                    journal.commit_direct(&self.conn, &self.checkpointer)?;
                } else if journal.apply_due() || self.finishes_compaction {
                    journal.apply(&self.conn, &self.checkpointer);
                }
            }
        }
        self.committed = true;
        self.undo.clear();
        if let Some(replacement) = self.replacement.take() {
            let built = std::mem::take(&mut *write_index(&replacement));
            *write_index(&self.index) = built;
        } else if !self.removals.is_empty() {
            write_index(&self.index).remove(std::mem::take(&mut self.removals));
        }
        Ok(())
    }
}

/// Removes the log rows `ids`, in id order. SQLite writes every page a
/// commit changed, freed ones included, but not a page a B-tree rebalance
/// frees before anything changed it; deleting in id order leaves about half
/// of the emptied pages so (docs/benchmarks/compaction.md).
pub(super) fn delete_rows(
    conn: &Connection,
    ids: impl IntoIterator<Item = i64>,
) -> rusqlite::Result<()> {
    let mut ids: Vec<i64> = ids.into_iter().collect();
    ids.sort_unstable();
    let mut delete = conn.prepare_cached("DELETE FROM log WHERE id = ?1")?;
    for id in ids {
        delete.execute([id])?;
    }
    Ok(())
}

/// Writes the `meta` row.
pub(super) fn write_revisions(conn: &Connection, revisions: &Revisions) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE meta SET revision = ?1, compact_revision = ?2, compacted_through = ?3",
    )?
    .execute(params![
        revisions.current,
        revisions.compact,
        revisions.compacted_through
    ])?;
    Ok(())
}

/// Writes the replication mark.
pub(super) fn write_replication_mark(conn: &Connection, mark: &[u8]) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT OR REPLACE INTO replication (id, mark) VALUES (1, ?1)")?
        .execute([mark])?;
    Ok(())
}

/// Appends `entry` to the log table.
pub(super) fn insert_row(conn: &Connection, entry: &LogEntry) -> rusqlite::Result<()> {
    let kv = &entry.kv;
    conn.prepare_cached(
        "INSERT INTO log (id, key, value, create_revision, version, lease, deleted) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        row_id(kv.mod_revision, entry.sub),
        kv.key,
        kv.value,
        kv.create_revision,
        kv.version,
        kv.lease,
        entry.deleted
    ])?;
    Ok(())
}

/// Writes lease `id` (None: removes it).
pub(super) fn write_lease(
    conn: &Connection,
    id: i64,
    lease: Option<&LeaseRow>,
) -> rusqlite::Result<()> {
    match lease {
        Some(lease) => conn
            .prepare_cached(
                "INSERT OR REPLACE INTO lease (id, ttl, expires_at) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![lease.id, lease.ttl, lease.expires_at])?,
        None => conn
            .prepare_cached("DELETE FROM lease WHERE id = ?1")?
            .execute([id])?,
    };
    Ok(())
}

/// Writes setting `name`.
pub(super) fn write_setting(conn: &Connection, name: &str, value: i64) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT OR REPLACE INTO settings (name, value) VALUES (?1, ?2)")?
        .execute(params![name, value])?;
    Ok(())
}
