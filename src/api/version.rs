//! etcd versions as the services compare them: by major and minor number
//! (the emulated version, the cluster version, a downgrade's target).

/// A major.minor version, as etcd's cluster version keeps it.
pub(super) type Minor = (u64, u64);

/// The major and minor number of a version such as `3.6.11` or `v3.7.0-rc.1`.
pub(super) fn major_minor(version: &str) -> Option<Minor> {
    let mut parts = version.trim_start_matches('v').split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}
