//! The narrow handle replicated mode gets on a member's store: the few
//! things Raft's state machine does besides applying entries through the
//! writer (which carries each entry's mark). Nothing in `crate::raft`
//! touches the database itself.

use std::path::Path;

use super::{Identity, Store};
use crate::backend::settings::{CLUSTER_ID, MEMBER_ID};
use crate::backend::snapshot::{self, Purpose};
use crate::backend::sqlite::Sqlite;
use crate::backend::{Backend, ReadTxn, WriteTxn};

/// A member's store as Raft's state machine sees it.
pub struct Replica<'a, B: Backend> {
    store: &'a Store<B>,
}

impl<B: Backend> Store<B> {
    /// This store as a replica of a Raft log.
    pub fn replica(&self) -> Replica<'_, B> {
        Replica { store: self }
    }
}

impl<B: Backend> Replica<'_, B> {
    fn backend(&self) -> &B {
        &self.store.backend
    }

    /// The encoded mark of the last applied entry, if any was applied.
    pub async fn mark(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let mut txn = self.backend().read_applied().await?;
        txn.replication_mark().await
    }

    /// Writes one consistent copy of the store to `path`; returns the mark
    /// the copy is at.
    pub async fn copy_to(&self, path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
        snapshot::write_database(self.backend(), path).await?;
        let mut copy = Sqlite::read_snapshot_file(path)?;
        copy.replication_mark().await
    }

    /// Replaces the store's contents with the snapshot file at `path`, which
    /// is at `mark`, keeping this member's `identity`; watchers then skip
    /// what the new contents compacted.
    pub async fn install(
        &self,
        path: &Path,
        mark: &[u8],
        identity: Identity,
    ) -> anyhow::Result<()> {
        let mut source = Sqlite::read_snapshot_file(path)?;
        let mut target = self.backend().write().await?;
        snapshot::empty_target(&mut target, true).await?;
        snapshot::copy(&mut source, &mut target, Purpose::Snapshot, &mut |_| {}).await?;
        // The copy brought the sender's ids; this member keeps its own.
        target
            .set_setting(CLUSTER_ID, identity.cluster_id as i64)
            .await?;
        target
            .set_setting(MEMBER_ID, identity.member_id as i64)
            .await?;
        target.set_replication_mark(mark).await?;
        target.commit().await?;
        self.store.reload().await
    }

    /// From now on commits need not be durable by themselves: the Raft log
    /// keeps every entry until `make_durable` ran (a snapshot covers it).
    pub async fn defer_durability(&self) -> anyhow::Result<()> {
        self.backend().defer_durability().await
    }

    /// Makes every commit so far durable, before Raft purges its log.
    pub async fn make_durable(&self) -> anyhow::Result<()> {
        self.backend().make_durable().await
    }

    /// Takes the id of the cluster this member joined.
    pub async fn adopt_cluster_id(&self, cluster_id: u64) -> anyhow::Result<()> {
        let mut txn = self.backend().write().await?;
        txn.set_setting(CLUSTER_ID, cluster_id as i64).await?;
        txn.commit().await?;
        Ok(())
    }
}
