//! The tracer's counters in one snapshot: what the driver hands the daemon (its metrics
//! endpoint exports them, `metrics/trace.rs`) and a `provisioner trace` session's summary.

use std::collections::BTreeMap;

use provisioner_common::kind;

use super::correlator::CorrelatorMetrics;
use super::kernel::{LossCounters, ObservationStatus, RingUsage};
use super::verdict::Verdict;

/// A snapshot of the tracer's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceMetrics {
    /// The correlator's counters; its `verdicts` name every verdict (0 when never given).
    #[serde(flatten)]
    pub correlator: CorrelatorMetrics,
    /// Records the kernel could not reserve in the ring buffer, by kind.
    pub lost_by_kind: BTreeMap<&'static str, u64>,
    /// Records userspace could not decode, by kind.
    pub undecodable_by_kind: BTreeMap<&'static str, u64>,
    /// Records the kernel did not send because the task's netns could not be read, by kind.
    pub netns_unreadable_by_kind: BTreeMap<&'static str, u64>,
    pub ring: RingUsage,
    /// What each observation runs on (see `trace::kernel::backends`).
    pub observations: Vec<ObservationStatus>,
}

impl TraceMetrics {
    pub fn collect(
        correlator: &CorrelatorMetrics,
        loss: &LossCounters,
        ring: RingUsage,
        observations: &[ObservationStatus],
    ) -> Self {
        let mut correlator = correlator.clone();
        for verdict in Verdict::ALL {
            correlator.verdicts.entry(verdict.as_str()).or_default();
        }
        let by_kind = |pairs: &[(u32, u64)]| -> BTreeMap<&'static str, u64> {
            let mut map = BTreeMap::new();
            for (k, n) in pairs {
                *map.entry(kind::name(*k)).or_default() += n;
            }
            map
        };
        Self {
            correlator,
            lost_by_kind: by_kind(&loss.reserve_failures),
            undecodable_by_kind: by_kind(&loss.decode_failures),
            netns_unreadable_by_kind: by_kind(&loss.netns_unreadable),
            ring,
            observations: observations.to_vec(),
        }
    }

    /// Events lost in the kernel, in decoding, or dropped to keep memory bounded.
    pub fn lost_total(&self) -> u64 {
        self.lost_by_kind
            .values()
            .chain(self.undecodable_by_kind.values())
            .chain(self.netns_unreadable_by_kind.values())
            .sum::<u64>()
            + self.correlator.evicted_namespaces
            + self.correlator.dropped_requests
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
            netns_unreadable: vec![(kind::NETNS_CREATED, 2)],
        };
        let m = TraceMetrics::collect(&correlator, &loss, RingUsage::default(), &[]);
        assert_eq!(m.correlator.verdicts.len(), Verdict::ALL.len());
        assert_eq!(m.correlator.verdicts["skipped"], 2);
        assert_eq!(m.correlator.verdicts["networked"], 0);
        assert_eq!(m.lost_by_kind["netlink_request"], 3);
        assert_eq!(m.netns_unreadable_by_kind["netns_created"], 2);
        assert_eq!(m.lost_total(), 6);
    }
}
