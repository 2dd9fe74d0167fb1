//! Automatic compaction, as etcd's `--auto-compaction-mode` and
//! `--auto-compaction-retention` configure it (etcd's v3compactor).
//!
//! Both modes only move the compact revision, through the writer like a
//! client's Compact; the store's compactor then removes the history in short
//! steps, so writers are never held up for more than one step. Every instance
//! watches the revisions, but only the one holding the compaction lock
//! compacts, so instances on a shared database do not compact twice; a
//! compaction at or below the current compact revision (say, the apiserver
//! compacted further meanwhile) counts as done, as in etcd.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::lock::{COMPACTION_LOCK, holds};
use crate::backend::{Backend, Revisions};
use crate::store::error::StoreError;
use crate::store::request::WriteRequest;
use crate::store::routing::Writes;

/// How revisions are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep the history of this long: compact to the revision that was
    /// current this long ago.
    Periodic(Duration),
    /// Keep this many revisions: compact to current minus this, checked
    /// every `interval` (etcd: every 5 minutes).
    Revision {
        /// Revisions to keep.
        retention: i64,
        /// How often to check.
        interval: Duration,
    },
}

/// Parses `--auto-compaction-retention` for `mode` as etcd 3.5 does: a
/// non-negative integer is hours (periodic) or revisions (revision);
/// anything else must be a Go duration such as `30m` or `1h30m`, which in
/// revision mode counts nanoseconds as revisions, as in etcd. `None` means off.
pub fn parse_retention(
    mode: &str,
    retention: &str,
    revision_interval: Duration,
) -> Result<Option<AutoCompaction>, String> {
    if retention.is_empty() {
        return Ok(None);
    }
    let amount = match retention.parse::<i64>() {
        Ok(number) if number >= 0 => match mode {
            "revision" => number as u128,
            _ => number as u128 * 3_600_000_000_000,
        },
        _ => {
            let duration = crate::go_duration::parse(retention)
                .map_err(|e| format!("error parsing CompactionRetention: {e}"))?;
            duration.as_nanos()
        }
    };
    if amount == 0 {
        return Ok(None);
    }
    match mode {
        "periodic" => Ok(Some(AutoCompaction::Periodic(Duration::from_nanos(
            amount.min(u64::MAX as u128) as u64,
        )))),
        "revision" => Ok(Some(AutoCompaction::Revision {
            retention: amount.min(i64::MAX as u128) as i64,
            interval: revision_interval,
        })),
        other => Err(format!("unsupported compaction mode {other}")),
    }
}

/// Runs the compactor for `mode` until the store stops.
pub(crate) async fn run<B: Backend>(
    mode: AutoCompaction,
    backend: Arc<B>,
    writes: Writes,
    revisions: watch::Receiver<Revisions>,
) {
    match mode {
        AutoCompaction::Periodic(period) => periodic(period, backend, writes, revisions).await,
        AutoCompaction::Revision {
            retention,
            interval,
        } => by_revision(retention, interval, backend, writes, revisions).await,
    }
}

/// What one compaction attempt came to.
enum Outcome {
    /// Compacted, or someone had compacted at least that far already.
    Done,
    /// Not this instance's turn, or the write failed: try again later.
    Retry,
    /// The store is stopping.
    Stopped,
}

/// Moves the compact revision to `revision` if this instance decides the
/// cluster's compactions and holds the compaction lock.
async fn compact<B: Backend>(backend: &B, writes: &Writes, revision: i64) -> Outcome {
    if !writes.decides() || !holds(backend, COMPACTION_LOCK).await {
        return Outcome::Retry;
    }
    match writes.send(WriteRequest::Compact(revision)).await {
        Ok(_) => {
            tracing::info!(revision, "auto compaction");
            Outcome::Done
        }
        Err(StoreError::Compacted) => Outcome::Done,
        Err(StoreError::Stopped) => Outcome::Stopped,
        Err(error) => {
            tracing::warn!(revision, "auto compaction failed: {error}");
            Outcome::Retry
        }
    }
}

/// etcd's periodic compactor: samples the current revision every tenth of
/// the period (of an hour, for periods over an hour), first compacts once a
/// whole period has passed, to the revision sampled a period ago, then again
/// every period (every hour for longer periods).
async fn periodic<B: Backend>(
    period: Duration,
    backend: Arc<B>,
    writes: Writes,
    revisions: watch::Receiver<Revisions>,
) {
    let compact_interval = period.min(Duration::from_secs(3600));
    // etcd samples every tenth of the interval; a floor keeps a retention of
    // a few nanoseconds from spinning.
    let retry_interval = (compact_interval / 10).max(Duration::from_millis(1));
    let kept = (period.as_nanos() / retry_interval.as_nanos()).min(1 << 20) as usize + 1;
    let mut samples = VecDeque::with_capacity(kept + 1);
    let mut last_success = Instant::now();
    let mut wait = period;
    loop {
        samples.push_back(revisions.borrow().current);
        if samples.len() > kept {
            // The front is now the revision of a period ago.
            samples.pop_front();
        }
        tokio::time::sleep(retry_interval).await;
        if last_success.elapsed() < wait {
            continue;
        }
        wait = compact_interval;
        match compact(&*backend, &writes, samples[0]).await {
            Outcome::Done => last_success = Instant::now(),
            Outcome::Retry => {}
            Outcome::Stopped => return,
        }
    }
}

/// etcd's revision compactor: every `interval`, compacts to current minus
/// `retention` unless that is not positive or was the last one done.
async fn by_revision<B: Backend>(
    retention: i64,
    interval: Duration,
    backend: Arc<B>,
    writes: Writes,
    revisions: watch::Receiver<Revisions>,
) {
    let mut previous = 0;
    loop {
        tokio::time::sleep(interval).await;
        let revision = revisions.borrow().current.saturating_sub(retention);
        if revision <= 0 || revision == previous {
            continue;
        }
        match compact(&*backend, &writes, revision).await {
            Outcome::Done => previous = revision,
            Outcome::Retry => {}
            Outcome::Stopped => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_MIN: Duration = Duration::from_secs(5 * 60);

    #[test]
    fn retention_parses_as_etcd() {
        let parse = |mode, text| parse_retention(mode, text, FIVE_MIN);
        assert_eq!(parse("periodic", "0"), Ok(None));
        assert_eq!(parse("revision", "0"), Ok(None));
        assert_eq!(parse("periodic", "0s"), Ok(None));
        assert_eq!(
            parse("periodic", "1"),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(3600))))
        );
        assert_eq!(
            parse("periodic", "30m"),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(1800))))
        );
        assert_eq!(
            parse("periodic", "1.5h"),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(5400))))
        );
        assert_eq!(
            parse("periodic", "2s"),
            Ok(Some(AutoCompaction::Periodic(Duration::from_secs(2))))
        );
        assert_eq!(
            parse("revision", "1000"),
            Ok(Some(AutoCompaction::Revision {
                retention: 1000,
                interval: FIVE_MIN
            }))
        );
        // As in etcd, a duration in revision mode counts nanoseconds.
        assert_eq!(
            parse("revision", "1us"),
            Ok(Some(AutoCompaction::Revision {
                retention: 1000,
                interval: FIVE_MIN
            }))
        );
        assert!(parse("periodic", "-1").is_err());
        assert!(parse("periodic", "-1h").is_err());
        assert!(parse("periodic", "5x").is_err());
        assert!(parse("periodic", "h").is_err());
        assert_eq!(parse("periodic", ""), Ok(None));
    }
}
