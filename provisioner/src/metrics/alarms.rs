//! The sandboxes whose latest verdict is an alarm (skipped, partial, failed), kept for a window
//! so that an alert can name each one's pod: `provisioner_sandbox_alarm`.

use std::collections::HashMap;
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

/// One series of the gauge, one sandbox: its verdict, its pod (empty when not known) and its
/// network namespace's cookie (as `provisioner sandboxes` shows it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlarmSeries {
    pub verdict: &'static str,
    pub pod_namespace: String,
    pub pod_name: String,
    pub netns_cookie: u64,
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
            netns_cookie,
        };
        self.by_netns
            .insert(netns_cookie, Alarm { series, at: now });
    }

    /// The alarms younger than [`ALARM_WINDOW`], in order; older ones are forgotten.
    pub fn current(&mut self, now: Instant) -> Vec<AlarmSeries> {
        self.by_netns
            .retain(|_, alarm| now.saturating_duration_since(alarm.at) < ALARM_WINDOW);
        let mut current: Vec<AlarmSeries> =
            self.by_netns.values().map(|a| a.series.clone()).collect();
        current.sort();
        current
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
    alarms: &[AlarmSeries],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(
        "sandbox_alarm",
        "1 for each sandbox whose latest verdict, within the last 15 minutes, is skipped, \
         partial or failed, by verdict, pod (empty when not known) and netns cookie",
        None,
        MetricType::Gauge,
    )?;
    for series in alarms {
        let cookie = series.netns_cookie.to_string();
        let labels = [
            ("verdict", series.verdict),
            ("pod_namespace", series.pod_namespace.as_str()),
            ("pod_name", series.pod_name.as_str()),
            ("netns_cookie", cookie.as_str()),
        ];
        ConstGauge::new(1).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

#[derive(Debug)]
pub struct AlarmCollector(pub std::sync::Arc<std::sync::Mutex<Vec<AlarmSeries>>>);

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

    fn series(verdict: &'static str, name: &str, netns_cookie: u64) -> AlarmSeries {
        AlarmSeries {
            verdict,
            pod_namespace: if name.is_empty() { "" } else { "default" }.into(),
            pod_name: name.into(),
            netns_cookie,
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
                series("failed", "", 4),
                series("partial", "b", 2),
                series("skipped", "", 5),
                series("skipped", "", 6),
                series("skipped", "a", 1),
            ]
        );
        alarms.record(1, Verdict::Networked, Some(&pod("a")), now);
        alarms.record(2, Verdict::Failed, Some(&pod("b")), now);
        assert_eq!(
            alarms.current(now),
            vec![
                series("failed", "", 4),
                series("failed", "b", 2),
                series("skipped", "", 5),
                series("skipped", "", 6),
            ]
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
        assert_eq!(alarms.current(after), vec![series("skipped", "new", 2)]);

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
