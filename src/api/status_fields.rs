//! Status's etcd 3.6 fields, filled as etcd 3.6 and 3.7 fill them
//! (maintenanceServer.Status in server/etcdserver/api/v3rpc/maintenance.go)
//! when cetera emulates one of those versions; a 3.5 has no such fields.

use crate::proto::etcdserverpb::{DowngradeInfo, StatusResponse};

/// etcd's default --quota-backend-bytes (2 GiB), which Status reports for 0.
const DEFAULT_QUOTA_BYTES: i64 = 2 * 1024 * 1024 * 1024;

/// The major and minor number of a version such as `3.6.11` or `v3.7.0-rc.1`.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Fills `storageVersion`, `dbSizeQuota` and `downgradeInfo` of `resp` as a
/// server of `version` would, with etcd's --quota-backend-bytes
/// `quota_backend_bytes`.
pub(super) fn fill(resp: &mut StatusResponse, version: &str, quota_backend_bytes: i64) {
    let Some((major, minor)) = major_minor(version).filter(|&v| v >= (3, 6)) else {
        return;
    };
    // etcd keeps the storage version at the cluster version's major.minor,
    // and this server is the whole cluster at the version it reports.
    resp.storage_version = format!("{major}.{minor}.0");
    // Only 0 becomes the default; a negative quota (none) is shown as given.
    resp.db_size_quota = match quota_backend_bytes {
        0 => DEFAULT_QUOTA_BYTES,
        bytes => bytes,
    };
    // No downgrade can be in progress: Downgrade is not served.
    resp.downgrade_info = Some(DowngradeInfo {
        enabled: false,
        target_version: String::new(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_35_version_gets_none_of_the_fields() {
        let mut resp = StatusResponse::default();
        fill(&mut resp, "3.5.13", 0);
        assert_eq!(resp, StatusResponse::default());
    }

    #[test]
    fn a_36_or_later_version_gets_etcds_values() {
        let mut resp = StatusResponse::default();
        fill(&mut resp, "3.6.11", 0);
        assert_eq!(resp.storage_version, "3.6.0");
        assert_eq!(resp.db_size_quota, DEFAULT_QUOTA_BYTES);
        assert_eq!(
            resp.downgrade_info,
            Some(DowngradeInfo {
                enabled: false,
                target_version: String::new()
            })
        );
        fill(&mut resp, "v3.7.1", -1);
        assert_eq!(
            (resp.storage_version.as_str(), resp.db_size_quota),
            ("3.7.0", -1)
        );
        fill(&mut resp, "4.0.0", 1 << 20);
        assert_eq!(
            (resp.storage_version.as_str(), resp.db_size_quota),
            ("4.0.0", 1 << 20)
        );
    }
}
