//! The reference CNI plugins (Debian's containernetworking-plugins), run as a runtime runs
//! them, with their host side in a "node" namespace.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::Netns;
use crate::daemon_harness::{PluginRun, run_with_stdin};

/// Where Debian installs the reference plugins.
pub const REFERENCE_DIR: &str = "/usr/lib/cni";

/// The reference `ptp` plugin with `host-local` IPAM on `subnet`, state in `data_dir`.
pub struct Ptp<'a> {
    pub node: &'a Netns,
    pub subnet: String,
    pub data_dir: PathBuf,
}

impl Ptp<'_> {
    /// Runs `command` (ADD, DEL) for `container_id` in the netns at `netns`; the plugin enters
    /// the node namespace (setns on the net namespace only) before exec.
    pub fn run(&self, command: &str, container_id: &str, netns: &Path) -> Result<PluginRun> {
        self.run_with_args(command, container_id, netns, None)
    }

    /// [`Ptp::run`] with `CNI_ARGS` (`K=V;K=V`, e.g. the pod's `K8S_POD_*`) when given.
    pub fn run_with_args(
        &self,
        command: &str,
        container_id: &str,
        netns: &Path,
        cni_args: Option<&str>,
    ) -> Result<PluginRun> {
        let plugin = testkit::tools::PTP.require()?;
        let config = serde_json::json!({
            "cniVersion": "0.4.0", "name": "reference-ptp", "type": "ptp", "mtu": 1460,
            "ipam": {"type": "host-local", "subnet": self.subnet,
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": self.data_dir},
        });
        let mut cmd = testkit::cni::command(
            plugin,
            command,
            container_id,
            Some(netns),
            "eth0",
            REFERENCE_DIR,
        );
        if let Some(args) = cni_args {
            cmd.env("CNI_ARGS", args);
        }
        self.node.enter(&mut cmd)?;
        let run = run_with_stdin(cmd, config.to_string().as_bytes())?;
        if run.code != 0 {
            bail!(
                "ptp {command} {container_id}: exit {}: {} {}",
                run.code,
                run.stdout,
                run.stderr
            );
        }
        Ok(run)
    }
}
