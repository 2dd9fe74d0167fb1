//! The names of the `settings` rows: small values kept beside the data,
//! which every datastore holds the same way.

/// The cluster id.
pub const CLUSTER_ID: &str = "cluster_id";
/// This member's id.
pub const MEMBER_ID: &str = "member_id";
/// How many server instances opened the database (on PostgreSQL and
/// MySQL, which several may share): each takes the next number for the
/// prefix of the lease ids it chooses.
pub const LEASE_ID_INSTANCES: &str = "lease_id_instances";
/// Whether auth is enabled (0 or 1).
pub const AUTH_ENABLED: &str = "auth_enabled";
/// etcd's auth revision: counts the changes of users, roles and the switch.
pub const AUTH_REVISION: &str = "auth_revision";
/// The target of etcd's Downgrade in flight, major << 32 | minor; 0 or
/// absent when none is (no server emulates 0.1, whose target 0.0 would be).
pub const DOWNGRADE_TARGET: &str = "downgrade_target";
/// Until when (Unix ms) keep-alives may have been answered from memory ahead
/// of the stored lease deadlines; 0 when the database holds every deadline
/// promised (see `store::lease_deadlines`).
pub const LEASE_RENEWALS_COVERED_UNTIL: &str = "lease_renewals_covered_until";
