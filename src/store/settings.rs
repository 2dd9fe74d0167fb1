//! The store's reading of the `settings` rows and the records kept beside
//! the keys: its identity, chosen on first start, and the auth state.

use super::{Identity, Store};
use crate::backend::changes::ChangeFeed;
use crate::backend::settings::{
    AUTH_ENABLED, AUTH_REVISION, CLUSTER_ID, LEASE_ID_INSTANCES, MEMBER_ID,
};
use crate::backend::{AuthKind, Backend, ReadTxn, WriteTxn};

/// Reads the cluster and member ids, choosing them on first start.
pub(super) async fn load_identity<B: Backend>(backend: &B) -> anyhow::Result<Identity> {
    let mut txn = backend.write().await?;
    let stored = (
        txn.setting(CLUSTER_ID).await?,
        txn.setting(MEMBER_ID).await?,
    );
    let identity = match stored {
        (Some(cluster), Some(member)) => Identity {
            cluster_id: cluster as u64,
            member_id: member as u64,
        },
        _ => {
            let identity = Identity {
                cluster_id: random_id(),
                member_id: random_id(),
            };
            txn.set_setting(CLUSTER_ID, identity.cluster_id as i64)
                .await?;
            txn.set_setting(MEMBER_ID, identity.member_id as i64)
                .await?;
            identity
        }
    };
    txn.commit().await?;
    Ok(identity)
}

/// This instance's number for its lease ids' prefix (see `lease_ids`): 0
/// where the backend is its database's only writer; on a database other
/// instances may share, the count of instances that opened it, this one
/// included, so that instances running at once number differently.
pub(super) async fn claim_lease_id_instance<B: Backend>(backend: &B) -> anyhow::Result<u16> {
    if backend.is_only_writer() {
        return Ok(0);
    }
    let mut txn = backend.write().await?;
    let opened = txn.setting(LEASE_ID_INSTANCES).await?.unwrap_or(0) + 1;
    txn.set_setting(LEASE_ID_INSTANCES, opened).await?;
    txn.commit().await?;
    Ok(opened as u16)
}

/// A non-zero id that also fits in a signed 64-bit database column.
fn random_id() -> u64 {
    rand::random_range(1..=i64::MAX as u64)
}

/// Whether auth is enabled and the auth revision (1 on a fresh store, as etcd starts).
pub(crate) async fn read_auth_flags<T: ReadTxn>(txn: &mut T) -> anyhow::Result<(bool, u64)> {
    let enabled = txn.setting(AUTH_ENABLED).await?.unwrap_or(0) != 0;
    let revision = txn.setting(AUTH_REVISION).await?.unwrap_or(1).max(1) as u64;
    Ok((enabled, revision))
}

/// The stored auth state as records: the switch, the auth revision, and
/// each user's and role's name and authpb record, read at one revision.
pub struct AuthRecords {
    /// Whether auth is enabled.
    pub enabled: bool,
    /// etcd's auth revision.
    pub revision: u64,
    /// (name, authpb.User) of every user.
    pub users: Vec<(Vec<u8>, Vec<u8>)>,
    /// (name, authpb.Role) of every role.
    pub roles: Vec<(Vec<u8>, Vec<u8>)>,
}

impl<B: Backend> Store<B> {
    /// The auth state as stored (changes go through `Store::change_auth`).
    pub async fn auth_records(&self) -> anyhow::Result<AuthRecords> {
        let mut txn = self.backend.read().await?;
        let (enabled, revision) = read_auth_flags(&mut txn).await?;
        Ok(AuthRecords {
            enabled,
            revision,
            users: txn.auth_records(AuthKind::User).await?,
            roles: txn.auth_records(AuthKind::Role).await?,
        })
    }

    /// Whether auth is enabled, and the auth revision: the cheap check of
    /// whether the stored auth state moved.
    pub async fn auth_flags(&self) -> anyhow::Result<(bool, u64)> {
        let mut txn = self.backend.read().await?;
        read_auth_flags(&mut txn).await
    }

    /// A new feed of other instances' commits on a shared database, for a
    /// follower of state kept beside the keys (auth).
    pub fn change_feed(&self) -> ChangeFeed {
        self.backend.change_feed()
    }
}
