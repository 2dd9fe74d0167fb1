//! Prometheus metrics, named like etcd's where etcd has the same measure so
//! that etcd dashboards and alerts work unchanged; cetera's own measures are
//! prefixed `cetera_`.
//!
//! One process-wide set (`metrics()`), so that the writer, the watch sessions
//! and the gRPC layer can count without a handle passed down to them. Values
//! that live in the database (revisions, size, active leases) are sampled when
//! /metrics is scraped rather than tracked on every write; `server::metrics_server`
//! serves them.

mod process;

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, exponential_buckets,
};

use process::ProcessMetrics;

/// Every metric cetera exports.
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// RPCs started, by type, service and method (etcd: grpc_server_started_total).
    pub grpc_started: IntCounterVec,
    /// RPCs finished, by type, service, method and gRPC code (etcd: grpc_server_handled_total).
    pub grpc_handled: IntCounterVec,
    /// Bytes of the etcd API's requests (etcd: etcd_network_client_grpc_received_bytes_total).
    pub grpc_received_bytes: IntCounter,
    /// Bytes of its responses (etcd: etcd_network_client_grpc_sent_bytes_total).
    pub grpc_sent_bytes: IntCounter,
    /// Time from the request to its final status (etcd: grpc_server_handling_seconds).
    pub grpc_handling_seconds: HistogramVec,
    /// The store's current revision (etcd: etcd_debugging_mvcc_current_revision).
    pub current_revision: IntGauge,
    /// The compact revision (etcd: etcd_debugging_mvcc_compact_revision).
    pub compact_revision: IntGauge,
    /// Database size on disk (etcd: etcd_mvcc_db_total_size_in_bytes).
    pub db_total_size: IntGauge,
    /// Part of the database holding live data (etcd: etcd_mvcc_db_total_size_in_use_in_bytes).
    pub db_in_use_size: IntGauge,
    /// Write requests in each group commit (cetera_writer_batch_requests).
    pub commit_batch_requests: Histogram,
    /// Write transactions the writer committed (cetera_writer_commits_total).
    pub commits: IntCounter,
    /// How long each commit took (etcd: etcd_disk_backend_commit_duration_seconds).
    pub commit_seconds: Histogram,
    /// Open watchers (etcd: etcd_debugging_mvcc_watcher_total).
    pub watchers: IntGauge,
    /// Open Watch streams (etcd: etcd_debugging_mvcc_watch_stream_total).
    pub watch_streams: IntGauge,
    /// Leases granted (etcd: etcd_debugging_lease_granted_total).
    pub leases_granted: IntCounter,
    /// Leases revoked by clients or expired (etcd: etcd_debugging_lease_revoked_total).
    pub leases_revoked: IntCounter,
    /// Successful keep-alives (etcd: etcd_debugging_lease_renewed_total).
    pub leases_renewed: IntCounter,
    /// Leases in the database (cetera_leases_active).
    pub leases_active: IntGauge,
    /// Whether there is a leader: always 1 on a single server, its own
    /// leader (etcd: etcd_server_has_leader).
    pub has_leader: IntGauge,
    /// Whether this server leads: always 1 on a single server (etcd:
    /// etcd_server_is_leader).
    pub is_leader: IntGauge,
    /// Leaders a cluster member has seen come (etcd:
    /// etcd_server_leader_changes_seen_total).
    pub leader_changes: IntCounter,
    /// The quota writes are checked against (etcd:
    /// etcd_server_quota_backend_bytes).
    pub quota_backend_bytes: IntGauge,
    /// How long each sync of the record log took, SQLite's counterpart of
    /// etcd's WAL (etcd: etcd_disk_wal_fsync_duration_seconds).
    pub wal_fsync_seconds: Histogram,
    /// The Raft log's last index, on a single server its revision (etcd:
    /// etcd_server_proposals_committed_total, a gauge as etcd's).
    pub proposals_committed: IntGauge,
    /// The last index applied, on a single server its revision (etcd:
    /// etcd_server_proposals_applied_total, a gauge).
    pub proposals_applied: IntGauge,
    /// Writes sent and not yet answered (etcd: etcd_server_proposals_pending).
    pub proposals_pending: IntGauge,
    /// Writes that failed for want of a leader, a timeout or the datastore,
    /// not by their own terms (etcd: etcd_server_proposals_failed_total).
    pub proposals_failed: IntCounter,
    /// Writes a follower sent to the leader in each call
    /// (cetera_raft_forwarded_writes).
    pub forwarded_writes: Histogram,
    /// Bytes of the peer messages a cluster member sent, by the member they
    /// went to (etcd: etcd_network_peer_sent_bytes_total{To}).
    pub peer_sent_bytes: IntCounterVec,
    /// Bytes of the peer messages it received, by the member they came from
    /// (etcd: etcd_network_peer_received_bytes_total{From}).
    pub peer_received_bytes: IntCounterVec,
    /// Peer calls that got no answer or a refusal, by the member called
    /// (etcd: etcd_network_peer_sent_failures_total{To}).
    pub peer_sent_failures: IntCounterVec,
    /// Peer messages received that did not decode, by the member they came
    /// from (etcd: etcd_network_peer_received_failures_total{From}).
    pub peer_received_failures: IntCounterVec,
    /// The smoothed round trip of the probes to each member, sampled (etcd:
    /// etcd_network_peer_round_trip_time_seconds{To}).
    pub peer_round_trip_seconds: HistogramVec,
    /// 1 while another member answers this one's calls, 0 once it stops
    /// (etcd: etcd_network_active_peers{Local,Remote}).
    pub active_peers: IntGaugeVec,
    /// Times another member went from active to silent (etcd:
    /// etcd_network_disconnected_peers_total{Local,Remote}).
    pub disconnected_peers: IntCounterVec,
}

/// A member id as etcd writes it in labels (types.ID): lowercase hex without
/// leading zeros.
pub fn member_label(id: u64) -> String {
    format!("{id:x}")
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        let grpc_labels = ["grpc_type", "grpc_service", "grpc_method"];
        let metrics = Metrics {
            grpc_started: IntCounterVec::new(
                Opts::new(
                    "grpc_server_started_total",
                    "Total number of RPCs started on the server.",
                ),
                &grpc_labels,
            )
            .expect("valid metric"),
            grpc_handled: IntCounterVec::new(
                Opts::new(
                    "grpc_server_handled_total",
                    "Total number of RPCs completed on the server, regardless of success or failure.",
                ),
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            )
            .expect("valid metric"),
            grpc_handling_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "grpc_server_handling_seconds",
                    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
                ),
                &grpc_labels,
            )
            .expect("valid metric"),
            current_revision: IntGauge::new(
                "etcd_debugging_mvcc_current_revision",
                "The current revision of the store.",
            )
            .expect("valid metric"),
            compact_revision: IntGauge::new(
                "etcd_debugging_mvcc_compact_revision",
                "The revision of the last compaction in the store.",
            )
            .expect("valid metric"),
            db_total_size: IntGauge::new(
                "etcd_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            )
            .expect("valid metric"),
            db_in_use_size: IntGauge::new(
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
            )
            .expect("valid metric"),
            commit_batch_requests: Histogram::with_opts(
                HistogramOpts::new(
                    "cetera_writer_batch_requests",
                    "Write requests applied together in one database commit (group commit).",
                )
                .buckets(exponential_buckets(1.0, 2.0, 9).expect("valid buckets")),
            )
            .expect("valid metric"),
            commits: IntCounter::new(
                "cetera_writer_commits_total",
                "Write transactions committed by the writer. On SQLite (WAL, synchronous=FULL) \
                 each commit that changed something is one fsync of the WAL.",
            )
            .expect("valid metric"),
            commit_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "etcd_disk_backend_commit_duration_seconds",
                    "The latency distributions of commit called by backend.",
                )
                .buckets(exponential_buckets(0.001, 2.0, 14).expect("valid buckets")),
            )
            .expect("valid metric"),
            watchers: IntGauge::new(
                "etcd_debugging_mvcc_watcher_total",
                "Total number of watchers.",
            )
            .expect("valid metric"),
            watch_streams: IntGauge::new(
                "etcd_debugging_mvcc_watch_stream_total",
                "Total number of watch streams.",
            )
            .expect("valid metric"),
            leases_granted: IntCounter::new(
                "etcd_debugging_lease_granted_total",
                "The total number of granted leases.",
            )
            .expect("valid metric"),
            leases_revoked: IntCounter::new(
                "etcd_debugging_lease_revoked_total",
                "The total number of revoked leases.",
            )
            .expect("valid metric"),
            leases_renewed: IntCounter::new(
                "etcd_debugging_lease_renewed_total",
                "The number of renewed leases seen by the leader.",
            )
            .expect("valid metric"),
            leases_active: IntGauge::new(
                "cetera_leases_active",
                "Leases currently granted and not yet revoked or expired.",
            )
            .expect("valid metric"),
            has_leader: IntGauge::new(
                "etcd_server_has_leader",
                "Whether or not a leader exists. 1 is existence, 0 is not.",
            )
            .expect("valid metric"),
            is_leader: IntGauge::new(
                "etcd_server_is_leader",
                "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            )
            .expect("valid metric"),
            leader_changes: IntCounter::new(
                "etcd_server_leader_changes_seen_total",
                "The number of leader changes seen.",
            )
            .expect("valid metric"),
            quota_backend_bytes: IntGauge::new(
                "etcd_server_quota_backend_bytes",
                "Current backend storage quota size in bytes.",
            )
            .expect("valid metric"),
            wal_fsync_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "etcd_disk_wal_fsync_duration_seconds",
                    "The latency distributions of fsync called by WAL.",
                )
                .buckets(exponential_buckets(0.001, 2.0, 14).expect("valid buckets")),
            )
            .expect("valid metric"),
            grpc_received_bytes: IntCounter::new(
                "etcd_network_client_grpc_received_bytes_total",
                "The total number of bytes received from grpc clients.",
            )
            .expect("valid metric"),
            grpc_sent_bytes: IntCounter::new(
                "etcd_network_client_grpc_sent_bytes_total",
                "The total number of bytes sent to grpc clients.",
            )
            .expect("valid metric"),
            proposals_committed: IntGauge::new(
                "etcd_server_proposals_committed_total",
                "The total number of consensus proposals committed.",
            )
            .expect("valid metric"),
            proposals_applied: IntGauge::new(
                "etcd_server_proposals_applied_total",
                "The total number of consensus proposals applied.",
            )
            .expect("valid metric"),
            proposals_pending: IntGauge::new(
                "etcd_server_proposals_pending",
                "The current number of pending proposals to commit.",
            )
            .expect("valid metric"),
            proposals_failed: IntCounter::new(
                "etcd_server_proposals_failed_total",
                "The total number of failed proposals seen.",
            )
            .expect("valid metric"),
            forwarded_writes: Histogram::with_opts(
                HistogramOpts::new(
                    "cetera_raft_forwarded_writes",
                    "Writes a follower sent to the leader together in one call.",
                )
                .buckets(exponential_buckets(1.0, 2.0, 9).expect("valid buckets")),
            )
            .expect("valid metric"),
            peer_sent_bytes: IntCounterVec::new(
                Opts::new(
                    "etcd_network_peer_sent_bytes_total",
                    "Bytes of the messages sent to each other cluster member.",
                ),
                &["To"],
            )
            .expect("valid metric"),
            peer_received_bytes: IntCounterVec::new(
                Opts::new(
                    "etcd_network_peer_received_bytes_total",
                    "Bytes of the messages received from each other cluster member.",
                ),
                &["From"],
            )
            .expect("valid metric"),
            peer_sent_failures: IntCounterVec::new(
                Opts::new(
                    "etcd_network_peer_sent_failures_total",
                    "Messages to another cluster member that failed to get through.",
                ),
                &["To"],
            )
            .expect("valid metric"),
            peer_received_failures: IntCounterVec::new(
                Opts::new(
                    "etcd_network_peer_received_failures_total",
                    "Messages from another cluster member that could not be read.",
                ),
                &["From"],
            )
            .expect("valid metric"),
            // etcd's buckets: 0.1 ms doubling up to 3.2768 s.
            peer_round_trip_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "etcd_network_peer_round_trip_time_seconds",
                    "Smoothed round trip time of the probes to each other cluster member.",
                )
                .buckets(exponential_buckets(0.0001, 2.0, 16).expect("valid buckets")),
                &["To"],
            )
            .expect("valid metric"),
            active_peers: IntGaugeVec::new(
                Opts::new(
                    "etcd_network_active_peers",
                    "Whether each other cluster member currently answers this one (1) or not (0).",
                ),
                &["Local", "Remote"],
            )
            .expect("valid metric"),
            disconnected_peers: IntCounterVec::new(
                Opts::new(
                    "etcd_network_disconnected_peers_total",
                    "Times another cluster member stopped answering this one.",
                ),
                &["Local", "Remote"],
            )
            .expect("valid metric"),
            registry,
        };
        metrics.has_leader.set(1);
        metrics.is_leader.set(1);
        let collectors: [Box<dyn prometheus::core::Collector>; 36] = [
            Box::new(metrics.grpc_started.clone()),
            Box::new(metrics.grpc_handled.clone()),
            Box::new(metrics.grpc_handling_seconds.clone()),
            Box::new(metrics.current_revision.clone()),
            Box::new(metrics.compact_revision.clone()),
            Box::new(metrics.db_total_size.clone()),
            Box::new(metrics.db_in_use_size.clone()),
            Box::new(metrics.commit_batch_requests.clone()),
            Box::new(metrics.commits.clone()),
            Box::new(metrics.commit_seconds.clone()),
            Box::new(metrics.watchers.clone()),
            Box::new(metrics.watch_streams.clone()),
            Box::new(metrics.leases_granted.clone()),
            Box::new(metrics.leases_revoked.clone()),
            Box::new(metrics.leases_renewed.clone()),
            Box::new(metrics.leases_active.clone()),
            Box::new(metrics.has_leader.clone()),
            Box::new(metrics.leader_changes.clone()),
            Box::new(metrics.is_leader.clone()),
            Box::new(metrics.quota_backend_bytes.clone()),
            Box::new(metrics.wal_fsync_seconds.clone()),
            Box::new(metrics.grpc_received_bytes.clone()),
            Box::new(metrics.grpc_sent_bytes.clone()),
            Box::new(metrics.proposals_committed.clone()),
            Box::new(metrics.proposals_applied.clone()),
            Box::new(metrics.proposals_pending.clone()),
            Box::new(metrics.proposals_failed.clone()),
            Box::new(metrics.forwarded_writes.clone()),
            Box::new(metrics.peer_sent_bytes.clone()),
            Box::new(metrics.peer_received_bytes.clone()),
            Box::new(metrics.peer_sent_failures.clone()),
            Box::new(metrics.peer_received_failures.clone()),
            Box::new(metrics.peer_round_trip_seconds.clone()),
            Box::new(metrics.active_peers.clone()),
            Box::new(metrics.disconnected_peers.clone()),
            // process_resident_memory_bytes, process_cpu_seconds_total,
            // process_open_fds...: what etcd's Go client exports and
            // etcd's dashboards and `etcdctl check datascale` read.
            Box::new(ProcessMetrics::for_self()),
        ];
        for collector in collectors {
            metrics
                .registry
                .register(collector)
                .expect("metric names are unique");
        }
        metrics
    }

    /// Records one group commit of `requests` write requests that took `took`.
    pub fn record_commit(&self, requests: usize, took: Duration) {
        self.commits.inc();
        self.commit_batch_requests.observe(requests as f64);
        self.commit_seconds.observe(took.as_secs_f64());
    }

    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|error| format!("# cannot encode metrics: {error}\n"))
    }
}

/// Counts one up in a gauge for as long as it lives: a watcher, a stream.
pub struct GaugeGuard(&'static IntGauge);

impl GaugeGuard {
    /// Increments `gauge` until the guard is dropped.
    pub fn new(gauge: &'static IntGauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_etcd_names() {
        let metrics = metrics();
        metrics.record_commit(3, Duration::from_millis(2));
        let text = metrics.render();
        for name in [
            "etcd_debugging_mvcc_current_revision",
            "etcd_mvcc_db_total_size_in_use_in_bytes",
            "cetera_writer_batch_requests_bucket",
            "etcd_disk_backend_commit_duration_seconds_count",
            "etcd_debugging_mvcc_watcher_total",
            "etcd_server_has_leader 1",
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "etcd_server_quota_backend_bytes",
            "etcd_disk_wal_fsync_duration_seconds_bucket",
            "etcd_server_proposals_committed_total",
            "etcd_server_proposals_pending",
            "etcd_server_proposals_failed_total",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    /// A single server, with no peers, shows none of the peer metrics, as
    /// etcd's vectors without label values show nothing; a member shows
    /// them labelled with ids as etcd writes them.
    #[test]
    fn peer_metrics_only_with_peers() {
        let metrics = Metrics::new();
        let text = metrics.render();
        for name in [
            "etcd_network_peer_",
            "_active_peers",
            "_disconnected_peers_",
        ] {
            assert!(!text.contains(name), "{name} in:\n{text}");
        }
        let to = member_label(0x0a1b_2c3d_4e5f_6071);
        assert_eq!(to, "a1b2c3d4e5f6071");
        metrics.peer_sent_bytes.with_label_values(&[&to]).inc_by(7);
        metrics
            .peer_round_trip_seconds
            .with_label_values(&[&to])
            .observe(0.0003);
        let text = metrics.render();
        assert!(
            text.contains("etcd_network_peer_sent_bytes_total{To=\"a1b2c3d4e5f6071\"} 7"),
            "{text}"
        );
        assert!(
            text.contains(
                "etcd_network_peer_round_trip_time_seconds_bucket{To=\"a1b2c3d4e5f6071\",le=\"0.0004\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("etcd_network_active_peers"), "{text}");
    }

    #[test]
    fn gauge_guard_counts_while_alive() {
        static GAUGE: LazyLock<IntGauge> =
            LazyLock::new(|| IntGauge::new("test_gauge", "test").unwrap());
        let first = GaugeGuard::new(&GAUGE);
        let second = GaugeGuard::new(&GAUGE);
        assert_eq!(GAUGE.get(), 2);
        drop(first);
        assert_eq!(GAUGE.get(), 1);
        drop(second);
        assert_eq!(GAUGE.get(), 0);
    }
}
