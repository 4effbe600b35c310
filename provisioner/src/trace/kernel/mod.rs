//! The kernel-facing half of the watch: what it observes and the backends each kernel offers
//! for it, the eBPF object's loading and attachment, the struct offsets read from BTF, the
//! ring buffer and the decoding of its records, and how namespaces are named. Nothing here
//! judges; the correlator (`trace/correlator/`) never learns which backend saw an event.

pub mod backends;
pub mod btf;
mod error;
pub mod events;
mod kernel_fs;
pub mod loader;
pub mod netlink_parse;
pub mod netns_ids;
pub mod ring;

pub use backends::{Backend, BackendChoices, Observation, ObservationStatus};
pub use error::TraceError;
pub use loader::{Attached, KernelTracer, ProgramCheck, check_every_backend};
pub use netns_ids::{NetnsIds, netns_of_path};
pub use ring::{EventBatch, LossCounters, RingUsage};
