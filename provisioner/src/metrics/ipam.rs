//! Address usage per range of the network in force: `provisioner_ipam_addresses_allocated` and
//! `provisioner_ipam_addresses_capacity`, so that free addresses are one expression.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::ipam::{Allocator, IpamError};

/// One range's usage.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeUsage {
    pub network: String,
    /// `start-end`.
    pub range: String,
    pub subnet: String,
    /// Addresses held in the range (allocated, adopted, or reserved from an earlier config).
    pub allocated: u64,
    /// Addresses the range can hand out: `start..=end` without the gateway.
    pub capacity: u128,
}

/// Copies the address usage of the network in force (its allocator; `None` when there is none)
/// into `metrics`. A store that cannot be read leaves the ranges out of the scrape, and says why
/// in the log, as no network in force does.
pub fn refresh(metrics: &super::Metrics, allocator: Option<&Allocator>) {
    metrics.set_ranges(match allocator.map(usage) {
        Some(Ok(usage)) => usage,
        Some(Err(err)) => {
            tracing::warn!(error = %err, "address usage for metrics could not be read");
            Vec::new()
        }
        None => Vec::new(),
    });
}

/// The usage of every range `allocator` allocates from.
fn usage(allocator: &Allocator) -> Result<Vec<RangeUsage>, IpamError> {
    let mut out = Vec::new();
    for set in allocator.ranges().sets() {
        for range in set.ranges() {
            out.push(RangeUsage {
                network: allocator.network().to_owned(),
                range: format!("{}-{}", range.start(), range.end()),
                subnet: range.subnet().to_string(),
                allocated: allocator.held_in(range)?,
                capacity: range.size(),
            });
        }
    }
    Ok(out)
}

type Value = fn(&RangeUsage) -> f64;

#[derive(Debug)]
pub struct RangeCollector(pub std::sync::Arc<std::sync::Mutex<Vec<RangeUsage>>>);

impl Collector for RangeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ranges = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let families: [(&str, &str, Value); 2] = [
            (
                "ipam_addresses_allocated",
                "Addresses held in each range of the network in force",
                |r| r.allocated as f64,
            ),
            (
                "ipam_addresses_capacity",
                "Addresses each range of the network in force can hand out (gateway excluded)",
                |r| r.capacity as f64,
            ),
        ];
        for (name, help, value) in families {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for r in ranges.iter() {
                let labels = [
                    ("network", r.network.as_str()),
                    ("range", r.range.as_str()),
                    ("subnet", r.subnet.as_str()),
                ];
                ConstGauge::new(value(r)).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
