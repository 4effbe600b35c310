//! The kernel watch: the kernel-facing half (`kernel/`: eBPF loading and backends, BTF,
//! decoding), the judging half (`correlator/`, verdicts, diagnosis), the driver that runs one
//! against the other for the daemon and for `provisioner trace`, and that session.

mod background;
pub mod cni_env;
pub mod correlator;
mod counters;
pub mod diagnosis;
pub mod driver;
pub mod kernel;
pub mod render;
pub mod sandbox_rules;
pub mod session;
pub mod verdict;

pub use correlator::{
    Correlator, CorrelatorConfig, CorrelatorMetrics, IntentCounts, PodQuery, SNAPSHOT_WAIT,
    SnapshotRequest,
};
pub use counters::TraceMetrics;
pub use kernel::btf::KernelOffsets;
pub use kernel::events::{
    BindMount, DevChange, EventKind, Exec, ExecEnv, Extack, NetlinkIo, NetlinkReply,
    NetlinkRequest, NetnsCreated, NetnsOrigin, NetnsRef, TaskInfo, TraceEvent,
};
/// The ring-buffer record decoder, public for the fuzz targets (fuzz/).
#[doc(hidden)]
pub use kernel::events::{Clock, decode};
pub use kernel::netlink_parse;
pub use kernel::{
    Attached, Backend, BackendChoices, EventBatch, KernelTracer, LossCounters, NetnsIds,
    Observation, ObservationStatus, ProgramCheck, RingUsage, TraceError, check_every_backend,
    netns_of_path,
};
pub use sandbox_rules::{SandboxReason, SandboxRules};
pub use session::{SessionOptions, SessionSummary};
pub use verdict::{
    Creator, Drift, Evidence, Intent, IntentKey, IntentOrigin, IntentStatus, IntentVerdict,
    NetnsVerdict, Report, RouteIntent, SkipSummary, Step, TimelineEntry, Verdict,
};
