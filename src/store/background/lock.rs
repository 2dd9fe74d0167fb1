//! The database-wide locks that let one instance of several on a shared
//! database run a job.

use crate::backend::Backend;

/// Database-wide lock of the instance that removes compacted history.
pub(super) const COMPACTION_LOCK: &str = "cetera-compaction";
/// Database-wide lock of the instance that expires leases.
pub(super) const LEASE_EXPIRY_LOCK: &str = "cetera-lease-expiry";

/// Whether this instance holds the database-wide lock `name` (taking it if free).
pub(super) async fn holds<B: Backend>(backend: &B, name: &str) -> bool {
    match backend.hold_lock(name).await {
        Ok(held) => held,
        Err(error) => {
            tracing::warn!(lock = name, "cannot check the database lock: {error:#}");
            false
        }
    }
}
