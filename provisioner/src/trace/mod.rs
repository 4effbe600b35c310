//! eBPF loading (aya), event decoding, correlation, verdicts, the `trace` session.

mod btf_offsets;
mod error;
mod events;
mod kernel_fs;
mod loader;
pub mod netlink_parse;

pub use btf_offsets::KernelOffsets;
pub use error::TraceError;
pub use events::{
    BindMount, DevChange, EventKind, Exec, Extack, NetlinkIo, NetlinkReply, NetlinkRequest,
    NetnsCreated, NetnsOrigin, NetnsRef, TaskInfo, TraceEvent,
};
pub use loader::{KernelTracer, LossCounters};
