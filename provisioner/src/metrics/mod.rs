//! Prometheus metrics: the registry of everything the daemon exports and its text exposition
//! (here, with the operations served and readiness), one file per family of figures and where
//! it is copied in from (`trace`, `ipam`, `alarms`, `process`, `build_info`), and the HTTP
//! endpoints that serve them with the health endpoints (`http`).
//!
//! Names follow Prometheus's conventions: counters end in `_total`, label names say what they
//! hold, label values are lower case. The daemon's own metrics are prefixed `provisioner_`, the
//! standard process metrics are `process_*`.

pub mod alarms;
mod build_info;
pub mod http;
pub mod ipam;
mod process;
pub mod trace;

pub use http::{DEFAULT_PORT, MAX_HTTP_CONNECTIONS, serve};

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::trace::TraceMetrics;

use alarms::{AlarmCollector, AlarmSeries};
use ipam::{RangeCollector, RangeUsage};
use trace::{TraceCollector, TraceExport};

/// The operation deadline the histogram reaches when none is given (the daemon's default).
pub const DEFAULT_OPERATION_DEADLINE: Duration = Duration::from_secs(30);
/// The smallest bucket of the operation histogram; each next one doubles it.
const FIRST_BUCKET_SECONDS: f64 = 0.000_25;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Operation {
    Add,
    Del,
    Check,
    Gc,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Del => "del",
            Self::Check => "check",
            Self::Gc => "gc",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
    /// `ok` or the CNI error code.
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpKindLabels {
    op: &'static str,
}

/// Everything the daemon exports.
pub struct Metrics {
    registry: Registry,
    operations: Family<OpLabels, Counter>,
    durations: Family<OpKindLabels, Histogram, DurationBuckets>,
    pub ready: Gauge,
    trace: Arc<Mutex<TraceExport>>,
    ranges: Arc<Mutex<Vec<RangeUsage>>>,
    alarms: Arc<Mutex<Vec<AlarmSeries>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Buckets doubling from 0.25 ms until one reaches past `deadline`: an operation that ran into
/// its deadline still lands in a bucket of its own, not only in `+Inf`.
fn duration_buckets(deadline: Duration) -> Vec<f64> {
    let deadline = deadline.as_secs_f64();
    let mut buckets = vec![FIRST_BUCKET_SECONDS];
    while buckets.last().is_some_and(|b| *b <= deadline) && buckets.len() < 64 {
        buckets.push(buckets.last().copied().unwrap_or(FIRST_BUCKET_SECONDS) * 2.0);
    }
    buckets
}

/// Makes each operation's histogram with the buckets of [`duration_buckets`].
#[derive(Clone, Debug)]
struct DurationBuckets(Vec<f64>);

impl MetricConstructor<Histogram> for DurationBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_operation_deadline(DEFAULT_OPERATION_DEADLINE)
    }

    /// Metrics whose operation histogram reaches past `deadline` (`--operation-timeout`).
    pub fn with_operation_deadline(deadline: Duration) -> Self {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("provisioner");
        let operations = Family::<OpLabels, Counter>::default();
        let durations = Family::new_with_constructor(DurationBuckets(duration_buckets(deadline)));
        let ready = Gauge::default();
        registry.register(
            "operations",
            "CNI operations served, by operation and result (ok or the CNI error code)",
            operations.clone(),
        );
        registry.register(
            "operation_duration_seconds",
            "Time to serve an operation",
            durations.clone(),
        );
        registry.register("ready", "1 when the daemon is ready", ready.clone());
        let trace = Arc::new(Mutex::new(TraceExport::default()));
        registry.register_collector(Box::new(TraceCollector(Arc::clone(&trace))));
        let ranges = Arc::new(Mutex::new(Vec::new()));
        registry.register_collector(Box::new(RangeCollector(Arc::clone(&ranges))));
        let alarms = Arc::new(Mutex::new(Vec::new()));
        registry.register_collector(Box::new(AlarmCollector(Arc::clone(&alarms))));
        registry.register_collector(Box::new(build_info::BuildInfo::default()));
        Self {
            registry: root,
            operations,
            durations,
            ready,
            trace,
            ranges,
            alarms,
        }
    }

    /// Records one finished operation.
    pub fn observe(&self, op: Operation, result: &str, took: Duration) {
        self.operations
            .get_or_create(&OpLabels {
                op: op.as_str(),
                result: result.to_owned(),
            })
            .inc();
        self.durations
            .get_or_create(&OpKindLabels { op: op.as_str() })
            .observe(took.as_secs_f64());
    }

    /// The kernel tracer's counters as of now; `None` when tracing does not run.
    pub fn set_trace(&self, trace: Option<TraceMetrics>) {
        *self.trace.lock().unwrap_or_else(PoisonError::into_inner) = TraceExport(trace);
    }

    /// The address usage of the network in force; empty when there is none.
    pub fn set_ranges(&self, ranges: Vec<RangeUsage>) {
        *self.ranges.lock().unwrap_or_else(PoisonError::into_inner) = ranges;
    }

    /// The current sandbox alarms ([`alarms::SandboxAlarms::current`]).
    pub fn set_alarms(&self, alarms: Vec<AlarmSeries>) {
        *self.alarms.lock().unwrap_or_else(PoisonError::into_inner) = alarms;
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn exposition_follows_prometheus_conventions() {
        let metrics = Metrics::new();
        metrics.observe(Operation::Add, "ok", Duration::from_millis(2));
        metrics.observe(Operation::Add, "101", Duration::from_millis(1));
        let mut trace = TraceMetrics::default();
        trace.correlator.verdicts = BTreeMap::from([("skipped", 3), ("networked", 0)]);
        trace.correlator.events = BTreeMap::from([("netns_created", 7)]);
        trace.correlator.intents.confirmed = 2;
        trace.observations = vec![
            crate::trace::ObservationStatus {
                observation: crate::trace::Observation::Rtnetlink,
                backend: Some(crate::trace::Backend::SyscallTracepoints),
                detail: String::new(),
            },
            crate::trace::ObservationStatus {
                observation: crate::trace::Observation::ErrorMessages,
                backend: None,
                detail: "no netlink_extack tracepoint".to_owned(),
            },
        ];
        metrics.set_trace(Some(trace));
        let text = metrics.encode();
        for line in [
            r#"provisioner_tracing_backend{observation="rtnetlink",backend="syscall_tracepoints"} 1"#,
            r#"provisioner_tracing_backend{observation="error_messages",backend="unavailable"} 1"#,
            r#"provisioner_operations_total{op="add",result="ok"} 1"#,
            r#"provisioner_operations_total{op="add",result="101"} 1"#,
            r#"provisioner_sandbox_verdicts_total{verdict="skipped"} 3"#,
            r#"provisioner_trace_events_total{kind="netns_created"} 7"#,
            r#"provisioner_sandbox_intents_total{status="confirmed"} 2"#,
            "provisioner_tracing_up 1",
            r#"provisioner_sandbox_verdicts_revised_total{alarm="skipped"} 0"#,
            r#"provisioner_sandbox_verdicts_revised_total{alarm="failed"} 0"#,
            "# TYPE provisioner_trace_events_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(
            text.lines()
                .any(|l| l == r#"provisioner_operation_duration_seconds_count{op="add"} 2"#),
            "{text}"
        );
        // Each observation lands in the buckets at or above it: 0 below 1 ms, 1 from 1 ms
        // (the 1 ms call), 2 from 2 ms, counts never decreasing.
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("provisioner_operation_duration_seconds_bucket{")?;
                if !rest.contains(r#"op="add""#) {
                    return None;
                }
                let le = rest.split("le=\"").nth(1)?.split('"').next()?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, l.rsplit(' ').next()?.parse().ok()?))
            })
            .collect();
        assert!(buckets.len() > 3, "{text}");
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{buckets:?}"
        );
        for (le, count) in &buckets {
            let want = match *le {
                le if le < 0.000_999 => 0,
                le if le < 0.001_999 => 1,
                _ => 2,
            };
            assert_eq!(*count, want, "bucket le={le}: {buckets:?}");
        }
    }

    #[test]
    fn duration_buckets_reach_past_the_deadline() {
        for deadline in [Duration::from_secs(30), Duration::from_millis(100)] {
            let buckets = duration_buckets(deadline);
            let last = buckets.last().copied().unwrap_or_default();
            assert!(last > deadline.as_secs_f64(), "{deadline:?}: {buckets:?}");
            assert!(
                last <= 2.0 * deadline.as_secs_f64(),
                "{deadline:?}: {buckets:?}"
            );
            assert_eq!(buckets.first(), Some(&FIRST_BUCKET_SECONDS));
        }
        let metrics = Metrics::with_operation_deadline(Duration::from_secs(30));
        metrics.observe(Operation::Del, "ok", Duration::from_secs(29));
        let text = metrics.encode();
        assert!(
            text.lines().any(|l| l.starts_with(
                r#"provisioner_operation_duration_seconds_bucket{op="del",le="32.768"} 1"#
            )),
            "{text}"
        );
    }

    #[test]
    fn operator_metrics_are_served() {
        let metrics = Metrics::new();
        metrics.set_ranges(vec![RangeUsage {
            network: "pods".into(),
            range: "10.9.0.2-10.9.0.14".into(),
            subnet: "10.9.0.0/28".into(),
            allocated: 12,
            capacity: 13,
        }]);
        metrics.set_alarms(vec![AlarmSeries {
            verdict: "skipped",
            pod_namespace: "default".into(),
            pod_name: "web-0".into(),
            netns_cookie: 4097,
        }]);
        let text = metrics.encode();
        let labels = r#"network="pods",range="10.9.0.2-10.9.0.14",subnet="10.9.0.0/28""#;
        for line in [
            format!("provisioner_ipam_addresses_allocated{{{labels}}} 12.0"),
            format!("provisioner_ipam_addresses_capacity{{{labels}}} 13.0"),
            r#"provisioner_sandbox_alarm{verdict="skipped",pod_namespace="default",pod_name="web-0",netns_cookie="4097"} 1"#.to_owned(),
            format!(
                r#"provisioner_build_info{{version="{}",revision="{}",ebpf_abi="{}"}} 1"#,
                env!("CARGO_PKG_VERSION"),
                build_info::REVISION,
                build_info::ebpf_abi()
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert_eq!(
            build_info::ebpf_abi().len(),
            16,
            "{}",
            build_info::ebpf_abi()
        );
        for name in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_cpu_seconds_total",
            "process_start_time_seconds",
        ] {
            assert!(
                text.lines().any(|l| l.split(' ').next() == Some(name)),
                "{name} missing in\n{text}"
            );
        }
    }
}
