//! eBPF loading (aya), event decoding, correlation, verdicts, the `trace` session.

mod background;
mod btf_offsets;
pub mod cni_env;
pub mod correlator;
pub mod diagnosis;
pub mod driver;
mod error;
mod events;
mod kernel_fs;
mod loader;
pub mod metrics;
pub mod netlink_parse;
pub mod netns_id;
pub mod render;
pub mod sandbox_rules;
pub mod session;
pub mod verdict;

pub use btf_offsets::KernelOffsets;
pub use correlator::{
    Correlator, CorrelatorConfig, CorrelatorMetrics, IntentCounts, PodQuery, SNAPSHOT_WAIT,
    SnapshotRequest,
};
pub use error::TraceError;
pub use events::{
    BindMount, DevChange, EventKind, Exec, ExecEnv, Extack, NetlinkIo, NetlinkReply,
    NetlinkRequest, NetnsCreated, NetnsOrigin, NetnsRef, TaskInfo, TraceEvent,
};
/// The ring-buffer record decoder, public for the fuzz targets (fuzz/).
#[doc(hidden)]
pub use events::{Clock, decode};
pub use loader::{
    EventBatch, KernelTracer, LossCounters, NamespaceHooks, RingUsage, load_syscall_fallback,
};
pub use metrics::TraceMetrics;
pub use netns_id::netns_of_path;
pub use sandbox_rules::{SandboxReason, SandboxRules};
pub use session::{SessionOptions, SessionSummary};
pub use verdict::{
    Creator, Drift, Evidence, Intent, IntentKey, IntentOrigin, IntentStatus, IntentVerdict,
    NetnsVerdict, Report, RouteIntent, SkipSummary, Step, TimelineEntry, Verdict,
};
