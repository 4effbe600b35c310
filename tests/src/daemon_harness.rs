//! Starting the daemon for a test, and running the binary as a CNI plugin the way a runtime does.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use testkit::daemon::{Placement, write_conflist};

use crate::{Netns, provisioner_bin};

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

/// A running `provisioner daemon` whose host side is `node` (the process stays in the caller's
/// namespace: its metrics address is the test's), with its files in a temp dir; stopped
/// (SIGTERM, by pid) on drop.
pub struct Daemon {
    process: testkit::daemon::Daemon,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for Daemon {
    type Target = testkit::daemon::Daemon;

    fn deref(&self) -> &Self::Target {
        &self.process
    }
}

impl Daemon {
    /// Starts a daemon watching a fresh conf dir that holds `config` (if any) as
    /// `10-provisioner.conflist`, and waits until its socket answers.
    pub fn start(node: &Netns, config: Option<&Value>) -> Result<Self> {
        Self::start_with(node, config, &[])
    }

    /// Like [`Daemon::start`] with extra daemon arguments.
    pub fn start_with(node: &Netns, config: Option<&Value>, extra: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        if let Some(config) = config {
            write_conflist(dir.path(), config)?;
        }
        Self::spawn(node, dir, extra)
    }

    /// Starts a second daemon on the state of a stopped one: same conf dir and data dir.
    pub fn start_in(node: &Netns, stopped: &Daemon) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::os::unix::fs::symlink(&stopped.conf_dir, dir.path().join("net.d"))?;
        std::os::unix::fs::symlink(&stopped.data_dir, dir.path().join("data"))?;
        Self::spawn(node, dir, &[])
    }

    /// Like [`Daemon::start_with`], the config built from the daemon's socket path (a config
    /// whose plugins talk to this daemon), written before the daemon starts.
    pub fn start_with_conflist(
        node: &Netns,
        extra: &[&str],
        config: impl FnOnce(&Path) -> Value,
    ) -> Result<Self> {
        Self::start_placed_with_conflist(node, extra, config, Placement::Outside)
    }

    /// Like [`Daemon::start_with_conflist`], the process placed inside `node` (as on a node,
    /// where the daemon lives in the host netns) rather than outside it.
    pub fn start_in_node_with_conflist(
        node: &Netns,
        extra: &[&str],
        config: impl FnOnce(&Path) -> Value,
    ) -> Result<Self> {
        Self::start_placed_with_conflist(node, extra, config, Placement::InNode)
    }

    fn start_placed_with_conflist(
        node: &Netns,
        extra: &[&str],
        config: impl FnOnce(&Path) -> Value,
        placement: Placement,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = config(&dir.path().join("provisioner.sock"));
        write_conflist(dir.path(), &config)?;
        Self::spawn_placed(node, dir, extra, placement)
    }

    fn spawn(node: &Netns, dir: tempfile::TempDir, extra: &[&str]) -> Result<Self> {
        Self::spawn_placed(node, dir, extra, Placement::Outside)
    }

    fn spawn_placed(
        node: &Netns,
        dir: tempfile::TempDir,
        extra: &[&str],
        placement: Placement,
    ) -> Result<Self> {
        let process = testkit::daemon::Daemon::spawn_placed(
            &provisioner_bin(),
            node,
            placement,
            dir.path(),
            extra,
        )?;
        let mut daemon = Self { process, _dir: dir };
        daemon.process.wait_listening(LISTENING_WITHIN)?;
        Ok(daemon)
    }

    /// Starts the daemon process again on the same socket, conf dir and data dir, after it
    /// was stopped or killed, and waits until its socket answers.
    pub fn restart(&mut self, node: &Netns, extra: &[&str]) -> Result<()> {
        self.process.respawn(node, Placement::Outside, extra)?;
        self.process.wait_listening(LISTENING_WITHIN)?;
        Ok(())
    }

    /// [`Self::restart`] with `env` set for the process (e.g. a failpoint).
    pub fn restart_with_env(
        &mut self,
        node: &Netns,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        self.process
            .respawn_with_env(node, Placement::Outside, extra, env)?;
        self.process.wait_listening(LISTENING_WITHIN)?;
        Ok(())
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        self.process.log_text()
    }

    /// Runs a CLI verb against this daemon (`provisioner <args> --socket S`).
    pub fn cli(&self, args: &[&str]) -> Result<std::process::Output> {
        self.process.cli(args)
    }

    /// `provisioner status --json`.
    pub fn status(&self) -> Result<Value> {
        let out = self.cli(&["status", "--json"])?;
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    }

    /// Waits (at most `limit`) until the daemon reports ready.
    pub fn wait_ready(&self, limit: Duration) -> Result<()> {
        crate::wait_until("the daemon to be ready", limit, || {
            let status = self.status()?;
            Ok((status["ready"] == true).then_some(()))
        })
        .with_context(|| format!("log:\n{}", self.log()))
    }

    /// `provisioner sandboxes --json`.
    pub fn sandboxes(&self) -> Result<Value> {
        let out = self.cli(&["sandboxes", "--json"])?;
        if !out.status.success() {
            bail!("sandboxes: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Kills the daemon with SIGKILL (as a crash would) and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        self.process.kill()
    }

    /// Stops the daemon with SIGTERM and waits for it (SIGKILL after 10 s, an error then).
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        self.process.stop_status()
    }
}

/// How long a daemon may take to answer on its socket after its start.
const LISTENING_WITHIN: Duration = Duration::from_secs(10);

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
