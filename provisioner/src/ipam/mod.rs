//! IPAM: validated address ranges (host-local config shape), a durable crash-safe allocator over
//! them backed by redb, and the report used to reconcile a store written by another config.
//!
//! - [`config`]: the wire config and its validation into [`RangeSets`]
//! - [`range`]: ranges, range sets, address arithmetic
//! - [`store`]: the redb file and its tables
//! - [`allocator`]: allocate / release / get / list
//! - [`damage`]: a damaged store file told apart from a refusing environment, kept aside
//! - [`adopt`]: reserving what the kernel shows routed but the store does not hold
//! - [`withdrawal`]: a release held back from allocations while the kernel withdraws it
//! - [`error`]: the error type, [`IpamError`]

pub mod adopt;
pub mod allocation;
pub mod allocator;
pub mod config;
pub mod damage;
pub mod error;
pub mod range;
pub mod store;
pub mod withdrawal;

pub use adopt::{ADOPTED_PREFIX, AdoptReport, RoutedOwner};
pub use allocation::{AllocatedIp, Allocation, AllocationKey};
pub use allocator::{Allocator, OpenReport, Reservation, STORE_FORMAT};
pub use config::{IpamConfig, RangeConfig, RouteConfig};
pub use error::IpamError;
pub use range::{Family, IpRange, RangeSet, RangeSets};

#[cfg(test)]
mod format_tests;
