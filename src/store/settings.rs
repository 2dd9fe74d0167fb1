//! The store's reading of the `settings` rows: its identity, chosen on
//! first start, and the auth flags.

use super::Identity;
use crate::backend::settings::{AUTH_ENABLED, AUTH_REVISION, CLUSTER_ID, MEMBER_ID};
use crate::backend::{Backend, ReadTxn, WriteTxn};

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
