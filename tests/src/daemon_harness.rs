//! Starting the daemon for a test, and running the binary as a CNI plugin the way a runtime does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

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

/// The plugin config a runtime passes on stdin for one plugin of a conflist.
pub fn plugin_stdin(conflist: &Value, cni_version: &str) -> Value {
    let mut plugin = conflist["plugins"][0].clone();
    plugin["cniVersion"] = Value::from(cni_version);
    plugin["name"] = conflist["name"].clone();
    plugin
}

/// A running `provisioner daemon` whose host side is `node`; stopped (SIGTERM, by pid) on drop.
pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
    pub conf_dir: PathBuf,
    pub data_dir: PathBuf,
    _dir: tempfile::TempDir,
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
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir)?;
        if let Some(config) = config {
            std::fs::write(
                conf_dir.join("10-provisioner.conflist"),
                serde_json::to_vec_pretty(config)?,
            )?;
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
        let dir = tempfile::tempdir()?;
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir)?;
        let config = config(&dir.path().join("provisioner.sock"));
        std::fs::write(
            conf_dir.join("10-provisioner.conflist"),
            serde_json::to_vec_pretty(&config)?,
        )?;
        Self::spawn(node, dir, extra)
    }

    fn spawn(node: &Netns, dir: tempfile::TempDir, extra: &[&str]) -> Result<Self> {
        let mut daemon = Self {
            child: None,
            socket: dir.path().join("provisioner.sock"),
            conf_dir: dir.path().join("net.d"),
            data_dir: dir.path().join("data"),
            _dir: dir,
        };
        daemon.launch(node, extra)?;
        Ok(daemon)
    }

    /// Starts the daemon process again on the same socket, conf dir and data dir, after it
    /// was stopped or killed.
    pub fn restart(&mut self, node: &Netns, extra: &[&str]) -> Result<()> {
        if self.child.is_some() {
            bail!("the daemon still runs");
        }
        self.launch(node, extra)
    }

    fn launch(&mut self, node: &Netns, extra: &[&str]) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self._dir.path().join("daemon.log"))?;
        let child = Command::new(provisioner_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--conf-dir")
            .arg(&self.conf_dir)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--host-netns")
            .arg(node.path())
            .args(extra)
            .env("PROVISIONER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawn provisioner daemon")?;
        self.child = Some(child);
        self.wait_listening(Duration::from_secs(10))
    }

    fn wait_listening(&self, limit: Duration) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "daemon did not listen on {} within {limit:?}; log:\n{}",
            self.socket.display(),
            self.log()
        )
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// Runs a CLI verb against this daemon (`provisioner <args> --socket S`).
    pub fn cli(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(provisioner_bin())
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .context("run provisioner CLI")
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

    /// Waits (at most `limit`) until the daemon's kernel tracing is attached.
    pub fn wait_tracing(&self, limit: Duration) -> Result<()> {
        crate::wait_until("kernel tracing to attach", limit, || {
            let answer = self.sandboxes()?;
            Ok(answer["tracing_unavailable"].is_null().then_some(()))
        })
        .with_context(|| format!("log:\n{}", self.log()))
    }

    /// The daemon's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the daemon with SIGKILL (as a crash would) and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        let mut child = self.child.take().context("daemon already stopped")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Stops the daemon with SIGTERM and waits for it.
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("daemon already stopped")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        Ok(child.wait()?)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

/// What a CNI plugin invocation printed and returned.
#[derive(Debug)]
pub struct PluginRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl PluginRun {
    /// stdout as JSON (Null when empty).
    pub fn json(&self) -> Value {
        if self.stdout.trim().is_empty() {
            return Value::Null;
        }
        serde_json::from_str(&self.stdout).unwrap_or(Value::Null)
    }

    /// The CNI error code printed on stdout, if any.
    pub fn error_code(&self) -> Option<u64> {
        self.json().get("code").and_then(Value::as_u64)
    }
}

/// Executes the binary exactly as a runtime does: CNI_* env, config on stdin, result on stdout.
pub fn run_plugin(
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    ifname: &str,
    stdin: &[u8],
) -> Result<PluginRun> {
    let mut cmd = Command::new(provisioner_bin());
    cmd.env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", "/opt/cni/bin")
        .env(
            "CNI_NETNS",
            netns.map(|p| p.display().to_string()).unwrap_or_default(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run_with_stdin(cmd, stdin)
}

/// Runs `cmd`, feeding `stdin`.
pub fn run_with_stdin(mut cmd: Command, stdin: &[u8]) -> Result<PluginRun> {
    let mut child = cmd.spawn().context("spawn plugin")?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(stdin)?;
    }
    let out = child.wait_with_output()?;
    Ok(PluginRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
