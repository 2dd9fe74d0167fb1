//! etcd's Downgrade RPC as a single etcd member answers it, in terms of
//! the emulated version (etcd's `EtcdServer.Downgrade` in
//! server/etcdserver/v3_server.go and `version.Manager` in
//! server/etcdserver/version, v3.5 to v3.7).
//!
//! The cluster version is the emulated version's major.minor. An etcd 3.6
//! or later leader lowers the cluster (and storage) version to the target
//! within seconds of ENABLE, so cetera does it at once; a 3.5 keeps its
//! cluster version until older members join, which a single server never
//! sees. Either way the downgrade stays in flight until CANCEL: etcd ends it
//! only once every member runs the target version, and cetera's own version
//! does not change. The target in flight is a settings row, so it outlasts
//! a restart and every instance on a shared database sees the same one, as
//! etcd keeps it in its cluster state. An etcd 3.5 makes ENABLE's and
//! CANCEL's change but never answers them (see `applied_unanswered`).

use tonic::{Code, Status};

use super::version::{Minor, major_minor};
use crate::backend::Backend;
use crate::proto::etcdserverpb::downgrade_request::DowngradeAction;
use crate::store::{Store, StoreResult};

/// Downgrade as a server of one emulated version answers it.
pub(super) struct Downgrade {
    /// The emulated version's major.minor; None when it does not parse,
    /// which etcd answers as a cluster version not yet known.
    emulated: Option<Minor>,
}

/// What one Downgrade request does: the stored target to set, if any, and
/// the answer once it is set.
#[derive(Debug)]
struct Decision {
    change: Option<Option<Minor>>,
    answer: Result<String, Status>,
}

/// How many times a change lost to another instance's is decided again.
const ATTEMPTS: usize = 3;

/// The settings row's value for `target`.
fn encode(target: Option<Minor>) -> i64 {
    target.map_or(0, |(major, minor)| {
        ((major << 32) | (minor & 0xffff_ffff)) as i64
    })
}

/// The target a settings row's value names.
fn decode(value: i64) -> Option<Minor> {
    (value != 0).then_some(((value as u64) >> 32, (value as u64) & 0xffff_ffff))
}

/// What Status shows of the downgrade state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DowngradeView {
    /// The cluster version (the storage version follows it).
    pub cluster: Option<Minor>,
    /// The target of the downgrade in flight.
    pub target: Option<Minor>,
}

fn invalid_target() -> Status {
    Status::new(
        Code::InvalidArgument,
        "etcdserver: invalid downgrade target version",
    )
}

fn in_process() -> Status {
    Status::new(
        Code::FailedPrecondition,
        "etcdserver: cluster has a downgrade job in progress",
    )
}

/// What an etcd 3.5 client gets for an ENABLE or CANCEL that changed the
/// state: 3.5's apply of the change returns no result, so the proposal is
/// never answered and times out (after 7 s with etcd's default timeouts;
/// cetera answers at once), though the change is made.
fn applied_unanswered() -> Status {
    Status::new(Code::Unavailable, "etcdserver: request timed out")
}

/// etcd's go-semver reading of `text`: MAJOR.MINOR.PATCH with an optional
/// `-pre.release` and `+build` of `[0-9A-Za-z-]` identifiers.
fn parse_semver(text: &str) -> Option<Minor> {
    let (text, build) = text.split_once('+').unwrap_or((text, ""));
    let (text, pre) = text.split_once('-').unwrap_or((text, ""));
    let identifiers_ok = |s: &str| {
        s.is_empty()
            || s.split('.').all(|id| {
                !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
    };
    if !identifiers_ok(build) || !identifiers_ok(pre) {
        return None;
    }
    // Go's ParseInt on each part: decimal digits within int64.
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<i64>().ok())
            .flatten()
            .map(|n| n as u64)
    };
    let mut parts = text.splitn(3, '.');
    let major = number(parts.next()?)?;
    let minor = number(parts.next()?)?;
    number(parts.next()?)?;
    Some((major, minor))
}

/// etcd's convertToClusterVersion: a semver, or MAJOR.MINOR, kept as
/// major.minor.
fn target_version(text: &str) -> Result<Minor, Status> {
    parse_semver(text)
        .or_else(|| parse_semver(&format!("{text}.0")))
        .ok_or_else(|| {
            Status::new(
                Code::InvalidArgument,
                "etcdserver: wrong downgrade target version format",
            )
        })
}

impl Downgrade {
    /// Downgrade for a server reporting `emulated_version`.
    pub(super) fn new(emulated_version: &str) -> Self {
        // Beyond 32 bits a number would not fit the stored target.
        let fits = |(major, minor): Minor| major.max(minor) <= u64::from(u32::MAX);
        Downgrade {
            emulated: major_minor(emulated_version).filter(|&v| fits(v)),
        }
    }

    /// Whether the emulated etcd has 3.6's Downgrade (and Status fields).
    pub(super) fn speaks_36(&self) -> bool {
        self.emulated.is_some_and(|v| v >= (3, 6))
    }

    /// The cluster version and the target in flight, as stored in `store`.
    pub(super) async fn view<B: Backend>(&self, store: &Store<B>) -> StoreResult<DowngradeView> {
        Ok(self.view_with(decode(store.downgrade_target().await?)))
    }

    /// Answers a DowngradeRequest on `store`: the `version` of the
    /// response, or etcd's error.
    pub(super) async fn answer<B: Backend>(
        &self,
        store: &Store<B>,
        action: i32,
        version: &str,
    ) -> Result<String, Status> {
        for _ in 0..ATTEMPTS {
            let stored = store.downgrade_target().await?;
            let decision = self.decide(action, version, decode(stored));
            if let Some(change) = decision.change {
                if store
                    .change_downgrade_target(stored, encode(change))
                    .await?
                    != stored
                {
                    // Another instance on the database changed it meanwhile.
                    continue;
                }
                if let Some((major, minor)) = change {
                    tracing::info!(
                        "downgrade to {major}.{minor}.0 enabled; it stays in flight until cancelled"
                    );
                }
            }
            return decision.answer;
        }
        Err(Status::new(
            Code::Unavailable,
            "etcdserver: request timed out",
        ))
    }

    fn view_with(&self, target: Option<Minor>) -> DowngradeView {
        let cluster = match target {
            Some(target) if self.speaks_36() => Some(target),
            _ => self.emulated,
        };
        DowngradeView { cluster, target }
    }

    /// The cluster version as DowngradeResponse carries it: 3.6 sends
    /// major.minor, 3.5 the semver with patch 0.
    fn version_text(&self, (major, minor): Minor) -> String {
        if self.speaks_36() {
            format!("{major}.{minor}")
        } else {
            format!("{major}.{minor}.0")
        }
    }

    /// etcd's DowngradeValidate on `view`: the target must be exactly one
    /// minor below the cluster version, and no downgrade in flight.
    fn validate(&self, view: DowngradeView, target: Minor) -> Result<Minor, Status> {
        let cluster = view.cluster.ok_or_else(|| {
            // etcd 3.6 moved this error from Unavailable to FailedPrecondition.
            let code = if self.speaks_36() {
                Code::FailedPrecondition
            } else {
                Code::Unavailable
            };
            Status::new(
                code,
                "etcdserver: cluster version not found during downgrade",
            )
        })?;
        let allowed = cluster.1.checked_sub(1).map(|minor| (cluster.0, minor));
        if allowed != Some(target) {
            return Err(invalid_target());
        }
        if view.target.is_some() {
            return Err(in_process());
        }
        Ok(cluster)
    }

    /// What a DowngradeRequest does with `target` in flight.
    fn decide(&self, action: i32, version: &str, target: Option<Minor>) -> Decision {
        let view = self.view_with(target);
        let answer_only = |answer| Decision {
            change: None,
            answer,
        };
        match DowngradeAction::try_from(action) {
            Ok(DowngradeAction::Validate) => answer_only(
                target_version(version)
                    .and_then(|wanted| self.validate(view, wanted))
                    .map(|cluster| self.version_text(cluster)),
            ),
            Ok(DowngradeAction::Enable) => {
                let checked = target_version(version)
                    .and_then(|wanted| Ok((wanted, self.validate(view, wanted)?)));
                match checked {
                    Err(refused) => answer_only(Err(refused)),
                    Ok((wanted, cluster)) => Decision {
                        change: Some(Some(wanted)),
                        // etcd answers with the cluster version read right
                        // after the change, before its monitor lowers it.
                        answer: if self.speaks_36() {
                            Ok(self.version_text(cluster))
                        } else {
                            Err(applied_unanswered())
                        },
                    },
                }
            }
            Ok(DowngradeAction::Cancel) => {
                if target.is_none() {
                    if !self.speaks_36() {
                        return answer_only(Err(Status::new(
                            Code::FailedPrecondition,
                            "etcdserver: no inflight downgrade job",
                        )));
                    }
                    // etcd 3.6 only logs this and answers as if cancelled.
                    tracing::warn!("failed to cancel downgrade: no inflight downgrade job");
                }
                let answer = if self.speaks_36() {
                    view.cluster
                        .map(|cluster| self.version_text(cluster))
                        .ok_or_else(|| {
                            Status::new(
                                Code::FailedPrecondition,
                                "etcdserver: cluster version not found during downgrade",
                            )
                        })
                } else {
                    Err(applied_unanswered())
                };
                Decision {
                    change: target.is_some().then_some(None),
                    answer,
                }
            }
            Err(_) => answer_only(Err(Status::new(
                Code::Unknown,
                "etcdserver: unknown method",
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALIDATE: i32 = DowngradeAction::Validate as i32;
    const ENABLE: i32 = DowngradeAction::Enable as i32;
    const CANCEL: i32 = DowngradeAction::Cancel as i32;

    fn error(result: Result<String, Status>) -> (Code, String) {
        let status = result.unwrap_err();
        (status.code(), status.message().to_string())
    }

    /// A server's downgrade with its stored target, as `Downgrade::answer`
    /// keeps it.
    struct Server {
        downgrade: Downgrade,
        target: Option<Minor>,
    }

    impl Server {
        fn new(version: &str) -> Server {
            Server {
                downgrade: Downgrade::new(version),
                target: None,
            }
        }

        fn answer(&mut self, action: i32, version: &str) -> Result<String, Status> {
            let decision = self.downgrade.decide(action, version, self.target);
            if let Some(change) = decision.change {
                self.target = change;
            }
            decision.answer
        }

        fn view(&self) -> DowngradeView {
            self.downgrade.view_with(self.target)
        }
    }

    #[test]
    fn targets_are_stored_as_one_number() {
        for target in [None, Some((3, 5)), Some((4, 0)), Some((0, 1))] {
            assert_eq!(decode(encode(target)), target);
        }
        assert_eq!(encode(None), 0);
    }

    #[test]
    fn targets_are_read_as_go_semver_or_major_minor() {
        assert_eq!(target_version("3.5").unwrap(), (3, 5));
        assert_eq!(target_version("3.5.7").unwrap(), (3, 5));
        assert_eq!(target_version("3.5.0-rc.1+build.7").unwrap(), (3, 5));
        // go-semver takes an empty pre-release.
        assert_eq!(target_version("3.5.0-").unwrap(), (3, 5));
        for bad in [
            "",
            "v3.5",
            "3",
            "3.5.0.1",
            "3.x",
            "3.+5",
            "3.5.0-a..b",
            "3.5-rc",
        ] {
            assert_eq!(
                error(target_version(bad).map(|_| String::new())),
                (
                    Code::InvalidArgument,
                    "etcdserver: wrong downgrade target version format".to_string()
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_36_server_downgrades_to_35_until_cancelled() {
        let mut d = Server::new("3.6.11");
        assert_eq!(d.answer(VALIDATE, "3.5").unwrap(), "3.6");
        assert_eq!(d.answer(VALIDATE, "3.5.99").unwrap(), "3.6");
        for bad in ["3.4", "3.6", "3.7", "4.5"] {
            assert_eq!(
                error(d.answer(VALIDATE, bad)).1,
                "etcdserver: invalid downgrade target version"
            );
        }
        assert_eq!(d.answer(ENABLE, "3.5.0").unwrap(), "3.6");
        assert_eq!(
            d.view(),
            DowngradeView {
                cluster: Some((3, 5)),
                target: Some((3, 5))
            }
        );
        // The cluster version is 3.5 now, so 3.5 is no longer one below it.
        assert_eq!(
            error(d.answer(ENABLE, "3.5")).1,
            "etcdserver: invalid downgrade target version"
        );
        assert_eq!(
            error(d.answer(VALIDATE, "3.4")),
            (
                Code::FailedPrecondition,
                "etcdserver: cluster has a downgrade job in progress".to_string()
            )
        );
        assert_eq!(d.answer(CANCEL, "").unwrap(), "3.5");
        assert_eq!(d.view().target, None);
        assert_eq!(d.view().cluster, Some((3, 6)));
        // 3.6 answers a cancel with nothing in flight as a success.
        assert_eq!(d.answer(CANCEL, "").unwrap(), "3.6");
    }

    #[test]
    fn a_35_server_keeps_its_cluster_version_and_refuses_an_idle_cancel() {
        let mut d = Server::new("3.5.13");
        assert_eq!(
            error(d.answer(CANCEL, "")),
            (
                Code::FailedPrecondition,
                "etcdserver: no inflight downgrade job".to_string()
            )
        );
        assert_eq!(d.answer(VALIDATE, "3.4").unwrap(), "3.5.0");
        let timed_out = (
            Code::Unavailable,
            "etcdserver: request timed out".to_string(),
        );
        assert_eq!(error(d.answer(ENABLE, "3.4")), timed_out);
        assert_eq!(
            d.view(),
            DowngradeView {
                cluster: Some((3, 5)),
                target: Some((3, 4))
            }
        );
        assert_eq!(
            error(d.answer(ENABLE, "3.4")).1,
            "etcdserver: cluster has a downgrade job in progress"
        );
        assert_eq!(error(d.answer(CANCEL, "")), timed_out);
        assert_eq!(d.view().target, None);
        assert_eq!(error(d.answer(7, "")).0, Code::Unknown);
    }

    #[test]
    fn no_target_below_minor_zero_and_no_cluster_version_without_a_version() {
        let mut d = Server::new("4.0.0");
        assert_eq!(
            error(d.answer(VALIDATE, "3.9")).1,
            "etcdserver: invalid downgrade target version"
        );
        let mut d = Server::new("unknown");
        assert_eq!(error(d.answer(VALIDATE, "3.5")).0, Code::Unavailable);
        // The format is checked first, as etcd does.
        assert_eq!(error(d.answer(VALIDATE, "x")).0, Code::InvalidArgument);
    }
}
