//! The daemon: socket, request dispatch, config following, graceful shutdown.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use ipnetwork::IpNetwork;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::OwnedRwLockReadGuard;
use tokio::task::JoinSet;

use crate::cni::{CniError, CniResult, CniVersion};
use crate::config::{ConfigWatcher, render_config};
use crate::dataplane::Dataplane;
use crate::ipam::{AllocationKey, IpamConfig};
use crate::metrics::Operation;
use crate::sandbox::{Network, SandboxRef};

use super::api::{AllocationInfo, AttachmentRef, NetworkClaim, Request, Response, SandboxRequest};
use super::errors::cni_error;
use super::kernel_watch::KernelWatch;
use super::result::cni_result;
use super::state::{Active, DaemonState, Paths};

type ActiveGuard = OwnedRwLockReadGuard<Option<Active>, Active>;

/// Largest request line accepted.
const MAX_REQUEST: usize = 1 << 20;
/// A client must send its request line within this time.
const REQUEST_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Retry interval for an allocation store that failed to open.
const STORE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// Longest wait for operations in flight at shutdown.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

pub struct DaemonOptions {
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    /// A conf dir (loaded as a runtime does) or one config file.
    pub config_source: PathBuf,
    /// Render this template into `render_output` before loading the config.
    pub render: Option<RenderAtStart>,
    /// Host ("node") network namespace; default: the daemon's own.
    pub host_netns: Option<PathBuf>,
    /// Serve Prometheus metrics here (loopback recommended).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Kernel tracing of sandbox setups; `None` turns it off.
    pub trace: Option<TraceOptions>,
}

pub struct TraceOptions {
    /// Time a sandbox namespace has to get its network.
    pub deadline: std::time::Duration,
    pub rules: crate::trace::SandboxRules,
}

pub struct RenderAtStart {
    pub template: PathBuf,
    pub pod_cidrs: Vec<IpNetwork>,
    pub output: PathBuf,
}

/// Runs until SIGTERM or SIGINT, then finishes the operations in flight and returns.
pub async fn run(opts: DaemonOptions) -> Result<()> {
    if let Some(render) = &opts.render {
        render_config(&render.template, &render.pod_cidrs, &render.output).with_context(|| {
            format!(
                "render {} into {}",
                render.template.display(),
                render.output.display()
            )
        })?;
    }
    let dataplane = match &opts.host_netns {
        Some(path) => Dataplane::with_host_netns(path),
        None => Dataplane::new(),
    }
    .context("open netlink in the host network namespace")?;
    // A runtime whose own CNI setup cannot be read is assumed to read the conf dir we watch.
    let cni_conf_dir = if opts.config_source.is_dir() {
        opts.config_source.clone()
    } else {
        opts.config_source
            .parent()
            .map_or_else(|| opts.config_source.clone(), Path::to_path_buf)
    };
    let kernel = opts
        .trace
        .as_ref()
        .map(|t| KernelWatch::start(t.deadline, t.rules.clone(), &cni_conf_dir));
    let (watcher, mut config_rx) = ConfigWatcher::start(&opts.config_source)
        .with_context(|| format!("watch {}", opts.config_source.display()))?;
    let state = Arc::new(DaemonState::new(
        Paths {
            socket: opts.socket.clone(),
            data_dir: opts.data_dir.clone(),
            config_source: opts.config_source.clone(),
        },
        dataplane,
        kernel,
    ));
    let initial = config_rx.borrow_and_update().clone();
    state.apply_config(initial).await;

    let follower = tokio::spawn({
        let state = Arc::clone(&state);
        async move {
            loop {
                tokio::select! {
                    changed = config_rx.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                    // A store that failed to open is retried until it opens.
                    () = tokio::time::sleep(STORE_RETRY), if state.store_failed() => {}
                }
                let next = config_rx.borrow_and_update().clone();
                state.apply_config(next).await;
            }
        }
    });

    let metrics_server = opts.metrics_addr.map(|addr| {
        let metrics = Arc::clone(&state.metrics);
        let kernel = state.kernel.clone();
        let refresh = Arc::new(move |m: &crate::metrics::Metrics| {
            refresh_trace_metrics(m, kernel.as_ref());
        });
        tokio::spawn(async move {
            if let Err(err) = crate::metrics::serve(addr, metrics, refresh).await {
                tracing::error!(%addr, error = %err, "metrics endpoint failed");
            }
        })
    });
    let listener = bind(&opts.socket)?;
    let status = state.status().await;
    tracing::info!(
        socket = %opts.socket.display(),
        ready = status.ready,
        reasons = ?status.reasons,
        "daemon listening"
    );
    let mut in_flight = JoinSet::new();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("install SIGTERM handler")?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let state = Arc::clone(&state);
                    in_flight.spawn(async move { serve(&state, stream).await });
                }
                Err(err) => tracing::warn!(error = %err, "accept failed"),
            },
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = sigterm.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    tracing::info!(
        in_flight = in_flight.len(),
        "shutting down: finishing operations in flight"
    );
    drop(listener);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while in_flight.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::error!(
            left = in_flight.len(),
            "operations still running after {DRAIN_TIMEOUT:?}: stopping anyway"
        );
        in_flight.abort_all();
    }
    let left = state.dataplane.flush_deletions().await;
    if left > 0 {
        tracing::warn!(
            left,
            "retired links not deleted yet; the next start removes them"
        );
    }
    follower.abort();
    if let Some(server) = metrics_server {
        server.abort();
    }
    drop(watcher);
    let _ = std::fs::remove_file(&opts.socket);
    tracing::info!("stopped");
    Ok(())
}

/// Binds the socket root-only (0600), replacing a stale socket file.
fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("another daemon is listening on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("remove stale {}", path.display()))?;
    }
    let old_umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(path);
    nix::sys::stat::umask(old_umask);
    let listener = listener.with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    Ok(listener)
}

async fn serve(state: &DaemonState, stream: UnixStream) {
    let allowed = stream.peer_cred().map(|cred| {
        let uid = cred.uid();
        (uid == 0 || uid == nix::unistd::geteuid().as_raw(), uid)
    });
    let (read, mut write) = stream.into_split();
    let response = match allowed {
        Ok((true, _)) => {
            let mut line = Vec::new();
            let mut reader = BufReader::new(read.take(MAX_REQUEST as u64));
            let read =
                tokio::time::timeout(REQUEST_READ_TIMEOUT, reader.read_until(b'\n', &mut line));
            match read.await.unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no request line within 10 s",
                ))
            }) {
                Ok(_) => match serde_json::from_slice::<Request>(&line) {
                    Ok(request) => handle(state, request).await,
                    Err(err) => CniError::decode(format!("undecodable request: {err}")).into(),
                },
                Err(err) => {
                    CniError::new(CniError::IO_FAILURE, format!("read request: {err}")).into()
                }
            }
        }
        Ok((false, uid)) => CniError::new(
            CniError::INTERNAL,
            format!("uid {uid} may not use the provisioner daemon (root only)"),
        )
        .into(),
        Err(err) => CniError::new(CniError::IO_FAILURE, format!("peer credentials: {err}")).into(),
    };
    let mut bytes = serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    if let Err(err) = write.write_all(&bytes).await {
        tracing::debug!(error = %err, "client went away before the answer");
    }
}

async fn handle(state: &DaemonState, request: Request) -> Response {
    match request {
        Request::Add(req) => sandbox_op(state, req, Op::Add).await,
        Request::Del(req) => sandbox_op(state, req, Op::Del).await,
        Request::Check(req) => sandbox_op(state, req, Op::Check).await,
        Request::Gc { network, valid } => gc(state, network.as_ref(), &valid).await,
        Request::Status => ok(&state.status().await),
        Request::List => list(state).await,
        Request::Sandboxes => match &state.kernel {
            Some(kernel) => ok(&kernel.sandboxes()),
            None => CniError::new(
                CniError::INTERNAL,
                "kernel tracing is off in this daemon (--no-trace)",
            )
            .into(),
        },
    }
}

fn refresh_trace_metrics(metrics: &crate::metrics::Metrics, kernel: Option<&KernelWatch>) {
    let trace = kernel.and_then(|kernel| match kernel.metrics() {
        (None, trace) => Some(trace),
        (Some(_), _) => None,
    });
    metrics.set_trace(trace);
}

#[derive(Clone, Copy)]
enum Op {
    Add,
    Del,
    Check,
}

fn ok<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_value(value) {
        Ok(result) => Response::Ok { result },
        Err(err) => CniError::internal(format!("encode answer: {err}")).into(),
    }
}

/// The network in force, or code 11 (try again later) with the reasons it is not ready.
async fn require_active(state: &DaemonState) -> Result<ActiveGuard, Response> {
    let active = state.active().await;
    if let Ok(active) = OwnedRwLockReadGuard::try_map(active, Option::as_ref) {
        return Ok(active);
    }
    let status = state.status().await;
    Err(CniError::try_again_later(format!(
        "provisioner daemon not ready: {}",
        status.reasons.join("; ")
    ))
    .into())
}

fn claim_mismatch(network: &Network, claim: Option<&NetworkClaim>) -> Option<Response> {
    let claim = claim?;
    let claimed = serde_json::from_value::<IpamConfig>(claim.ipam.clone())
        .map_err(|e| e.to_string())
        .and_then(|ipam| Network::new(&claim.name, None, ipam).map_err(|e| e.to_string()));
    let reason = match claimed {
        Ok(claimed) => network.mismatch(&claimed)?,
        Err(err) => format!("request's network config is invalid: {err}"),
    };
    Some(CniError::new(CniError::CONFIG_MISMATCH, reason).into())
}

async fn sandbox_op(state: &DaemonState, req: SandboxRequest, op: Op) -> Response {
    let started = std::time::Instant::now();
    let response = sandbox_op_inner(state, req, op).await;
    let result = match &response {
        Response::Ok { .. } => "ok".to_owned(),
        Response::Error { code, .. } => code.to_string(),
    };
    let operation = match op {
        Op::Add => Operation::Add,
        Op::Del => Operation::Del,
        Op::Check => Operation::Check,
    };
    state.metrics.observe(operation, &result, started.elapsed());
    response
}

async fn sandbox_op_inner(state: &DaemonState, req: SandboxRequest, op: Op) -> Response {
    let active = match require_active(state).await {
        Ok(active) => active,
        Err(response) => return response,
    };
    let service = &active.service;
    if let Some(mismatch) = claim_mismatch(service.network(), req.network.as_ref()) {
        // DEL is keyed by (container id, ifname) alone: a runtime tearing down with the config
        // cached at ADD time (before a PodCIDR change) must still get its sandbox removed.
        if !matches!(op, Op::Del) {
            return mismatch;
        }
        tracing::warn!(container = %req.container_id, "DEL with a network config that differs from the loaded one: served anyway");
    }
    let sandbox = SandboxRef {
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        netns: req.netns.clone(),
    };
    match op {
        Op::Add => match service.add(&sandbox).await {
            Ok(outcome) => {
                tracing::info!(container = %req.container_id, ifname = %req.ifname, addresses = ?outcome.allocation.ips.iter().map(|i| i.address.to_string()).collect::<Vec<_>>(), "added");
                Response::Ok {
                    result: cni_result(&outcome).to_json(CniVersion::LATEST),
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "ADD failed");
                cni_error(&err).into()
            }
        },
        Op::Del => match service.del(&sandbox).await {
            Ok(outcome) => {
                tracing::info!(container = %req.container_id, ifname = %req.ifname, released = outcome.released.is_some(), "deleted");
                Response::Ok {
                    result: serde_json::Value::Null,
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "DEL failed");
                cni_error(&err).into()
            }
        },
        Op::Check => {
            let claimed = match req
                .prev_result
                .as_ref()
                .map(CniResult::from_json)
                .transpose()
            {
                Ok(prev) => prev.map(|prev| {
                    prev.ips
                        .iter()
                        .map(|ip| ip.address)
                        .collect::<Vec<IpNetwork>>()
                }),
                Err(err) => return err.into(),
            };
            match service.check(&sandbox, claimed.as_deref()).await {
                Ok(_) => Response::Ok {
                    result: serde_json::Value::Null,
                },
                Err(err) => cni_error(&err).into(),
            }
        }
    }
}

async fn gc(
    state: &DaemonState,
    network: Option<&NetworkClaim>,
    valid: &[AttachmentRef],
) -> Response {
    let active = match require_active(state).await {
        Ok(active) => active,
        Err(response) => return response,
    };
    let service = &active.service;
    if let Some(mismatch) = claim_mismatch(service.network(), network) {
        return mismatch;
    }
    let valid: Vec<AllocationKey> = valid
        .iter()
        .map(|v| AllocationKey::new(v.container_id.clone(), v.ifname.clone()))
        .collect();
    let outcome = match service.gc(&valid).await {
        Ok(outcome) => outcome,
        Err(err) => return cni_error(&err).into(),
    };
    tracing::info!(
        released = outcome.released.len(),
        in_flight = outcome.in_flight.len(),
        "GC"
    );
    if outcome.errors.is_empty() {
        let released: Vec<String> = outcome.released.iter().map(ToString::to_string).collect();
        ok(&serde_json::json!({ "released": released }))
    } else {
        let errors: Vec<String> = outcome.errors.iter().map(ToString::to_string).collect();
        CniError::internal(format!("GC: {}", errors.join("; "))).into()
    }
}

async fn list(state: &DaemonState) -> Response {
    let active = match require_active(state).await {
        Ok(active) => active,
        Err(response) => return response,
    };
    match active.service.list().await {
        Ok(allocations) => ok(&allocations
            .iter()
            .map(|a| AllocationInfo {
                container_id: a.key.container_id.clone(),
                ifname: a.key.ifname.clone(),
                addresses: a.ips.iter().map(|ip| ip.address.to_string()).collect(),
            })
            .collect::<Vec<_>>()),
        Err(err) => cni_error(&err).into(),
    }
}
