//! Counters for the daemon's metrics endpoint (it renders Prometheus text from this).

use std::collections::BTreeMap;

use provisioner_common::kind;

use super::correlator::{CorrelatorMetrics, IntentCounts};
use super::loader::LossCounters;
use super::verdict::Verdict;

/// A snapshot of the tracer's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceMetrics {
    /// Sandbox setups by verdict (`networked`, `skipped`, ...); every verdict name is present.
    /// A revised verdict counts again under its new name.
    pub setups_by_verdict: BTreeMap<&'static str, u64>,
    /// Alarms revised to `networked` (the network arrived after the deadline), by the alarm.
    pub revised_by_alarm: BTreeMap<&'static str, u64>,
    /// Events correlated, by kind.
    pub events_by_kind: BTreeMap<&'static str, u64>,
    /// Records the kernel could not reserve in the ring buffer, by kind.
    pub lost_by_kind: BTreeMap<&'static str, u64>,
    /// Records userspace could not decode, by kind.
    pub undecodable_by_kind: BTreeMap<&'static str, u64>,
    pub intents: IntentCounts,
    /// Namespace states read from the kernel, and reads that failed.
    pub snapshots_taken: u64,
    pub snapshots_failed: u64,
    /// Namespaces and request pairings dropped to keep the correlator's memory bounded.
    pub evicted_namespaces: u64,
    pub dropped_requests: u64,
    pub tracked_namespaces: usize,
}

impl TraceMetrics {
    pub fn collect(correlator: &CorrelatorMetrics, loss: &LossCounters) -> Self {
        let mut setups_by_verdict: BTreeMap<&'static str, u64> =
            Verdict::ALL.iter().map(|v| (v.as_str(), 0)).collect();
        for (name, n) in &correlator.verdicts {
            *setups_by_verdict.entry(name).or_default() += n;
        }
        let by_kind = |pairs: &[(u32, u64)]| -> BTreeMap<&'static str, u64> {
            let mut map = BTreeMap::new();
            for (k, n) in pairs {
                *map.entry(kind::name(*k)).or_default() += n;
            }
            map
        };
        Self {
            setups_by_verdict,
            revised_by_alarm: correlator.revised.clone(),
            events_by_kind: correlator.events.clone(),
            lost_by_kind: by_kind(&loss.reserve_failures),
            undecodable_by_kind: by_kind(&loss.decode_failures),
            intents: correlator.intents.clone(),
            snapshots_taken: correlator.snapshots_taken,
            snapshots_failed: correlator.snapshots_failed,
            evicted_namespaces: correlator.evicted_namespaces,
            dropped_requests: correlator.dropped_requests,
            tracked_namespaces: correlator.tracked_namespaces,
        }
    }

    /// Events lost in the kernel, in decoding, or dropped to keep memory bounded.
    pub fn lost_total(&self) -> u64 {
        self.lost_by_kind
            .values()
            .chain(self.undecodable_by_kind.values())
            .sum::<u64>()
            + self.evicted_namespaces
            + self.dropped_requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_is_present_and_losses_are_named() {
        let correlator = CorrelatorMetrics {
            verdicts: [("skipped", 2)].into_iter().collect(),
            ..CorrelatorMetrics::default()
        };
        let loss = LossCounters {
            reserve_failures: vec![(kind::NETLINK_REQUEST, 3)],
            decode_failures: vec![(kind::EXEC, 1)],
        };
        let m = TraceMetrics::collect(&correlator, &loss);
        assert_eq!(m.setups_by_verdict.len(), Verdict::ALL.len());
        assert_eq!(m.setups_by_verdict["skipped"], 2);
        assert_eq!(m.setups_by_verdict["networked"], 0);
        assert_eq!(m.lost_by_kind["netlink_request"], 3);
        assert_eq!(m.lost_total(), 4);
    }
}
