//! Netlink operations (veth, address, route, link, sysctl) and netns handles; setup, teardown
//! and check of one sandbox, wired like the reference CNI `ptp` plugin.
//!
//! One netlink socket per namespace: the socket of a namespace is created by a pooled worker
//! thread that entered it (`setns(CLONE_NEWNET)`) and went back home, then driven from tokio;
//! the calling thread never changes namespace. The host socket is created once and reused for
//! every call. The requests of a `Conn::batch` are all sent before any reply is read; the
//! calling task reads the replies itself (the kernel answers inside the send: no connection
//! task in between). The messages come from rtnetlink's message builders wherever those give
//! the same bytes (a hand-built one says why); rtnetlink's own connection, which reads replies
//! in a task of its own, is not used.
//! Teardown retires the host veth (withdrawn, down, in the graveyard group) and a reaper
//! thread deletes retired links in batches, off the DEL path (see `reaper`).

mod address;
mod check;
mod error;
mod inventory;
mod link;
mod locate;
mod naming;
mod netlink;
mod netns;
mod plan;
mod reaper;
mod route;
mod setup;
mod snapshot;
mod spec;
mod sysctl;
mod teardown;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

pub use crate::nsfs::BadNetns;
pub use error::{CheckFailure, DataplaneError, SetupStep};
pub use inventory::{HostVeth, Inventory};
pub use locate::{SANDBOX_PIN_DIRS, netns_files};
pub use naming::{
    GRAVEYARD_GROUP, GRAVEYARD_IFNAME_PREFIX, HOST_IFNAME_PREFIX, IFNAME_MAX, graveyard_ifname,
    host_ifname, is_graveyard_ifname, is_host_ifname,
};
pub use netlink::{
    DEFAULT_REQUEST_TIMEOUT as DEFAULT_NETLINK_TIMEOUT, request_timeout as netlink_timeout,
    set_request_timeout as set_netlink_timeout,
};
pub use netns::{
    current_netns_cookie, netns_cookie_of_file, netns_inode_and_cookie, socket_netns_cookie,
};
pub use plan::{ExpectedState, FamilyPlan, plan};
pub use route::{Route, Scope};
pub use setup::StartedSetup;
pub use snapshot::{NetnsSnapshot, SnapshotAddress, SnapshotLink, SnapshotRoute};
pub use spec::{LinkSpec, PodAddress, RouteSpec, SandboxSpec, SetupOutcome, TeardownOutcome};

use netlink::Conn;

/// Reads the network state of the namespace at `path` (links, addresses, main-table routes) and
/// its cookie: what the tracer judges on when it did not see the namespace's history.
pub async fn snapshot(path: &Path) -> Result<NetnsSnapshot, DataplaneError> {
    snapshot::take(path).await
}
use crate::nsfs::NsIdentity;
use netns::NetnsFile;
use reaper::Reaper;

/// Sets sandboxes up, tears them down and checks them. Cheap to clone; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Dataplane {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    host_ns: NetnsFile,
    /// Namespaces no sandbox may use: the node's and the daemon's own.
    not_sandboxes: Vec<NsIdentity>,
    /// The host socket, created in the host netns by the constructor; moved into `host_conn`
    /// on first use (registering with tokio needs a runtime).
    host_socket: Mutex<Option<netlink_sys::Socket>>,
    host_conn: tokio::sync::OnceCell<Conn>,
    /// Deletes retired host links in the background (see [`Dataplane::flush_deletions`]).
    reaper: Reaper,
    /// `net.ipv4.ip_forward` / `net.ipv6.conf.all.forwarding` seen at 1 in the host netns: not
    /// read nor written again.
    forwarding_v4: AtomicBool,
    forwarding_v6: AtomicBool,
    /// Turning IPv6 off on a host veth failed once (and was reported).
    host_ipv6_off_failed: AtomicBool,
    /// The host netns is the daemon's own: its threads are in it (but while
    /// [`NetnsFile::run_here`] runs), so they write its sysctls without entering it.
    host_is_own: bool,
    /// Where the sysctls are read and written: a procfs `sys` dir (see [`Dataplane::open`]).
    proc_sys: Arc<Path>,
}

/// The `/proc/sys` of [`Dataplane::new`] and [`Dataplane::with_host_netns`].
pub const DEFAULT_PROC_SYS: &str = "/proc/sys";

impl Dataplane {
    /// The host ("node") side is the netns of the calling thread.
    pub fn new() -> Result<Self, DataplaneError> {
        Self::open(None, Path::new(DEFAULT_PROC_SYS))
    }

    /// The host side is the netns at `path` (e.g. a "node" netns in tests).
    pub fn with_host_netns(path: &Path) -> Result<Self, DataplaneError> {
        Self::open(Some(path), Path::new(DEFAULT_PROC_SYS))
    }

    /// The host side is the netns at `host_netns` (default: the calling thread's). Sysctls
    /// are read and written under `proc_sys`: a `/proc/sys` whose `net` dir is the host's
    /// procfs one, which resolves against the namespace of the thread that opens a file, so
    /// a writable bind mount of it serves every namespace, the node's and each sandbox's.
    pub fn open(host_netns: Option<&Path>, proc_sys: &Path) -> Result<Self, DataplaneError> {
        let (host_ns, socket) = match host_netns {
            Some(path) => {
                let host_ns = NetnsFile::open(path)?;
                let socket = netlink::socket_in(&host_ns)?;
                (host_ns, socket)
            }
            None => {
                let host_ns = NetnsFile::current_thread()?;
                let socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)
                    .map_err(|source| DataplaneError::Socket {
                        netns: host_ns.label().to_owned(),
                        source,
                    })?;
                (host_ns, socket)
            }
        };
        Self::from_parts(host_ns, socket, Arc::from(proc_sys))
    }

    fn from_parts(
        host_ns: NetnsFile,
        socket: netlink_sys::Socket,
        proc_sys: Arc<Path>,
    ) -> Result<Self, DataplaneError> {
        // Decided now, before a kernel watch attaches: the check makes a namespace of its own.
        netns::ns_id_is_cookie();
        let own = NetnsFile::open(Path::new("/proc/self/ns/net"))?.identity()?;
        let host = host_ns.identity()?;
        let host_is_own = host.same_namespace(&own);
        let not_sandboxes = vec![
            host.named("the node's network namespace (the daemon's host netns)"),
            own.named("the daemon's own network namespace"),
        ];
        let reaper = Reaper::start(&host_ns)?;
        Ok(Self {
            inner: Arc::new(Inner {
                host_ns,
                not_sandboxes,
                host_socket: Mutex::new(Some(socket)),
                host_conn: tokio::sync::OnceCell::new(),
                reaper,
                forwarding_v4: AtomicBool::new(false),
                forwarding_v6: AtomicBool::new(false),
                host_ipv6_off_failed: AtomicBool::new(false),
                host_is_own,
                proc_sys,
            }),
        })
    }

    pub(crate) fn reaper(&self) -> &Reaper {
        &self.inner.reaper
    }

    /// Whether forwarding of the family is known to be on in the host netns.
    pub(crate) fn forwarding_flag(&self, v6: bool) -> &AtomicBool {
        if v6 {
            &self.inner.forwarding_v6
        } else {
            &self.inner.forwarding_v4
        }
    }

    /// The host netns label used in messages.
    #[must_use]
    pub fn host_netns(&self) -> &str {
        self.inner.host_ns.label()
    }

    pub(crate) fn host_ns(&self) -> &NetnsFile {
        &self.inner.host_ns
    }

    /// Applies `list` in the host netns from the calling thread (see [`sysctl::apply_here`]).
    pub(crate) fn apply_host_sysctls(&self, list: &[sysctl::Sysctl]) -> Result<(), DataplaneError> {
        sysctl::apply_here(
            self.host_ns(),
            &self.inner.proc_sys,
            list,
            self.inner.host_is_own,
        )
    }

    /// Applies `list` in the sandbox netns `ns`, on a pooled worker (see [`sysctl::apply_in`]).
    pub(crate) async fn apply_sandbox_sysctls(
        &self,
        ns: &NetnsFile,
        list: Vec<sysctl::Sysctl>,
    ) -> Result<(), DataplaneError> {
        sysctl::apply_in(ns, &self.inner.proc_sys, list).await
    }

    /// Opens the network namespace of a sandbox at `path`: it must be a network namespace,
    /// and neither the node's nor the daemon's own. Whatever uses the namespace afterwards uses
    /// this handle, never the path again. The caller's thread never waits on the path: it is
    /// opened at once when it is cached and leads to a namespace file (the usual case), else
    /// from a blocking thread (a path on a hung file system then holds that thread).
    pub(crate) async fn open_sandbox_netns(
        &self,
        path: &Path,
    ) -> Result<NetnsFile, DataplaneError> {
        let ns = NetnsFile::open_nonblocking(path).await?;
        ns.check_sandbox(&self.inner.not_sandboxes)?;
        Ok(ns)
    }

    /// Checks that `path` is a network namespace a sandbox may use (see
    /// `Self::open_sandbox_netns`; setup and check repeat the check on the handle they use).
    pub async fn check_sandbox_netns(&self, path: &Path) -> Result<(), DataplaneError> {
        self.open_sandbox_netns(path).await.map(drop)
    }

    /// The host connection, created on first use and reused afterwards.
    pub(crate) async fn host(&self) -> Result<&Conn, DataplaneError> {
        self.inner
            .host_conn
            .get_or_try_init(|| async {
                let taken = self
                    .inner
                    .host_socket
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                let socket = match taken {
                    Some(s) => s,
                    None => netlink::socket_in(&self.inner.host_ns)?,
                };
                Conn::from_socket(socket, self.inner.host_ns.label())
            })
            .await
    }

    /// Creates the sandbox interface, its addresses and routes, and the host side (ptp wiring).
    /// On failure everything created so far is rolled back and the error names the step.
    pub async fn setup(&self, spec: &SandboxSpec) -> Result<SetupOutcome, DataplaneError> {
        setup::run(self, spec).await
    }

    /// [`Self::setup`], then a check of what the kernel's acknowledgements of its requests
    /// cannot tell: that the node routes each pod address through the new host veth (one FIB
    /// lookup per family; [`Self::check`] reads everything back, for the CHECK verb). The
    /// check's verdict is returned beside the outcome; a failed check is not rolled back.
    pub async fn setup_and_check(
        &self,
        spec: &SandboxSpec,
    ) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
        setup::run_and_check(self, spec).await
    }

    /// The part of [`Self::setup_and_check`] that needs no address: the sandbox's namespace
    /// opened, its veth pair made (ADD runs it while it reserves the addresses). Finish it with
    /// [`StartedSetup::finish`], or undo it with [`StartedSetup::abandon`]. On failure what was
    /// made is rolled back, and the error names the step, as setup's does.
    pub async fn start_setup(&self, link: LinkSpec) -> Result<StartedSetup, DataplaneError> {
        setup::start(self, link).await
    }

    /// Removes what setup created. Idempotent: succeeds when nothing is there, when the netns is
    /// gone, on a second call. Goes on after errors and reports them all.
    ///
    /// On success nothing routes the sandbox's addresses any more (routes and addresses through
    /// the host veth are withdrawn, both ends are down, the sandbox end renamed `pvx<index>`
    /// and the host end in the graveyard group), so the caller may release them. A new setup
    /// of the same sandbox works at once: it renames the retired host end out of its way. The
    /// veth itself is deleted in the background (see [`Self::flush_deletions`]).
    pub async fn teardown(
        &self,
        container_id: &str,
        ifname: &str,
        netns: Option<&Path>,
    ) -> Result<TeardownOutcome, DataplaneError> {
        teardown::run(self, container_id, ifname, netns).await
    }

    /// Waits until the background reaper deleted every link retired so far (call it before the
    /// process exits: the daemon's shutdown). Returns the number of links still waiting, which
    /// is 0 unless a deletion failed meanwhile (then it returns at once rather than hang; the
    /// links stay in the graveyard group and the next start-up sweep deletes them).
    pub async fn flush_deletions(&self) -> usize {
        self.inner.reaper.flush().await
    }

    /// Names of every link in the host netns.
    pub async fn host_link_names(&self) -> Result<Vec<String>, DataplaneError> {
        let links = link::all(self.host().await?).await?;
        Ok(links.into_iter().map(|l| l.name).collect())
    }

    /// The global (not link-local) addresses on host link `name`; empty when it is absent.
    pub async fn host_link_addresses(
        &self,
        name: &str,
    ) -> Result<Vec<ipnetwork::IpNetwork>, DataplaneError> {
        let conn = self.host().await?;
        let Some(found) = link::by_name(conn, name).await? else {
            return Ok(Vec::new());
        };
        let addresses = address::list(conn, found.index, name).await?;
        Ok(addresses
            .into_iter()
            .filter(|a| !a.link_local)
            .map(|a| a.net)
            .collect())
    }

    /// Deletes the host link `name` (and with a veth its peer); absent is fine. The link is
    /// retired at once (nothing routes through it when this returns) and deleted by the
    /// background reaper, like in [`Self::teardown`]. Graveyard links (`pvx*`) are accepted.
    pub async fn delete_host_link(&self, name: &str) -> Result<(), DataplaneError> {
        let conn = self.host().await?;
        let Some(found) = link::by_name(conn, name).await? else {
            return Ok(());
        };
        let mut errors = Vec::new();
        teardown::retire(self, conn, &found, &mut errors).await;
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(DataplaneError::Teardown {
                container_id: format!("host link {name}"),
                errors,
            }),
        }
    }

    /// The sandbox netns of each host veth named in `host_links` that has one: found from the
    /// kernel (the veth's peer namespace), among the pins under [`SANDBOX_PIN_DIRS`] and every
    /// process's namespace.
    pub async fn sandbox_netns_of(
        &self,
        host_links: &[String],
    ) -> Result<std::collections::HashMap<String, std::path::PathBuf>, DataplaneError> {
        let pin_dirs: Vec<std::path::PathBuf> = SANDBOX_PIN_DIRS
            .iter()
            .map(std::path::PathBuf::from)
            .collect();
        let candidates = tokio::task::spawn_blocking(move || netns_files(&pin_dirs))
            .await
            .map_err(|e| DataplaneError::Protocol {
                op: "list network namespace files".to_owned(),
                netns: self.host_netns().to_owned(),
                detail: e.to_string(),
            })?;
        locate::peer_netns(self.host().await?, host_links, &candidates).await
    }

    /// Cheap liveness check of the host netlink socket (readiness).
    pub async fn probe(&self) -> Result<(), DataplaneError> {
        link::by_name(self.host().await?, "lo").await.map(|_| ())
    }

    /// Verifies every resource setup would create; names each one missing or different.
    pub async fn check(&self, spec: &SandboxSpec) -> Result<(), CheckFailure> {
        check::run(self, spec).await
    }
}
