//! Start-up: the conf rendered, the dataplane opened, the kernel watch and the config watcher
//! started, the daemon's state built; then the tasks that run beside the socket (the config
//! follower, the metrics endpoints).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{ConfigState, ConfigWatcher, render_config};
use crate::dataplane::Dataplane;
use crate::metrics::Metrics;

use super::options::{DaemonOptions, RenderAtStart};
use crate::daemon::kernel_watch::KernelWatch;
use crate::daemon::state::{DaemonState, Paths};

/// Interval of the store check: a store that failed to open is opened again, one that
/// cannot commit is reopened once its data dir takes writes (see `DaemonState::heal_store`).
const STORE_CHECK: Duration = Duration::from_secs(1);

/// What start-up leaves running: the state the socket serves, and the config watcher with the
/// changes it sends (dropping the watcher stops it).
pub(super) struct Started {
    pub state: Arc<DaemonState>,
    pub watcher: ConfigWatcher,
    pub config_rx: watch::Receiver<ConfigState>,
}

/// Renders the conf (when asked), opens the dataplane, starts the kernel watch and the config
/// watcher, and applies the config found.
pub(super) async fn start(opts: &DaemonOptions) -> Result<Started> {
    if let Some(render) = &opts.render {
        render_at_start(render)?;
    }
    crate::dataplane::set_netlink_timeout(opts.netlink_timeout);
    let dataplane = open_dataplane(opts.host_netns.as_deref(), &opts.proc_sys)?;
    let kernel = opts
        .trace
        .as_ref()
        .map(|t| KernelWatch::start(t, &cni_conf_dir(&opts.config_source)));
    let (watcher, mut config_rx) = ConfigWatcher::start(&opts.config_source)
        .with_context(|| format!("watch {}", opts.config_source.display()))?;
    let state = Arc::new(new_state(opts, dataplane, kernel));
    let initial = config_rx.borrow_and_update().clone();
    state.apply_config(initial).await;
    Ok(Started {
        state,
        watcher,
        config_rx,
    })
}

/// Renders the conf template into its output file.
fn render_at_start(render: &RenderAtStart) -> Result<()> {
    render_config(&render.template, &render.pod_cidrs, &render.output).with_context(|| {
        format!(
            "render {} into {}",
            render.template.display(),
            render.output.display()
        )
    })?;
    Ok(())
}

/// Netlink in the host network namespace (the given one, or the daemon's own), with the
/// node's and the sandboxes' sysctls under `proc_sys` (checked to hold `net/`).
fn open_dataplane(host_netns: Option<&Path>, proc_sys: &Path) -> Result<Dataplane> {
    let proc_sys_net = proc_sys.join("net");
    ensure!(
        proc_sys_net.is_dir(),
        "--proc-sys {}: no directory {} (the sysctls of the node and its sandboxes are set there)",
        proc_sys.display(),
        proc_sys_net.display()
    );
    Dataplane::open(host_netns, proc_sys).context("open netlink in the host network namespace")
}

/// The CNI conf dir of `config_source`: itself when a dir, else the dir of the file.
/// A runtime whose own CNI setup cannot be read is assumed to read the conf dir we watch.
fn cni_conf_dir(config_source: &Path) -> PathBuf {
    if config_source.is_dir() {
        config_source.to_path_buf()
    } else {
        config_source
            .parent()
            .map_or_else(|| config_source.to_path_buf(), Path::to_path_buf)
    }
}

fn new_state(
    opts: &DaemonOptions,
    dataplane: Dataplane,
    kernel: Option<KernelWatch>,
) -> DaemonState {
    let mut state = DaemonState::new(
        Paths {
            socket: opts.socket.clone(),
            data_dir: opts.data_dir.clone(),
            config_source: opts.config_source.clone(),
        },
        dataplane,
        kernel,
    );
    // The operation histogram's buckets reach past this daemon's operation deadline.
    state.metrics = Arc::new(Metrics::with_operation_deadline(
        opts.limits.operation_deadline,
    ));
    state
}

/// Applies each config change as it comes, and checks the store every `STORE_CHECK`.
pub(super) fn spawn_config_follower(
    state: Arc<DaemonState>,
    mut config_rx: watch::Receiver<ConfigState>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut check = tokio::time::interval(STORE_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = config_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let next = config_rx.borrow_and_update().clone();
                    state.apply_config(next).await;
                }
                _ = check.tick() => state.heal_store().await,
            }
        }
    })
}

/// Serves Prometheus metrics on `addr`, refreshing the kernel watch's and the ranges' figures
/// at each scrape.
pub(super) fn spawn_metrics_server(
    addr: std::net::SocketAddr,
    state: Arc<DaemonState>,
) -> JoinHandle<()> {
    let metrics = Arc::clone(&state.metrics);
    let refresh = Arc::new(move |m: &Metrics| {
        let kernel = state.kernel.as_ref();
        crate::metrics::trace::refresh(m, kernel.map(KernelWatch::metrics));
        m.set_alarms(kernel.map(KernelWatch::alarms).unwrap_or_default());
        let active = state.active();
        crate::metrics::ipam::refresh(m, active.as_deref().map(|a| a.service.allocator().as_ref()));
    });
    tokio::spawn(async move {
        if let Err(err) = crate::metrics::serve(addr, metrics, refresh).await {
            tracing::error!(%addr, error = %err, "metrics endpoint failed");
        }
    })
}
