//! [`PodResolver`] over CRI: the runtime that created a namespace is asked which of its
//! sandboxes uses it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;

use super::bounded;
use super::cri::{CriClient, CriError, PodSandbox, PodSandboxState};
use super::netns::Wanted;
use super::socket::{self, CONTAINERD_SOCKET, CRIO_SOCKET, CriEndpoint};
use crate::pod::{
    K8S_POD_INFRA_CONTAINER_ID, K8S_POD_NAME, K8S_POD_NAMESPACE, K8S_POD_UID, NetnsCreator, Pod,
    PodName, PodResolver, PodSource,
};

/// How long one lookup may take, connecting included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Sandbox statuses asked for at once.
const STATUS_CONCURRENCY: usize = 8;

/// Names a namespace's pod by asking its creator's runtime over CRI.
pub struct CriResolver {
    /// The socket to ask whoever created the namespace (`--cri-socket`).
    socket_override: Option<PathBuf>,
    timeout: Duration,
    /// Per socket: sandbox id -> its netns path (`None`: it has none). A sandbox's namespace
    /// path never changes; ids the runtime no longer lists are dropped at each lookup.
    netns_by_id: Mutex<HashMap<PathBuf, HashMap<String, Option<PathBuf>>>>,
}

impl CriResolver {
    /// A resolver that finds each creator's socket, or always asks `socket_override`.
    pub fn new(socket_override: Option<PathBuf>) -> Self {
        Self {
            socket_override: socket_override.map(|s| socket::socket_path(&s)),
            timeout: DEFAULT_TIMEOUT,
            netns_by_id: Mutex::new(HashMap::new()),
        }
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The pod whose sandbox uses one of `netns_paths`, or why none can be named; within the
    /// resolver's timeout, every socket asked included.
    pub async fn resolve(
        &self,
        netns_paths: &[PathBuf],
        creator: Option<&NetnsCreator>,
    ) -> PodName {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let endpoints = match self.endpoints_within_deadline(creator).await {
            Ok(endpoints) => endpoints,
            Err(reason) => return PodName::Unknown { reason },
        };
        let mut unknown = Vec::new();
        for endpoint in endpoints {
            let listed = AtomicBool::new(false);
            let lookup = self.lookup(&endpoint, netns_paths, &listed);
            match tokio::time::timeout_at(deadline, lookup).await {
                Ok(Ok(known @ PodName::Known { .. })) => return known,
                Ok(Ok(PodName::Unknown { reason }) | Err(reason)) => unknown.push(reason),
                Err(_) => {
                    tracing::debug!(socket = %endpoint.socket.display(), timeout = ?self.timeout, "CRI lookup timed out");
                    unknown.push(if listed.load(Ordering::Relaxed) {
                        format!(
                            "no CNI plugin ran and {}'s sandboxes could not all be read within {} ms",
                            endpoint.runtime_name(),
                            self.timeout.as_millis()
                        )
                    } else {
                        format!("{endpoint} did not answer")
                    });
                    break;
                }
            }
        }
        PodName::Unknown {
            reason: unknown.join("; "),
        }
    }

    /// [`endpoints`]: a runtime creator's command line and config are read on the
    /// runtime-files reader, waited for at most the resolver's timeout from a blocking thread,
    /// never on the caller's.
    async fn endpoints_within_deadline(
        &self,
        creator: Option<&NetnsCreator>,
    ) -> Result<Vec<CriEndpoint>, String> {
        let reads_files = creator.is_some_and(|c| socket::is_cri_runtime_comm(&c.comm));
        if self.socket_override.is_some() || !reads_files {
            return endpoints(self.socket_override.as_deref(), creator);
        }
        let (creator, timeout) = (creator.cloned(), self.timeout);
        tokio::task::spawn_blocking(move || {
            bounded::within_deadline(timeout, move || endpoints(None, creator.as_ref()))
        })
        .await
        .map_err(|e| format!("reading the creator's CRI socket failed: {e}"))?
        .map_err(|unfinished| {
            format!(
                "no CNI plugin ran and the creator's CRI socket could not be read ({unfinished})"
            )
        })?
    }

    /// One lookup on one socket: `Ok` with the pod or why the runtime cannot name it, `Err`
    /// when the socket gave no usable answer. `listed` is set once the runtime listed its
    /// sandboxes (the statuses read until the deadline stay cached for the next lookup).
    async fn lookup(
        &self,
        endpoint: &CriEndpoint,
        wanted: &[PathBuf],
        listed: &AtomicBool,
    ) -> Result<PodName, String> {
        let mut client = CriClient::connect(&endpoint.socket)
            .await
            .map_err(|e| unanswered(endpoint, e))?;
        let endpoint = match &endpoint.runtime {
            Some(_) => endpoint.clone(),
            None => CriEndpoint {
                runtime: Some(
                    client
                        .runtime_name()
                        .await
                        .map_err(|e| unanswered(endpoint, e))?,
                )
                .filter(|n| !n.is_empty()),
                socket: endpoint.socket.clone(),
            },
        };
        let mut sandboxes = client
            .sandboxes()
            .await
            .map_err(|e| unanswered(&endpoint, e))?;
        listed.store(true, Ordering::Relaxed);
        // A sandbox no plugin ran for is most likely NOTREADY and recent.
        sandboxes.sort_by_key(|s| {
            (
                s.state != PodSandboxState::SandboxNotready as i32,
                std::cmp::Reverse(s.created_at),
            )
        });
        let (cached, unread) = self.split_cached(&endpoint.socket, &sandboxes);
        let runtime = endpoint.runtime_name().to_owned();
        let wanted = Wanted::new(wanted);
        if let Some(found) = cached.iter().find(|(_, netns)| wanted.matches(netns)) {
            return Ok(named(found.0, &runtime));
        }
        let ids: Vec<String> = unread.iter().map(|s| s.id.clone()).collect();
        let mut statuses = futures::stream::iter(ids.into_iter().enumerate().map(|(i, id)| {
            let mut client = client.clone();
            async move {
                let netns = client.sandbox_netns(&id).await;
                (i, id, netns)
            }
        }))
        .buffered(STATUS_CONCURRENCY);
        let mut unreadable = 0usize;
        while let Some((i, id, netns)) = statuses.next().await {
            match netns {
                Ok(netns) => {
                    let found = netns.as_deref().is_some_and(|n| wanted.matches(n));
                    self.remember(&endpoint.socket, &id, netns);
                    if found && let Some(sandbox) = unread.get(i) {
                        return Ok(named(sandbox, &runtime));
                    }
                }
                Err(err) => {
                    tracing::debug!(sandbox = %id, error = %err, "CRI sandbox status unreadable");
                    unreadable += 1;
                }
            }
        }
        let mut reason = format!("no CNI plugin ran and {runtime} does not list the sandbox");
        if unreadable > 0 {
            reason.push_str(&format!(
                " (the status of {unreadable} of its sandboxes could not be read)"
            ));
        }
        Ok(PodName::Unknown { reason })
    }

    /// The listed sandboxes whose netns path is known (with it), and those still to read; the
    /// cache keeps only the listed ids.
    fn split_cached<'s>(
        &self,
        socket: &Path,
        sandboxes: &'s [PodSandbox],
    ) -> (Vec<(&'s PodSandbox, PathBuf)>, Vec<&'s PodSandbox>) {
        let mut cache = self
            .netns_by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = cache.entry(socket.to_path_buf()).or_default();
        let listed: HashSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        known.retain(|id, _| listed.contains(id.as_str()));
        let mut cached = Vec::new();
        let mut unread = Vec::new();
        for sandbox in sandboxes {
            match known.get(&sandbox.id) {
                Some(Some(netns)) => cached.push((sandbox, netns.clone())),
                Some(None) => {}
                None => unread.push(sandbox),
            }
        }
        (cached, unread)
    }

    fn remember(&self, socket: &Path, id: &str, netns: Option<PathBuf>) {
        let mut cache = self
            .netns_by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache
            .entry(socket.to_path_buf())
            .or_default()
            .insert(id.to_owned(), netns);
    }
}

/// The sockets to ask: the override (named after the creator's runtime when its name
/// tells, else after what the socket reports), the creator's runtime's, or (creator
/// unknown) the default sockets present on the node.
fn endpoints(
    socket_override: Option<&Path>,
    creator: Option<&NetnsCreator>,
) -> Result<Vec<CriEndpoint>, String> {
    if let Some(socket) = socket_override {
        return Ok(vec![CriEndpoint {
            runtime: creator
                .and_then(|c| socket::runtime_of_comm(&c.comm))
                .map(str::to_owned),
            socket: socket.to_path_buf(),
        }]);
    }
    match creator {
        Some(creator) => match socket::endpoint_of(creator.pid, &creator.comm) {
            Ok(Some(endpoint)) => Ok(vec![endpoint]),
            Ok(None) => Err(format!(
                "no CNI plugin ran and the creator {} is not a CRI runtime",
                crate::text::escaped(&creator.comm)
            )),
            Err(untrusted) => Err(format!(
                "no CNI plugin ran and the creator {}[{}] is not trusted as a CRI runtime \
                 ({untrusted}; --cri-socket names the runtime to ask)",
                crate::text::escaped(&creator.comm),
                creator.pid
            )),
        },
        None => {
            let found = socket::default_endpoints();
            if found.is_empty() {
                Err(format!(
                    "no CNI plugin ran, its creator is unknown and no CRI socket is at {CONTAINERD_SOCKET} or {CRIO_SOCKET}"
                ))
            } else {
                Ok(found)
            }
        }
    }
}

/// Why `endpoint` gave no usable answer, in words; what the transport said goes to the log.
fn unanswered(endpoint: &CriEndpoint, err: CriError) -> String {
    match err {
        CriError::Unreachable(detail) => {
            tracing::debug!(socket = %endpoint.socket.display(), %detail, "CRI socket did not answer");
            format!("{endpoint} did not answer")
        }
        refused => format!("{endpoint}: {refused}"),
    }
}

/// The pod of `sandbox` from its metadata, or why it has no name.
fn named(sandbox: &PodSandbox, runtime: &str) -> PodName {
    let meta = sandbox.metadata.clone().unwrap_or_default();
    let pod = Pod::from_pairs([
        (K8S_POD_NAMESPACE, meta.namespace.as_str()),
        (K8S_POD_NAME, meta.name.as_str()),
        (K8S_POD_UID, meta.uid.as_str()),
        (K8S_POD_INFRA_CONTAINER_ID, sandbox.id.as_str()),
    ]);
    match pod {
        Some(pod) => PodName::Known {
            pod,
            source: PodSource::Cri {
                runtime: runtime.to_owned(),
            },
        },
        None => PodName::Unknown {
            reason: format!(
                "{runtime} lists the sandbox as {} without a pod name",
                crate::pod::short_id(&sandbox.id)
            ),
        },
    }
}

impl PodResolver for CriResolver {
    fn pod_of_netns<'a>(
        &'a self,
        netns_paths: &'a [PathBuf],
        creator: Option<&'a NetnsCreator>,
    ) -> Pin<Box<dyn Future<Output = PodName> + Send + 'a>> {
        Box::pin(self.resolve(netns_paths, creator))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_creator_that_is_no_runtime_is_said_so() {
        let resolver = CriResolver::new(None);
        let creator = NetnsCreator {
            pid: std::process::id(),
            comm: "unshare".to_owned(),
        };
        let answer = resolver
            .resolve(&[PathBuf::from("/run/netns/x")], Some(&creator))
            .await;
        assert_eq!(
            answer.to_string(),
            "pod unknown (no CNI plugin ran and the creator unshare is not a CRI runtime)"
        );
    }

    #[tokio::test]
    async fn a_missing_socket_did_not_answer() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("containerd.sock");
        let resolver = CriResolver::new(Some(socket.clone()));
        let answer = resolver
            .resolve(&[PathBuf::from("/run/netns/x")], None)
            .await;
        assert_eq!(
            answer,
            PodName::Unknown {
                reason: format!("CRI socket {} did not answer", socket.display())
            }
        );
    }

    #[tokio::test]
    async fn an_overridden_socket_is_named_after_the_creators_runtime() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("gone.sock");
        let resolver =
            CriResolver::new(Some(PathBuf::from(format!("unix://{}", socket.display()))));
        let creator = NetnsCreator {
            pid: u32::MAX,
            comm: "containerd".to_owned(),
        };
        let answer = resolver
            .resolve(&[PathBuf::from("/run/netns/x")], Some(&creator))
            .await;
        assert_eq!(
            answer.to_string(),
            format!(
                "pod unknown (containerd's CRI socket {} did not answer)",
                socket.display()
            )
        );
    }

    #[tokio::test]
    async fn a_silent_socket_times_out() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("silent.sock");
        // Accepts connections (the kernel does, from the backlog) and never speaks HTTP/2.
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let resolver =
            CriResolver::new(Some(socket.clone())).with_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let answer = resolver
            .resolve(&[PathBuf::from("/run/netns/x")], None)
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            answer.to_string(),
            format!(
                "pod unknown (CRI socket {} did not answer)",
                socket.display()
            )
        );
    }
}
