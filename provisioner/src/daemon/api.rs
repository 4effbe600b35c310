//! The daemon's wire protocol: one [`Request`] line, one [`Response`] line.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::pod::Pod;

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
    /// Every sandbox namespace the kernel watch saw, with verdicts and timelines; only those
    /// of `pod` (`namespace/name` or a bare name) and/or whose latest verdict is `verdict`
    /// (`skipped`, `networked`, ...) when given.
    Sandboxes {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verdict: Option<String>,
    },
    /// For one pod (`namespace/name` or a bare name): its sandboxes' verdict, timeline and
    /// the diagnosis, in words ([`WhyAnswer`]).
    Why {
        pod: String,
    },
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
    /// The pod the runtime named in `CNI_ARGS` (absent from an older plugin's request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Pod>,
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
    /// The kernel watch; `None` when the daemon runs without it (`--no-trace`).
    #[serde(default)]
    pub kernel_watch: Option<KernelWatchStatus>,
}

/// Whether the kernel watch runs, and what each of its observations runs on on this kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelWatchStatus {
    /// `None` while it runs; else why it does not (starting, paused, or what the kernel lacks).
    pub unavailable: Option<String>,
    /// Empty until the programs were attached once.
    pub observations: Vec<crate::trace::ObservationStatus>,
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

/// `provisioner why`: what the daemon knows of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhyAnswer {
    /// The pod asked about, as asked.
    pub pod: String,
    /// One explanation per sandbox of the pod the daemon knows, oldest first (a pod whose
    /// sandbox was recreated has several); empty when it knows none.
    pub sandboxes: Vec<String>,
    /// `None` when kernel tracing runs; else why it does not.
    pub tracing_unavailable: Option<String>,
}

/// One line of `provisioner list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationInfo {
    pub container_id: String,
    pub ifname: String,
    pub addresses: Vec<String>,
    /// The pod its latest ADD named; `None` when none did (or before a store migration).
    #[serde(default)]
    pub pod: Option<Pod>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_without_a_pod_still_parses_and_a_pod_round_trips() {
        // What a plugin that predates pods sends.
        let old = r#"{"op":"add","container_id":"c1","ifname":"eth0","netns":"/run/netns/c1","network":null}"#;
        let Ok(Request::Add(req)) = serde_json::from_str::<Request>(old) else {
            panic!("an older plugin's ADD must parse");
        };
        assert_eq!(req.pod, None);
        let unnamed = serde_json::to_string(&Request::Add(req.clone())).expect("serialise");
        assert!(!unnamed.contains("pod"), "no pod key when none: {unnamed}");

        let pod = Pod::from_cni_args(
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-1;K8S_POD_INFRA_CONTAINER_ID=c1",
        );
        let named = Request::Del(SandboxRequest { pod, ..req });
        let line = serde_json::to_string(&named).expect("serialise");
        let back: Request = serde_json::from_str(&line).expect("parse");
        assert_eq!(back, named);
        let Request::Del(back) = back else {
            panic!("a DEL")
        };
        let pod = back.pod.expect("the pod");
        assert_eq!(
            (
                pod.namespace.as_str(),
                pod.name.as_str(),
                pod.uid.as_deref()
            ),
            ("default", "web-0", Some("u-1"))
        );
    }

    #[test]
    fn sandboxes_without_a_filter_is_the_request_of_old() {
        let old: Request = serde_json::from_str(r#"{"op":"sandboxes"}"#).expect("parse");
        assert_eq!(
            old,
            Request::Sandboxes {
                pod: None,
                verdict: None
            }
        );
        assert_eq!(
            serde_json::to_string(&old).expect("serialise"),
            r#"{"op":"sandboxes"}"#
        );
    }

    #[test]
    fn a_list_entry_without_a_pod_parses() {
        let info: AllocationInfo = serde_json::from_str(
            r#"{"container_id":"c1","ifname":"eth0","addresses":["10.0.0.2/24"]}"#,
        )
        .expect("parse");
        assert_eq!(info.pod, None);
    }
}
