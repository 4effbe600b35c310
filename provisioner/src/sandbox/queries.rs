//! Read-only questions about the sandboxes of a service.

use crate::ipam::Allocation;

use super::traits::{AllocationStore, SandboxDataplane};
use super::{SandboxError, SandboxService};

impl<D: SandboxDataplane, A: AllocationStore> SandboxService<D, A> {
    /// Every allocation of this network.
    pub async fn list(&self) -> Result<Vec<Allocation>, SandboxError> {
        self.blocking("allocation store", |allocator| allocator.list())
            .await
    }

    /// How many allocations this network holds.
    pub async fn count(&self) -> Result<u64, SandboxError> {
        self.blocking("allocation store", |allocator| allocator.count())
            .await
    }
}
