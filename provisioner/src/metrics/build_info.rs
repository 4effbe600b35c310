//! `provisioner_build_info`: which build runs, as labels of a constant 1.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// The git revision the binary was built from (`build.rs`), `unknown` outside a checkout.
pub const REVISION: &str = env!("PROVISIONER_REVISION");

/// The record layout hash the eBPF loader checks the embedded object against.
pub fn ebpf_abi() -> String {
    let tag = provisioner_common::abi_tag();
    let hash = tag
        .strip_prefix(provisioner_common::ABI_MARKER.as_slice())
        .unwrap_or(&tag);
    String::from_utf8_lossy(hash).into_owned()
}

#[derive(Debug)]
pub struct BuildInfo {
    ebpf_abi: String,
}

impl Default for BuildInfo {
    fn default() -> Self {
        Self {
            ebpf_abi: ebpf_abi(),
        }
    }
}

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(
            "build_info",
            "The running build: version, git revision, eBPF record layout hash (always 1)",
            None,
            MetricType::Gauge,
        )?;
        let labels = [
            ("version", env!("CARGO_PKG_VERSION")),
            ("revision", REVISION),
            ("ebpf_abi", self.ebpf_abi.as_str()),
        ];
        ConstGauge::new(1).encode(metric.encode_family(&labels)?)
    }
}
