//! provisioner: gives container sandboxes their network through netlink and proves, from the
//! kernel, that every sandbox really got it.
//!
//! Dependency direction is one way: `daemon` -> `sandbox` -> {`ipam`, `dataplane`}, and
//! `daemon` -> {`cni`, `config`, `trace`}, `trace` -> `runtime`.
//! None of those import `daemon`; `cni` does not know netlink; `dataplane` does not know CNI JSON.

pub mod cni;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod failpoint;
pub mod ipam;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod pod;
pub mod runtime;
pub mod sandbox;
pub mod trace;
