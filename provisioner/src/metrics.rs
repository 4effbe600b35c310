//! Prometheus metrics and their text exposition, served over HTTP (`http`) with the health
//! endpoints.
//!
//! Names follow Prometheus's conventions: counters end in `_total`, label names say what they
//! hold, label values are lower case. The daemon's own metrics are prefixed `provisioner_`, the
//! standard process metrics are `process_*`.

pub mod alarms;
pub mod build_info;
pub mod http;
pub mod ipam;
pub mod process;

pub use http::{DEFAULT_PORT, MAX_HTTP_CONNECTIONS, serve};

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::trace::{TraceMetrics, Verdict};

use alarms::{AlarmCollector, AlarmSeries};
use ipam::{RangeCollector, RangeUsage};

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

/// The tracer's counters, copied in before each scrape.
#[derive(Debug, Default)]
struct TraceExport(Option<TraceMetrics>);

#[derive(Debug)]
struct TraceCollector(Arc<Mutex<TraceExport>>);

/// One family of values by one label.
fn family<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    label: &'static str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (value, n) in values {
        let labels = [(label, value)];
        let sample = metric.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(n).encode(sample)?,
            _ => ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(sample)?,
        }
    }
    Ok(())
}

fn single(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    n: u64,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, kind)?;
    match kind {
        MetricType::Counter => ConstCounter::new(n).encode(metric),
        _ => ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(metric),
    }
}

/// Revisions by the alarm revised, every alarm verdict present (0 until one is revised): a
/// series that appears only at its first revision has no increase Prometheus can see.
fn revised_by_alarm<'a>(
    revised: &'a std::collections::BTreeMap<&'static str, u64>,
) -> impl Iterator<Item = (&'static str, u64)> + 'a {
    Verdict::ALL
        .into_iter()
        .filter(|v| !matches!(v, Verdict::Networked | Verdict::Gone))
        .map(|v| (v.as_str(), revised.get(v.as_str()).copied().unwrap_or(0)))
}

impl Collector for TraceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let export = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let up = export.0.is_some();
        single(
            &mut encoder,
            "tracing_up",
            "1 when kernel tracing of sandbox network setup runs",
            MetricType::Gauge,
            u64::from(up),
        )?;
        let Some(trace) = &export.0 else {
            return Ok(());
        };
        encode_backends(&mut encoder, trace)?;
        encode_verdicts(&mut encoder, trace)?;
        encode_events(&mut encoder, trace)?;
        encode_tracker_state(&mut encoder, trace)
    }
}

/// What each observation of the kernel watch runs on: one series per observation, its
/// backend `unavailable` when it has none.
fn encode_backends(
    encoder: &mut DescriptorEncoder,
    trace: &TraceMetrics,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(
        "tracing_backend",
        "1 for the backend each observation of the kernel watch runs on (docs/install.md)",
        None,
        MetricType::Gauge,
    )?;
    for status in &trace.observations {
        let backend = status.backend.map_or("unavailable", |b| b.name());
        let labels = [
            ("observation", status.observation.name()),
            ("backend", backend),
        ];
        ConstGauge::new(1).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The verdicts on sandboxes, their revisions, and the daemon's setups checked against them.
fn encode_verdicts(
    encoder: &mut DescriptorEncoder,
    trace: &TraceMetrics,
) -> Result<(), std::fmt::Error> {
    let m = &trace.correlator;
    let c = MetricType::Counter;
    family(
        encoder,
        "sandbox_verdicts",
        "Verdicts on sandbox network setups (a revised verdict counts again)",
        c,
        "verdict",
        m.verdicts.iter().map(|(k, v)| (*k, *v)),
    )?;
    family(
        encoder,
        "sandbox_verdicts_revised",
        "Alarms revised to networked because the network arrived after the deadline",
        c,
        "alarm",
        revised_by_alarm(&m.revised),
    )?;
    family(
        encoder,
        "sandbox_intents",
        "The daemon's setups checked against the kernel, by outcome",
        c,
        "status",
        [
            ("confirmed", m.intents.confirmed),
            ("unconfirmed", m.intents.unconfirmed),
            ("drifted", m.intents.drifted),
        ],
    )?;
    single(
        encoder,
        "sandbox_drifts",
        "Interfaces, addresses or routes of confirmed sandboxes that went missing",
        c,
        m.intents.drifts,
    )
}

/// The kernel events correlated and those lost, by kind (and cause).
fn encode_events(
    encoder: &mut DescriptorEncoder,
    trace: &TraceMetrics,
) -> Result<(), std::fmt::Error> {
    let m = &trace.correlator;
    let c = MetricType::Counter;
    family(
        encoder,
        "trace_events",
        "Kernel events correlated, by kind",
        c,
        "kind",
        m.events.iter().map(|(k, v)| (*k, *v)),
    )?;
    let mut lost = encoder.encode_descriptor(
        "trace_lost_events",
        "Kernel events lost, by kind and cause",
        None,
        c,
    )?;
    let causes = [
        ("ring_buffer_full", &trace.lost_by_kind),
        ("undecodable", &trace.undecodable_by_kind),
        ("netns_unreadable", &trace.netns_unreadable_by_kind),
    ];
    for (cause, by_kind) in causes {
        for (kind, n) in by_kind {
            let labels = [("kind", *kind), ("cause", cause)];
            ConstCounter::new(*n).encode(lost.encode_family(&labels)?)?;
        }
    }
    for (kind, n) in [
        ("namespace", m.evicted_namespaces),
        ("request_pairing", m.dropped_requests),
    ] {
        let labels = [("kind", kind), ("cause", "memory_bound")];
        ConstCounter::new(n).encode(lost.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The namespace snapshots, the namespaces tracked and the ring buffer's use.
fn encode_tracker_state(
    encoder: &mut DescriptorEncoder,
    trace: &TraceMetrics,
) -> Result<(), std::fmt::Error> {
    let m = &trace.correlator;
    family(
        encoder,
        "trace_snapshots",
        "Namespace states read from the kernel, by result",
        MetricType::Counter,
        "result",
        [("ok", m.snapshots_taken), ("failed", m.snapshots_failed)],
    )?;
    single(
        encoder,
        "trace_tracked_namespaces",
        "Network namespaces the correlator tracks now",
        MetricType::Gauge,
        m.tracked_namespaces as u64,
    )?;
    single(
        encoder,
        "trace_ring_bytes",
        "Size of the kernel-to-daemon ring buffer of trace records",
        MetricType::Gauge,
        trace.ring.bytes,
    )?;
    single(
        encoder,
        "trace_ring_backlog_peak_bytes",
        "The most bytes of trace records drained from the ring buffer at once",
        MetricType::Gauge,
        trace.ring.backlog_peak_bytes,
    )
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

    #[test]
    fn tracing_down_is_said() {
        let metrics = Metrics::new();
        metrics.set_trace(None);
        let text = metrics.encode();
        assert!(
            text.lines().any(|l| l == "provisioner_tracing_up 0"),
            "{text}"
        );
        assert!(!text.contains("sandbox_verdicts"), "{text}");
    }
}
