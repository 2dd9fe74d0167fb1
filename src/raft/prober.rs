//! etcd's prober's counterpart. Every member probes every other member
//! (`Peers::probe`) every PROBE_INTERVAL, as etcd's prober does, for two
//! reasons: followers otherwise never call each other, and a member should
//! see each other member as active or not (etcd's streams keep every pair
//! connected); and the probes' round trips, smoothed as etcd's prober
//! smooths them, are sampled into etcd_network_peer_round_trip_time_seconds.
//! Raft's own calls are not timed for that: an append answers only once
//! the follower has synced its log, which is disk latency, not the network's.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::time::MissedTickBehavior;

use super::node::Node;
use crate::metrics::{member_label, metrics};

/// How often each member is probed: etcd's proberInterval (its peer
/// connections' read timeout less a second).
const PROBE_INTERVAL: Duration = Duration::from_secs(4);

/// How often a member's smoothed round trip is sampled into the histogram:
/// etcd's statusMonitoringInterval.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(30);

/// The weight of a new round trip in the smoothed one: etcd's prober's
/// (TCP's SRTT weight, 1/8).
const NEW_WEIGHT: f64 = 0.125;

/// One member's smoothed round trip.
#[derive(Debug, Default)]
struct RoundTrip {
    /// Seconds; none before the first answer.
    smoothed: Option<f64>,
    /// When it was last sampled into the histogram.
    sampled: Option<Instant>,
}

impl RoundTrip {
    /// Takes in one probe's round trip; the smoothed one when a sample is
    /// due (at the first answer, then every SAMPLE_INTERVAL).
    fn record(&mut self, round_trip: Duration, now: Instant) -> Option<f64> {
        let new = round_trip.as_secs_f64();
        // etcd's starts from zero, which makes its first samples too short;
        // this starts from the first round trip.
        let smoothed = match self.smoothed {
            Some(old) => old * (1.0 - NEW_WEIGHT) + new * NEW_WEIGHT,
            None => new,
        };
        self.smoothed = Some(smoothed);
        let due = self
            .sampled
            .is_none_or(|at| now.duration_since(at) >= SAMPLE_INTERVAL);
        if due {
            self.sampled = Some(now);
        }
        due.then_some(smoothed)
    }
}

/// Probes the other members every PROBE_INTERVAL, from now until Raft
/// stops.
pub(super) async fn probe_members(node: Weak<Node>) {
    let mut round_trips: HashMap<u64, RoundTrip> = HashMap::new();
    let mut ticks = tokio::time::interval(PROBE_INTERVAL);
    // A round of probes can take up to a probe's timeout: the next waits.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // Not held across the probes, which must not keep a stopped
        // member's Node alive.
        let (peers, others) = {
            let Some(node) = node.upgrade() else {
                return;
            };
            if node.metrics().borrow().running_state.is_err() {
                return;
            }
            let others: Vec<(u64, String)> = node
                .members()
                .into_iter()
                .filter(|m| m.id != node.id())
                .map(|m| (m.id, m.member.peer_url))
                .collect();
            (node.peers().clone(), others)
        };
        let answers = join_all(others.iter().map(|(_, url)| peers.probe(url))).await;
        round_trips.retain(|id, _| others.iter().any(|(other, _)| other == id));
        let now = Instant::now();
        for ((id, _), answer) in others.iter().zip(answers) {
            // A member that does not answer has no round trip: etcd samples
            // its last one again, every 5 s; this samples nothing.
            let Ok(round_trip) = answer else {
                continue;
            };
            if let Some(smoothed) = round_trips.entry(*id).or_default().record(round_trip, now) {
                metrics()
                    .peer_round_trip_seconds
                    .with_label_values(&[&member_label(*id)])
                    .observe(smoothed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_are_smoothed_and_sampled_every_interval() {
        let start = Instant::now();
        let mut round_trip = RoundTrip::default();
        let ms = Duration::from_millis;
        assert_eq!(round_trip.record(ms(8), start), Some(0.008));
        // Within the interval: smoothed, not sampled.
        assert_eq!(round_trip.record(ms(16), start + PROBE_INTERVAL), None);
        let smoothed = round_trip.smoothed.unwrap();
        assert!((smoothed - 0.009).abs() < 1e-9, "{smoothed}");
        let sampled = round_trip.record(ms(16), start + SAMPLE_INTERVAL);
        assert!(
            sampled.is_some_and(|s| (s - 0.009875).abs() < 1e-9),
            "{sampled:?}"
        );
        assert_eq!(
            round_trip.record(ms(16), start + SAMPLE_INTERVAL + PROBE_INTERVAL),
            None
        );
    }
}
