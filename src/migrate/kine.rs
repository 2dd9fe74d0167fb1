//! `cetera migrate --from kine+sqlite://PATH` (or `kine+postgres://...`,
//! `kine+mysql://...`, kine's endpoint syntax after the prefix): imports a
//! kine datastore (k3s-io/kine v0.16.4) by reading kine's `kine` table
//! directly, with its history.
//!
//! kine's row id is the revision, so every kept row becomes one log row at
//! its id (see `kine_rows` for what the rows mean and what is left out).
//! The current revision is kine's (its largest id, bookkeeping rows
//! included), the compact revision kine's own (never compacted: -1). The
//! whole table is read in one read transaction of the source and written in
//! one transaction of the target, so an interrupted import commits nothing.
//!
//! Leases: kine has none; its lease column holds the TTL a key was written
//! with, and kine's LeaseGrant hands out ID = TTL, so the keys' lease
//! fields are that TTL. The import grants one lease per distinct TTL among
//! the live keys, id = TTL, with the full TTL from the import: the keys'
//! lease fields stay as kine reported them, and each key expires the TTL
//! after the import, which is also what kine does after a restart (it gives
//! every leased key its full TTL again; kine records no write times, so
//! nothing better is known). Per key leases would expire at that same
//! moment but in thousands of leases that Kubernetes never has on etcd,
//! where the apiserver shares one lease among the Events written within a
//! window; one lease per TTL is the closer match, and its expiry deletes
//! the keys in one revision, as an etcd lease expiry does.

use std::collections::BTreeMap;

use anyhow::bail;

use super::kine_rows::{Bookkeeping, Converted, Converter, HEALTH_KEY};
use super::kine_source::{KineEndpoint, KineSource};
use super::{Imported, Migrated, progress_bar};
use crate::backend::snapshot::empty_target;
use crate::backend::{Backend, LeaseRow, LogEntry, Revisions, WriteTxn};
use crate::store::hash::LiveKeysHasher;

/// The prefix of `--from` naming a kine datastore.
pub const PREFIX: &str = "kine+";

/// kine rows read per query.
const PAGE: usize = 1000;

/// Ids fetched per query when the live keys are read again for the check.
const ID_BATCH: usize = 500;

/// The kine endpoint named by a `kine+...` source, if `from` is one.
pub fn kine_endpoint(from: &str) -> Option<&str> {
    from.strip_prefix(PREFIX)
}

/// Parses the endpoint after `kine+` and checks that it is not `to`'s
/// SQLite file.
pub(crate) fn parse_source(endpoint: &str, to: &str) -> anyhow::Result<KineEndpoint> {
    let source = KineEndpoint::parse(endpoint)?;
    if let (KineEndpoint::Sqlite(from), Ok(crate::backend::datastore::Datastore::Sqlite(to))) =
        (&source, crate::backend::datastore::Datastore::parse(to))
        && (from == &to || same_file(from, &to))
    {
        bail!("--from and --to name the same SQLite file");
    }
    Ok(source)
}

fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Counts of what an import read.
#[derive(Debug, Default)]
struct Tally {
    rows: u64,
    gaps: u64,
    compact_rows: u64,
    health_rows: u64,
    /// The id of the last health row left out.
    health_left: Option<i64>,
}

/// Copies the kine datastore `source` (opened with `KineSource::open`)
/// into `target` in one target transaction, then checks the result
/// against the source.
pub(crate) async fn import<T: Backend>(
    mut source: KineSource,
    target: &T,
    force: bool,
) -> anyhow::Result<Migrated> {
    let current = source.current_revision().await?.max(1);
    let kine_compact = source.compact_revision().await?;
    let compact = if kine_compact > 0 {
        kine_compact.min(current)
    } else {
        -1
    };
    let revisions = Revisions {
        current,
        compact,
        compacted_through: compact.max(0),
    };
    tracing::info!(
        "importing kine revisions up to {current} (kine's compact revision {kine_compact})"
    );

    let mut writer = target.write().await?;
    empty_target(&mut writer, force).await?;

    let bar = progress_bar(current, "revisions");
    let mut logged = 0;
    let mut converter = Converter::default();
    // The keys' states at the compact revision, for the check's replay.
    let mut at_compact = None;
    let mut tally = Tally::default();
    let mut after = 0;
    loop {
        let page = source.rows_after(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.id;
        for row in page {
            if at_compact.is_none() && row.id > compact {
                at_compact = Some(converter.clone());
            }
            tally.rows += 1;
            let id = row.id;
            match converter.convert(row) {
                Converted::Entry(entry) => writer.append(&entry).await?,
                Converted::Left(Bookkeeping::Gap) => tally.gaps += 1,
                Converted::Left(Bookkeeping::CompactRevision) => tally.compact_rows += 1,
                Converted::Left(Bookkeeping::Health) => {
                    tally.health_rows += 1;
                    tally.health_left = Some(id);
                }
            }
        }
        bar.set_position(after.max(0) as u64);
        // Without a terminal there is no bar; a line every tenth instead.
        if bar.is_hidden() && (after - logged) * 10 >= current {
            tracing::info!("copied {after} of {current} revisions");
            logged = after;
        }
    }
    if bar.is_hidden() && logged < after {
        tracing::info!("copied {after} of {current} revisions");
    }
    let at_compact = at_compact.unwrap_or_else(|| converter.clone());

    let leases = lease_rows(&converter, now_ms());
    for lease in &leases {
        writer.put_lease(lease).await?;
    }
    writer.set_revisions(revisions).await?;
    bar.set_message("committing");
    writer.commit().await?;
    bar.finish_and_clear();
    tracing::info!(
        "read {} kine rows; left out {} gap rows, {} compact_rev_key rows, {} health-key rows; \
         {} leases granted; verifying",
        tally.rows,
        tally.gaps,
        tally.compact_rows,
        tally.health_rows,
        leases.len()
    );

    let hash = source_hash(&mut source, &converter, at_compact, compact).await?;
    let (mut keys, lease_count) = source.live_counts().await?;
    // kine's own health key, if its latest row is kine's create, is a live
    // key to kine's count but not imported.
    let health_state = converter.keys().get(HEALTH_KEY).map(|state| state.last);
    if tally
        .health_left
        .is_some_and(|left| health_state.is_none_or(|last| left > last))
    {
        keys -= 1;
    }
    super::verify_import(
        target,
        Imported {
            revisions,
            hash,
            keys: usize::try_from(keys).unwrap_or_default(),
            leases: usize::try_from(lease_count).unwrap_or_default(),
        },
    )
    .await
}

/// One lease per distinct TTL among the live keys, id = TTL, expiring the
/// full TTL after `now_ms` (see the module's doc for why).
fn lease_rows(converter: &Converter, now_ms: i64) -> Vec<LeaseRow> {
    let mut ttls: Vec<i64> = converter
        .keys()
        .values()
        .filter(|state| state.live && state.lease > 0)
        .map(|state| state.lease)
        .collect();
    ttls.sort_unstable();
    ttls.dedup();
    ttls.into_iter()
        .map(|ttl| LeaseRow {
            id: ttl,
            ttl,
            expires_at: now_ms.saturating_add(ttl.saturating_mul(1000)),
        })
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// HashKV at the current revision of the store the import wrote, computed
/// from the source as `hash_kv` computes it from a store: the rows of the
/// live keys last changed at or before the compact revision (read again
/// from kine by id), then every row after the compact revision (read again
/// and converted from the keys' states at the compact revision); the
/// hasher puts them in revision order.
async fn source_hash(
    source: &mut KineSource,
    converter: &Converter,
    mut replay: Converter,
    compact: i64,
) -> anyhow::Result<u32> {
    let mut hasher = LiveKeysHasher::default();
    if compact > 0 {
        let surviving: BTreeMap<&[u8], _> = converter
            .keys()
            .iter()
            .filter(|(_, state)| state.live && state.last <= compact)
            .map(|(key, state)| (key.as_slice(), *state))
            .collect();
        let ordered: Vec<_> = surviving.into_iter().collect();
        for batch in ordered.chunks(ID_BATCH) {
            let ids: Vec<i64> = batch.iter().map(|(_, state)| state.last).collect();
            let mut rows: BTreeMap<i64, _> = source
                .rows_by_id(&ids)
                .await?
                .into_iter()
                .map(|row| (row.id, row))
                .collect();
            for (key, state) in batch {
                let Some(row) = rows.remove(&state.last) else {
                    bail!("kine row {} vanished during the import", state.last);
                };
                // Every kine row is a revision of its own: sub 0.
                hasher.add(&LogEntry {
                    kv: Converter::live_entry(key, state, row),
                    sub: 0,
                    deleted: false,
                });
            }
        }
    }
    let mut after = compact.max(0);
    loop {
        let page = source.rows_after(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.id;
        for row in page {
            if let Converted::Entry(entry) = replay.convert(row) {
                hasher.add(&entry);
            }
        }
    }
    Ok(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::kine_source::KineRow;

    #[test]
    fn one_lease_per_ttl_of_the_live_keys() {
        let mut converter = Converter::default();
        let put = |id: i64, name: &str, lease: i64, deleted: bool| KineRow {
            id,
            name: name.into(),
            created: !deleted,
            deleted,
            create_revision: 0,
            prev_revision: 0,
            lease,
            value: b"v".to_vec(),
        };
        for row in [
            put(2, "/e/1", 3660, false),
            put(3, "/e/2", 3660, false),
            put(4, "/m/1", 15, false),
            put(5, "/x", 60, false),
            put(6, "/x", 0, true),
            put(7, "/p", 0, false),
        ] {
            converter.convert(row);
        }
        let leases = lease_rows(&converter, 1_000);
        assert_eq!(
            leases,
            vec![
                LeaseRow {
                    id: 15,
                    ttl: 15,
                    expires_at: 16_000
                },
                LeaseRow {
                    id: 3660,
                    ttl: 3660,
                    expires_at: 3_661_000
                },
            ]
        );
    }

    #[test]
    fn the_prefix_names_a_kine_source() {
        assert_eq!(kine_endpoint("kine+sqlite:///x.db"), Some("sqlite:///x.db"));
        assert_eq!(kine_endpoint("sqlite:///x.db"), None);
        assert!(parse_source("sqlite:///tmp/x.db", "sqlite:///tmp/x.db").is_err());
        assert!(parse_source("sqlite:///tmp/x.db", "sqlite:///tmp/y.db").is_ok());
    }
}
