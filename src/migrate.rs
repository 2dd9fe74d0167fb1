//! `cetera migrate --from ENDPOINT --to ENDPOINT`: copies a whole store from
//! one datastore to another (SQLite, PostgreSQL, MySQL in any pairing), then
//! checks that both sides hold the same data and prints the comparison.
//!
//! The copy reads one consistent view of the source and writes the target in
//! ONE transaction (the same page-by-page copy as snapshots and restore), so
//! an interrupted migration commits nothing: the target stays as it was (its
//! contents cleared only if the transaction commits), and a rerun starts
//! clean. Revisions, create/mod revisions, versions, leases with their
//! deadlines (so the remaining TTL carries over), users, roles, the auth
//! switch and the cluster and member ids are kept.
//!
//! `--from http(s)://...` imports a live etcd instead (see `etcd`),
//! `--from etcd-snapshot://PATH` an etcd snapshot file (see `etcd_snapshot`),
//! `--from kine+ENDPOINT` a kine datastore (see `kine`);
//! `--to http(s)://...` exports into a live etcd (see `export`).

pub mod etcd;
pub mod etcd_snapshot;
pub mod export;
pub mod kine;
mod kine_rows;
mod kine_source;

use std::io::IsTerminal;

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::datastore::{Datastore, DatastoreTls};
use crate::backend::open::{BackendJob, OpenFor, with_datastore};
use crate::backend::snapshot::{Purpose, copy, empty_target};
use crate::backend::{Backend, KeyRange, ReadAt, ReadTxn, Revisions, WriteTxn};
use crate::config::Config;
use crate::store::hash::{hash_kv, hash_kv_if_compacted};

/// What to migrate and how.
#[derive(Clone, Debug)]
pub struct MigrateOptions {
    /// Source endpoint (same forms as --endpoint).
    pub from: String,
    /// Target endpoint.
    pub to: String,
    /// Replace a target that holds data.
    pub force: bool,
    /// Copy the history after the compact revision (otherwise only live keys,
    /// compacted at the current revision).
    pub history: bool,
    /// TLS files for an etcd source.
    pub etcd_tls: etcd::EtcdTls,
    /// TLS files for an etcd target (--to-cacert, --to-cert, --to-key).
    pub to_etcd_tls: etcd::EtcdTls,
}

/// One line of the final verification: a quantity measured on both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was measured.
    pub what: String,
    /// Its value on the source.
    pub source: String,
    /// Its value on the target.
    pub target: String,
}

/// What a migration did.
#[derive(Clone, Debug)]
pub struct Migrated {
    /// The target's counters after the copy.
    pub revisions: Revisions,
    /// The verification, every line of which matched.
    pub checks: Vec<Check>,
}

/// `cetera migrate`: runs the migration and prints its verification.
pub async fn migrate_command(config: &Config, options: &MigrateOptions) -> anyhow::Result<()> {
    let tls = config.datastore_tls();
    let from_etcd = etcd::is_etcd_url(&options.from);
    let snapshot = etcd_snapshot::snapshot_path(&options.from);
    let from_kine = kine::kine_endpoint(&options.from);
    if etcd::is_etcd_url(&options.to) {
        if from_etcd || snapshot.is_some() {
            bail!("--from and --to both name an etcd; cetera migrates to or from a datastore");
        }
        if from_kine.is_some() {
            bail!("a kine datastore is imported into a cetera datastore, not into an etcd");
        }
        return export_command(options, &tls).await;
    }
    let migrated = if let Some(endpoint) = from_kine {
        if !options.history {
            bail!("--history=false is not supported for a kine source: its history is always kept");
        }
        // The source first: a bad one fails before the target is made.
        let endpoint = kine::parse_source(endpoint, &options.to)?;
        let job = FromKine {
            source: kine_source::KineSource::open(&endpoint, &tls).await?,
            force: options.force,
        };
        with_datastore(&options.to, &tls, OpenFor::BulkLoad, job).await?
    } else if let Some(path) = snapshot {
        let job = FromEtcdSnapshot {
            path,
            force: options.force,
            history: options.history,
        };
        with_datastore(&options.to, &tls, OpenFor::BulkLoad, job).await?
    } else if from_etcd {
        if options.history {
            tracing::warn!(
                "etcd's history cannot be read through its API; importing the keys at one \
                 revision, compacted there (as --history=false)"
            );
        }
        let channel = etcd::connect(&options.from, &options.etcd_tls).await?;
        let job = FromEtcd {
            channel,
            force: options.force,
        };
        with_datastore(&options.to, &tls, OpenFor::BulkLoad, job).await?
    } else {
        if Datastore::parse(&options.from)? == Datastore::parse(&options.to)? {
            bail!("--from and --to name the same datastore");
        }
        let job = FromSource { options, tls: &tls };
        with_datastore(&options.from, &tls, OpenFor::Reading, job).await?
    };
    let history = options.history && !from_etcd;
    println!(
        "migrated: revision {}, compact revision {}, history {}",
        migrated.revisions.current,
        migrated.revisions.compact,
        if history { "kept" } else { "dropped" }
    );
    for check in &migrated.checks {
        println!(
            "verified {}: source {} target {} (equal)",
            check.what, check.source, check.target
        );
    }
    Ok(())
}

/// `cetera migrate --to http(s)://...`: exports into etcd and prints the
/// verification.
async fn export_command(options: &MigrateOptions, tls: &DatastoreTls) -> anyhow::Result<()> {
    let channel = etcd::connect_as(&options.to, &options.to_etcd_tls, "to").await?;
    let job = ToEtcd {
        channel,
        force: options.force,
    };
    let exported = with_datastore(&options.from, tls, OpenFor::Reading, job).await?;
    println!(
        "exported: {} leases, keys read back at etcd revision {}; {}",
        exported.leases,
        exported.etcd_revision,
        export::NOT_KEPT
    );
    for check in &exported.checks {
        println!(
            "verified {}: source {} target {} (equal)",
            check.what, check.source, check.target
        );
    }
    Ok(())
}

/// An export to etcd: etcd connected, the source opened.
struct ToEtcd {
    channel: tonic::transport::Channel,
    force: bool,
}

impl BackendJob for ToEtcd {
    type Output = export::Exported;
    async fn run<S: Backend>(self, source: S) -> anyhow::Result<export::Exported> {
        export::export(&source, self.channel, self.force).await
    }
}

/// An import from etcd: the target opened, etcd connected.
struct FromEtcd {
    channel: tonic::transport::Channel,
    force: bool,
}

impl BackendJob for FromEtcd {
    type Output = Migrated;
    async fn run<T: Backend>(self, target: T) -> anyhow::Result<Migrated> {
        etcd::import(self.channel, &target, self.force).await
    }
}

/// An import from a kine datastore: the target opened.
struct FromKine {
    source: kine_source::KineSource,
    force: bool,
}

impl BackendJob for FromKine {
    type Output = Migrated;
    async fn run<T: Backend>(self, target: T) -> anyhow::Result<Migrated> {
        kine::import(self.source, &target, self.force).await
    }
}

/// An import from an etcd snapshot file: the target opened.
struct FromEtcdSnapshot<'a> {
    path: &'a std::path::Path,
    force: bool,
    history: bool,
}

impl BackendJob for FromEtcdSnapshot<'_> {
    type Output = Migrated;
    async fn run<T: Backend>(self, target: T) -> anyhow::Result<Migrated> {
        etcd_snapshot::import(self.path, &target, self.force, self.history).await
    }
}

/// The outer job: holds the opened source, opens the target.
struct FromSource<'a> {
    options: &'a MigrateOptions,
    tls: &'a DatastoreTls,
}

impl BackendJob for FromSource<'_> {
    type Output = Migrated;
    async fn run<S: Backend>(self, source: S) -> anyhow::Result<Migrated> {
        let job = IntoTarget {
            source: &source,
            force: self.options.force,
            history: self.options.history,
        };
        with_datastore(&self.options.to, self.tls, OpenFor::BulkLoad, job).await
    }
}

/// The inner job: both datastores open.
struct IntoTarget<'a, S> {
    source: &'a S,
    force: bool,
    history: bool,
}

impl<S: Backend> BackendJob for IntoTarget<'_, S> {
    type Output = Migrated;
    async fn run<T: Backend>(self, target: T) -> anyhow::Result<Migrated> {
        migrate(self.source, &target, self.force, self.history).await
    }
}

/// Copies `source` into `target` in one transaction, then verifies.
pub async fn migrate<S: Backend, T: Backend>(
    source: &S,
    target: &T,
    force: bool,
    history: bool,
) -> anyhow::Result<Migrated> {
    let mut reader = source.read().await?;
    let total = reader.revisions().await?.current;
    let mut writer = target.write().await?;
    empty_target(&mut writer, force).await?;

    let bar = progress_bar(total, "revisions");
    tracing::info!("copying {total} revisions");
    let mut logged = 0;
    let mut progress = |revision: i64| {
        bar.set_position(revision as u64);
        // Without a terminal there is no bar; a line every tenth instead.
        if bar.is_hidden() && (revision - logged) * 10 >= total {
            tracing::info!("copied {revision} of {total} revisions");
            logged = revision;
        }
    };
    let purpose = Purpose::Migrate { history };
    let revisions = copy(&mut reader, &mut writer, purpose, &mut progress).await?;
    bar.set_message("committing");
    writer.commit().await?;
    bar.finish_and_clear();
    tracing::info!("copied; verifying");

    let mut check = target.read().await?;
    let checks = verify(&mut reader, &mut check, revisions, history).await?;
    Ok(Migrated { revisions, checks })
}

/// A bar on stderr when it is a terminal, hidden otherwise.
fn progress_bar(total: i64, unit: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total.max(0) as u64);
    let style = ProgressStyle::with_template(&format!(
        "{{spinner}} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {unit} {{msg}} (eta {{eta}})"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// Compares HashKV, key and lease counts of both sides; fails on a difference.
async fn verify<R: ReadTxn, C: ReadTxn>(
    source: &mut R,
    target: &mut C,
    revisions: Revisions,
    history: bool,
) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let target_revisions = target.revisions().await?;
    checks.push(Check {
        what: "revision".into(),
        source: revisions.current.to_string(),
        target: target_revisions.current.to_string(),
    });
    let source_hash = if history {
        hash_kv(source, 0, false).await?.hash
    } else {
        hash_kv_if_compacted(source).await?
    };
    checks.push(Check {
        what: format!("HashKV at revision {}", revisions.current),
        source: format!("{source_hash:#010x}"),
        target: format!("{:#010x}", hash_kv(target, 0, false).await?.hash),
    });
    // The oldest readable revision too: the history between is covered by
    // the first hash, this checks the compacted store's base.
    let oldest = revisions.compact + 1;
    if history && oldest > 1 && oldest < revisions.current {
        checks.push(Check {
            what: format!("HashKV at revision {oldest}"),
            source: format!("{:#010x}", hash_kv(source, oldest, false).await?.hash),
            target: format!("{:#010x}", hash_kv(target, oldest, false).await?.hash),
        });
    }
    let everything = KeyRange {
        start: Vec::new(),
        end: None,
    };
    checks.push(Check {
        what: format!("keys at revision {}", revisions.current),
        source: source
            .count(&everything, ReadAt::Current)
            .await?
            .to_string(),
        target: target
            .count(&everything, ReadAt::Current)
            .await?
            .to_string(),
    });
    checks.push(Check {
        what: "leases".into(),
        source: source.leases().await?.len().to_string(),
        target: target.leases().await?.len().to_string(),
    });
    all_equal(&checks)?;
    Ok(checks)
}

/// What an import from etcd wrote, as counted while reading the source.
pub(crate) struct Imported {
    /// The counters the target was given.
    pub revisions: Revisions,
    /// HashKV of the live keys, computed from the source's keys.
    pub hash: u32,
    /// Live keys copied.
    pub keys: usize,
    /// Leases copied.
    pub leases: usize,
}

/// Checks an imported target against what the import wrote (revisions,
/// HashKV and key count at the current revision, leases), fails on the first
/// difference, and returns the checks for the report.
pub(crate) async fn verify_import<B: Backend>(
    target: &B,
    imported: Imported,
) -> anyhow::Result<Migrated> {
    let mut check = target.read().await?;
    let target_revisions = check.revisions().await?;
    let current = imported.revisions.current;
    let everything = KeyRange {
        start: Vec::new(),
        end: None,
    };
    let checks = vec![
        Check {
            what: "revision".into(),
            source: current.to_string(),
            target: target_revisions.current.to_string(),
        },
        Check {
            what: "compact revision".into(),
            source: imported.revisions.compact.to_string(),
            target: target_revisions.compact.to_string(),
        },
        Check {
            what: format!("HashKV at revision {current}"),
            source: format!("{:#010x}", imported.hash),
            target: format!("{:#010x}", hash_kv(&mut check, 0, false).await?.hash),
        },
        Check {
            what: format!("keys at revision {current}"),
            source: imported.keys.to_string(),
            target: check.count(&everything, ReadAt::Current).await?.to_string(),
        },
        Check {
            what: "leases".into(),
            source: imported.leases.to_string(),
            target: check.leases().await?.len().to_string(),
        },
    ];
    all_equal(&checks)?;
    Ok(Migrated {
        revisions: imported.revisions,
        checks,
    })
}

/// Fails on the first check whose two sides differ.
fn all_equal(checks: &[Check]) -> anyhow::Result<()> {
    for check in checks {
        if check.source != check.target {
            bail!(
                "verification failed: {} is {} on the source but {} on the target",
                check.what,
                check.source,
                check.target
            );
        }
    }
    Ok(())
}
