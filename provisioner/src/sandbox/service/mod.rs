//! ADD / DEL / CHECK / GC of sandboxes over an allocator and a dataplane, serialised per
//! sandbox, told to an observer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnetwork::IpNetwork;

use crate::dataplane::{
    CheckFailure, Dataplane, DataplaneError, ExpectedState, LinkSpec, PodAddress, RouteSpec,
    SandboxSpec, SetupOutcome, TeardownOutcome, host_ifname,
};
use crate::ipam::{Allocation, AllocationKey, Allocator, Reservation};
use crate::pod::Pod;

use super::key_locks::KeyLocks;
use super::observer::{NoObserver, Removal, SandboxObserver};
use super::traits::{AllocationStore, SandboxDataplane};
use super::{Network, SandboxError};

/// Which sandbox interface an operation is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRef {
    pub container_id: String,
    pub ifname: String,
    /// The sandbox netns; DEL may come without one (the runtime already removed it).
    pub netns: Option<PathBuf>,
    /// The pod the runtime named (`CNI_ARGS`), or the one its allocation records.
    pub pod: Option<Pod>,
}

impl SandboxRef {
    fn key(&self) -> AllocationKey {
        AllocationKey::new(self.container_id.clone(), self.ifname.clone())
    }

    fn of(key: &AllocationKey, netns: Option<PathBuf>, pod: Option<Pod>) -> Self {
        Self {
            container_id: key.container_id.clone(),
            ifname: key.ifname.clone(),
            netns,
            pod,
        }
    }

    /// `sandbox <id> (eth0 in /run/netns/x) of pod default/web-0 (uid .., sandbox ..)`: what
    /// an error message names.
    fn label(&self) -> String {
        let mut label = match &self.netns {
            Some(netns) => format!(
                "sandbox {} ({} in {})",
                self.container_id,
                self.ifname,
                netns.display()
            ),
            None => format!("sandbox {} ({})", self.container_id, self.ifname),
        };
        if let Some(pod) = &self.pod {
            label.push_str(&format!(" of pod {pod}"));
        }
        label
    }
}

/// What ADD produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOutcome {
    pub allocation: Allocation,
    pub spec: SandboxSpec,
    /// What the sandbox must have (what CHECK and the tracer verify).
    pub expected: ExpectedState,
    pub setup: SetupOutcome,
}

/// What DEL found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelOutcome {
    pub teardown: TeardownOutcome,
    /// The allocation released, if there was one.
    pub released: Option<Allocation>,
}

/// What GC did.
#[derive(Debug, Default)]
pub struct GcOutcome {
    pub released: Vec<AllocationKey>,
    /// Left alone because an operation on them was in flight (the next GC decides).
    pub in_flight: Vec<AllocationKey>,
    /// Host veths of ours that no allocation, valid attachment or operation in flight owns
    /// (left by an interrupted ADD): removed.
    pub orphan_links: Vec<String>,
    pub errors: Vec<SandboxError>,
}

/// Provisions sandboxes of one network over a dataplane and an allocation store (the real ones
/// by default). Cheap to clone.
pub struct SandboxService<D = Dataplane, A = Allocator> {
    network: Arc<Network>,
    allocator: Arc<A>,
    dataplane: D,
    /// Shared by the services of successive configs, so one sandbox is never worked on twice
    /// at once across a config change.
    locks: Arc<KeyLocks>,
    observer: Arc<dyn SandboxObserver>,
}

impl<D: Clone, A> Clone for SandboxService<D, A> {
    fn clone(&self) -> Self {
        Self {
            network: Arc::clone(&self.network),
            allocator: Arc::clone(&self.allocator),
            dataplane: self.dataplane.clone(),
            locks: Arc::clone(&self.locks),
            observer: Arc::clone(&self.observer),
        }
    }
}

impl<D: SandboxDataplane, A: AllocationStore> SandboxService<D, A> {
    /// A service with its own locks and no observer (the in-process CLI mode).
    pub fn new(network: Network, allocator: Arc<A>, dataplane: D) -> Self {
        Self::with_observer(
            network,
            allocator,
            dataplane,
            Arc::new(KeyLocks::default()),
            Arc::new(NoObserver),
        )
    }

    pub fn with_observer(
        network: Network,
        allocator: Arc<A>,
        dataplane: D,
        locks: Arc<KeyLocks>,
        observer: Arc<dyn SandboxObserver>,
    ) -> Self {
        Self {
            network: Arc::new(network),
            allocator,
            dataplane,
            locks,
            observer,
        }
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    pub fn allocator(&self) -> &Arc<A> {
        &self.allocator
    }

    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// Reserves addresses, wires the sandbox and verifies it. The veth pair, which needs no
    /// address, is made while the addresses are reserved; the rest of the kernel work overlaps
    /// the durable commit of a new reservation; the answer waits for both.
    pub async fn add(&self, sandbox: &SandboxRef) -> Result<AddOutcome, SandboxError> {
        let _serialised = self
            .locks
            .lock(&sandbox.container_id, &sandbox.ifname)
            .await;
        let label = sandbox.label();
        let netns = sandbox.netns.clone().ok_or_else(|| {
            SandboxError::Config(format!("{label}: ADD needs a network namespace path"))
        })?;
        let key = sandbox.key();
        let (reservation, started) = self
            .reserve_and_start(sandbox, &key, &netns, &label)
            .await?;
        let existed = !reservation.is_new();
        let allocation = reservation.allocation().clone();
        crate::failpoint::hit("add.reserved");
        let spec = self.spec_for(&allocation, &netns);
        let expected = match crate::dataplane::plan(&spec) {
            Ok(expected) => expected,
            Err(source) => {
                self.abandon(started, &label).await;
                if !existed && reservation.durable().await.is_ok() {
                    self.release_after_failure(&key, &label).await;
                }
                return Err(SandboxError::Dataplane {
                    sandbox: label,
                    source,
                });
            }
        };
        let netns_cookie = started
            .as_ref()
            .ok()
            .and_then(|s| self.dataplane.started_netns_cookie(s));
        self.observer.planned(sandbox, netns_cookie, &expected);
        let durable = async {
            let durable = reservation.durable().await;
            if durable.is_ok() {
                crate::failpoint::hit("add.durable");
            }
            durable
        };
        let (wired, durable) =
            tokio::join!(self.finish_replacing_leftovers(&spec, started), durable);
        if let Err(source) = durable {
            self.roll_back_undurable(sandbox, &netns, &label, wired.is_ok())
                .await;
            return Err(SandboxError::Ipam {
                sandbox: label,
                source,
            });
        }
        let (setup, verified) = match wired {
            Ok(setup) => setup,
            Err(source) => {
                self.roll_back_failed_setup(sandbox, &source, &key, &label, existed)
                    .await;
                return Err(SandboxError::Dataplane {
                    sandbox: label,
                    source,
                });
            }
        };
        if let Err(source) = verified {
            self.roll_back_unverified(sandbox, &netns, &key, &label, existed)
                .await;
            return Err(SandboxError::Verify {
                sandbox: label,
                source,
            });
        }
        self.observer.set_up(sandbox, &expected);
        crate::failpoint::pause_task("add.slow").await;
        crate::failpoint::hit("add.before-reply");
        Ok(AddOutcome {
            allocation,
            spec,
            expected,
            setup,
        })
    }

    /// Reserves the sandbox's addresses while its veth pair is made; a failed reservation
    /// abandons the pair.
    async fn reserve_and_start(
        &self,
        sandbox: &SandboxRef,
        key: &AllocationKey,
        netns: &Path,
        label: &str,
    ) -> Result<(Reservation, Result<D::Started, DataplaneError>), SandboxError> {
        let link = LinkSpec {
            container_id: sandbox.container_id.clone(),
            netns: netns.to_path_buf(),
            ifname: sandbox.ifname.clone(),
            mtu: self.network.mtu,
        };
        let (reservation, started) = tokio::join!(
            self.allocator.reserve_queued(key, sandbox.pod.as_ref()),
            self.dataplane.start_setup(link)
        );
        match reservation {
            Ok(reservation) => Ok((reservation, started)),
            Err(source) => {
                self.abandon(started, label).await;
                Err(SandboxError::Ipam {
                    sandbox: label.to_owned(),
                    source,
                })
            }
        }
    }

    /// Undoes the wiring of an ADD whose reservation could not be made durable.
    async fn roll_back_undurable(
        &self,
        sandbox: &SandboxRef,
        netns: &Path,
        label: &str,
        wired: bool,
    ) {
        // Not on disk, and the store refuses writes until reopened: undo the wiring so
        // that nothing routes an address the store does not hold.
        self.observer.rolled_back(sandbox);
        if wired
            && let Err(err) = self
                .dataplane
                .teardown(&sandbox.container_id, &sandbox.ifname, Some(netns))
                .await
        {
            tracing::error!(sandbox = %label, error = %err, "rollback after a failed durable commit");
        }
    }

    /// After a setup that failed (and rolled itself back): a new allocation is released
    /// unless the rollback left something behind.
    async fn roll_back_failed_setup(
        &self,
        sandbox: &SandboxRef,
        source: &DataplaneError,
        key: &AllocationKey,
        label: &str,
        existed: bool,
    ) {
        self.observer.rolled_back(sandbox);
        // A rollback that left something behind may leave the address routed: keep
        // the allocation so it is not handed out again; DEL or reconciliation frees it.
        let clean_rollback = !matches!(
            source,
            DataplaneError::Setup { rollback_errors, .. } if !rollback_errors.is_empty()
        );
        if !existed && clean_rollback {
            self.release_after_failure(key, label).await;
        }
    }

    /// Tears down a sandbox that failed its verification, and releases a new allocation once
    /// the teardown succeeded.
    async fn roll_back_unverified(
        &self,
        sandbox: &SandboxRef,
        netns: &Path,
        key: &AllocationKey,
        label: &str,
        existed: bool,
    ) {
        self.observer.rolled_back(sandbox);
        if let Err(err) = self
            .dataplane
            .teardown(&sandbox.container_id, &sandbox.ifname, Some(netns))
            .await
        {
            tracing::error!(sandbox = %label, error = %err, "rollback after failed verification");
        } else if !existed {
            self.release_after_failure(key, label).await;
        }
    }

    /// Undoes a setup started for an ADD that cannot go on.
    async fn abandon(&self, started: Result<D::Started, DataplaneError>, label: &str) {
        if let Ok(started) = started {
            for err in self.dataplane.abandon_setup(started).await {
                tracing::error!(sandbox = %label, error = %err, "rollback of the veth pair of an ADD that could not go on");
            }
        }
    }

    /// The started setup finished, and checked; when the host veth of the sandbox was already
    /// there (left by an ADD that crashed, or a repeated ADD), it is torn down with what it
    /// routes, its adopted addresses (if reconciliation adopted it) released, and setup runs
    /// once more.
    async fn finish_replacing_leftovers(
        &self,
        spec: &SandboxSpec,
        started: Result<D::Started, DataplaneError>,
    ) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
        let first = match started {
            Ok(started) => self.dataplane.finish_setup(started, spec).await,
            Err(failed) => Err(failed),
        };
        let host_link = host_ifname(&spec.container_id, &spec.ifname);
        let leftover = matches!(
            &first,
            Err(DataplaneError::Setup { source, .. })
                if matches!(source.as_ref(), DataplaneError::InterfaceExists { ifname, .. } if *ifname == host_link)
        );
        if !leftover {
            return first;
        }
        tracing::warn!(container_id = %spec.container_id, ifname = %spec.ifname, %host_link,
            "host veth already there (an earlier ADD did not finish): replacing it");
        self.dataplane
            .teardown(&spec.container_id, &spec.ifname, Some(&spec.netns))
            .await?;
        self.release_adopted(&host_link).await;
        self.dataplane.setup_and_check(spec).await
    }

    /// Releases what reconciliation adopted from host veth `host_link` (now torn down).
    async fn release_adopted(&self, host_link: &str) {
        let adopted = AllocationKey::adopted(host_link);
        let label = format!("host veth {host_link}");
        if let Err(err) = self
            .blocking(&label, move |allocator| allocator.release(&adopted))
            .await
        {
            tracing::error!(%host_link, error = %err, "release of the addresses adopted from a removed host veth");
        }
    }

    /// The runtime's DEL: removes the wiring and releases the addresses. Idempotent.
    pub async fn del(&self, sandbox: &SandboxRef) -> Result<DelOutcome, SandboxError> {
        let _serialised = self
            .locks
            .lock(&sandbox.container_id, &sandbox.ifname)
            .await;
        self.remove(sandbox, Removal::Del).await
    }

    /// Removes a sandbox whose namespace is gone (reconciliation).
    pub async fn release_gone(&self, key: &AllocationKey) -> Result<DelOutcome, SandboxError> {
        let sandbox = SandboxRef::of(key, None, None);
        let _serialised = self.locks.lock(&key.container_id, &key.ifname).await;
        self.remove(&sandbox, Removal::NetnsGone).await
    }

    /// Removes the wiring and releases the addresses (the caller holds the key's lock). The
    /// release runs during the teardown, so that its durable commit overlaps the kernel work,
    /// and its addresses are held back from every allocation until the teardown is done. When
    /// teardown fails the allocation is written back (its address may still be routed) and
    /// the error returned, so the runtime's retry can finish the job.
    async fn remove(
        &self,
        sandbox: &SandboxRef,
        cause: Removal,
    ) -> Result<DelOutcome, SandboxError> {
        let label = sandbox.label();
        let key = sandbox.key();
        if let Some(host_link) = key.adopted_link() {
            return self.remove_adopted(&key, host_link, &label).await;
        }
        self.observer.removing(sandbox, cause);
        // The host veth goes: so do the addresses reconciliation adopted from it.
        let adopted = AllocationKey::adopted(&host_ifname(&key.container_id, &key.ifname));
        let teardown = async {
            crate::failpoint::pause_task("teardown.slow").await;
            self.dataplane
                .teardown(
                    &sandbox.container_id,
                    &sandbox.ifname,
                    sandbox.netns.as_deref(),
                )
                .await
        };
        let releases = async {
            // Both queued at once: one batch of the committer, usually.
            let both = tokio::join!(
                self.allocator.release_holding(&key),
                self.allocator.release_holding(&adopted)
            );
            crate::failpoint::hit("del.release-durable");
            both
        };
        // The releases first: queued to the committer, they wait for its thread, while the
        // teardown's requests (answered inside their sends) run on this one.
        let ((released, adopted_released), teardown) = tokio::join!(releases, teardown);
        let teardown = match teardown {
            Ok(teardown) => teardown,
            Err(source) => {
                for (held, released) in [(&key, &released), (&adopted, &adopted_released)] {
                    match released {
                        Ok(Some(allocation)) => self.reinstate(allocation, &label).await,
                        Ok(None) => {}
                        // Not released: the store still reserves the addresses.
                        Err(err) => {
                            tracing::warn!(sandbox = %label, key = %held, error = %err,
                                "release during a teardown that failed: not released");
                            self.allocator.end_hold(held);
                        }
                    }
                }
                return Err(SandboxError::Dataplane {
                    sandbox: label,
                    source,
                });
            }
        };
        crate::failpoint::hit("del.teardown");
        self.allocator.end_hold(&key);
        self.allocator.end_hold(&adopted);
        let ipam_err = |source| SandboxError::Ipam {
            sandbox: label.clone(),
            source,
        };
        adopted_released.map_err(ipam_err)?;
        let released = released.map_err(ipam_err)?;
        crate::failpoint::hit("del.released");
        self.observer.removed(sandbox, cause, released.as_ref());
        Ok(DelOutcome { teardown, released })
    }

    /// Writes back what a DEL released when its teardown failed, and ends the hold on it. If
    /// that fails the addresses stay held (never handed out) until a DEL of the sandbox
    /// succeeds or the daemon restarts (whose reconciliation adopts what is still routed).
    async fn reinstate(&self, allocation: &Allocation, label: &str) {
        let key = allocation.key.clone();
        let write = allocation.clone();
        match self
            .blocking(label, move |allocator| allocator.reinstate(&write))
            .await
        {
            Ok(()) => self.allocator.end_hold(&key),
            Err(err) => {
                tracing::error!(sandbox = label, %key, error = %err,
                    "teardown failed and its released addresses could not be written back: \
                     they stay held until a DEL of the sandbox succeeds or the daemon restarts");
            }
        }
    }

    /// Removes an adopted allocation: its host veth, then its addresses.
    async fn remove_adopted(
        &self,
        key: &AllocationKey,
        host_link: &str,
        label: &str,
    ) -> Result<DelOutcome, SandboxError> {
        self.dataplane
            .delete_host_link(host_link)
            .await
            .map_err(|source| SandboxError::Dataplane {
                sandbox: label.to_owned(),
                source,
            })?;
        let key = key.clone();
        let released = self
            .blocking(label, move |allocator| allocator.release(&key))
            .await?;
        Ok(DelOutcome {
            teardown: TeardownOutcome {
                host_link_deleted: true,
                ..TeardownOutcome::default()
            },
            released,
        })
    }

    /// Verifies that the kernel holds everything the allocation implies and, with `claimed`
    /// (the addresses of the runtime's prevResult), that they are the allocation's.
    pub async fn check(
        &self,
        sandbox: &SandboxRef,
        claimed: Option<&[IpNetwork]>,
    ) -> Result<Allocation, SandboxError> {
        let _serialised = self
            .locks
            .lock(&sandbox.container_id, &sandbox.ifname)
            .await;
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
                sandbox: label.clone(),
                source,
            })?;
        if let Some(claimed) = claimed {
            let sorted = |nets: &mut dyn Iterator<Item = IpNetwork>| {
                let mut all: Vec<String> = nets.map(|n| n.to_string()).collect();
                all.sort();
                all
            };
            let allocated = sorted(&mut allocation.ips.iter().map(|ip| ip.address));
            let claimed = sorted(&mut claimed.iter().copied());
            if allocated != claimed {
                return Err(SandboxError::PrevResultMismatch {
                    sandbox: label,
                    claimed: claimed.join(","),
                    allocated: allocated.join(","),
                });
            }
        }
        Ok(allocation)
    }

    /// The runtime's GC: removes every sandbox of this network not in `valid`. A sandbox with
    /// an operation in flight (an ADD the runtime lists no attachment for yet) is left alone.
    pub async fn gc(&self, valid: &[AllocationKey]) -> Result<GcOutcome, SandboxError> {
        let mut outcome = GcOutcome::default();
        let valid_links: std::collections::HashSet<String> = valid
            .iter()
            .map(|k| host_ifname(&k.container_id, &k.ifname))
            .collect();
        for allocation in self.list().await? {
            let key = allocation.key;
            // An adopted allocation belongs to the sandbox whose host veth it was adopted from.
            let kept = match key.adopted_link() {
                Some(link) => valid_links.contains(link),
                None => valid.contains(&key),
            };
            if kept {
                continue;
            }
            let Some(_serialised) = self.locks.try_lock(&key.container_id, &key.ifname) else {
                tracing::info!(key = %key, "GC: operation in flight, skipped");
                outcome.in_flight.push(key);
                continue;
            };
            let pod = allocation.pod;
            let who = crate::pod::describe(pod.as_ref());
            let sandbox = SandboxRef::of(&key, None, pod);
            match self.remove(&sandbox, Removal::Gc).await {
                Ok(_) => {
                    crate::pod_event!(tracing::Level::INFO, sandbox.pod.as_ref(), Some(key.container_id.as_str()),
                        container = %key.container_id, ifname = %key.ifname,
                        "GC {who}: released (no attachment of the runtime names it)");
                    outcome.released.push(key);
                }
                Err(err) => {
                    crate::pod_event!(tracing::Level::WARN, sandbox.pod.as_ref(), Some(key.container_id.as_str()),
                        container = %key.container_id, ifname = %key.ifname, error = %err,
                        "GC {who}: release failed");
                    outcome.errors.push(err);
                }
            }
        }
        self.remove_orphan_links(&valid_links, &mut outcome).await?;
        Ok(outcome)
    }

    /// Removes the host veths of ours that nothing owns. Read in this order so that an ADD
    /// finishing meanwhile is never taken for an orphan: the links, then the keys in flight,
    /// then the allocations (an ADD holds its key until its allocation is durable).
    async fn remove_orphan_links(
        &self,
        valid_links: &std::collections::HashSet<String>,
        outcome: &mut GcOutcome,
    ) -> Result<(), SandboxError> {
        let links =
            self.dataplane
                .host_veths()
                .await
                .map_err(|source| SandboxError::Dataplane {
                    sandbox: "GC: host veths".to_owned(),
                    source,
                })?;
        let mut owned: std::collections::HashSet<String> = self
            .locks
            .held()
            .into_iter()
            .map(|(container_id, ifname)| host_ifname(&container_id, &ifname))
            .collect();
        owned.extend(self.list().await?.iter().map(|a| host_link_of(&a.key)));
        let unreadable = self
            .blocking("allocation store", |allocator| allocator.unreadable_keys())
            .await?;
        owned.extend(unreadable.iter().map(host_link_of));
        for link in links
            .into_iter()
            .filter(|l| !owned.contains(l) && !valid_links.contains(l))
        {
            tracing::warn!(host_link = %link, "GC: host veth of ours that nothing owns: removing");
            match self.dataplane.delete_host_link(&link).await {
                Ok(()) => outcome.orphan_links.push(link),
                Err(source) => outcome.errors.push(SandboxError::Dataplane {
                    sandbox: format!("GC: host veth {link}"),
                    source,
                }),
            }
        }
        Ok(())
    }

    /// Tells the observer of every sandbox this network holds an allocation for, with its
    /// namespace found from the kernel (the peer of its host veth) and what it must have: the
    /// audit at start.
    pub async fn announce_existing(&self) -> Result<usize, SandboxError> {
        let mut allocations = self.list().await?;
        allocations.retain(|a| a.key.adopted_link().is_none());
        let host_links: Vec<String> = allocations
            .iter()
            .map(|a| host_ifname(&a.key.container_id, &a.key.ifname))
            .collect();
        let located: HashMap<String, PathBuf> = self
            .dataplane
            .sandbox_netns_of(&host_links)
            .await
            .map_err(|source| SandboxError::Dataplane {
                sandbox: "sandboxes found at start".to_owned(),
                source,
            })?;
        for (allocation, host_link) in allocations.iter().zip(&host_links) {
            let netns = located.get(host_link);
            let sandbox = SandboxRef::of(&allocation.key, netns.cloned(), allocation.pod.clone());
            let spec = self.spec_for(allocation, netns.map_or(Path::new(""), PathBuf::as_path));
            match crate::dataplane::plan(&spec) {
                Ok(expected) => {
                    self.observer
                        .found(&sandbox, netns.map(PathBuf::as_path), &expected)
                }
                Err(err) => {
                    tracing::warn!(sandbox = %sandbox.label(), error = %err, "allocation found at start does not make a valid sandbox");
                }
            }
        }
        Ok(allocations.len())
    }

    /// The wiring an allocation implies in `netns`.
    pub fn spec_for(&self, allocation: &Allocation, netns: &Path) -> SandboxSpec {
        let key = &allocation.key;
        SandboxSpec::new(&key.container_id, netns, &key.ifname)
            .with_addresses(
                allocation
                    .ips
                    .iter()
                    .map(|ip| PodAddress::new(ip.address, ip.gateway)),
            )
            .with_mtu(self.network.mtu)
            .with_routes(
                self.network
                    .routes
                    .iter()
                    .map(|r| RouteSpec::new(r.dst, r.gw)),
            )
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
        op: impl FnOnce(&A) -> Result<T, crate::ipam::IpamError> + Send + 'static,
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

/// The host veth an allocation's sandbox has (or had): an adopted allocation's is in its key.
#[must_use]
pub fn host_link_of(key: &AllocationKey) -> String {
    key.adopted_link().map_or_else(
        || host_ifname(&key.container_id, &key.ifname),
        str::to_owned,
    )
}

#[cfg(test)]
mod tests;
