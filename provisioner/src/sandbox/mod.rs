//! One sandbox's network, end to end: durable address reservation (ipam) + wiring (dataplane)
//! + verification, with the rollback rules that keep the two consistent.
//!
//! Rules: an address is handed out again only once the kernel objects that route it are gone
//! (DEL releases it during its teardown, held back from allocations until the teardown is
//! done, and written back if the teardown fails); an
//! allocation that existed before an ADD (a duplicate ADD, or a retry) is never released by that
//! ADD's failure; ADD reports success only after `check` saw the interface with its addresses.

mod cni_result;
mod error;
mod key_locks;
mod network;
mod observer;
mod queries;
mod service;
mod traits;

pub use error::SandboxError;
pub use key_locks::{KeyGuard, KeyLocks};
pub use network::Network;
pub use observer::{NoObserver, Removal, SandboxObserver};
pub use service::{AddOutcome, DelOutcome, GcOutcome, SandboxRef, SandboxService, host_link_of};
pub use traits::{AllocationStore, SandboxDataplane};
