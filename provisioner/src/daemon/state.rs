//! What the daemon holds: the network in force with its service, readiness and its reasons.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::config::{ConfigState, LoadedNetwork};
use crate::dataplane::Dataplane;
use crate::ipam::Allocator;
use crate::metrics::Metrics;
use crate::sandbox::{KeyLocks, Network, NoObserver, SandboxObserver, SandboxService};

use super::api::{KernelWatchStatus, LoadInfo, NetworkInfo, Status};
use super::kernel_watch::{self, KernelWatch};
use super::reconcile;
use super::store_health;

/// The network in force and the service that provisions it.
pub struct Active {
    pub loaded: Arc<LoadedNetwork>,
    pub service: SandboxService,
}

pub struct Paths {
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    pub config_source: PathBuf,
}

pub struct DaemonState {
    pub paths: Paths,
    pub dataplane: Dataplane,
    /// Per-sandbox serialisation, shared by the services of successive configs.
    locks: Arc<KeyLocks>,
    pub metrics: Arc<Metrics>,
    /// The kernel watch, unless tracing was turned off.
    pub kernel: Option<KernelWatch>,
    /// The network in force: requests take a snapshot (an `Arc` clone) and never hold this
    /// lock across an await, so STATUS answers whatever operations do.
    active: std::sync::RwLock<Option<Arc<Active>>>,
    /// Sandbox operations hold a read guard while they run; a service swap takes the write
    /// guard, so it waits for the operations in flight (each bounded by its deadline and the
    /// netlink deadlines) and reconciliation never races an ADD.
    operations: Arc<RwLock<()>>,
    /// The config state last applied (for status), and the store error if opening failed.
    applied: std::sync::Mutex<Applied>,
}

#[derive(Default)]
struct Applied {
    config: Option<ConfigState>,
    store_error: Option<String>,
    dataplane_error: Option<String>,
}

/// What opening a store told of its past, for reconciliation.
struct StoreHistory {
    same_boot: bool,
    /// Why the store started empty although one existed.
    lost: Option<String>,
}

impl StoreHistory {
    /// A store kept open: nothing lost, the same boot.
    const KEPT: Self = Self {
        same_boot: true,
        lost: None,
    };
}

/// Held by a sandbox operation while it runs (see [`DaemonState::begin_operation`]).
pub type OperationGuard = OwnedRwLockReadGuard<()>;

impl DaemonState {
    pub fn new(paths: Paths, dataplane: Dataplane, kernel: Option<KernelWatch>) -> Self {
        Self {
            kernel,
            paths,
            dataplane,
            locks: Arc::new(KeyLocks::default()),
            metrics: Arc::new(Metrics::new()),
            active: std::sync::RwLock::new(None),
            operations: Arc::new(RwLock::new(())),
            applied: std::sync::Mutex::new(Applied::default()),
        }
    }

    fn applied(&self) -> std::sync::MutexGuard<'_, Applied> {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the last attempt to open the allocation store failed.
    pub fn store_failed(&self) -> bool {
        self.applied().store_error.is_some()
    }

    /// A snapshot of the network in force; `None` when not ready.
    pub fn active(&self) -> Option<Arc<Active>> {
        self.active
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_active(&self, active: Option<Arc<Active>>) {
        *self
            .active
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = active;
    }

    /// Waits for a sandbox operation to be allowed (no service swap under way) and returns
    /// the guard the operation holds while it runs.
    pub async fn begin_operation(&self) -> OperationGuard {
        Arc::clone(&self.operations).read_owned().await
    }

    /// Waits until no sandbox operation runs (at shutdown), at most `limit`; false on expiry.
    pub async fn wait_operations(&self, limit: std::time::Duration) -> bool {
        tokio::time::timeout(limit, self.operations.write())
            .await
            .is_ok()
    }

    /// Applies a new config state: keeps the service when nothing relevant changed, else
    /// swaps it once in-flight operations are done. Reopens the store only when the network's
    /// name or ranges changed.
    pub async fn apply_config(&self, state: ConfigState) {
        self.apply(state, false).await;
    }

    /// Checks the store of the network in force, and heals it: readiness drops while it cannot
    /// commit; once the data dir takes a write again, the store is reopened and rebuilt from
    /// the store plus the kernel as at start. A store that failed to open is opened again.
    pub async fn heal_store(&self) {
        let config = self.applied().config.clone();
        let Some(config) = config else {
            return;
        };
        if self.store_failed() {
            self.apply(config, true).await;
            return;
        }
        let Some(active) = self.active() else {
            return;
        };
        if active.service.allocator().unwritable().is_none() {
            return;
        }
        self.metrics.ready.set(0);
        let path = active.service.allocator().path().to_path_buf();
        drop(active);
        if let Err(err) = store_health::probe_write(&path).await {
            tracing::debug!(store = %path.display(), error = %err, "data dir still refuses writes");
            return;
        }
        tracing::warn!(store = %path.display(), "data dir takes writes again: reopening the allocation store");
        self.apply(config, true).await;
    }

    /// [`Self::apply_config`]; `reopen`: open the store again even if the network kept its name
    /// and ranges.
    async fn apply(&self, state: ConfigState, reopen: bool) {
        self.applied().config = Some(state.clone());
        let Some(loaded) = state.current.clone() else {
            if self.active().is_some() {
                tracing::warn!(source = %self.paths.config_source.display(), "network config removed: not ready");
            }
            self.set_active(None);
            self.metrics.ready.set(0);
            return;
        };
        let network = match Network::from_config(&loaded.config) {
            Ok(network) => network,
            Err(err) => {
                tracing::error!(file = %loaded.file.display(), error = %err, "network config rejected; keeping the previous one");
                return;
            }
        };
        if let Some(current) = self.active()
            && current.service.network() == &network
            && !reopen
        {
            self.set_active(Some(Arc::new(Active {
                loaded,
                service: current.service.clone(),
            })));
            return;
        }
        // Operations in flight finish on the service they started with; new ones wait.
        let _exclusive = self.operations.write().await;
        let Some((allocator, history)) = self.store_for(&network, reopen).await else {
            return;
        };
        self.put_in_force(loaded, network, allocator, history).await;
    }

    /// The allocation store of `network`: the one in force when the network kept its name and
    /// ranges and the store still commits (and no `reopen`), else one opened anew. `None` when
    /// it cannot be opened (not ready). Called with the operations excluded.
    async fn store_for(
        &self,
        network: &Network,
        reopen: bool,
    ) -> Option<(Arc<Allocator>, StoreHistory)> {
        let current = self.active();
        let reuse = current.as_ref().and_then(|current| {
            let same_store = current.service.network().name == network.name
                && current.service.network().ranges == network.ranges
                && current.service.allocator().unwritable().is_none()
                && !reopen;
            same_store.then(|| Arc::clone(current.service.allocator()))
        });
        let previous_store = current
            .as_ref()
            .map(|current| Arc::downgrade(current.service.allocator()));
        drop(current);
        if let Some(allocator) = reuse {
            return Some((allocator, StoreHistory::KEPT));
        }
        // The store file allows one open handle: close the old one first. No operation
        // runs; a STATUS may still count on it for a moment.
        self.set_active(None);
        if let Some(previous) = previous_store {
            wait_released(&previous).await;
        }
        self.open_store(network)
    }

    /// Opens the store of `network`; a failure is logged when its reason is new, and kept for
    /// STATUS.
    fn open_store(&self, network: &Network) -> Option<(Arc<Allocator>, StoreHistory)> {
        match Allocator::open(&self.paths.data_dir, &network.name, &network.ranges) {
            Ok((allocator, report)) => {
                reconcile::report_store(&report);
                self.applied().store_error = None;
                let history = StoreHistory {
                    same_boot: report.same_boot,
                    lost: report.lost,
                };
                Some((Arc::new(allocator), history))
            }
            Err(err) => {
                let err = err.to_string();
                let mut applied = self.applied();
                // Retried every second: said again only when the reason changes.
                if applied.store_error.as_ref() != Some(&err) {
                    tracing::error!(error = %err, "cannot open the allocation store");
                }
                applied.store_error = Some(err);
                drop(applied);
                self.metrics.ready.set(0);
                None
            }
        }
    }

    /// Builds the service of `network` over `allocator`, reconciles it with the kernel and puts
    /// it in force (ready), unless reconciliation refuses service.
    async fn put_in_force(
        &self,
        loaded: Arc<LoadedNetwork>,
        network: Network,
        allocator: Arc<Allocator>,
        history: StoreHistory,
    ) {
        tracing::info!(
            network = %network.name,
            file = %loaded.file.display(),
            ranges = %network.ranges_summary(),
            mtu = ?network.mtu,
            "network in force"
        );
        let observer: Arc<dyn SandboxObserver> = match &self.kernel {
            Some(kernel) => Arc::new(kernel.clone()),
            None => Arc::new(NoObserver),
        };
        let service = SandboxService::with_observer(
            network,
            allocator,
            self.dataplane.clone(),
            Arc::clone(&self.locks),
            observer,
        );
        let origin = reconcile::StoreOrigin {
            lost: history.lost.as_deref(),
            same_boot: history.same_boot,
        };
        if let Err(err) = reconcile::with_kernel(&service, origin).await {
            tracing::error!(error = %err, "reconciling allocations with the kernel");
            self.applied().dataplane_error = Some(err.to_string());
            if err.refuses_service() {
                self.set_active(None);
                self.metrics.ready.set(0);
                return;
            }
        } else {
            self.applied().dataplane_error = None;
            if self.kernel.is_some() {
                kernel_watch::audit_existing(&service, "network applied").await;
            }
        }
        crate::memory::return_freed_memory();
        self.set_active(Some(Arc::new(Active { loaded, service })));
        self.metrics.ready.set(1);
    }

    /// Readiness with every reason, what is loaded, and the last load attempt.
    pub async fn status(&self) -> Status {
        let mut reasons = Vec::new();
        let active = self.active();
        let (config, store_error, dataplane_error) = {
            let applied = self.applied();
            (
                applied.config.clone(),
                applied.store_error.clone(),
                applied.dataplane_error.clone(),
            )
        };
        let last_load = config.as_ref().map(|c| LoadInfo {
            at: c
                .last_attempt
                .at
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default(),
            file: c.last_attempt.file.clone(),
            ok: c.last_attempt.result.is_ok(),
            error: c.last_attempt.result.clone().err(),
        });
        match &config {
            None => reasons.push("network config not loaded yet".to_owned()),
            Some(c) if c.current.is_none() => reasons.push(match &c.last_attempt.result {
                Err(err) => format!("no valid network config: {err}"),
                Ok(()) => format!(
                    "no network with type provisioner in {}",
                    self.paths.config_source.display()
                ),
            }),
            Some(_) => {}
        }
        if let Some(err) = store_error {
            reasons.push(format!("allocation store unavailable: {err}"));
        }
        if let Some(err) = active
            .as_ref()
            .and_then(|active| active.service.allocator().unwritable())
        {
            reasons.push(format!("allocation store cannot commit: {err}"));
        }
        if let Some(err) = dataplane_error {
            reasons.push(format!("dataplane: {err}"));
        }
        if let Err(err) = self.dataplane.probe().await {
            reasons.push(format!("netlink unreachable: {err}"));
        }
        if active.is_none() && reasons.is_empty() {
            reasons.push("network config not in force".to_owned());
        }
        let (network, allocations) = match active.as_ref() {
            Some(active) => {
                let network = active.service.network();
                let count = active.service.count().await.ok();
                (
                    Some(NetworkInfo {
                        name: network.name.clone(),
                        file: active.loaded.file.clone(),
                        ranges: network
                            .ranges_summary()
                            .split(',')
                            .map(str::to_owned)
                            .collect(),
                        mtu: network.mtu,
                    }),
                    count,
                )
            }
            None => (None, None),
        };
        Status {
            ready: reasons.is_empty(),
            reasons,
            network,
            last_load,
            allocations,
            config_source: self.paths.config_source.clone(),
            socket: self.paths.socket.clone(),
            data_dir: self.paths.data_dir.clone(),
            kernel_watch: self.kernel.as_ref().map(|kernel| {
                let (unavailable, metrics) = kernel.metrics();
                KernelWatchStatus {
                    unavailable,
                    observations: metrics.observations,
                }
            }),
        }
    }
}

/// Waits (at most a few seconds) until nothing holds the allocator of a previous network.
async fn wait_released(previous: &std::sync::Weak<Allocator>) {
    let started = std::time::Instant::now();
    while previous.strong_count() > 0 && started.elapsed() < STORE_RELEASE_WAIT {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Longest wait for the previous allocation store to be closed before opening the next one.
const STORE_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
