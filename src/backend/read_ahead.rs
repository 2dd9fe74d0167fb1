//! What a PostgreSQL or MySQL write transaction knows without asking: the
//! alarms it read with its lock, and the keys and leases it read ahead
//! (`WriteTxn::read_ahead`) or wrote since. Later reads of the same keys
//! and leases are answered from here, not by a statement.
//!
//! Each dialect writes its own lock and read statements (PostgreSQL binds
//! the keys as one array parameter, MySQL writes them out in its text) and
//! hands their answers here, in the order `ReadAheadCache::take_in` names.

use std::collections::HashMap;

use anyhow::Context;

use super::rows::{Columns, alarm_from_row, kv_from_row, lease_from_row, revisions_from_row};
use super::{AlarmRow, BackendError, BackendResult, LeaseRow, ReadAhead, Revisions};
use crate::proto::mvccpb::KeyValue;

/// The alarms, keys and leases a write transaction has read or written.
#[derive(Debug, Default)]
pub(crate) struct ReadAheadCache {
    /// The raised alarms, read with the lock, unless changed since.
    alarms: Option<Vec<AlarmRow>>,
    /// The live state of keys read ahead or written in this transaction.
    keys: HashMap<Vec<u8>, Option<KeyValue>>,
    /// Leases read ahead or written in this transaction.
    leases: HashMap<i64, Option<LeaseRow>>,
}

impl ReadAheadCache {
    /// Takes in the answers to a lock and its reads ahead, one result set
    /// each, in this order: when `locking`, the meta row locked and the
    /// alarms; then, when `ahead` names keys, the rows of those keys; then,
    /// when it names leases, those leases. Returns the counters when
    /// `locking`.
    pub(crate) fn take_in<R: Columns>(
        &mut self,
        mut sets: impl Iterator<Item = Vec<R>>,
        locking: bool,
        ahead: Option<&ReadAhead>,
    ) -> BackendResult<Option<Revisions>>
    where
        BackendError: From<R::Error>,
    {
        let keys = ahead.map_or(&[][..], |a| a.keys.as_slice());
        let leases = ahead.map_or(&[][..], |a| a.leases.as_slice());
        let mut revisions = None;
        if locking {
            let meta = sets.next().context("no answer to the meta lock")?;
            let row = meta.first().context("the meta table has no row")?;
            revisions = Some(revisions_from_row(row)?);
            let alarms = sets.next().context("no answer to the alarm read")?;
            self.alarms = Some(
                alarms
                    .iter()
                    .map(alarm_from_row)
                    .collect::<Result<_, _>>()?,
            );
        }
        if !keys.is_empty() {
            let rows = sets.next().context("no answer to the key read")?;
            for key in keys {
                self.keys.entry(key.clone()).or_insert(None);
            }
            for row in &rows {
                let kv = kv_from_row(row)?;
                self.keys.insert(kv.key.clone(), Some(kv));
            }
        }
        if !leases.is_empty() {
            let rows = sets.next().context("no answer to the lease read")?;
            for id in leases {
                self.leases.entry(*id).or_insert(None);
            }
            for row in &rows {
                let lease = lease_from_row(row)?;
                self.leases.insert(lease.id, Some(lease));
            }
        }
        Ok(revisions)
    }

    /// The live state of `key` (None: it has none), if known.
    pub(crate) fn key(&self, key: &[u8]) -> Option<&Option<KeyValue>> {
        self.keys.get(key)
    }

    /// Lease `id` (None: there is no such lease), if known.
    pub(crate) fn lease(&self, id: i64) -> Option<Option<LeaseRow>> {
        self.leases.get(&id).copied()
    }

    /// The raised alarms, if known.
    pub(crate) fn alarms(&self) -> Option<&Vec<AlarmRow>> {
        self.alarms.as_ref()
    }

    /// Notes `key`'s live state as this transaction wrote it.
    pub(crate) fn wrote_key(&mut self, key: &[u8], live: Option<KeyValue>) {
        self.keys.insert(key.to_vec(), live);
    }

    /// Notes lease `id` as this transaction wrote it (None: removed).
    pub(crate) fn wrote_lease(&mut self, id: i64, lease: Option<LeaseRow>) {
        self.leases.insert(id, lease);
    }

    /// Notes the alarms as read (or as known to be).
    pub(crate) fn read_alarms(&mut self, alarms: Vec<AlarmRow>) {
        self.alarms = Some(alarms);
    }

    /// Forgets the alarms, which this transaction changed.
    pub(crate) fn changed_alarms(&mut self) {
        self.alarms = None;
    }

    /// Notes that this transaction emptied the store: no key, lease or
    /// alarm is left.
    pub(crate) fn cleared(&mut self) {
        self.keys.clear();
        self.leases.clear();
        self.alarms = Some(Vec::new());
    }
}
