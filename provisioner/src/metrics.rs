//! Prometheus metrics and their text exposition on a loopback HTTP endpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Operation {
    Add,
    Del,
    Check,
    Gc,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: Operation,
    /// `ok` or the CNI error code.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpKindLabels {
    pub op: Operation,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabels {
    pub name: String,
}

/// Everything the daemon exports.
pub struct Metrics {
    registry: Registry,
    operations: Family<OpLabels, Counter>,
    durations: Family<OpKindLabels, Histogram>,
    /// Sandbox namespaces by tracer verdict (networked, skipped, ...).
    pub verdicts: Family<NameLabels, Gauge>,
    /// Kernel events received, by kind.
    pub trace_events: Family<NameLabels, Gauge>,
    /// Kernel events lost (ring buffer full or undecodable), by kind.
    pub trace_lost: Family<NameLabels, Gauge>,
    pub ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("provisioner");
        let operations = Family::<OpLabels, Counter>::default();
        let durations = Family::<OpKindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_25, 2.0, 14))
        });
        let verdicts = Family::<NameLabels, Gauge>::default();
        let trace_events = Family::<NameLabels, Gauge>::default();
        let trace_lost = Family::<NameLabels, Gauge>::default();
        let ready = Gauge::default();
        registry.register("operations", "CNI operations by result", operations.clone());
        registry.register(
            "operation_duration_seconds",
            "Time to serve an operation (setup latency for add)",
            durations.clone(),
        );
        registry.register(
            "sandboxes",
            "Sandbox namespaces by verdict",
            verdicts.clone(),
        );
        registry.register(
            "trace_events",
            "Kernel events received by kind",
            trace_events.clone(),
        );
        registry.register(
            "trace_lost_events",
            "Kernel events lost by kind",
            trace_lost.clone(),
        );
        registry.register("ready", "1 when the daemon is ready", ready.clone());
        Self {
            registry,
            operations,
            durations,
            verdicts,
            trace_events,
            trace_lost,
            ready,
        }
    }

    /// Records one finished operation.
    pub fn observe(&self, op: Operation, result: &str, took: Duration) {
        self.operations
            .get_or_create(&OpLabels {
                op: op.clone(),
                result: result.to_owned(),
            })
            .inc();
        self.durations
            .get_or_create(&OpKindLabels { op })
            .observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves `GET /metrics` on `addr` until the task is dropped. `refresh` runs before each
/// scrape to copy values that live elsewhere (readiness, tracer counters) into the gauges.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    refresh: Arc<dyn Fn(&Metrics) + Send + Sync>,
) -> std::io::Result<()> {
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "metrics endpoint is not on loopback");
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "metrics on http://{addr}/metrics");
    loop {
        let (mut stream, _) = listener.accept().await?;
        let metrics = Arc::clone(&metrics);
        let refresh = Arc::clone(&refresh);
        tokio::spawn(async move {
            let mut head = vec![0u8; 2048];
            let n = match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut head)).await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&head[..n]);
            let response = if request.starts_with("GET /metrics") {
                refresh(&metrics);
                let body = metrics.encode();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_owned()
            };
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_operations_and_results() {
        let metrics = Metrics::new();
        metrics.observe(Operation::Add, "ok", Duration::from_millis(2));
        metrics.observe(Operation::Add, "101", Duration::from_millis(1));
        metrics
            .verdicts
            .get_or_create(&NameLabels {
                name: "skipped".into(),
            })
            .set(3);
        let text = metrics.encode();
        assert!(
            text.contains(r#"provisioner_operations_total{op="Add",result="ok"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"result="101""#), "{text}");
        assert!(
            text.contains(r#"provisioner_sandboxes{name="skipped"} 3"#),
            "{text}"
        );
        assert!(
            text.contains("provisioner_operation_duration_seconds_bucket"),
            "{text}"
        );
    }
}
