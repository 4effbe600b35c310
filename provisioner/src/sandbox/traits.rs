//! What the sandbox service needs of the kernel and of the allocation store: two small traits,
//! implemented by [`Dataplane`] and [`Allocator`], so that the service's rollback and release
//! rules are unit-tested with recording fakes (no root).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};

use crate::dataplane::{
    CheckFailure, Dataplane, DataplaneError, LinkSpec, SandboxSpec, SetupOutcome, StartedSetup,
    TeardownOutcome,
};
use crate::ipam::{Allocation, AllocationKey, Allocator, IpamError, Reservation};
use crate::pod::Pod;

/// The kernel side of a sandbox.
pub trait SandboxDataplane: Clone + Send + Sync + 'static {
    /// A setup started before the sandbox's addresses were known.
    type Started: Send;

    /// Starts the setup of `link` with what needs no address (its veth pair); see
    /// [`Dataplane::start_setup`].
    fn start_setup(
        &self,
        link: LinkSpec,
    ) -> impl Future<Output = Result<Self::Started, DataplaneError>> + Send;

    /// Finishes a started setup with the sandbox's addresses and checks it, as
    /// [`Self::setup_and_check`] does; on failure the veth pair is rolled back too.
    fn finish_setup(
        &self,
        started: Self::Started,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError>> + Send;

    /// Undoes a started setup; the errors met, if any.
    fn abandon_setup(
        &self,
        started: Self::Started,
    ) -> impl Future<Output = Vec<DataplaneError>> + Send;

    /// The cookie of the sandbox's namespace, when the started setup knows it.
    fn started_netns_cookie(&self, _started: &Self::Started) -> Option<u64> {
        None
    }

    /// Wires `spec` and checks it; see [`Dataplane::setup_and_check`].
    fn setup_and_check(
        &self,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError>> + Send;

    /// Removes what setup created; idempotent. See [`Dataplane::teardown`].
    fn teardown(
        &self,
        container_id: &str,
        ifname: &str,
        netns: Option<&Path>,
    ) -> impl Future<Output = Result<TeardownOutcome, DataplaneError>> + Send;

    /// Verifies every resource of `spec`.
    fn check(&self, spec: &SandboxSpec) -> impl Future<Output = Result<(), CheckFailure>> + Send;

    /// The sandbox netns of each host veth named in `host_links` that has one.
    fn sandbox_netns_of(
        &self,
        host_links: &[String],
    ) -> impl Future<Output = Result<HashMap<String, PathBuf>, DataplaneError>> + Send;

    /// Names of the host veths of ours (`pvn*`) in the host netns.
    fn host_veths(&self) -> impl Future<Output = Result<Vec<String>, DataplaneError>> + Send;

    /// Retires the host link `name` (nothing routes through it on return); absent is fine.
    fn delete_host_link(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(), DataplaneError>> + Send;
}

impl SandboxDataplane for Dataplane {
    type Started = StartedSetup;

    fn start_setup(
        &self,
        link: LinkSpec,
    ) -> impl Future<Output = Result<StartedSetup, DataplaneError>> + Send {
        Dataplane::start_setup(self, link)
    }

    fn finish_setup(
        &self,
        started: StartedSetup,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError>> + Send
    {
        started.finish(spec)
    }

    fn abandon_setup(
        &self,
        started: StartedSetup,
    ) -> impl Future<Output = Vec<DataplaneError>> + Send {
        started.abandon()
    }

    fn started_netns_cookie(&self, started: &StartedSetup) -> Option<u64> {
        started.sandbox_netns_cookie()
    }

    fn setup_and_check(
        &self,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError>> + Send
    {
        Dataplane::setup_and_check(self, spec)
    }

    fn teardown(
        &self,
        container_id: &str,
        ifname: &str,
        netns: Option<&Path>,
    ) -> impl Future<Output = Result<TeardownOutcome, DataplaneError>> + Send {
        Dataplane::teardown(self, container_id, ifname, netns)
    }

    fn check(&self, spec: &SandboxSpec) -> impl Future<Output = Result<(), CheckFailure>> + Send {
        Dataplane::check(self, spec)
    }

    fn sandbox_netns_of(
        &self,
        host_links: &[String],
    ) -> impl Future<Output = Result<HashMap<String, PathBuf>, DataplaneError>> + Send {
        Dataplane::sandbox_netns_of(self, host_links)
    }

    async fn host_veths(&self) -> Result<Vec<String>, DataplaneError> {
        Ok(Dataplane::inventory(self)
            .await?
            .veths
            .into_iter()
            .map(|v| v.name)
            .collect())
    }

    fn delete_host_link(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(), DataplaneError>> + Send {
        Dataplane::delete_host_link(self, name)
    }
}

/// The durable allocations of one network (calls may block on fsync: the service runs them off
/// the async workers).
pub trait AllocationStore: Send + Sync + 'static {
    fn get(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError>;
    /// The key's allocation, made (and durable) when it has none.
    fn allocate(&self, key: &AllocationKey) -> Result<Allocation, IpamError>;
    /// The key's allocation, made when it has none and answered before it is durable: await
    /// [`Reservation::durable`] before reporting success. A `pod` given is recorded with it
    /// (also on an existing allocation); `None` leaves the recorded one.
    fn reserve(&self, key: &AllocationKey, pod: Option<&Pod>) -> Result<Reservation, IpamError> {
        let existed = self.get(key)?.is_some();
        let mut allocation = self.allocate(key)?;
        if pod.is_some() {
            allocation.pod = pod.cloned();
        }
        Ok(Reservation::durable_already(
            allocation,
            !existed,
            Path::new("(fake store)"),
        ))
    }
    /// [`Self::reserve`] for async callers, without blocking their thread. The default runs
    /// `reserve` in place: for stores that never block.
    fn reserve_queued(
        &self,
        key: &AllocationKey,
        pod: Option<&Pod>,
    ) -> impl Future<Output = Result<Reservation, IpamError>> + Send + 'static {
        std::future::ready(self.reserve(key, pod))
    }
    /// Frees the key's addresses; the allocation released, if there was one.
    fn release(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError>;
    /// [`Self::release`] of a key that may have no allocation, for async callers, without
    /// blocking their thread, the released addresses held back from every allocation until
    /// [`Self::end_hold`]: DEL releases while its teardown still withdraws them. The default
    /// releases at once, in place: for stores that never block nor hand out an address twice.
    fn release_holding(
        &self,
        key: &AllocationKey,
    ) -> impl Future<Output = Result<Option<Allocation>, IpamError>> + Send + 'static {
        std::future::ready(match self.get(key) {
            Ok(Some(_)) => self.release(key),
            other => other,
        })
    }
    /// Ends the hold [`Self::release_holding`] put on the addresses of `key`.
    fn end_hold(&self, _key: &AllocationKey) {}
    /// Writes a released allocation back under its key, durably (its addresses still held):
    /// the undo of a DEL's release when its teardown failed.
    fn reinstate(&self, allocation: &Allocation) -> Result<(), IpamError>;
    fn list(&self) -> Result<Vec<Allocation>, IpamError>;
    /// The keys of records that cannot be decoded (skipped by `list`; still owners).
    fn unreadable_keys(&self) -> Result<Vec<AllocationKey>, IpamError> {
        Ok(Vec::new())
    }
    fn count(&self) -> Result<u64, IpamError>;
}

impl AllocationStore for Allocator {
    fn get(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        Allocator::get(self, key)
    }

    fn allocate(&self, key: &AllocationKey) -> Result<Allocation, IpamError> {
        Allocator::allocate(self, key)
    }

    fn reserve(&self, key: &AllocationKey, pod: Option<&Pod>) -> Result<Reservation, IpamError> {
        Allocator::reserve(self, key, pod)
    }

    fn reserve_queued(
        &self,
        key: &AllocationKey,
        pod: Option<&Pod>,
    ) -> impl Future<Output = Result<Reservation, IpamError>> + Send + 'static {
        Allocator::reserve_queued(self, key, pod)
    }

    fn release(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        Allocator::release(self, key)
    }

    fn release_holding(
        &self,
        key: &AllocationKey,
    ) -> impl Future<Output = Result<Option<Allocation>, IpamError>> + Send + 'static {
        Allocator::release_holding(self, key)
    }

    fn end_hold(&self, key: &AllocationKey) {
        Allocator::end_hold(self, key);
    }

    fn reinstate(&self, allocation: &Allocation) -> Result<(), IpamError> {
        Allocator::reinstate(self, allocation)
    }

    fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        Allocator::list(self)
    }

    fn unreadable_keys(&self) -> Result<Vec<AllocationKey>, IpamError> {
        Ok(Allocator::list_all(self)?
            .1
            .into_iter()
            .map(|(key, _)| key)
            .collect())
    }

    fn count(&self) -> Result<u64, IpamError> {
        Allocator::count(self)
    }
}
