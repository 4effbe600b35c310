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

use super::api::{LoadInfo, NetworkInfo, Status};
use super::kernel_watch::KernelWatch;
use super::reconcile;

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
    /// Requests hold a read guard for their whole duration; a config change takes the write
    /// guard, so it waits for operations in flight and none ever sees a half-applied config.
    active: Arc<RwLock<Option<Active>>>,
    /// The config state last applied (for status), and the store error if opening failed.
    applied: std::sync::Mutex<Applied>,
}

#[derive(Default)]
struct Applied {
    config: Option<ConfigState>,
    store_error: Option<String>,
    dataplane_error: Option<String>,
}

pub type ActiveGuard = OwnedRwLockReadGuard<Option<Active>>;

impl DaemonState {
    pub fn new(paths: Paths, dataplane: Dataplane, kernel: Option<KernelWatch>) -> Self {
        Self {
            kernel,
            paths,
            dataplane,
            locks: Arc::new(KeyLocks::default()),
            metrics: Arc::new(Metrics::new()),
            active: Arc::new(RwLock::new(None)),
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

    /// The network in force for one request; `None` inside when not ready.
    pub async fn active(&self) -> ActiveGuard {
        Arc::clone(&self.active).read_owned().await
    }

    /// Applies a new config state: keeps the service when nothing relevant changed, else
    /// swaps it once in-flight operations are done. Reopens the store only when the network's
    /// name or ranges changed.
    pub async fn apply_config(&self, state: ConfigState) {
        self.applied().config = Some(state.clone());
        let Some(loaded) = state.current.clone() else {
            if self.active.read().await.is_some() {
                tracing::warn!(source = %self.paths.config_source.display(), "network config removed: not ready");
            }
            *self.active.write().await = None;
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
        let mut active = self.active.write().await;
        if let Some(current) = active.as_ref()
            && current.service.network() == &network
        {
            *active = Some(Active {
                loaded,
                service: current.service.clone(),
            });
            return;
        }
        let reuse = active.as_ref().and_then(|current| {
            let same_store = current.service.network().name == network.name
                && current.service.network().ranges == network.ranges;
            same_store.then(|| Arc::clone(current.service.allocator()))
        });
        let mut same_boot = true;
        let allocator = match reuse {
            Some(allocator) => allocator,
            None => {
                // The store file allows one open handle: close the old one first.
                *active = None;
                match Allocator::open(&self.paths.data_dir, &network.name, &network.ranges) {
                    Ok((allocator, report)) => {
                        reconcile::report_store(&report);
                        same_boot = report.same_boot;
                        self.applied().store_error = None;
                        Arc::new(allocator)
                    }
                    Err(err) => {
                        tracing::error!(error = %err, "cannot open the allocation store");
                        self.applied().store_error = Some(err.to_string());
                        self.metrics.ready.set(0);
                        return;
                    }
                }
            }
        };
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
        if let Err(err) = reconcile::with_kernel(&service, same_boot).await {
            tracing::error!(error = %err, "reconciling allocations with the kernel");
            self.applied().dataplane_error = Some(err.to_string());
            if err.refuses_service() {
                *active = None;
                self.metrics.ready.set(0);
                return;
            }
        } else {
            self.applied().dataplane_error = None;
            if self.kernel.is_some() {
                // The audit: every sandbox already there is checked against the kernel.
                match service.announce_existing().await {
                    Ok(n) => tracing::info!(
                        sandboxes = n,
                        "sandboxes found at start handed to the kernel watch"
                    ),
                    Err(err) => {
                        tracing::warn!(error = %err, "audit of the sandboxes found at start")
                    }
                }
            }
        }
        return_freed_memory();
        *active = Some(Active { loaded, service });
        self.metrics.ready.set(1);
    }

    /// Readiness with every reason, what is loaded, and the last load attempt.
    pub async fn status(&self) -> Status {
        let mut reasons = Vec::new();
        let active = self.active().await;
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
        }
    }
}

/// Reconciliation reads every host link and every allocation at once; glibc keeps the pages it
/// frees afterwards in its arenas (RSS 24 instead of 11 MiB after a restart with 1000 sandboxes,
/// kernel watch off): give them back.
fn return_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}
