//! Which pod a sandbox belongs to, and how that is known.
//!
//! A runtime names the pod to every CNI plugin it runs, in `CNI_ARGS`
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`, `K8S_POD_INFRA_CONTAINER_ID`). The daemon
//! reads them from its own ADDs, the kernel watch from any plugin's exec, and where no plugin ran
//! the runtime is asked over CRI. Every output names the pod first; a pod that cannot be named is
//! [`PodName::Unknown`] with the reason, never a guess.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub const K8S_POD_NAMESPACE: &str = "K8S_POD_NAMESPACE";
pub const K8S_POD_NAME: &str = "K8S_POD_NAME";
pub const K8S_POD_UID: &str = "K8S_POD_UID";
pub const K8S_POD_INFRA_CONTAINER_ID: &str = "K8S_POD_INFRA_CONTAINER_ID";

/// Longest value kept for any field: Kubernetes names are at most 253 bytes, uids 36, sandbox
/// ids 64; anything longer is cut (a runtime's argument is not trusted to be sane).
const MAX_FIELD: usize = 253;

/// A pod as its runtime names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pod {
    /// The Kubernetes namespace; empty where the runtime gives none (podman).
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The pod sandbox's id (`K8S_POD_INFRA_CONTAINER_ID`, the CRI `PodSandboxId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
}

impl Pod {
    /// The pod named by `KEY=VALUE` pairs (the `CNI_ARGS` keys above), when they name one
    /// (`K8S_POD_NAME` non-empty). The last value of a repeated key wins.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Pod> {
        let mut pod = Pod::default();
        for (key, value) in pairs {
            let value = clean(value);
            match key {
                K8S_POD_NAMESPACE => pod.namespace = value,
                K8S_POD_NAME => pod.name = value,
                K8S_POD_UID => pod.uid = Some(value).filter(|v| !v.is_empty()),
                K8S_POD_INFRA_CONTAINER_ID => {
                    pod.sandbox_id = Some(value).filter(|v| !v.is_empty())
                }
                _ => {}
            }
        }
        (!pod.name.is_empty()).then_some(pod)
    }

    /// The pod named by a raw `CNI_ARGS` value (`K=V;K=V`), read leniently: a segment without
    /// `=` is skipped, as an observer must not reject what a runtime sent.
    pub fn from_cni_args(args: &str) -> Option<Pod> {
        Pod::from_pairs(args.split(';').filter_map(|seg| seg.split_once('=')))
    }

    /// This pod with every field cleaned as [`Pod::from_pairs`] cleans it (control characters
    /// dropped, length bounded), or `None` without a name left: for a pod that came by another
    /// road than `CNI_ARGS` (a socket caller's request).
    pub fn sanitized(self) -> Option<Pod> {
        let opt = |v: Option<String>| v.map(|v| clean(&v)).filter(|v| !v.is_empty());
        let pod = Pod {
            namespace: clean(&self.namespace),
            name: clean(&self.name),
            uid: opt(self.uid),
            sandbox_id: opt(self.sandbox_id),
        };
        (!pod.name.is_empty()).then_some(pod)
    }

    /// `namespace/name`, or `name` alone where there is no namespace.
    pub fn qualified_name(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }

    /// Whether `query` (`namespace/name`, or a bare `name`) names this pod.
    pub fn matches(&self, query: &str) -> bool {
        match query.split_once('/') {
            Some((ns, name)) => ns == self.namespace && name == self.name,
            None => query == self.name,
        }
    }
}

/// `default/web-0 (uid 1f.., sandbox 4bf982a7)`: the sandbox id shortened to 8 characters as
/// `crictl pods` shows it.
impl fmt::Display for Pod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.qualified_name())?;
        let mut extra = Vec::new();
        if let Some(uid) = &self.uid {
            extra.push(format!("uid {uid}"));
        }
        if let Some(id) = &self.sandbox_id {
            extra.push(format!("sandbox {}", short_id(id)));
        }
        if !extra.is_empty() {
            write!(f, " ({})", extra.join(", "))?;
        }
        Ok(())
    }
}

/// How a pod was identified.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum PodSource {
    /// The CNI call this daemon served (its `CNI_ARGS`).
    CniCall,
    /// The environment of a CNI plugin the kernel watch saw executed for the namespace.
    PluginExec { plugin: String },
    /// The runtime's answer over CRI.
    Cri { runtime: String },
}

impl fmt::Display for PodSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CniCall => f.write_str("its CNI call"),
            Self::PluginExec { plugin } => write!(f, "the environment of CNI plugin {plugin}"),
            Self::Cri { runtime } => write!(f, "{runtime} over CRI"),
        }
    }
}

/// The pod of a sandbox, or why it cannot be named.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PodName {
    Known {
        pod: Pod,
        source: PodSource,
    },
    /// `reason` completes "pod unknown (...)", e.g. "no CNI plugin ran and containerd does not
    /// list the sandbox".
    Unknown {
        reason: String,
    },
}

impl PodName {
    pub fn known(&self) -> Option<&Pod> {
        match self {
            Self::Known { pod, .. } => Some(pod),
            Self::Unknown { .. } => None,
        }
    }
}

/// `pod default/web-0 (uid .., sandbox ..)` or `pod unknown (reason)`.
impl fmt::Display for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Known { pod, .. } => write!(f, "pod {pod}"),
            Self::Unknown { reason } => write!(f, "pod unknown ({reason})"),
        }
    }
}

/// Asks who a sandbox namespace belongs to where no CNI call named it (the node's runtime over
/// CRI). The kernel watch calls it at most once per namespace, off the ADD path.
pub trait PodResolver: Send + Sync {
    /// The pod whose sandbox uses the network namespace at one of `netns_paths` (the files
    /// that may be it, most likely first), or why none can be named. `creator` is the process
    /// that created the namespace, when the trace saw it: its runtime is the one to ask (its
    /// CRI socket is found from its command line and config, as its CNI conf dir is). Bounded
    /// in time by the resolver itself.
    fn pod_of_netns<'a>(
        &'a self,
        netns_paths: &'a [PathBuf],
        creator: Option<&'a NetnsCreator>,
    ) -> Pin<Box<dyn Future<Output = PodName> + Send + 'a>>;
}

/// The process that created a namespace, as a [`PodResolver`] needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsCreator {
    pub pid: u32,
    pub comm: String,
}

/// The log fields naming a sandbox's pod (`pod_namespace`, `pod_name`, `pod_uid`,
/// `sandbox_id`), each absent from the event when unknown. See [`crate::pod_event`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogFields<'a> {
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub uid: Option<&'a str>,
    pub sandbox_id: Option<&'a str>,
}

impl<'a> LogFields<'a> {
    /// The fields of `pod`; the sandbox id is the pod's, else `container_id` (a runtime's
    /// `CNI_CONTAINERID` is the pod sandbox's id).
    pub fn of(pod: Option<&'a Pod>, container_id: Option<&'a str>) -> Self {
        Self {
            namespace: pod.map(|p| p.namespace.as_str()).filter(|n| !n.is_empty()),
            name: pod.map(|p| p.name.as_str()),
            uid: pod.and_then(|p| p.uid.as_deref()),
            sandbox_id: pod.and_then(|p| p.sandbox_id.as_deref()).or(container_id),
        }
    }
}

/// `pod default/web-0 (uid .., sandbox ..)`, or `pod unknown` when no pod was named: how a
/// message about a sandbox starts.
pub fn describe(pod: Option<&Pod>) -> String {
    match pod {
        Some(pod) => format!("pod {pod}"),
        None => "pod unknown".to_owned(),
    }
}

/// A `tracing` event about a sandbox, with its pod's [`LogFields`] (`pod_namespace`,
/// `pod_name`, `pod_uid`, `sandbox_id`) before the event's own fields and message:
/// `pod_event!(Level::INFO, pod, container_id, key = value, "message")`.
#[macro_export]
macro_rules! pod_event {
    ($level:expr, $pod:expr, $container_id:expr, $($rest:tt)+) => {{
        let fields = $crate::pod::LogFields::of($pod, $container_id);
        tracing::event!(
            $level,
            pod_namespace = fields.namespace,
            pod_name = fields.name,
            pod_uid = fields.uid,
            sandbox_id = fields.sandbox_id,
            $($rest)+
        )
    }};
}

/// A sandbox or container id as `crictl` shows it: its first 8 characters.
pub fn short_id(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// A field value with control characters dropped and its length bounded.
fn clean(value: &str) -> String {
    let mut out: String = value.chars().filter(|c| !c.is_control()).collect();
    if out.len() > MAX_FIELD {
        let mut end = MAX_FIELD;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_containerd_passes_in_any_order() {
        let pod = Pod::from_cni_args(
            "IgnoreUnknown=1;K8S_POD_UID=u-1;K8S_POD_NAMESPACE=e2e-lo-only;K8S_POD_NAME=e2e-lo-only-0;K8S_POD_INFRA_CONTAINER_ID=4bf982a7deadbeef",
        )
        .expect("a pod");
        assert_eq!(pod.namespace, "e2e-lo-only");
        assert_eq!(pod.name, "e2e-lo-only-0");
        assert_eq!(pod.uid.as_deref(), Some("u-1"));
        assert_eq!(pod.sandbox_id.as_deref(), Some("4bf982a7deadbeef"));
        assert_eq!(
            pod.to_string(),
            "e2e-lo-only/e2e-lo-only-0 (uid u-1, sandbox 4bf982a7)"
        );
        assert!(pod.matches("e2e-lo-only/e2e-lo-only-0"));
        assert!(pod.matches("e2e-lo-only-0"));
        assert!(!pod.matches("default/e2e-lo-only-0"));
    }

    #[test]
    fn no_name_no_pod_and_junk_is_tolerated() {
        assert_eq!(
            Pod::from_cni_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=x"),
            None
        );
        assert_eq!(Pod::from_cni_args(""), None);
        let pod = Pod::from_cni_args("garbage;K8S_POD_NAME=web\u{7}-0;K8S_POD_UID=").expect("pod");
        assert_eq!(pod.name, "web-0");
        assert_eq!(pod.uid, None);
        assert_eq!(pod.qualified_name(), "web-0");
    }

    #[test]
    fn long_values_are_cut_on_a_char_boundary() {
        let long = "é".repeat(200);
        let pod = Pod::from_cni_args(&format!("K8S_POD_NAME={long}")).expect("pod");
        assert!(pod.name.len() <= MAX_FIELD);
        assert!(pod.name.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_pod_from_elsewhere_is_cleaned_like_cni_args() {
        let sent = Pod {
            namespace: "default\n".to_owned(),
            name: format!("web-0\r\nforged log line{}", "x".repeat(400)),
            uid: Some("\u{1b}[31m".to_owned()),
            sandbox_id: Some("4bf982a7".to_owned()),
        };
        let pod = sent.sanitized().expect("a name is left");
        assert_eq!(pod.namespace, "default");
        assert!(pod.name.starts_with("web-0forged log line"), "{}", pod.name);
        assert!(pod.name.len() <= MAX_FIELD);
        assert_eq!(pod.uid.as_deref(), Some("[31m"));
        let nameless = Pod {
            name: "\u{7}".to_owned(),
            ..Pod::default()
        };
        assert_eq!(nameless.sanitized(), None);
    }

    #[test]
    fn unknown_says_why() {
        let name = PodName::Unknown {
            reason: "containerd's CRI socket did not answer".into(),
        };
        assert_eq!(
            name.to_string(),
            "pod unknown (containerd's CRI socket did not answer)"
        );
    }
}
