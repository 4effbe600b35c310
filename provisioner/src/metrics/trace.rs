//! The kernel tracer's figures: `provisioner_tracing_up`, the backend of each observation, the
//! verdicts on sandboxes, the kernel events correlated and lost, and the correlator's state;
//! copied in from the kernel watch before each scrape ([`refresh`]).

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::trace::{TraceMetrics, Verdict};

use super::Metrics;

/// Copies the kernel watch's counters into `metrics`: `kernel` is what the watch reports (why
/// tracing is unavailable, if it is, and its counters), `None` when the daemon runs without it.
/// Unavailable tracing exports as down, as no tracing does.
pub fn refresh(metrics: &Metrics, kernel: Option<(Option<String>, TraceMetrics)>) {
    let trace = kernel.and_then(|(unavailable, trace)| unavailable.is_none().then_some(trace));
    metrics.set_trace(trace);
}

/// The tracer's counters, copied in before each scrape.
#[derive(Debug, Default)]
pub(super) struct TraceExport(pub(super) Option<TraceMetrics>);

#[derive(Debug)]
pub(super) struct TraceCollector(pub(super) Arc<Mutex<TraceExport>>);

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

    #[test]
    fn unavailable_tracing_exports_as_down() {
        let metrics = Metrics::new();
        refresh(&metrics, Some((None, TraceMetrics::default())));
        assert!(
            metrics
                .encode()
                .lines()
                .any(|l| l == "provisioner_tracing_up 1")
        );
        refresh(
            &metrics,
            Some((Some("no BTF".to_owned()), TraceMetrics::default())),
        );
        assert!(
            metrics
                .encode()
                .lines()
                .any(|l| l == "provisioner_tracing_up 0")
        );
        refresh(&metrics, None);
        assert!(
            metrics
                .encode()
                .lines()
                .any(|l| l == "provisioner_tracing_up 0")
        );
    }
}
