//! The process metrics etcd's Go client exports (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`...), from the
//! prometheus crate's collector, with one mend: that collector counts CPU in
//! whole seconds, so `rate(process_cpu_seconds_total[1m])`, the CPU graph of
//! etcd's dashboards, moves in steps of a sixtieth of a core. Go's client
//! counts to the clock tick, and so does this.

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::{Counter, MetricFamily};

/// The name whose value is mended.
const CPU_SECONDS: &str = "process_cpu_seconds_total";

/// This process's metrics.
pub(super) struct ProcessMetrics(ProcessCollector);

impl ProcessMetrics {
    /// The metrics of the running process.
    pub(super) fn for_self() -> Self {
        ProcessMetrics(ProcessCollector::for_self())
    }
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.0.collect();
        if let Some(seconds) = cpu_seconds() {
            for family in families.iter_mut().filter(|f| f.name() == CPU_SECONDS) {
                for metric in family.mut_metric() {
                    let mut counter = Counter::default();
                    counter.set_value(seconds);
                    metric.set_counter(counter);
                }
            }
        }
        families
    }
}

/// The CPU (user and system) this process has used, to the clock tick.
fn cpu_seconds() -> Option<f64> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    Some((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rendered value lies between readings taken just before and just
    /// after, where whole seconds would fall below the first: the CPU is
    /// spent until the reading before is not a whole number of seconds.
    #[test]
    fn cpu_seconds_count_to_the_tick() {
        let collector = ProcessMetrics::for_self();
        let mut spin = 0u64;
        let before = loop {
            let seconds = cpu_seconds().expect("this process's stat");
            if seconds.fract() > 0.0 {
                break seconds;
            }
            for i in 0..1_000_000u64 {
                spin = std::hint::black_box(spin.wrapping_add(i));
            }
        };
        let families = collector.collect();
        let after = cpu_seconds().expect("this process's stat");
        let family = families
            .iter()
            .find(|f| f.name() == CPU_SECONDS)
            .expect("the CPU family");
        let value = family.get_metric()[0].get_counter().get_value();
        assert!(
            (before..=after).contains(&value),
            "{value} not within {before}..={after}"
        );
        // The other process metrics are still there.
        assert!(
            families
                .iter()
                .any(|f| f.name() == "process_resident_memory_bytes")
        );
    }
}
