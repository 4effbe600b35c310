//! Starting the daemon for a test, and running the binary as a CNI plugin the way a runtime does.

use std::path::Path;

use anyhow::Result;
use serde_json::Value;

use crate::provisioner_bin;

/// A conflist for network `name` with one v4 (and optionally one v6) range.
pub fn conflist(name: &str, cni_version: &str, socket: &Path, v4: &str, v6: Option<&str>) -> Value {
    let mut ranges = vec![serde_json::json!([{ "subnet": v4 }])];
    let mut routes = vec![serde_json::json!({ "dst": "0.0.0.0/0" })];
    if let Some(v6) = v6 {
        ranges.push(serde_json::json!([{ "subnet": v6 }]));
        routes.push(serde_json::json!({ "dst": "::/0" }));
    }
    serde_json::json!({
        "cniVersion": cni_version,
        "name": name,
        "plugins": [{
            "type": "provisioner",
            "mtu": 1400,
            "socket": socket,
            "ipam": { "ranges": ranges, "routes": routes }
        }]
    })
}

pub use testkit::cni::{Run as PluginRun, plugin_config as plugin_stdin, run_with_stdin};

pub use testkit::daemon::Daemon;

/// Executes the binary exactly as a runtime does: CNI_* env, config on stdin, result on stdout.
pub fn run_plugin(
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    ifname: &str,
    stdin: &[u8],
) -> Result<PluginRun> {
    let cmd = testkit::cni::command(
        &provisioner_bin(),
        command,
        container_id,
        netns,
        ifname,
        "/opt/cni/bin",
    );
    run_with_stdin(cmd, stdin)
}

/// [`run_plugin`] with `CNI_ARGS` set, as a runtime passes the pod (`K8S_POD_NAMESPACE=..;..`).
pub fn run_plugin_with_args(
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    cni_args: &str,
    stdin: &[u8],
) -> Result<PluginRun> {
    let mut cmd = testkit::cni::command(
        &provisioner_bin(),
        command,
        container_id,
        netns,
        "eth0",
        "/opt/cni/bin",
    );
    cmd.env("CNI_ARGS", cni_args);
    run_with_stdin(cmd, stdin)
}
