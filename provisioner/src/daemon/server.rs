//! The daemon: socket, request dispatch, config following, graceful shutdown.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ipnetwork::IpNetwork;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::cni::{CniError, CniResult, CniVersion};
use crate::config::{ConfigWatcher, render_config};
use crate::dataplane::{BadNetns, Dataplane, DataplaneError};
use crate::ipam::{AllocationKey, IpamConfig};
use crate::metrics::Operation;
use crate::names;
use crate::sandbox::{Network, SandboxRef};

use super::api::{
    AllocationInfo, AttachmentRef, NetworkClaim, Request, Response, SandboxRequest, WhyAnswer,
};
use super::errors::{cni_error, dataplane_refusal};
use super::kernel_watch::{self, KernelWatch};
use super::sandbox_filter::SandboxFilter;
use super::state::{Active, DaemonState, Paths};

/// Largest request line accepted.
const MAX_REQUEST: usize = 1 << 20;
/// A client must send its request line within this time.
const REQUEST_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Interval of the store check: a store that failed to open is opened again, one that
/// cannot commit is reopened once its data dir takes writes (see `DaemonState::heal_store`).
const STORE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest wait for operations in flight at shutdown.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Pause after a failed accept (e.g. EMFILE), instead of spinning on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Bounds on the API, so that no caller and no stuck operation can freeze the daemon.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time an operation (ADD, DEL, CHECK, GC, LIST) has to answer; after it the caller gets
    /// "try again later" (11) while the operation finishes (or rolls back) in the daemon.
    pub operation_deadline: Duration,
    /// Connections served at once; more are answered "try again later" and closed.
    pub max_connections: usize,
    /// Time a client has to take its answer.
    pub reply_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            operation_deadline: Duration::from_secs(30),
            max_connections: 4096,
            reply_timeout: Duration::from_secs(10),
        }
    }
}

pub struct DaemonOptions {
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    /// A conf dir (loaded as a runtime does) or one config file.
    pub config_source: PathBuf,
    /// Render this template into `render_output` before loading the config.
    pub render: Option<RenderAtStart>,
    /// Host ("node") network namespace; default: the daemon's own.
    pub host_netns: Option<PathBuf>,
    /// Serve Prometheus metrics and the health endpoints on each of these.
    pub metrics_addrs: Vec<std::net::SocketAddr>,
    /// Kernel tracing of sandbox setups; `None` turns it off.
    pub trace: Option<TraceOptions>,
    /// Bounds on operations and connections.
    pub limits: Limits,
    /// Time the kernel has to answer each netlink request.
    pub netlink_timeout: Duration,
    /// The `/proc/sys` whose `net` dir the sysctls are read and written under (a writable
    /// bind mount of the host's `/proc/sys/net` where the container's `/proc/sys` is
    /// read-only).
    pub proc_sys: PathBuf,
}

pub struct TraceOptions {
    /// Time a sandbox namespace has to get its network.
    pub deadline: std::time::Duration,
    /// Time a read of a sandbox's state (and the runtime's answer about its pod) may take.
    pub read_wait: std::time::Duration,
    pub rules: crate::trace::SandboxRules,
    /// Asked for the pod of an alarmed sandbox no CNI call named (the node's CRI runtime).
    pub pod_resolver: Option<Arc<dyn crate::pod::PodResolver>>,
    /// Backends chosen instead of the probe's (`--trace-backend`).
    pub backends: crate::trace::BackendChoices,
}

pub struct RenderAtStart {
    pub template: PathBuf,
    pub pod_cidrs: Vec<IpNetwork>,
    pub output: PathBuf,
}

/// Runs until SIGTERM or SIGINT, then finishes the operations in flight and returns.
pub async fn run(opts: DaemonOptions) -> Result<()> {
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
    let state = Arc::new(new_state(&opts, dataplane, kernel));
    let initial = config_rx.borrow_and_update().clone();
    state.apply_config(initial).await;

    let follower = spawn_config_follower(Arc::clone(&state), config_rx);
    let metrics_servers: Vec<JoinHandle<()>> = opts
        .metrics_addrs
        .iter()
        .map(|addr| spawn_metrics_server(*addr, Arc::clone(&state)))
        .collect();
    let (listener, socket_file) = bind(&opts.socket)?;
    let status = state.status().await;
    tracing::info!(
        socket = %opts.socket.display(),
        ready = status.ready,
        reasons = ?status.reasons,
        "daemon listening"
    );
    let mut in_flight = serve_until_signal(&listener, &state, &opts.limits).await?;
    tracing::info!(
        in_flight = in_flight.len(),
        "shutting down: finishing operations in flight"
    );
    drop(listener);
    // Gone with the listener, so that a successor started meanwhile binds at once; only while
    // the path is still the socket bound here, never a successor's.
    socket_file.remove_if_ours();
    drain(&mut in_flight, &state).await;
    follower.abort();
    for server in metrics_servers {
        server.abort();
    }
    drop(watcher);
    tracing::info!("stopped");
    Ok(())
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

/// Netlink in the given host network namespace, or in the daemon's own.
/// Netlink in the host network namespace, with the node's and the sandboxes' sysctls under
/// `proc_sys` (checked to hold `net/`).
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
    state.metrics = Arc::new(crate::metrics::Metrics::with_operation_deadline(
        opts.limits.operation_deadline,
    ));
    state
}

/// Applies each config change as it comes, and checks the store every `STORE_CHECK`.
fn spawn_config_follower(
    state: Arc<DaemonState>,
    mut config_rx: tokio::sync::watch::Receiver<crate::config::ConfigState>,
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
fn spawn_metrics_server(addr: std::net::SocketAddr, state: Arc<DaemonState>) -> JoinHandle<()> {
    let metrics = Arc::clone(&state.metrics);
    let refresh = Arc::new(move |m: &crate::metrics::Metrics| {
        refresh_trace_metrics(m, state.kernel.as_ref());
        refresh_ipam_metrics(m, state.active().as_deref());
    });
    tokio::spawn(async move {
        if let Err(err) = crate::metrics::serve(addr, metrics, refresh).await {
            tracing::error!(%addr, error = %err, "metrics endpoint failed");
        }
    })
}

/// Accepts connections, each served as a task of its own, until SIGTERM or SIGINT; returns the
/// connections still being served.
async fn serve_until_signal(
    listener: &UnixListener,
    state: &Arc<DaemonState>,
    limits: &Limits,
) -> Result<JoinSet<()>> {
    let mut in_flight = JoinSet::new();
    let limits = Arc::new(limits.clone());
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("install SIGTERM handler")?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match Arc::clone(&connections).try_acquire_owned() {
                    Ok(permit) => {
                        let state = Arc::clone(state);
                        let limits = Arc::clone(&limits);
                        in_flight.spawn(async move {
                            serve(&state, &limits, stream).await;
                            drop(permit);
                        });
                    }
                    Err(_) => refuse_busy(&stream, limits.max_connections),
                },
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = sigterm.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(in_flight)
}

/// Waits up to `DRAIN_TIMEOUT` for the connections and the operations in flight, then deletes
/// the retired links still queued.
async fn drain(in_flight: &mut JoinSet<()>, state: &DaemonState) {
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
    } else if !state.wait_operations(DRAIN_TIMEOUT).await {
        // Operations whose callers were answered "try again later" and that still run.
        tracing::error!("operations still running after {DRAIN_TIMEOUT:?}: stopping anyway");
    }
    let left = state.dataplane.flush_deletions().await;
    if left > 0 {
        tracing::warn!(
            left,
            "retired links not deleted yet; the next start removes them"
        );
    }
}

/// The socket file this daemon bound, told apart from one bound later at the same path (by a
/// successor started while this one drains) by its device and inode.
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    fn remove_if_ours(&self) {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => {
                if let Err(err) = std::fs::remove_file(&self.path) {
                    tracing::warn!(socket = %self.path.display(), error = %err, "remove the API socket");
                }
            }
            Ok(_) => tracing::info!(
                socket = %self.path.display(),
                "the API socket's path now belongs to another daemon: left in place"
            ),
            Err(_) => {}
        }
    }
}

/// Binds the socket root-only (0600, in a directory only its owner may enter), replacing a
/// stale socket file.
fn bind(path: &Path) -> Result<(UnixListener, SocketFile)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        private_dir(dir)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("another daemon is listening on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("remove stale {}", path.display()))?;
    }
    // No umask change (other threads run): the directory keeps everyone else out until the
    // socket's own mode is set.
    let listener = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("inspect the bound socket {}", path.display()))?;
    let file = SocketFile {
        path: path.to_path_buf(),
        dev: std::os::unix::fs::MetadataExt::dev(&meta),
        ino: std::os::unix::fs::MetadataExt::ino(&meta),
    };
    Ok((listener, file))
}

/// Creates `dir` 0700, or checks an existing one: a directory owned by the daemon's user
/// that no one else may write to (else another user could replace the socket).
fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("create socket directory {}", dir.display()))?;
            // The mode given to mkdir is cut by the umask; make it exactly 0700.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("chmod 0700 {}", dir.display()))
        }
        Err(err) => Err(err).with_context(|| format!("inspect socket directory {}", dir.display())),
        Ok(meta) => {
            let me = nix::unistd::geteuid().as_raw();
            let refuse = |why: String| {
                anyhow::anyhow!(
                    "socket directory {} {why}: refusing to put the API socket there (it must \
                     be a directory owned by uid {me} that no one else may write to)",
                    dir.display()
                )
            };
            if !meta.is_dir() {
                return Err(refuse("is not a directory".to_owned()));
            }
            if meta.uid() != me {
                return Err(refuse(format!("is owned by uid {}", meta.uid())));
            }
            if meta.mode() & 0o022 != 0 {
                return Err(refuse(format!(
                    "is group- or world-writable (mode {:04o})",
                    meta.mode() & 0o7777
                )));
            }
            Ok(())
        }
    }
}

/// Answers a connection beyond the limit "try again later" without waiting (a fresh socket's
/// buffer takes the short line) and closes it.
fn refuse_busy(stream: &UnixStream, max: usize) {
    let response: Response = CniError::try_again_later(format!(
        "provisioner daemon busy: {max} connections open already"
    ))
    .into();
    let mut bytes = serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    if let Err(err) = stream.try_write(&bytes) {
        tracing::debug!(error = %err, "could not tell a refused connection why");
    }
    tracing::warn!(max, "connection refused: too many connections");
}

async fn serve(state: &Arc<DaemonState>, limits: &Limits, stream: UnixStream) {
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
                    Ok(request) => handle(state, limits, request).await,
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
    match tokio::time::timeout(limits.reply_timeout, write.write_all(&bytes)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::debug!(error = %err, "client went away before the answer"),
        Err(_) => tracing::warn!(
            timeout = ?limits.reply_timeout,
            "client did not take its answer in time: connection closed"
        ),
    }
}

async fn handle(state: &Arc<DaemonState>, limits: &Limits, request: Request) -> Response {
    match request {
        Request::Add(req) => sandbox_op(state, limits, req, Op::Add).await,
        Request::Del(req) => sandbox_op(state, limits, req, Op::Del).await,
        Request::Check(req) => sandbox_op(state, limits, req, Op::Check).await,
        Request::Gc { network, valid } => {
            in_operation(state, limits, "GC".to_owned(), move |active| async move {
                gc(&active, network.as_ref(), &valid).await
            })
            .await
        }
        Request::Status => ok(&state.status().await),
        Request::List => {
            in_operation(state, limits, "LIST".to_owned(), |active| async move {
                list(&active).await
            })
            .await
        }
        Request::Sandboxes { pod, verdict } => match &state.kernel {
            Some(kernel) => match SandboxFilter::parse(pod, verdict.as_deref()) {
                Ok(filter) => ok(&kernel.sandboxes(&filter)),
                Err(reason) => CniError::invalid_env(format!("sandboxes: {reason}")).into(),
            },
            None => tracing_off(),
        },
        Request::Why { pod } => match &state.kernel {
            Some(kernel) => ok(&why(kernel, pod)),
            None => tracing_off(),
        },
        Request::KernelWatch { on } => match &state.kernel {
            Some(kernel) => switch_kernel_watch(state, kernel, on).await,
            None => tracing_off(),
        },
    }
}

/// What the kernel watch knows of `pod`'s sandboxes, explained.
fn why(kernel: &KernelWatch, pod: String) -> WhyAnswer {
    let filter = SandboxFilter {
        pod: Some(pod.clone()),
        verdict: None,
    };
    let answer = kernel.sandboxes(&filter);
    let mut sandboxes: Vec<String> = answer.sandboxes.iter().map(super::why::explain).collect();
    sandboxes.extend(answer.absent.iter().map(super::why::explain_absent));
    WhyAnswer {
        pod,
        sandboxes,
        tracing_unavailable: answer.tracing_unavailable,
    }
}

fn tracing_off() -> Response {
    CniError::new(
        CniError::INTERNAL,
        "kernel tracing is off in this daemon (--no-trace)",
    )
    .into()
}

/// Pauses or resumes the kernel watch. A resumed watch audits the live sandboxes, as at start:
/// what happened to them while it was paused was not seen.
async fn switch_kernel_watch(state: &DaemonState, kernel: &KernelWatch, on: bool) -> Response {
    if !on {
        kernel.pause().await;
    } else if kernel.resume()
        && let Some(active) = state.active()
    {
        kernel_watch::audit_existing(&active.service, "kernel watch resumed").await;
    }
    ok(&serde_json::json!({
        "kernel_watch": if on { "on" } else { "off" },
        "tracing_unavailable": kernel.metrics().0,
    }))
}

/// Runs `op` on the network in force, as a task of its own that holds the operation guard and
/// a snapshot of the network, and answers within the operation deadline: "try again later"
/// when the network is not ready, a config change does not end in time, or `op` does not.
async fn in_operation<F, Fut>(state: &DaemonState, limits: &Limits, what: String, op: F) -> Response
where
    F: FnOnce(Arc<Active>) -> Fut,
    Fut: Future<Output = Response> + Send + 'static,
{
    let deadline = Instant::now() + limits.operation_deadline;
    let Ok(guard) = tokio::time::timeout_at(deadline, state.begin_operation()).await else {
        return CniError::try_again_later(format!(
            "{what}: a network config change did not finish within {:?}",
            limits.operation_deadline
        ))
        .into();
    };
    let active = match require_active(state).await {
        Ok(active) => active,
        Err(response) => return response,
    };
    let work = op(active);
    let task = tokio::spawn(async move {
        let _running = guard;
        work.await
    });
    answer_by(deadline, limits.operation_deadline, &what, task).await
}

/// The answer of `task`, or at `deadline` "try again later" while the task goes on (so that
/// what it started is finished or rolled back; the caller's retry then converges).
async fn answer_by(
    deadline: Instant,
    allowed: Duration,
    what: &str,
    task: JoinHandle<Response>,
) -> Response {
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => CniError::internal(format!("{what} failed: {err}")).into(),
        Err(_) => {
            tracing::warn!(
                operation = what,
                ?allowed,
                "operation over its deadline: answered try again later, it goes on"
            );
            CniError::try_again_later(format!(
                "{what} did not finish within {allowed:?}; it goes on in the daemon: retry later"
            ))
            .into()
        }
    }
}

fn refresh_trace_metrics(metrics: &crate::metrics::Metrics, kernel: Option<&KernelWatch>) {
    let trace = kernel.and_then(|kernel| match kernel.metrics() {
        (None, trace) => Some(trace),
        (Some(_), _) => None,
    });
    metrics.set_trace(trace);
    metrics.set_alarms(kernel.map(KernelWatch::alarms).unwrap_or_default());
}

/// The address usage of the network in force; a store that cannot be read leaves the ranges
/// out of the scrape (and says why in the log), as no network in force does.
fn refresh_ipam_metrics(metrics: &crate::metrics::Metrics, active: Option<&Active>) {
    let usage = active.map(|active| crate::metrics::ipam::usage(active.service.allocator()));
    metrics.set_ranges(match usage {
        Some(Ok(usage)) => usage,
        Some(Err(err)) => {
            tracing::warn!(error = %err, "address usage for metrics could not be read");
            Vec::new()
        }
        None => Vec::new(),
    });
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

/// A snapshot of the network in force, or code 11 (try again later) with the reasons it is
/// not ready.
async fn require_active(state: &DaemonState) -> Result<Arc<Active>, Response> {
    if let Some(active) = state.active() {
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
    match claimed {
        Ok(claimed) => {
            let reason = network.mismatch(&claimed)?;
            Some(CniError::new(CniError::CONFIG_MISMATCH, reason).into())
        }
        Err(err) => Some(
            CniError::invalid_config(format!("request's network config is invalid: {err}")).into(),
        ),
    }
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Add => "ADD",
            Op::Del => "DEL",
            Op::Check => "CHECK",
        }
    }
}

async fn sandbox_op(
    state: &Arc<DaemonState>,
    limits: &Limits,
    mut req: SandboxRequest,
    op: Op,
) -> Response {
    let started = std::time::Instant::now();
    // Stored and logged: held to what the plugin's own parsing of CNI_ARGS lets through.
    req.pod = req.pod.and_then(crate::pod::Pod::sanitized);
    let response = match admit(state, limits, &req, op).await {
        Err(refused) => refused,
        Ok(()) => {
            let what = format!(
                "{} of container {:?} ifname {:?}",
                op.name(),
                req.container_id,
                req.ifname
            );
            in_operation(state, limits, what, move |active| async move {
                sandbox_op_inner(&active, req, op).await
            })
            .await
        }
    };
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

/// What is checked before anything is allocated or touched: the names of an ADD or CHECK
/// (code 4, they are the runtime's `CNI_CONTAINERID` and `CNI_IFNAME`) and the netns path (a network namespace, not
/// the node's nor the daemon's own: code 4; missing: 3). DEL tolerates a path that is gone or
/// not a namespace any more (its teardown skips the sandbox side), never the node's netns.
async fn admit(
    state: &Arc<DaemonState>,
    limits: &Limits,
    req: &SandboxRequest,
    op: Op,
) -> Result<(), Response> {
    names::sandbox(&req.container_id, &req.ifname).map_err(|err| {
        Response::from(CniError::invalid_env(format!(
            "{} refused: {err}",
            op.name()
        )))
    })?;
    let Some(netns) = req.netns.clone() else {
        return match op {
            Op::Del => Ok(()),
            Op::Add | Op::Check => Err(CniError::invalid_env(format!(
                "{} of container {} needs a network namespace path",
                op.name(),
                req.container_id
            ))
            .into()),
        };
    };
    // A path on a hung filesystem must not hold the caller either.
    let checked = tokio::time::timeout(
        limits.operation_deadline,
        state.dataplane.check_sandbox_netns(&netns),
    )
    .await
    .map_err(|_| {
        Response::from(CniError::try_again_later(format!(
            "{} of container {}: netns {} not inspected within {:?}",
            op.name(),
            req.container_id,
            netns.display(),
            limits.operation_deadline
        )))
    })?;
    let Err(err) = checked else {
        return Ok(());
    };
    let fatal = match op {
        Op::Add | Op::Check => true,
        Op::Del => matches!(
            err,
            DataplaneError::BadNetns {
                reason: BadNetns::NotASandbox(_),
                ..
            }
        ),
    };
    if !fatal {
        return Ok(());
    }
    tracing::warn!(container = %req.container_id, error = %err, op = op.name(), "refused before allocating");
    let mut refused = dataplane_refusal(&err);
    refused.msg = format!(
        "{} of container {}: {}",
        op.name(),
        req.container_id,
        refused.msg
    );
    Err(refused.into())
}

async fn sandbox_op_inner(active: &Active, req: SandboxRequest, op: Op) -> Response {
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
        pod: req.pod.clone(),
    };
    let pod = req.pod.as_ref();
    let container = Some(req.container_id.as_str());
    let who = crate::pod::describe(pod);
    match op {
        Op::Add => match service.add(&sandbox).await {
            Ok(outcome) => {
                crate::pod_event!(tracing::Level::INFO, pod, container,
                    container = %req.container_id, ifname = %req.ifname,
                    addresses = ?outcome.allocation.ips.iter().map(|i| i.address.to_string()).collect::<Vec<_>>(),
                    "ADD {who}: added");
                Response::Ok {
                    result: outcome.cni_result().to_json(CniVersion::LATEST),
                }
            }
            Err(err) => {
                crate::pod_event!(tracing::Level::WARN, pod, container,
                    container = %req.container_id, ifname = %req.ifname, error = %err,
                    "ADD {who}: failed");
                cni_error(&err).into()
            }
        },
        Op::Del => match service.del(&sandbox).await {
            Ok(outcome) => {
                // A DEL without CNI_ARGS names the pod its ADD recorded.
                let pod = pod.or_else(|| outcome.released.as_ref()?.pod.as_ref());
                let who = crate::pod::describe(pod);
                crate::pod_event!(tracing::Level::INFO, pod, container,
                    container = %req.container_id, ifname = %req.ifname,
                    released = outcome.released.is_some(), "DEL {who}: deleted");
                Response::Ok {
                    result: serde_json::Value::Null,
                }
            }
            Err(err) => {
                crate::pod_event!(tracing::Level::WARN, pod, container,
                    container = %req.container_id, ifname = %req.ifname, error = %err,
                    "DEL {who}: failed");
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
                Ok(allocation) => {
                    let pod = pod.or(allocation.pod.as_ref());
                    let who = crate::pod::describe(pod);
                    crate::pod_event!(tracing::Level::DEBUG, pod, container,
                        container = %req.container_id, ifname = %req.ifname, "CHECK {who}: ok");
                    Response::Ok {
                        result: serde_json::Value::Null,
                    }
                }
                Err(err) => {
                    crate::pod_event!(tracing::Level::WARN, pod, container,
                        container = %req.container_id, ifname = %req.ifname, error = %err,
                        "CHECK {who}: failed");
                    cni_error(&err).into()
                }
            }
        }
    }
}

async fn gc(active: &Active, network: Option<&NetworkClaim>, valid: &[AttachmentRef]) -> Response {
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

async fn list(active: &Active) -> Response {
    match active.service.list().await {
        Ok(allocations) => ok(&allocations
            .iter()
            .map(|a| AllocationInfo {
                container_id: a.key.container_id.clone(),
                ifname: a.key.ifname.clone(),
                addresses: a.ips.iter().map(|ip| ip.address.to_string()).collect(),
                pod: a.pod.clone(),
            })
            .collect::<Vec<_>>()),
        Err(err) => cni_error(&err).into(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde::Deserialize;

    use super::*;

    #[test]
    fn a_claim_is_served_when_its_name_and_ranges_are_the_daemons() {
        let loaded = serde_json::json!({
            "type": "provisioner",
            "ranges": [[{"subnet": "10.244.0.0/22"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        });
        let ipam = IpamConfig::deserialize(&loaded).expect("ipam");
        let network = Network::new("pods", None, ipam).expect("network");
        let claim = |name: &str, ipam: serde_json::Value| NetworkClaim {
            name: name.to_owned(),
            ipam,
        };
        let code = |claim: &NetworkClaim| match claim_mismatch(&network, Some(claim)) {
            None => None,
            Some(Response::Error { code, msg, .. }) => Some((code, msg)),
            Some(other) => panic!("not an error: {other:?}"),
        };
        assert_eq!(code(&claim("pods", loaded.clone())), None);
        // Other routes, the same ranges: still this network.
        let other_routes = serde_json::json!({"ranges": [[{"subnet": "10.244.0.0/22"}]]});
        assert_eq!(code(&claim("pods", other_routes)), None);
        let (c, msg) = code(&claim("other", loaded)).expect("another network");
        assert_eq!(c, CniError::CONFIG_MISMATCH, "{msg}");
        assert!(msg.contains("\"other\""), "{msg}");
        let other_ranges = serde_json::json!({"ranges": [[{"subnet": "10.245.0.0/22"}]]});
        let (c, msg) = code(&claim("pods", other_ranges)).expect("other ranges");
        assert_eq!(c, CniError::CONFIG_MISMATCH, "{msg}");
        assert!(msg.contains("10.245.0.0/22"), "{msg}");
        let invalid = serde_json::json!({"ranges": [[{"subnet": "10.245.0.0/33"}]]});
        let (c, msg) = code(&claim("pods", invalid)).expect("invalid");
        assert_eq!(c, CniError::INVALID_NETWORK_CONFIG, "{msg}");
    }

    #[test]
    fn a_missing_socket_directory_is_created_0700() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("run").join("provisioner");
        private_dir(&dir).expect("created");
        let meta = std::fs::metadata(&dir).expect("exists");
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o7777, 0o700);
        // And accepted as it is on the next start.
        private_dir(&dir).expect("accepted");
    }

    #[test]
    fn a_socket_directory_others_may_write_to_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        for mode in [0o777, 0o1777, 0o770, 0o722] {
            std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(mode))
                .expect("chmod");
            let e = private_dir(root.path()).expect_err("writable by others");
            let msg = e.to_string();
            assert!(msg.contains("group- or world-writable"), "{mode:o}: {msg}");
            assert!(msg.contains(&root.path().display().to_string()), "{msg}");
        }
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        private_dir(root.path()).expect("0755 owned by us is fine");
    }

    #[test]
    fn a_socket_directory_of_another_user_or_a_file_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let file = root.path().join("file");
        std::fs::write(&file, b"").expect("write");
        let e = private_dir(&file).expect_err("a file");
        assert!(e.to_string().contains("is not a directory"), "{e}");
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(4242)), None).expect("chown");
        let e = private_dir(&theirs).expect_err("owned by another user");
        assert!(e.to_string().contains("is owned by uid 4242"), "{e}");
    }

    #[tokio::test]
    async fn an_operation_over_its_deadline_is_answered_try_again_later_and_goes_on() {
        let finished = std::sync::Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let finished = std::sync::Arc::clone(&finished);
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                finished.store(true, Ordering::SeqCst);
                Response::Ok {
                    result: serde_json::Value::Null,
                }
            }
        });
        let allowed = Duration::from_millis(20);
        let started = Instant::now();
        let answer = answer_by(started + allowed, allowed, "ADD of container c", task).await;
        assert!(started.elapsed() < Duration::from_millis(250));
        match answer {
            Response::Error { code, msg, .. } => {
                assert_eq!(code, CniError::TRY_AGAIN_LATER);
                assert!(
                    msg.contains("ADD of container c did not finish within"),
                    "{msg}"
                );
            }
            Response::Ok { .. } => panic!("answered before the operation could finish"),
        }
        // The operation was not cancelled: it finishes (or rolls back) on its own.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !finished.load(Ordering::SeqCst) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn an_operation_within_its_deadline_is_answered_with_its_result() {
        let task = tokio::spawn(async {
            Response::Ok {
                result: serde_json::json!({ "done": true }),
            }
        });
        let allowed = Duration::from_secs(5);
        let answer = answer_by(Instant::now() + allowed, allowed, "DEL", task).await;
        assert_eq!(
            answer,
            Response::Ok {
                result: serde_json::json!({ "done": true })
            }
        );
    }
}
