//! The sandboxes whose latest verdict is an alarm (skipped, partial, failed), kept for a window
//! so that an alert can name each one's pod: `provisioner_sandbox_alarm`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::pod::Pod;
use crate::trace::Verdict;

/// How long an alarm stays in the gauge after its verdict.
pub const ALARM_WINDOW: Duration = Duration::from_secs(15 * 60);
/// Most sandboxes kept; the oldest alarm goes first.
pub const MAX_ALARMS: usize = 1024;

/// One series of the gauge: how many sandboxes with this verdict the pod has (1 for a named
/// pod; sandboxes whose pod is not known share the series with empty pod labels).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlarmSeries {
    pub verdict: &'static str,
    pub pod_namespace: String,
    pub pod_name: String,
}

#[derive(Debug)]
struct Alarm {
    series: AlarmSeries,
    at: Instant,
}

/// The alarms by netns cookie.
#[derive(Debug, Default)]
pub struct SandboxAlarms {
    by_netns: HashMap<u64, Alarm>,
}

impl SandboxAlarms {
    /// A sandbox's latest verdict: an alarm verdict replaces what the sandbox had, any other
    /// (networked, also when it revises an alarm) clears it.
    pub fn record(&mut self, netns_cookie: u64, verdict: Verdict, pod: Option<&Pod>, now: Instant) {
        if !matches!(
            verdict,
            Verdict::Skipped | Verdict::Partial | Verdict::Failed
        ) {
            self.by_netns.remove(&netns_cookie);
            return;
        }
        if !self.by_netns.contains_key(&netns_cookie) && self.by_netns.len() >= MAX_ALARMS {
            self.drop_oldest();
        }
        let series = AlarmSeries {
            verdict: verdict.as_str(),
            pod_namespace: pod.map(|p| p.namespace.clone()).unwrap_or_default(),
            pod_name: pod.map(|p| p.name.clone()).unwrap_or_default(),
        };
        self.by_netns
            .insert(netns_cookie, Alarm { series, at: now });
    }

    /// The alarms younger than [`ALARM_WINDOW`], counted by series; older ones are forgotten.
    pub fn current(&mut self, now: Instant) -> Vec<(AlarmSeries, u64)> {
        self.by_netns
            .retain(|_, alarm| now.saturating_duration_since(alarm.at) < ALARM_WINDOW);
        let mut counts = BTreeMap::new();
        for alarm in self.by_netns.values() {
            *counts.entry(alarm.series.clone()).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }

    fn drop_oldest(&mut self) {
        let oldest = self
            .by_netns
            .iter()
            .min_by_key(|(_, alarm)| alarm.at)
            .map(|(cookie, _)| *cookie);
        if let Some(cookie) = oldest {
            self.by_netns.remove(&cookie);
        }
    }
}

/// Encodes the alarms copied in before the scrape.
pub fn encode(
    encoder: &mut DescriptorEncoder,
    alarms: &[(AlarmSeries, u64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(
        "sandbox_alarm",
        "Sandboxes whose latest verdict, within the last 15 minutes, is skipped, partial or \
         failed, by verdict and pod (empty pod labels: the pod is not known)",
        None,
        MetricType::Gauge,
    )?;
    for (series, n) in alarms {
        let labels = [
            ("verdict", series.verdict),
            ("pod_namespace", series.pod_namespace.as_str()),
            ("pod_name", series.pod_name.as_str()),
        ];
        ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX))
            .encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

#[derive(Debug)]
pub struct AlarmCollector(pub std::sync::Arc<std::sync::Mutex<Vec<(AlarmSeries, u64)>>>);

impl Collector for AlarmCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let alarms = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        encode(&mut encoder, &alarms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Pod {
        Pod {
            namespace: "default".into(),
            name: name.into(),
            ..Pod::default()
        }
    }

    fn series(verdict: &'static str, name: &str) -> AlarmSeries {
        AlarmSeries {
            verdict,
            pod_namespace: if name.is_empty() { "" } else { "default" }.into(),
            pod_name: name.into(),
        }
    }

    #[test]
    fn latest_verdict_decides_and_networked_clears() {
        let now = Instant::now();
        let mut alarms = SandboxAlarms::default();
        alarms.record(1, Verdict::Skipped, Some(&pod("a")), now);
        alarms.record(2, Verdict::Partial, Some(&pod("b")), now);
        alarms.record(3, Verdict::Networked, Some(&pod("c")), now);
        alarms.record(4, Verdict::Failed, None, now);
        alarms.record(5, Verdict::Skipped, None, now);
        alarms.record(6, Verdict::Skipped, None, now);
        assert_eq!(
            alarms.current(now),
            vec![
                (series("failed", ""), 1),
                (series("partial", "b"), 1),
                (series("skipped", ""), 2),
                (series("skipped", "a"), 1),
            ]
        );
        alarms.record(1, Verdict::Networked, Some(&pod("a")), now);
        alarms.record(2, Verdict::Failed, Some(&pod("b")), now);
        let current = alarms.current(now);
        assert!(
            !current.contains(&(series("skipped", "a"), 1)),
            "{current:?}"
        );
        assert!(current.contains(&(series("failed", "b"), 1)), "{current:?}");
        assert!(
            !current.contains(&(series("partial", "b"), 1)),
            "{current:?}"
        );
    }

    #[test]
    fn alarms_expire_and_stay_bounded() {
        let start = Instant::now();
        let mut alarms = SandboxAlarms::default();
        alarms.record(1, Verdict::Skipped, Some(&pod("old")), start);
        let later = start + ALARM_WINDOW / 2;
        alarms.record(2, Verdict::Skipped, Some(&pod("new")), later);
        let after = start + ALARM_WINDOW + Duration::from_secs(1);
        assert_eq!(alarms.current(after), vec![(series("skipped", "new"), 1)]);

        let mut alarms = SandboxAlarms::default();
        for cookie in 0..MAX_ALARMS as u64 + 10 {
            let at = start + Duration::from_millis(cookie);
            alarms.record(cookie, Verdict::Skipped, None, at);
        }
        assert_eq!(alarms.by_netns.len(), MAX_ALARMS);
        assert!(!alarms.by_netns.contains_key(&0), "the oldest goes first");
        assert!(alarms.by_netns.contains_key(&(MAX_ALARMS as u64 + 9)));
    }
}
