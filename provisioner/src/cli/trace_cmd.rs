//! `provisioner trace`: a live kernel-level tracing session, without the daemon.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use provisioner::pod::PodResolver;
use provisioner::runtime::CriResolver;
use provisioner::trace::SandboxRules;
use provisioner::trace::session::{self, SessionOptions};

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// JSON lines instead of human-readable lines.
    #[arg(long)]
    json: bool,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Only this network namespace (path); it is treated as a sandbox.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Only events of tasks (or namespaces created by tasks) with this comm.
    #[arg(long)]
    comm: Option<String>,
    /// Seconds a sandbox namespace has to get its network before its verdict (from its
    /// creation, the latest ADD that names it, or its setup's latest request).
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    deadline: f64,
    /// Seconds a read of a sandbox's state (and the runtime's answer about its pod) may take
    /// before the verdict goes on without it.
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    read_timeout: f64,
    /// Print verdicts only, not every event.
    #[arg(long)]
    verdicts_only: bool,
    /// Run an observation on this backend instead of the one this kernel's probe picks, e.g.
    /// `rtnetlink=syscall_tracepoints` (repeatable).
    #[arg(long, value_name = "OBSERVATION=BACKEND")]
    backend: Vec<String>,
    /// comm of a runtime process whose namespaces are sandboxes (repeatable; replaces the
    /// default list: containerd, containerd-shim*, runc*, crun, crio, conmon, pinns, podman, pause).
    #[arg(long = "runtime-comm", value_name = "COMM")]
    runtime_comms: Vec<String>,
    /// Name prefix of pinned sandbox namespaces under /run/netns (repeatable; default cni-, netns-).
    #[arg(long = "pin-prefix", value_name = "PREFIX")]
    pin_prefixes: Vec<String>,
    /// CNI conf dir assumed when a runtime's own cannot be read (to explain its skips).
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// CRI socket asked for the pod of a sandbox no CNI plugin ran for (default: the socket of
    /// the runtime that created its namespace, from its command line and config).
    #[arg(long, value_name = "PATH")]
    cri_socket: Option<PathBuf>,
    /// Log lines as text or as one JSON object per line.
    #[arg(long, value_enum, default_value_t = super::LogFormat::Text)]
    pub log_format: super::LogFormat,
}

fn seconds(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .with_context(|| format!("{what}: {s} is not a duration in seconds"))
}

pub fn run(args: TraceArgs) -> Result<()> {
    let mut rules = SandboxRules::default();
    if !args.runtime_comms.is_empty() {
        rules.runtime_comms = args.runtime_comms;
    }
    if !args.pin_prefixes.is_empty() {
        rules.pin_prefixes = args.pin_prefixes;
    }
    let read_wait = seconds(args.read_timeout, "--read-timeout")?;
    let pod_resolver: Option<Arc<dyn PodResolver>> = Some(Arc::new(
        CriResolver::new(args.cri_socket.clone()).with_timeout(read_wait),
    ));
    let opts = SessionOptions {
        json: args.json,
        duration: args
            .duration
            .map(|d| seconds(d, "--duration"))
            .transpose()?,
        netns: args.netns,
        comm: args.comm,
        deadline: seconds(args.deadline, "--deadline")?,
        read_wait,
        rules,
        verdicts_only: args.verdicts_only,
        cni_conf_dir: args.cni_conf_dir,
        pod_resolver,
        backends: super::backend_choices(&args.backend, "--backend")?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let mut stdout = std::io::stdout();
    runtime
        .block_on(session::run(opts, &mut stdout))
        .context("kernel tracing session (needs root: eBPF, tracefs)")?;
    Ok(())
}
