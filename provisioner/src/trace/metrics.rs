//! Counters for the daemon's metrics endpoint (it renders Prometheus text from this).

use std::collections::BTreeMap;

use provisioner_common::kind;

use super::correlator::CorrelatorMetrics;
use super::loader::LossCounters;
use super::verdict::Verdict;

/// A snapshot of the tracer's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceMetrics {
    /// Sandbox setups by verdict (`networked`, `skipped`, `partial`, `failed`, `gone`); every
    /// verdict name is present.
    pub setups_by_verdict: BTreeMap<&'static str, u64>,
    /// Events correlated, by kind.
    pub events_by_kind: BTreeMap<&'static str, u64>,
    /// Records the kernel could not reserve in the ring buffer, by kind.
    pub lost_by_kind: BTreeMap<&'static str, u64>,
    /// Records userspace could not decode, by kind.
    pub undecodable_by_kind: BTreeMap<&'static str, u64>,
    pub intents_confirmed: u64,
    pub intents_unconfirmed: u64,
    pub drifts: u64,
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
            events_by_kind: correlator.events.clone(),
            lost_by_kind: by_kind(&loss.reserve_failures),
            undecodable_by_kind: by_kind(&loss.decode_failures),
            intents_confirmed: correlator.intents_confirmed,
            intents_unconfirmed: correlator.intents_unconfirmed,
            drifts: correlator.drifts,
            tracked_namespaces: correlator.tracked_namespaces,
        }
    }

    /// Events lost in the kernel or in decoding, all kinds.
    pub fn lost_total(&self) -> u64 {
        self.lost_by_kind
            .values()
            .chain(self.undecodable_by_kind.values())
            .sum()
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
        assert_eq!(m.setups_by_verdict.len(), 5);
        assert_eq!(m.setups_by_verdict["skipped"], 2);
        assert_eq!(m.setups_by_verdict["networked"], 0);
        assert_eq!(m.lost_by_kind["netlink_request"], 3);
        assert_eq!(m.lost_total(), 4);
    }
}
