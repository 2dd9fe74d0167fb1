//! Status's etcd 3.6 fields, filled as etcd 3.6 and 3.7 fill them
//! (maintenanceServer.Status in server/etcdserver/api/v3rpc/maintenance.go)
//! when cetera emulates one of those versions; a 3.5 has no such fields.

use super::downgrade::DowngradeView;
use super::version::major_minor;
use crate::proto::etcdserverpb::{DowngradeInfo, StatusResponse};
use crate::store::alarm::quota_as_shown;

/// The storage version a server of `version` reports (in Status and
/// Snapshot), empty before 3.6: etcd keeps it at the cluster version's
/// major.minor, this server's own or a downgrade's target.
pub(super) fn storage_version(version: &str, downgrade: DowngradeView) -> String {
    match downgrade.cluster {
        Some((major, minor)) if major_minor(version).is_some_and(|v| v >= (3, 6)) => {
            format!("{major}.{minor}.0")
        }
        _ => String::new(),
    }
}

/// Fills `storageVersion`, `dbSizeQuota` and `downgradeInfo` of `resp` as a
/// server of `version` would, with etcd's --quota-backend-bytes
/// `quota_backend_bytes` and the downgrade state `downgrade`.
pub(super) fn fill(
    resp: &mut StatusResponse,
    version: &str,
    quota_backend_bytes: i64,
    downgrade: DowngradeView,
) {
    if major_minor(version).is_none_or(|v| v < (3, 6)) {
        return;
    }
    resp.storage_version = storage_version(version, downgrade);
    resp.db_size_quota = quota_as_shown(quota_backend_bytes);
    // etcd stores the target as a semver with patch 0.
    resp.downgrade_info = Some(DowngradeInfo {
        enabled: downgrade.target.is_some(),
        target_version: downgrade
            .target
            .map(|(major, minor)| format!("{major}.{minor}.0"))
            .unwrap_or_default(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(version: &str) -> DowngradeView {
        DowngradeView {
            cluster: major_minor(version),
            target: None,
        }
    }

    #[test]
    fn a_35_version_gets_none_of_the_fields() {
        let mut resp = StatusResponse::default();
        fill(&mut resp, "3.5.13", 0, idle("3.5.13"));
        assert_eq!(resp, StatusResponse::default());
    }

    #[test]
    fn a_36_or_later_version_gets_etcds_values() {
        let mut resp = StatusResponse::default();
        fill(&mut resp, "3.6.11", 0, idle("3.6.11"));
        assert_eq!(resp.storage_version, "3.6.0");
        assert_eq!(resp.db_size_quota, crate::store::alarm::DEFAULT_QUOTA_BYTES);
        assert_eq!(
            resp.downgrade_info,
            Some(DowngradeInfo {
                enabled: false,
                target_version: String::new()
            })
        );
        fill(&mut resp, "v3.7.1", -1, idle("v3.7.1"));
        assert_eq!(
            (resp.storage_version.as_str(), resp.db_size_quota),
            ("3.7.0", -1)
        );
        fill(&mut resp, "4.0.0", 1 << 20, idle("4.0.0"));
        assert_eq!(
            (resp.storage_version.as_str(), resp.db_size_quota),
            ("4.0.0", 1 << 20)
        );
    }

    #[test]
    fn a_downgrade_in_flight_shows_its_target() {
        let mut resp = StatusResponse::default();
        let downgrade = DowngradeView {
            cluster: Some((3, 5)),
            target: Some((3, 5)),
        };
        fill(&mut resp, "3.6.11", 0, downgrade);
        assert_eq!(resp.storage_version, "3.5.0");
        assert_eq!(
            resp.downgrade_info,
            Some(DowngradeInfo {
                enabled: true,
                target_version: "3.5.0".to_string()
            })
        );
    }
}
