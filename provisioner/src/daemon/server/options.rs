//! What the daemon is started with: paths, the metrics listeners, tracing, and the bounds on
//! its API.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnetwork::IpNetwork;

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
    pub deadline: Duration,
    /// Time a read of a sandbox's state (and the runtime's answer about its pod) may take.
    pub read_wait: Duration,
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
