//! eBPF loading (aya), event decoding, correlation, verdicts, the `trace` session.

mod btf_offsets;
pub mod correlator;
mod error;
mod events;
mod kernel_fs;
mod loader;
pub mod netlink_parse;
pub mod sandbox_rules;
pub mod verdict;

pub use btf_offsets::KernelOffsets;
pub use correlator::{Correlator, CorrelatorConfig, CorrelatorMetrics, NetnsKey};
pub use error::TraceError;
pub use events::{
    BindMount, DevChange, EventKind, Exec, Extack, NetlinkIo, NetlinkReply, NetlinkRequest,
    NetnsCreated, NetnsOrigin, NetnsRef, TaskInfo, TraceEvent,
};
pub use loader::{KernelTracer, LossCounters};
pub use sandbox_rules::{SandboxReason, SandboxRules};
pub use verdict::{
    Creator, Drift, Intent, IntentId, IntentStatus, IntentVerdict, NetnsVerdict, Report,
    RouteIntent, SkipSummary, Step, TimelineEntry, Verdict,
};
