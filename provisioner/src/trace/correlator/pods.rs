//! Which pod a namespace belongs to: named by the environment of a CNI plugin executed for it,
//! or by a [`crate::pod::PodResolver`]'s answer; and the CNI calls that name a namespace the
//! correlator does not know yet.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::pod::{Pod, PodName, PodSource};
use crate::trace::cni_env::CniEnv;
use crate::trace::kernel::events::{ExecEnv, TraceEvent};
use crate::trace::sandbox_rules::{PinSource, parse_pin_source};
use crate::trace::verdict::Step;

use super::Correlator;

/// CNI calls kept while the namespace they name is not known yet.
const MAX_PENDING: usize = 64;
/// How long such a call waits for its namespace to become known (pinned, created).
pub(super) const PENDING_FOR: Duration = Duration::from_secs(2);

/// The pod of one namespace, as far as it is known.
#[derive(Clone, Debug, Default)]
pub(super) struct PodState {
    /// Named by a plugin's environment, or the resolver's answer (known or why not).
    pub named: Option<PodName>,
    /// A CNI plugin that ran for the namespace without naming a pod.
    pub plugin_without_pod: Option<String>,
    /// A plugin not run by root that named a pod (not taken: any user can exec a binary with
    /// any environment), and its uid.
    pub untrusted: Option<(String, u32)>,
    /// An alarm is due and the pod is not known: the next read of the state asks a resolver.
    pub wanted: bool,
    /// A resolver was asked (at most once per namespace).
    pub asked: bool,
}

impl PodState {
    /// Takes the pod named by a CNI call's environment (of a plugin run by `uid`: only root's
    /// are believed); the first pod named stays.
    pub(super) fn plugin_ran(&mut self, plugin: &str, uid: u32, pod: Option<&Pod>) {
        if uid != 0 {
            if pod.is_some() && self.untrusted.is_none() {
                self.untrusted = Some((plugin.to_owned(), uid));
            }
            return;
        }
        match pod {
            Some(pod) if self.named.as_ref().and_then(PodName::known).is_none() => {
                self.named = Some(PodName::Known {
                    pod: pod.clone(),
                    source: PodSource::PluginExec {
                        plugin: plugin.to_owned(),
                    },
                });
            }
            Some(_) => {}
            None => {
                if self.plugin_without_pod.is_none() {
                    self.plugin_without_pod = Some(plugin.to_owned());
                }
            }
        }
    }

    /// Whether a resolver should be asked with the next read of the namespace's state: once,
    /// while no plugin named the pod.
    pub(super) fn take_query(&mut self) -> bool {
        let ask =
            self.wanted && !self.asked && self.named.as_ref().and_then(PodName::known).is_none();
        if ask {
            self.asked = true;
        }
        self.wanted = false;
        ask
    }

    /// A resolver's answer: kept unless a plugin named the pod meanwhile.
    pub(super) fn resolved(&mut self, answer: PodName) {
        if self.named.as_ref().and_then(PodName::known).is_none() {
            self.named = Some(answer);
        }
    }

    /// The pod a verdict names: known, or why not. `configured`: some process was seen
    /// changing the namespace (a plugin may have run whose environment was not read: one not
    /// run by a runtime nor from a CNI plugin directory).
    pub(super) fn for_verdict(&self, configured: bool) -> PodName {
        if let Some(named) = &self.named {
            return named.clone();
        }
        let reason = match (&self.plugin_without_pod, &self.untrusted) {
            (Some(plugin), _) => {
                format!("CNI plugin {plugin} ran with no K8S_POD_NAME in CNI_ARGS")
            }
            (None, Some((plugin, uid))) => {
                format!("only CNI plugin {plugin} run by uid {uid}, not root, named one")
            }
            (None, None) if configured => {
                "no CNI call naming it was seen and no runtime was asked".to_owned()
            }
            (None, None) => "no CNI plugin ran and no runtime was asked".to_owned(),
        };
        PodName::Unknown { reason }
    }
}

/// The pod a CNI call's environment names: `CNI_ARGS`, its sandbox id completed from
/// `CNI_CONTAINERID` when the runtime gives none.
pub(super) fn pod_of(cni: &CniEnv) -> Option<Pod> {
    let mut pod = Pod::from_cni_args(cni.args.as_deref()?)?;
    if pod.sandbox_id.is_none() && !cni.container_id.is_empty() {
        pod.sandbox_id = Some(cni.container_id.clone());
    }
    Some(pod)
}

/// How a CNI call names its namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum NetnsName {
    /// A file, `/var/run` spelled `/run` (the usual link).
    Path(PathBuf),
    /// `/proc/<pid>[/task/<tid>]/ns/net`: the namespace of that process.
    Process { pid: u32, path: PathBuf },
}

impl NetnsName {
    /// How `CNI_NETNS` names the namespace; `None` when it names none (empty, or the plugin's
    /// own `/proc/self`).
    pub(super) fn parse(netns: &str) -> Option<Self> {
        if netns.is_empty() {
            return None;
        }
        match parse_pin_source(netns) {
            Some(PinSource::Task { pid, .. }) => Some(Self::Process {
                pid,
                path: PathBuf::from(netns),
            }),
            Some(PinSource::Caller) => None,
            None => Some(Self::Path(normal(Path::new(netns)))),
        }
    }
}

/// `path` with a leading `/var/run` spelled `/run`.
pub(super) fn normal(path: &Path) -> PathBuf {
    match path.strip_prefix("/var/run") {
        Ok(rest) => Path::new("/run").join(rest),
        Err(_) => path.to_path_buf(),
    }
}

/// Whether `path` is `normal` (a [`normal`] path), `/var/run` spelled `/run`; without
/// allocating (it is asked of every file of every tracked namespace).
pub(super) fn spelled_alike(path: &Path, normal: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = path.as_os_str().as_bytes();
    let normal = normal.as_os_str().as_bytes();
    path == normal || path.strip_prefix(b"/var".as_slice()) == Some(normal)
}

/// A CNI call whose namespace was not known when its plugin was executed.
#[derive(Clone, Debug)]
pub(super) struct PendingCall {
    pub event: TraceEvent,
    pub cni: CniEnv,
    pub parent: String,
    pub uid: u32,
    pub netns: NetnsName,
}

/// CNI calls waiting for their namespace, bounded in number and time.
#[derive(Default)]
pub(super) struct PendingCalls {
    calls: VecDeque<PendingCall>,
    pub dropped: u64,
}

impl PendingCalls {
    pub(super) fn push(&mut self, call: PendingCall) {
        if self.calls.len() >= MAX_PENDING {
            self.calls.pop_front();
            self.dropped += 1;
        }
        self.calls.push_back(call);
    }

    /// Takes the calls that `matches` (their namespace became known), and drops the ones that
    /// waited longer than [`PENDING_FOR`] before `now`.
    pub(super) fn take(
        &mut self,
        now: SystemTime,
        matches: impl Fn(&NetnsName) -> bool,
    ) -> Vec<PendingCall> {
        let before = self.calls.len();
        self.calls
            .retain(|c| now.duration_since(c.event.at).unwrap_or_default() <= PENDING_FOR);
        self.dropped += (before - self.calls.len()) as u64;
        let (found, waiting): (Vec<_>, Vec<_>) =
            self.calls.drain(..).partition(|c| matches(&c.netns));
        self.calls = waiting.into();
        found
    }

    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

impl Correlator {
    /// A binary's environment at exec: when it is a CNI call, its step and its pod go to the
    /// namespace `CNI_NETNS` names. An ADD naming one not known yet is kept a while (its pin
    /// may come later); other calls name namespaces that existed before (a DEL's may be judged
    /// and no longer followed).
    pub(super) fn on_exec_env(&mut self, event: &TraceEvent, env: &ExecEnv) -> Option<u64> {
        let cni = env.cni.as_ref()?;
        let netns = NetnsName::parse(&cni.netns)?;
        let call = PendingCall {
            event: event.clone(),
            cni: cni.clone(),
            parent: env.parent_comm.clone(),
            uid: env.uid,
            netns,
        };
        let Some(cookie) = self.named_netns(&call.netns) else {
            if call.cni.command == "ADD" {
                self.pending_cni.push(call);
            }
            return None;
        };
        self.cni_call(cookie, &call);
        Some(cookie)
    }

    /// The tracked namespace a CNI call names (the latest created, when a pin path was
    /// reused).
    fn named_netns(&self, name: &NetnsName) -> Option<u64> {
        let has = |path: &std::path::Path| {
            self.namespaces
                .iter()
                .filter(|(_, ns)| {
                    ns.pins
                        .iter()
                        .chain(&ns.handles)
                        .any(|p| spelled_alike(p, path))
                })
                .max_by_key(|(_, ns)| ns.created_at)
                .map(|(cookie, _)| *cookie)
        };
        match name {
            NetnsName::Path(path) => has(path),
            NetnsName::Process { pid, path } => self
                .by_pid
                .get(pid)
                .copied()
                .filter(|c| self.namespaces.contains_key(c))
                .or_else(|| has(path)),
        }
    }

    /// Adds a CNI call to the timeline of namespace `cookie`, and the pod it names. An ADD not
    /// judged yet starts the sandbox's deadline again: a plugin is at work on it, and a slow one
    /// (a chain, a loaded node) is given the deadline from its own start.
    pub(super) fn cni_call(&mut self, cookie: u64, call: &PendingCall) {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return;
        };
        if call.cni.command == "ADD" && ns.verdict.is_none() {
            ns.deadline_from = ns.deadline_from.max(call.event.at);
        }
        let pod = pod_of(&call.cni);
        let plugin = call.event.task.comm.clone();
        ns.pod.plugin_ran(&plugin, call.uid, pod.as_ref());
        ns.push(
            &call.event,
            Step::CniCall {
                command: call.cni.command.clone(),
                plugin,
                parent: call.parent.clone(),
                uid: call.uid,
                pod: pod.map(Box::new),
            },
            None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_names_are_read_as_runtimes_write_them() {
        assert_eq!(
            NetnsName::parse("/var/run/netns/cni-1"),
            Some(NetnsName::Path(PathBuf::from("/run/netns/cni-1")))
        );
        assert_eq!(
            NetnsName::parse("/proc/42/ns/net"),
            Some(NetnsName::Process {
                pid: 42,
                path: PathBuf::from("/proc/42/ns/net")
            })
        );
        assert_eq!(NetnsName::parse(""), None);
        let pin = Path::new("/run/netns/cni-1");
        assert!(spelled_alike(Path::new("/var/run/netns/cni-1"), pin));
        assert!(spelled_alike(pin, pin));
        assert!(!spelled_alike(Path::new("/var/run/netns/cni-2"), pin));
        assert!(!spelled_alike(Path::new("/var/lib/netns/cni-1"), pin));
        assert_eq!(NetnsName::parse("/proc/self/ns/net"), None);
    }

    #[test]
    fn the_reason_never_says_no_plugin_ran_where_something_configured_the_namespace() {
        let state = PodState::default();
        let reason = |configured| match state.for_verdict(configured) {
            PodName::Unknown { reason } => reason,
            known => panic!("{known:?}"),
        };
        assert_eq!(reason(false), "no CNI plugin ran and no runtime was asked");
        assert_eq!(
            reason(true),
            "no CNI call naming it was seen and no runtime was asked"
        );
    }

    #[test]
    fn no_resolver_is_asked_for_a_pod_a_plugin_named() {
        let mut state = PodState::default();
        let pod = Pod::from_cni_args("K8S_POD_NAME=web-0").expect("pod");
        state.plugin_ran("loopback", 0, Some(&pod));
        state.wanted = true;
        assert!(!state.take_query());
        assert!(!state.wanted, "the want is consumed");
    }

    fn cni(container_id: &str, args: Option<&str>) -> CniEnv {
        CniEnv {
            command: "ADD".to_owned(),
            netns: "/var/run/netns/cni-1".to_owned(),
            container_id: container_id.to_owned(),
            args: args.map(str::to_owned),
        }
    }

    #[test]
    fn a_calls_pod_takes_its_sandbox_id_from_cni_args_else_from_the_container_id() {
        let args = "K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=4bf982a7";
        let sandbox = |env: &CniEnv| pod_of(env).and_then(|p| p.sandbox_id);
        assert_eq!(
            sandbox(&cni("c0ffee", Some(args))).as_deref(),
            Some("4bf982a7")
        );
        assert_eq!(
            sandbox(&cni("c0ffee", Some("K8S_POD_NAME=web-0"))).as_deref(),
            Some("c0ffee")
        );
        assert_eq!(sandbox(&cni("", Some("K8S_POD_NAME=web-0"))), None);
        assert_eq!(pod_of(&cni("c0ffee", None)), None, "no CNI_ARGS, no pod");
    }

    fn call(at_ms: u64, pin: &str) -> PendingCall {
        PendingCall {
            event: TraceEvent {
                at: SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms),
                task: crate::trace::TaskInfo {
                    pid: 7,
                    tid: 7,
                    comm: "loopback".to_owned(),
                    cgroup_id: 1,
                },
                kind: crate::trace::EventKind::ExecEnv(ExecEnv {
                    parent_pid: 1,
                    parent_comm: "containerd".to_owned(),
                    uid: 0,
                    cni: None,
                    env_len: 0,
                    copied: 0,
                }),
            },
            cni: cni("c1", None),
            parent: "containerd".to_owned(),
            uid: 0,
            netns: NetnsName::Path(PathBuf::from(pin)),
        }
    }

    #[test]
    fn pending_calls_are_bounded_in_number_and_time_and_the_dropped_counted() {
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut calls = PendingCalls::default();
        assert!(calls.is_empty());
        for i in 0..MAX_PENDING + 2 {
            calls.push(call(0, &format!("/run/netns/cni-{i}")));
        }
        assert!(!calls.is_empty());
        assert_eq!(calls.dropped, 2, "the two oldest dropped");
        let gone = calls.take(at(0), |n| *n == NetnsName::Path("/run/netns/cni-0".into()));
        assert!(gone.is_empty(), "the oldest was dropped: {gone:?}");
        let found = calls.take(at(0), |n| *n == NetnsName::Path("/run/netns/cni-2".into()));
        assert_eq!(found.len(), 1);
        assert_eq!(calls.dropped, 2);
        // Waited longer than PENDING_FOR: dropped and counted.
        let late = at(u64::try_from(PENDING_FOR.as_millis()).unwrap_or(u64::MAX) + 1);
        assert!(calls.take(late, |_| true).is_empty());
        assert_eq!(calls.dropped, 2 + MAX_PENDING as u64 - 1);
        assert!(calls.is_empty());
    }

    #[test]
    fn the_first_pod_a_root_plugin_names_stays() {
        let mut state = PodState::default();
        let first = Pod::from_cni_args("K8S_POD_NAMESPACE=a;K8S_POD_NAME=web-0").expect("pod");
        let second = Pod::from_cni_args("K8S_POD_NAMESPACE=b;K8S_POD_NAME=web-1").expect("pod");
        state.plugin_ran("loopback", 0, Some(&first));
        state.plugin_ran("bridge", 0, Some(&second));
        assert_eq!(
            state.for_verdict(true),
            PodName::Known {
                pod: first,
                source: PodSource::PluginExec {
                    plugin: "loopback".into()
                }
            }
        );
    }

    #[test]
    fn only_an_untrusted_plugin_that_named_a_pod_is_told_and_the_first_stays() {
        let reason = |state: &PodState| match state.for_verdict(false) {
            PodName::Unknown { reason } => reason,
            known => panic!("{known:?}"),
        };
        let pod = Pod::from_cni_args("K8S_POD_NAME=web-0").expect("pod");
        let mut state = PodState::default();
        // A user's plugin that names no pod: neither taken nor told.
        state.plugin_ran("loopback", 1000, None);
        assert_eq!(reason(&state), "no CNI plugin ran and no runtime was asked");
        state.plugin_ran("loopback", 1000, Some(&pod));
        state.plugin_ran("bridge", 2000, Some(&pod));
        assert_eq!(
            reason(&state),
            "only CNI plugin loopback run by uid 1000, not root, named one"
        );
        // A root plugin that names none is the one told.
        state.plugin_ran("portmap", 0, None);
        state.plugin_ran("tuning", 0, None);
        assert_eq!(
            reason(&state),
            "CNI plugin portmap ran with no K8S_POD_NAME in CNI_ARGS"
        );
    }

    #[test]
    fn a_resolver_is_asked_once_and_a_plugin_wins_over_its_answer() {
        let mut state = PodState::default();
        assert!(!state.take_query(), "not wanted");
        state.wanted = true;
        assert!(state.take_query());
        state.wanted = true;
        assert!(!state.take_query(), "asked once");
        state.resolved(PodName::Unknown {
            reason: "containerd's CRI socket did not answer".into(),
        });
        let pod = Pod::from_cni_args("K8S_POD_NAME=web-0").expect("pod");
        state.plugin_ran("loopback", 1000, Some(&pod));
        assert_eq!(
            state.for_verdict(false).known(),
            None,
            "not root: not taken"
        );
        state.plugin_ran("loopback", 0, Some(&pod));
        assert_eq!(state.for_verdict(false).known(), Some(&pod));
        state.resolved(PodName::Unknown { reason: "x".into() });
        assert_eq!(
            state.for_verdict(false).known(),
            Some(&pod),
            "the plugin's pod stays"
        );
    }
}
