//! ADD / DEL / CHECK of one sandbox over an allocator and a dataplane.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dataplane::{
    Dataplane, DataplaneError, PodAddress, RouteSpec, SandboxSpec, SetupOutcome, TeardownOutcome,
};
use crate::ipam::{Allocation, AllocationKey, Allocator};

use super::{Network, SandboxError};

/// Which sandbox interface an operation is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRef {
    pub container_id: String,
    pub ifname: String,
    /// The sandbox netns; DEL may come without one (the runtime already removed it).
    pub netns: Option<PathBuf>,
}

impl SandboxRef {
    fn key(&self) -> AllocationKey {
        AllocationKey::new(self.container_id.clone(), self.ifname.clone())
    }

    fn label(&self) -> String {
        match &self.netns {
            Some(netns) => format!(
                "sandbox {} ({} in {})",
                self.container_id,
                self.ifname,
                netns.display()
            ),
            None => format!("sandbox {} ({})", self.container_id, self.ifname),
        }
    }
}

/// What ADD produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOutcome {
    pub allocation: Allocation,
    pub spec: SandboxSpec,
    pub setup: SetupOutcome,
}

/// What DEL found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelOutcome {
    pub teardown: TeardownOutcome,
    /// The allocation released, if there was one.
    pub released: Option<Allocation>,
}

/// Provisions sandboxes of one network. Cheap to clone.
#[derive(Clone)]
pub struct SandboxService {
    network: Arc<Network>,
    allocator: Arc<Allocator>,
    dataplane: Dataplane,
}

impl SandboxService {
    pub fn new(network: Network, allocator: Arc<Allocator>, dataplane: Dataplane) -> Self {
        Self {
            network: Arc::new(network),
            allocator,
            dataplane,
        }
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    pub fn dataplane(&self) -> &Dataplane {
        &self.dataplane
    }

    /// Reserves addresses, wires the sandbox and verifies it.
    pub async fn add(&self, sandbox: &SandboxRef) -> Result<AddOutcome, SandboxError> {
        self.add_observed(sandbox, |_| {}).await
    }

    /// Like [`Self::add`]; `before_setup` learns the planned wiring once the addresses are
    /// reserved and before the kernel is touched (the kernel watch registers its intent there).
    pub async fn add_observed(
        &self,
        sandbox: &SandboxRef,
        before_setup: impl FnOnce(&SandboxSpec),
    ) -> Result<AddOutcome, SandboxError> {
        let label = sandbox.label();
        let netns = sandbox.netns.clone().ok_or_else(|| {
            SandboxError::Config(format!("{label}: ADD needs a network namespace path"))
        })?;
        let key = sandbox.key();
        let (existed, allocation) = self
            .blocking(&label, {
                let key = key.clone();
                move |allocator| {
                    let existed = allocator.get(&key)?.is_some();
                    Ok((existed, allocator.allocate(&key)?))
                }
            })
            .await?;
        let spec = self.spec_for(&allocation, &netns);
        before_setup(&spec);
        let (setup, verified) = match self.dataplane.setup_and_check(&spec).await {
            Ok(setup) => setup,
            Err(source) => {
                // A rollback that left something behind may leave the address routed: keep
                // the allocation so it is not handed out again; DEL or reconciliation frees it.
                let clean_rollback = !matches!(
                    &source,
                    DataplaneError::Setup { rollback_errors, .. } if !rollback_errors.is_empty()
                );
                if !existed && clean_rollback {
                    self.release_after_failure(&key, &label).await;
                }
                return Err(SandboxError::Dataplane {
                    sandbox: label,
                    source,
                });
            }
        };
        if let Err(source) = verified {
            if let Err(err) = self
                .dataplane
                .teardown(&sandbox.container_id, &sandbox.ifname, Some(&netns))
                .await
            {
                tracing::error!(sandbox = %label, error = %err, "rollback after failed verification");
            } else if !existed {
                self.release_after_failure(&key, &label).await;
            }
            return Err(SandboxError::Verify {
                sandbox: label,
                source,
            });
        }
        Ok(AddOutcome {
            allocation,
            spec,
            setup,
        })
    }

    /// Removes the wiring, then releases the addresses. Idempotent. When teardown fails the
    /// allocation is kept (its address may still be routed) and the error returned, so the
    /// runtime's retry can finish the job.
    pub async fn del(&self, sandbox: &SandboxRef) -> Result<DelOutcome, SandboxError> {
        let label = sandbox.label();
        let teardown = self
            .dataplane
            .teardown(
                &sandbox.container_id,
                &sandbox.ifname,
                sandbox.netns.as_deref(),
            )
            .await
            .map_err(|source| SandboxError::Dataplane {
                sandbox: label.clone(),
                source,
            })?;
        let key = sandbox.key();
        let released = self
            .blocking(&label, move |allocator| allocator.release(&key))
            .await?;
        Ok(DelOutcome { teardown, released })
    }

    /// Verifies that the kernel holds everything the allocation implies.
    pub async fn check(&self, sandbox: &SandboxRef) -> Result<Allocation, SandboxError> {
        let label = sandbox.label();
        let netns = sandbox.netns.clone().ok_or_else(|| {
            SandboxError::Config(format!("{label}: CHECK needs a network namespace path"))
        })?;
        let key = sandbox.key();
        let allocation = self
            .blocking(&label, move |allocator| allocator.get(&key))
            .await?
            .ok_or_else(|| SandboxError::NotFound {
                sandbox: label.clone(),
            })?;
        let spec = self.spec_for(&allocation, &netns);
        self.dataplane
            .check(&spec)
            .await
            .map_err(|source| SandboxError::Check {
                sandbox: label,
                source,
            })?;
        Ok(allocation)
    }

    /// The wiring an allocation implies in `netns`.
    pub fn spec_for(&self, allocation: &Allocation, netns: &Path) -> SandboxSpec {
        SandboxSpec {
            container_id: allocation.key.container_id.clone(),
            netns: netns.to_path_buf(),
            ifname: allocation.key.ifname.clone(),
            addresses: allocation
                .ips
                .iter()
                .map(|ip| PodAddress {
                    address: ip.address,
                    gateway: ip.gateway,
                })
                .collect(),
            mtu: self.network.mtu,
            routes: self
                .network
                .routes
                .iter()
                .map(|r| RouteSpec {
                    dst: r.dst,
                    gw: r.gw,
                })
                .collect(),
        }
    }

    async fn release_after_failure(&self, key: &AllocationKey, label: &str) {
        let key = key.clone();
        if let Err(err) = self
            .blocking(label, move |allocator| allocator.release(&key))
            .await
        {
            tracing::error!(sandbox = %label, error = %err, "release after failed ADD");
        }
    }

    /// Runs a store operation (it may fsync) off the async workers.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        label: &str,
        op: impl FnOnce(&Allocator) -> Result<T, crate::ipam::IpamError> + Send + 'static,
    ) -> Result<T, SandboxError> {
        let allocator = Arc::clone(&self.allocator);
        tokio::task::spawn_blocking(move || op(&allocator))
            .await
            .map_err(|e| SandboxError::Worker {
                sandbox: label.to_owned(),
                reason: e.to_string(),
            })?
            .map_err(|source| SandboxError::Ipam {
                sandbox: label.to_owned(),
                source,
            })
    }
}
