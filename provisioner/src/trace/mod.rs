//! eBPF loading (aya), event decoding, correlation, verdicts, the `trace` session.

mod btf_offsets;
mod error;
mod events;
mod kernel_fs;
mod loader;

pub use btf_offsets::KernelOffsets;
pub use error::TraceError;
pub use events::{EventKind, NetnsCreated, NetnsOrigin, TaskInfo, TraceEvent};
pub use loader::{KernelTracer, LossCounters};
