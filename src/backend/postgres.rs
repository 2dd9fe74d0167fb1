//! The Postgres backend (work in progress).

use super::{
    Backend, BackendResult, DatabaseSize, KeyRange, LeaseRow, LogEntry, ReadAt, ReadTxn, Revisions,
    WriteTxn,
};
use crate::config::DatastoreTls;
use crate::proto::mvccpb::KeyValue;

/// A store in a Postgres database.
pub struct Postgres {}

impl Postgres {
    /// Connects to the database named by `url`, creating it and its schema if needed.
    pub async fn connect(url: &str, tls: &DatastoreTls) -> anyhow::Result<Self> {
        let _ = (url, tls);
        anyhow::bail!("the Postgres backend is not built yet")
    }
}

/// A read transaction.
pub struct PostgresRead {}
/// A write transaction.
pub struct PostgresWrite {}

impl Backend for Postgres {
    type Read = PostgresRead;
    type Write = PostgresWrite;
    async fn read(&self) -> BackendResult<PostgresRead> {
        unimplemented!()
    }
    async fn write(&self) -> BackendResult<PostgresWrite> {
        unimplemented!()
    }
    async fn size(&self) -> BackendResult<DatabaseSize> {
        unimplemented!()
    }
}

macro_rules! read_txn {
    ($ty:ty) => {
        impl ReadTxn for $ty {
            async fn revisions(&mut self) -> BackendResult<Revisions> {
                unimplemented!()
            }
            async fn range(
                &mut self,
                _: &KeyRange,
                _: ReadAt,
                _: usize,
                _: bool,
            ) -> BackendResult<Vec<KeyValue>> {
                unimplemented!()
            }
            async fn count(&mut self, _: &KeyRange, _: ReadAt) -> BackendResult<i64> {
                unimplemented!()
            }
            async fn log_entries(&mut self, _: i64, _: i64) -> BackendResult<Vec<LogEntry>> {
                unimplemented!()
            }
            async fn setting(&mut self, _: &str) -> BackendResult<Option<i64>> {
                unimplemented!()
            }
            async fn lease(&mut self, _: i64) -> BackendResult<Option<LeaseRow>> {
                unimplemented!()
            }
            async fn leases(&mut self) -> BackendResult<Vec<LeaseRow>> {
                unimplemented!()
            }
            async fn expired_leases(&mut self, _: i64, _: usize) -> BackendResult<Vec<i64>> {
                unimplemented!()
            }
            async fn lease_keys(&mut self, _: i64) -> BackendResult<Vec<KeyValue>> {
                unimplemented!()
            }
        }
    };
}
read_txn!(PostgresRead);
read_txn!(PostgresWrite);

impl WriteTxn for PostgresWrite {
    async fn append(&mut self, _: &LogEntry) -> BackendResult<()> {
        unimplemented!()
    }
    async fn set_revisions(&mut self, _: Revisions) -> BackendResult<()> {
        unimplemented!()
    }
    async fn remove_history_before(&mut self, _: &LogEntry) -> BackendResult<()> {
        unimplemented!()
    }
    async fn remove_entry(&mut self, _: &LogEntry) -> BackendResult<()> {
        unimplemented!()
    }
    async fn set_setting(&mut self, _: &str, _: i64) -> BackendResult<()> {
        unimplemented!()
    }
    async fn put_lease(&mut self, _: &LeaseRow) -> BackendResult<()> {
        unimplemented!()
    }
    async fn remove_lease(&mut self, _: i64) -> BackendResult<()> {
        unimplemented!()
    }
    async fn commit(self) -> BackendResult<()> {
        unimplemented!()
    }
}
