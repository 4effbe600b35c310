//! The daemon's wire protocol: one [`Request`] line, one [`Response`] line.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Default path of the daemon's socket.
pub const DEFAULT_SOCKET: &str = "/run/provisioner/provisioner.sock";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Add(SandboxRequest),
    Del(SandboxRequest),
    Check(SandboxRequest),
    /// Release every allocation of `network` whose (container id, ifname) is not in `valid`.
    Gc {
        network: Option<NetworkClaim>,
        valid: Vec<AttachmentRef>,
    },
    Status,
    List,
    /// Every sandbox namespace the kernel watch saw, with verdicts and timelines.
    Sandboxes,
    /// Pause (`on: false`: the eBPF programs are detached when the answer comes) or resume
    /// kernel tracing.
    KernelWatch {
        on: bool,
    },
}

/// One sandbox interface, as CNI names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRequest {
    pub container_id: String,
    pub ifname: String,
    pub netns: Option<PathBuf>,
    /// The network the caller believes it talks to; checked against the daemon's.
    pub network: Option<NetworkClaim>,
    /// CNI prevResult (CHECK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_result: Option<Value>,
}

/// Name and IPAM section of the caller's network config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkClaim {
    pub name: String,
    pub ipam: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRef {
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Response {
    /// `result`: a CNI result (1.1.0 shape) for ADD, a status/list document otherwise.
    Ok { result: Value },
    /// A CNI error code and message (codes from [`crate::cni::CniError`]).
    Error {
        code: u32,
        msg: String,
        #[serde(default)]
        details: String,
    },
}

/// `provisioner status`: readiness with every reason and what is loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub ready: bool,
    /// Why the daemon is not ready (empty when ready).
    pub reasons: Vec<String>,
    pub network: Option<NetworkInfo>,
    pub last_load: Option<LoadInfo>,
    pub allocations: Option<u64>,
    pub config_source: PathBuf,
    pub socket: PathBuf,
    pub data_dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkInfo {
    pub name: String,
    pub file: PathBuf,
    pub ranges: Vec<String>,
    pub mtu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadInfo {
    /// Seconds since the Unix epoch.
    pub at: f64,
    pub file: Option<PathBuf>,
    pub ok: bool,
    pub error: Option<String>,
}

/// One line of `provisioner list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationInfo {
    pub container_id: String,
    pub ifname: String,
    pub addresses: Vec<String>,
}
