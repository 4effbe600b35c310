//! `provisioner daemon`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use provisioner::config::parse_pod_cidrs;
use provisioner::daemon::api::DEFAULT_SOCKET;
use provisioner::daemon::{DaemonOptions, Limits, RenderAtStart, TraceOptions};
use provisioner::pod::PodResolver;
use provisioner::runtime::CriResolver;
use provisioner::trace::SandboxRules;

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Unix socket of the API (created 0600, root only).
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Where allocations are stored.
    #[arg(long, default_value = "/var/lib/provisioner")]
    data_dir: PathBuf,
    /// CNI conf dir, loaded as a runtime does (first network with a "provisioner" plugin).
    #[arg(long, conflicts_with = "config")]
    conf_dir: Option<PathBuf>,
    /// One network config file instead of a conf dir.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Render this containerd-style template at start (needs --pod-cidr).
    #[arg(long, requires = "pod_cidr")]
    template: Option<PathBuf>,
    /// Pod CIDR(s) for --template, comma separated.
    #[arg(long)]
    pod_cidr: Option<String>,
    /// Where --template renders to (default: <conf-dir>/10-provisioner.conflist).
    #[arg(long)]
    template_output: Option<PathBuf>,
    /// Host ("node") network namespace path; default: the daemon's own.
    #[arg(long)]
    host_netns: Option<PathBuf>,
    /// Serve Prometheus metrics (/metrics) and the health endpoints (/healthz, /readyz) on
    /// this address: IP:PORT, or an IP alone for port 9640 (repeatable: one listener each).
    #[arg(long, value_name = "ADDR", value_parser = provisioner::metrics::http::parse_addr)]
    metrics_addr: Vec<std::net::SocketAddr>,
    /// Do not trace sandbox network setup in the kernel.
    #[arg(long)]
    no_trace: bool,
    /// Seconds a sandbox namespace has to get its network before its verdict (from its
    /// creation, the latest ADD that names it, or its setup's latest request).
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    trace_deadline: f64,
    /// Seconds a read of a sandbox's state from the kernel (and the runtime's answer about
    /// its pod, asked with it) may take before the verdict goes on without it.
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    trace_read_timeout: f64,
    /// Run an observation of the kernel watch on this backend instead of the one this
    /// kernel's probe picks, e.g. `rtnetlink=syscall_tracepoints` (repeatable; see
    /// `provisioner status` and docs/install.md).
    #[arg(long, value_name = "OBSERVATION=BACKEND")]
    trace_backend: Vec<String>,
    /// CRI socket asked for the pod of a sandbox no CNI plugin ran for (default: the socket of
    /// the runtime that created its namespace, from its command line and config).
    #[arg(long, value_name = "PATH")]
    cri_socket: Option<PathBuf>,
    /// Seconds an operation (ADD, DEL, CHECK, GC) has to answer; after them the caller is told
    /// to try again later (CNI code 11) while the operation finishes in the daemon.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    operation_timeout: f64,
    /// Seconds the kernel has to answer each netlink request.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    netlink_timeout: f64,
    /// The `/proc/sys` the sysctls are read and written under (its `net` dir): in a container
    /// whose own `/proc/sys` is read-only, where the host's `/proc/sys/net` is mounted writable.
    #[arg(long, value_name = "DIR", default_value = provisioner::dataplane::DEFAULT_PROC_SYS)]
    proc_sys: PathBuf,
    /// Connections served at once; more are answered "try again later" and closed.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    max_connections: usize,
    /// Log lines as text or as one JSON object per line.
    #[arg(long, value_enum, default_value_t = super::LogFormat::Text)]
    pub log_format: super::LogFormat,
}

pub fn run(args: DaemonArgs) -> Result<()> {
    let config_source = match (&args.conf_dir, &args.config) {
        (Some(dir), None) => dir.clone(),
        (None, Some(file)) => file.clone(),
        _ => bail!("give --conf-dir DIR or --config FILE"),
    };
    let render = match (&args.template, &args.pod_cidr) {
        (Some(template), Some(cidrs)) => {
            let output = match (&args.template_output, &args.conf_dir) {
                (Some(output), _) => output.clone(),
                (None, Some(dir)) => dir.join("10-provisioner.conflist"),
                (None, None) => args.config.clone().context("--template-output")?,
            };
            Some(RenderAtStart {
                template: template.clone(),
                pod_cidrs: parse_pod_cidrs(cidrs).context("--pod-cidr")?,
                output,
            })
        }
        _ => None,
    };
    let trace = if args.no_trace {
        None
    } else {
        let read_wait =
            Duration::try_from_secs_f64(args.trace_read_timeout).context("--trace-read-timeout")?;
        let pod_resolver: Arc<dyn PodResolver> =
            Arc::new(CriResolver::new(args.cri_socket.clone()).with_timeout(read_wait));
        Some(TraceOptions {
            deadline: Duration::try_from_secs_f64(args.trace_deadline)
                .context("--trace-deadline")?,
            read_wait,
            rules: SandboxRules::default(),
            pod_resolver: Some(pod_resolver),
            backends: super::backend_choices(&args.trace_backend, "--trace-backend")?,
        })
    };
    let seconds = |flag: &str, value: f64| {
        Duration::try_from_secs_f64(value)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("{flag} must be a positive number of seconds, not {value}"))
    };
    let limits = Limits {
        operation_deadline: seconds("--operation-timeout", args.operation_timeout)?,
        max_connections: args.max_connections.max(1),
        ..Limits::default()
    };
    let netlink_timeout = seconds("--netlink-timeout", args.netlink_timeout)?;
    limit_malloc_arenas();
    // One thread runs every async task: each is short (what blocks or computes for long runs on
    // the committer, the netns workers, the reaper, the trace driver or the blocking pool), and
    // the kernel serializes rtnetlink requests anyway. A multi-threaded runtime cost each ADD
    // ~1/5 more CPU in wake-ups across its workers, and was no faster with 16 callers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(provisioner::daemon::run(DaemonOptions {
        socket: args.socket,
        data_dir: args.data_dir,
        config_source,
        render,
        host_netns: args.host_netns,
        metrics_addrs: args.metrics_addr,
        trace,
        limits,
        netlink_timeout,
        proc_sys: args.proc_sys,
    }))
}

/// glibc gives threads that allocate at the same time arenas of their own (up to 8 per CPU) and
/// keeps their free pages: with the daemon's ~20 threads (tokio, blocking pool, netns workers,
/// committer, reaper, tracer) that doubled its RSS (40 MiB instead of 24 MiB with 1000 sandboxes
/// and the kernel watch on). Two arenas, set before any thread starts.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes an allocator parameter; no other thread runs yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
