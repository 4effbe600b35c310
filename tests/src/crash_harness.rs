//! A daemon that can be armed with a failpoint (it kills itself there), killed and restarted on
//! the same state; and the convergence check of the store against the node's kernel state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use provisioner::daemon::api::AllocationInfo;
use provisioner::dataplane::{GRAVEYARD_GROUP, host_ifname};
use serde_json::Value;

use crate::daemon_harness::{PluginRun, conflist, plugin_stdin, run_plugin};
use crate::{Netns, provisioner_bin, wait_until};
use testkit::daemon::{Daemon, Placement, write_conflist};

/// How long a start may take (a daemon surveying a large store, on a loaded machine).
const START_LIMIT: Duration = Duration::from_secs(20);

/// The crash tests run without the kernel watch: what they check is the store and the kernel.
const NO_TRACE: &[&str] = &["--no-trace"];

/// Container-id prefix the daemon gives the addresses it adopted from a host veth.
const ADOPTED: &str = "adopted:";

/// A daemon on a fixed socket, conf dir and data dir, started and killed at will: the one
/// [`Daemon`] with a conflist of its own and a failpoint to arm at each start.
pub struct CrashDaemon {
    process: Daemon,
    config: Value,
    /// Daemon arguments besides `--no-trace`.
    args: Vec<String>,
    dir: tempfile::TempDir,
}

impl std::ops::Deref for CrashDaemon {
    type Target = Daemon;

    fn deref(&self) -> &Daemon {
        &self.process
    }
}

impl std::ops::DerefMut for CrashDaemon {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.process
    }
}

impl CrashDaemon {
    /// Prepares the dirs and a conflist of network `name` over `v4`; nothing runs yet.
    pub fn new(name: &str, v4: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let process = Daemon::unspawned(&provisioner_bin(), dir.path())?;
        let config = conflist(name, "1.1.0", &process.socket, v4, None);
        write_conflist(dir.path(), &config)?;
        Ok(Self {
            process,
            config,
            args: Vec::new(),
            dir,
        })
    }

    /// Daemon arguments for the next starts (besides `--no-trace`).
    pub fn set_args(&mut self, args: &[&str]) {
        self.args = args.iter().map(|a| (*a).to_owned()).collect();
    }

    /// Renames the network in the conflist (takes effect at the next start).
    pub fn rename_network(&mut self, name: &str) -> Result<()> {
        self.config["name"] = Value::from(name);
        write_conflist(self.dir.path(), &self.config)
    }

    /// Starts the daemon and waits until it answers STATUS (ready or not); its first answer.
    pub fn start_unready(&mut self, node: &Netns) -> Result<Value> {
        self.spawn(node, None)?;
        self.process.wait_listening(START_LIMIT)?;
        self.process.status()
    }

    /// Starts the daemon with `node` as host netns, armed with `failpoint` if any, and waits
    /// until it is ready.
    pub fn start(&mut self, node: &Netns, failpoint: Option<&str>) -> Result<()> {
        self.spawn(node, failpoint)?;
        self.process.wait_ready(START_LIMIT)?;
        Ok(())
    }

    fn spawn(&mut self, node: &Netns, failpoint: Option<&str>) -> Result<()> {
        // An empty value arms nothing (and overrides one inherited from the test's environment).
        let env = [(provisioner::failpoint::ENV, failpoint.unwrap_or(""))];
        let mut args: Vec<&str> = NO_TRACE.to_vec();
        args.extend(self.args.iter().map(String::as_str));
        self.process
            .respawn_with_env(node, Placement::Outside, &args, &env)
    }

    /// Waits (bounded) for the daemon to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus> {
        let mut status = None;
        wait_until("the daemon to exit by itself", limit, || {
            status = self.process.exited()?;
            Ok(status.map(|_| ()))
        })
        .with_context(|| format!("log:\n{}", self.log()))?;
        status.context("the daemon exited")
    }

    /// The plugin's stdin for this network.
    pub fn stdin(&self) -> Vec<u8> {
        serde_json::to_vec(&plugin_stdin(&self.config, "1.1.0")).unwrap_or_default()
    }

    /// Runs the plugin as a runtime does.
    pub fn plugin(
        &self,
        command: &str,
        container_id: &str,
        netns: Option<&Path>,
    ) -> Result<PluginRun> {
        run_plugin(command, container_id, netns, "eth0", &self.stdin())
    }

    /// The runtime's GC: every attachment not in `valid` (container ids, ifname eth0) goes.
    pub fn gc(&self, valid: &[String]) -> Result<PluginRun> {
        let mut stdin = plugin_stdin(&self.config, "1.1.0");
        stdin["cni.dev/valid-attachments"] = valid
            .iter()
            .map(|c| serde_json::json!({ "containerID": c, "ifname": "eth0" }))
            .collect();
        run_plugin("GC", "", None, "", &serde_json::to_vec(&stdin)?)
    }

    /// The store's allocations (`provisioner list --json`).
    pub fn allocations(&self) -> Result<Vec<AllocationInfo>> {
        let out = self.cli(&["list", "--json"])?;
        if !out.status.success() {
            bail!("list: {}", String::from_utf8_lossy(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).context("provisioner list --json: not a list")
    }

    /// Every address the store's allocations hold, in a collection of the caller's choice.
    pub fn addresses<C: FromIterator<String>>(&self) -> Result<C> {
        Ok(self
            .allocations()?
            .into_iter()
            .flat_map(|a| a.addresses)
            .collect())
    }
}

/// Our links on the node: host veths with the pod addresses routed through each, and retired
/// links.
#[derive(Debug, Default)]
pub struct NodeState {
    pub veths: BTreeMap<String, BTreeSet<String>>,
    pub retired: Vec<String>,
}

/// Reads the node's links (`pvn*`; `pvx*` and the graveyard group's are retired) and its host
/// routes through our veths.
pub fn node_state(node: &Netns) -> Result<NodeState> {
    let mut state = NodeState::default();
    // Read before the links: a link retired by then is still retired (or gone) when they are.
    let graveyard = node.links_in_group(GRAVEYARD_GROUP)?;
    for link in node.links()? {
        if link.starts_with("pvx") || graveyard.contains(&link) {
            state.retired.push(link);
        } else if link.starts_with("pvn") {
            state.veths.insert(link, BTreeSet::new());
        }
    }
    for family in ["-4", "-6"] {
        for route in node.ip(&[family, "route", "show"])?.lines() {
            let words: Vec<&str> = route.split_whitespace().collect();
            let dev = words
                .iter()
                .position(|w| *w == "dev")
                .and_then(|i| words.get(i + 1));
            // A host route (/32, /128) is printed as a bare address.
            if let (Some(dst), Some(dev)) = (words.first(), dev)
                && dst.parse::<std::net::IpAddr>().is_ok()
                && !route.contains(" via ")
                && let Some(routed) = state.veths.get_mut(*dev)
            {
                routed.insert((*dst).to_owned());
            }
        }
    }
    Ok(state)
}

/// The host veth an allocation's sandbox has.
fn host_link(a: &AllocationInfo) -> String {
    match a.container_id.strip_prefix(ADOPTED) {
        Some(link) if a.ifname.is_empty() => link.to_owned(),
        _ => host_ifname(&a.container_id, &a.ifname),
    }
}

/// Checks that the store and the node agree exactly: no address with two owners in the store,
/// every allocation's host veth routes exactly its addresses, every host veth of ours belongs
/// to an allocation, no retired link left (waits for the reaper, bounded).
pub fn assert_converged(daemon: &CrashDaemon, node: &Netns) -> Result<Vec<AllocationInfo>> {
    assert_store_is_node(node, || daemon.allocations())
}

/// [`assert_converged`] for any daemon: `allocations` reads its store.
pub fn assert_store_is_node(
    node: &Netns,
    allocations: impl FnOnce() -> Result<Vec<AllocationInfo>>,
) -> Result<Vec<AllocationInfo>> {
    wait_until("retired links deleted", Duration::from_secs(10), || {
        Ok(node_state(node)?.retired.is_empty().then_some(()))
    })?;
    let allocations = allocations()?;
    let state = node_state(node)?;
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    let mut links = BTreeSet::new();
    for a in &allocations {
        let who = format!("{}/{}", a.container_id, a.ifname);
        for address in &a.addresses {
            let ip = address.split('/').next().unwrap_or(address).to_owned();
            if let Some(other) = owners.insert(ip.clone(), who.clone()) {
                bail!("address {ip} has two owners in the store: {other} and {who}");
            }
        }
        let link = host_link(a);
        let want: BTreeSet<String> = a
            .addresses
            .iter()
            .map(|s| s.split('/').next().unwrap_or(s).to_owned())
            .collect();
        match state.veths.get(&link) {
            Some(routed) if *routed == want => {}
            Some(routed) => {
                bail!("{who}: host veth {link} routes {routed:?}, store holds {want:?}")
            }
            None => bail!(
                "{who} holds {want:?} but its host veth {link} is not on the node ({:?})",
                state.veths
            ),
        }
        links.insert(link);
    }
    for (veth, routed) in &state.veths {
        if !links.contains(veth) {
            bail!(
                "host veth {veth} (routing {routed:?}) belongs to no allocation: {allocations:?}"
            );
        }
    }
    Ok(allocations)
}
